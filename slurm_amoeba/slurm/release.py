"""Which Slurm a cluster runs, as a typed value, and which JSON shape its commands print.

Part of ``slurm/`` (DESIGN.md): the release is detected once per client (:meth:`CliSlurmClient.slurm_release
<slurm_amoeba.slurm.client.CliSlurmClient.slurm_release>`, from ``sinfo --version``) and read again from the ``meta``
block of every JSON reply, so that :mod:`~slurm_amoeba.slurm.parsers` can name the release in its errors and
:mod:`~slurm_amoeba.slurm.options` can use the release's sbatch options. Nothing here runs a command.

Slurm writes its release and its JSON plugin into ``meta`` in three shapes:

- 22.05 (``openapi/v0.0.38`` and ``openapi/dbv0.0.38``, CLI and slurmrestd alike): ``meta.plugin.type`` names the
  plugin, ``meta.Slurm.release`` the release, ``meta.Slurm.version`` its numbers as integers;
- 23.02 (``data_parser/v0.0.39``): the CLI writes ``meta.plugins.data_parser``, slurmrestd ``meta.plugin.data_parser``
  (``v0.0.39``, without the ``data_parser/`` prefix); both keep ``meta.Slurm``;
- 23.11 and later (``data_parser/v0.0.40`` to ``v0.0.44``): ``meta.plugin.data_parser`` and a lower-case
  ``meta.slurm`` whose version numbers are strings.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from slurm_amoeba.core.errors import ParseError

_VERSION = re.compile(r"(?<![0-9.])(?P<major>[0-9]{2})\.(?P<minor>[0-9]{1,2})(?:\.(?P<micro>[0-9]+))?")
_PARSER = re.compile(r"v0\.0\.[0-9]+")


@dataclasses.dataclass(frozen=True, order=True)
class SlurmRelease:
    """A Slurm release: ``SlurmRelease(23, 11, 4)`` is 23.11.4.

    Attributes:
        major: the year (``23``).
        minor: the month (``2``, ``5``, ``11``).
        micro: the maintenance release (0 when not known).
    """

    major: int
    minor: int
    micro: int = 0

    @classmethod
    def parse(cls, text: str) -> SlurmRelease:
        """Read a release from ``sinfo --version``/``squeue --version`` (``slurm 22.05.8``, ``slurm-wlm 23.11.4``)
        or a bare ``25.11.0-0rc1``.

        Raises:
            ParseError: the text holds no ``YY.MM`` release.
        """
        match = _VERSION.search(text)
        if match is None:
            raise ParseError(
                "no Slurm release such as 23.11.4 in the text; is this the output of `sinfo --version`?",
                source="slurm version",
                text=text,
            )
        micro = match.group("micro")
        return cls(int(match.group("major")), int(match.group("minor")), int(micro) if micro else 0)

    @classmethod
    def from_meta(cls, meta: object) -> SlurmRelease | None:
        """The release a JSON reply's ``meta`` names (``meta.Slurm`` up to 23.02, ``meta.slurm`` after), or None
        when it names none."""
        if not isinstance(meta, Mapping):
            return None
        slurm = meta.get("slurm", meta.get("Slurm"))
        if not isinstance(slurm, Mapping):
            return None
        release = slurm.get("release")
        if isinstance(release, str) and _VERSION.search(release):
            return cls.parse(release)
        version = slurm.get("version")
        if isinstance(version, Mapping):
            numbers = [_as_int(version.get(key)) for key in ("major", "minor", "micro")]
            if numbers[0] is not None and numbers[1] is not None:
                return cls(numbers[0], numbers[1], numbers[2] or 0)
        return None

    @property
    def series(self) -> str:
        """The release series as Slurm writes it: ``"23.11"``."""
        return f"{self.major:02d}.{self.minor:02d}"

    @property
    def data_parser(self) -> str | None:
        """The JSON plugin its commands use by default (``v0.0.40`` for 23.11), or None for an unsupported series."""
        return DATA_PARSERS.get(self.series)

    @property
    def is_supported(self) -> bool:
        """Whether this project reads this release's output (22.05 through 25.11)."""
        return self.series in DATA_PARSERS

    def __str__(self) -> str:
        return f"{self.series}.{self.micro}"


#: The supported release series and the JSON plugin each prints by default (``squeue --json``, ``sacct --json``,
#: and the newest API slurmrestd of that release serves).
DATA_PARSERS: dict[str, str] = {
    "22.05": "v0.0.38",
    "23.02": "v0.0.39",
    "23.11": "v0.0.40",
    "24.05": "v0.0.41",
    "24.11": "v0.0.42",
    "25.05": "v0.0.43",
    "25.11": "v0.0.44",
}
#: The supported release series, oldest first.
SUPPORTED_SERIES = tuple(DATA_PARSERS)


def data_parser_of(meta: object) -> str | None:
    """The JSON plugin a reply's ``meta`` names, as ``v0.0.NN`` (``openapi/v0.0.38``, ``openapi/dbv0.0.38``,
    ``data_parser/v0.0.41`` and ``v0.0.39`` all name one), or None."""
    if not isinstance(meta, Mapping):
        return None
    for holder in ("plugin", "plugins"):
        plugin = meta.get(holder)
        if not isinstance(plugin, Mapping):
            continue
        for key in ("data_parser", "type"):
            value = plugin.get(key)
            found = _PARSER.search(value) if isinstance(value, str) else None
            if found:
                return found.group(0)
    return None


@dataclasses.dataclass(frozen=True)
class JsonShape:
    """What a JSON reply says of its origin: the release and the JSON plugin (either may be unknown).

    Attributes:
        release: the Slurm release that printed it, if ``meta`` says.
        data_parser: the JSON plugin (``v0.0.40``), if ``meta`` says.
    """

    release: SlurmRelease | None = None
    data_parser: str | None = None

    @classmethod
    def of(cls, document: Mapping[str, Any]) -> JsonShape:
        """Read the shape from a reply's ``meta`` block (an absent or odd ``meta`` gives an unknown shape)."""
        meta = document.get("meta")
        release = SlurmRelease.from_meta(meta)
        parser = data_parser_of(meta) or (release.data_parser if release else None)
        return cls(release, parser)

    def describe(self) -> str:
        """How errors name the shape: ``"Slurm 23.11.4, data_parser v0.0.40"``, or ``"unknown Slurm release"``."""
        parts = []
        if self.release is not None:
            parts.append(f"Slurm {self.release}")
        if self.data_parser is not None:
            parts.append(f"data_parser {self.data_parser}")
        return ", ".join(parts) or "unknown Slurm release"


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None
