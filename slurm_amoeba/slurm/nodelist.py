"""Slurm hostlists: ``compute-b2[1-3,5,6,8]`` <-> ``["compute-b21", ...]``.

Pure functions, no Slurm needed. A hostlist is a comma-separated list of host patterns; each pattern may hold
bracketed ranges (``n[01-04]`` keeps the zero padding, ``r[1-2]n[1-2]`` is a product). Malformed lists raise the
package's :class:`~slurm_amoeba.core.errors.ParseError`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from slurm_amoeba.core.errors import ParseError

_MAX_HOSTS = 1_000_000
_SOURCE = "hostlist"


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are outside brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ParseError("nested '[' in a hostlist", source=_SOURCE, text=text)
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ParseError("']' without '['", source=_SOURCE, text=text)
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ParseError("'[' without ']'", source=_SOURCE, text=text)
    parts.append(text[start:])
    return parts


def _expand_range(body: str, text: str) -> list[str]:
    values: list[str] = []
    for item in body.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if match is None:
            raise ParseError(f"bad range {item!r} in brackets", source=_SOURCE, text=text)
        low_s, high_s = match.group(1), match.group(2)
        if high_s is None:
            values.append(low_s)
            continue
        low, high = int(low_s), int(high_s)
        if high < low:
            raise ParseError(f"range {item!r} runs backwards", source=_SOURCE, text=text)
        if high - low >= _MAX_HOSTS:
            raise ParseError(f"range {item!r} is too large", source=_SOURCE, text=text)
        width = len(low_s) if low_s.startswith("0") else 0
        values.extend(str(v).zfill(width) for v in range(low, high + 1))
    return values


def _expand_pattern(pattern: str, text: str) -> list[str]:
    pieces = re.split(r"(\[[^\]]*\])", pattern)
    choices: list[list[str]] = []
    for piece in pieces:
        if piece.startswith("["):
            choices.append(_expand_range(piece[1:-1], text))
        elif piece:
            if any(c in piece for c in "[], \t\n"):
                raise ParseError(f"bad host pattern {pattern!r}", source=_SOURCE, text=text)
            choices.append([piece])
    total = 1
    for c in choices:
        total *= len(c)
        if total > _MAX_HOSTS:
            raise ParseError(f"pattern {pattern!r} names too many hosts", source=_SOURCE, text=text)
    return ["".join(combo) for combo in itertools.product(*choices)]


def expand_nodelist(text: str) -> list[str]:
    """Expand a Slurm hostlist into host names, in order.

    Args:
        text: e.g. ``"n[1-3],gpu07"``; empty or whitespace gives ``[]``.

    Returns:
        The host names, e.g. ``["n1", "n2", "n3", "gpu07"]``.

    Raises:
        ParseError: unbalanced or nested brackets, a bad range, or an empty name between commas.
    """
    text = text.strip()
    if not text or text == "(null)":
        return []
    hosts: list[str] = []
    for part in _split_top_level(text):
        if not part:
            raise ParseError("empty host name between commas", source=_SOURCE, text=text)
        hosts.extend(_expand_pattern(part, text))
        if len(hosts) > _MAX_HOSTS:
            raise ParseError("hostlist names too many hosts", source=_SOURCE, text=text)
    return hosts


_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


def compress_nodelist(hosts: Iterable[str]) -> str:
    """Write host names as a compact Slurm hostlist (the inverse of :func:`expand_nodelist`).

    Hosts sharing a prefix and a number width are grouped into one bracket; order within a group is sorted and
    duplicates are dropped.

    Args:
        hosts: host names, e.g. ``["n1", "n2", "n3", "n5"]``.

    Returns:
        e.g. ``"n[1-3,5]"``.
    """
    names = list(hosts)
    # Zero-padded numbers fix their group's width; an unpadded number of that many digits joins it (gpu08-gpu10).
    padded: set[tuple[str, int]] = set()
    for host in names:
        match = _TRAILING_NUMBER.match(host)
        if match is not None and match.group(2).startswith("0") and len(match.group(2)) > 1:
            padded.add((match.group(1), len(match.group(2))))
    groups: dict[tuple[str, int], set[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for host in names:
        match = _TRAILING_NUMBER.match(host)
        if match is None:
            if host not in plain:
                plain.append(host)
                order.append(host)
            continue
        prefix, digits = match.group(1), match.group(2)
        width = len(digits) if (prefix, len(digits)) in padded else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = set()
            order.append(key)
        groups[key].add(int(digits))
    out: list[str] = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        prefix, width = item
        numbers = sorted(groups[item])
        if len(numbers) == 1:
            out.append(f"{prefix}{str(numbers[0]).zfill(width)}")
            continue
        runs: list[str] = []
        start = prev = numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            low, high = str(start).zfill(width), str(prev).zfill(width)
            runs.append(low if start == prev else f"{low}-{high}")
            if n is not None:
                start = prev = n
        out.append(f"{prefix}[{','.join(runs)}]")
    return ",".join(out)
