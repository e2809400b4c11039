"""Pure parsers of Slurm's output: ``squeue --json``, ``sinfo --json``, GRES strings, ``sbatch --parsable``.

No commands run here. Anything that cannot be understood raises the package's
:class:`~slurm_amoeba.core.errors.ParseError` (never ``KeyError``/``TypeError``), naming what was parsed.
Tested on output recorded from the real test cluster (``tests/data/slurm/``) and on mangled input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.slurm.nodelist import expand_nodelist
from slurm_amoeba.slurm.records import JobRecord, JobState, NodeRecord, StepRecord

_GRES_ITEM = re.compile(r"^gpu(?::(?P<type>\(null\)|[^:(]*))?:(?P<count>[0-9]+)(?:\((?P<detail>[^)]*)\))?$")
_DIGITS = re.compile(r"[0-9]+")
_IDX = re.compile(r"IDX:(?P<idx>[0-9,\-]*|N/A)")


class SlurmReportedError(ParseError):
    """The command's JSON carries Slurm's own errors (e.g. slurmctld unreachable) instead of data.

    Attributes:
        errors: Slurm's error entries, as reported.
    """

    def __init__(self, errors: list[Any], *, source: str) -> None:
        self.errors = errors
        described = "; ".join(
            str(e.get("description") or e.get("error") or e) if isinstance(e, dict) else str(e) for e in errors
        )
        super().__init__(f"Slurm reported errors instead of data: {described}", source=source)


def _load_document(text: str, source: str) -> Mapping[str, Any]:
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ParseError(f"output is not JSON ({exc})", source=source, text=text) from None
    if not isinstance(doc, dict):
        raise ParseError(f"expected a JSON object, got {type(doc).__name__}", source=source, text=text)
    errors = doc.get("errors")
    if isinstance(errors, list) and errors:
        raise SlurmReportedError(errors, source=source)
    return doc


def _records(doc: Mapping[str, Any], key: str, source: str, text: str) -> list[Mapping[str, Any]]:
    items = doc.get(key)
    if not isinstance(items, list):
        raise ParseError(f"no {key!r} list in the output", source=source, text=text)
    for item in items:
        if not isinstance(item, dict):
            raise ParseError(f"an entry of {key!r} is {type(item).__name__}, not an object", source=source, text=text)
    return items


def _field(rec: Mapping[str, Any], name: str, kind: type, source: str, default: Any = None) -> Any:
    value = rec.get(name, default)
    if value is None and default is not None:
        value = default
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParseError(f"field {name!r} is {value!r}, not an integer", source=source)
        return value
    if not isinstance(value, kind):
        raise ParseError(f"field {name!r} is {value!r}, not {kind.__name__}", source=source)
    return value


def parse_gres_count(text: str, *, source: str = "gres") -> int:
    """Count the GPUs in a GRES string such as ``gpu:4``, ``gpu:a100:2(S:0-1)`` or ``gpu:(null):3(IDX:0-2)``.

    Non-GPU entries (``shard:8``, ``mps:100``) are ignored; an empty string or ``(null)`` means 0.

    Raises:
        ParseError: a ``gpu`` entry without a whole count.
    """
    total = 0
    for item in _split_gres(text):
        if item == "gpu" or item.startswith("gpu:"):
            match = _GRES_ITEM.match(item)
            if match is None:
                raise ParseError(f"cannot read the GPU count of {item!r}", source=source, text=text)
            total += int(match.group("count"))
    return total


def _split_gres(text: str) -> list[str]:
    """Split a GRES list at commas outside parentheses."""
    text = text.strip()
    if not text or text == "(null)":
        return []
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    items.append(text[start:].strip())
    return [i for i in items if i]


def parse_gpu_indices(detail: str, *, source: str = "gres_detail") -> tuple[int, ...]:
    """Read the GPU indices of one node's ``gres_detail`` entry, e.g. ``gpu:2(IDX:0-1)`` -> ``(0, 1)``.

    Indices are node-wide (a second job on a node may get ``(2, 3)``).

    Raises:
        ParseError: a GPU entry whose index list cannot be read.
    """
    indices: list[int] = []
    for item in _split_gres(detail):
        if not item.startswith("gpu"):
            continue
        match = _IDX.search(item)
        if match is None or match.group("idx") == "N/A":
            continue
        for part in match.group("idx").split(","):
            if not part:
                continue
            bounds = part.split("-")
            if len(bounds) > 2 or not all(_DIGITS.fullmatch(b) for b in bounds):
                raise ParseError(f"bad GPU index range {part!r}", source=source, text=detail)
            low, high = int(bounds[0]), int(bounds[-1])
            if high < low or high - low > 4096:
                raise ParseError(f"bad GPU index range {part!r}", source=source, text=detail)
            indices.extend(range(low, high + 1))
    return tuple(indices)


def _gpus_per_node(tres_per_node: str, source: str) -> int:
    # e.g. "gres:gpu:2", "gres/gpu:2", "gres:gpu:a100:2", "" (no GPUs)
    total = 0
    for item in tres_per_node.split(","):
        item = item.strip()
        for prefix in ("gres:", "gres/"):
            if item.startswith(prefix):
                item = item[len(prefix) :]
        if item.startswith("gpu"):
            total += parse_gres_count(item, source=source)
    return total


_GPUS_PER_TASK = re.compile(r"^(?:gres[:/])?gpu(?::[A-Za-z0-9_.-]+)?[:=](?P<count>[0-9]{1,6})$")


def _gpus_per_task(tres: str) -> int:
    """GPUs in Slurm's ``tres_per_task`` (``gres:gpu:2``, ``gres/gpu=2``, ``gres:gpu:a100:2``); 0 when none."""
    for item in tres.split(","):
        match = _GPUS_PER_TASK.match(item.strip())
        if match:
            return int(match["count"])
    return 0


def parse_squeue_json(text: str) -> list[JobRecord]:
    """Parse ``squeue --json`` (openapi v0.0.38, Slurm 22.05) into job records.

    squeue's JSON ignores ``-j``/``-t``: it returns every job slurmctld still remembers; filter the result.

    Raises:
        ParseError: the output is not JSON, Slurm reported errors, or a job record lacks a field or has one of
            the wrong type.
    """
    source = "squeue --json"
    doc = _load_document(text, source)
    jobs: list[JobRecord] = []
    for rec in _records(doc, "jobs", source, text):
        job_id = _field(rec, "job_id", int, source)
        where = f"{source}, job {job_id}"
        nodes = tuple(expand_nodelist(_field(rec, "nodes", str, where, "")))
        details = _field(rec, "gres_detail", list, where, [])
        if not all(isinstance(d, str) for d in details):
            raise ParseError(f"gres_detail is {details!r}, not a list of strings", source=where)
        gpu_indices = tuple(parse_gpu_indices(d, source=where) for d in details)
        jobs.append(
            JobRecord(
                job_id=job_id,
                name=_field(rec, "name", str, where, ""),
                comment=_field(rec, "comment", str, where, ""),
                state=JobState.parse(_field(rec, "job_state", str, where)),
                state_reason=_field(rec, "state_reason", str, where, ""),
                user=_field(rec, "user_name", str, where, ""),
                uid=_field(rec, "user_id", int, where),
                partition=_field(rec, "partition", str, where, ""),
                nodes=nodes,
                batch_host=_field(rec, "batch_host", str, where, ""),
                gpus_per_node=_gpus_per_node(_field(rec, "tres_per_node", str, where, ""), where),
                gpu_indices=gpu_indices,
                cpus=_field(rec, "cpus", int, where, 0),
                node_count=_field(rec, "node_count", int, where, 0),
                het_job_id=_field(rec, "het_job_id", int, where, 0),
                het_job_offset=_field(rec, "het_job_offset", int, where, 0),
                submit_time=_field(rec, "submit_time", int, where, 0),
                start_time=_field(rec, "start_time", int, where, 0),
                priority=_field(rec, "priority", int, where, 0),
                account=_field(rec, "account", str, where, ""),
                qos=_field(rec, "qos", str, where, ""),
                reservation=_field(rec, "resv_name", str, where, ""),
                features=_field(rec, "features", str, where, ""),
                admin_comment=_field(rec, "admin_comment", str, where, ""),
                time_limit_s=_time_limit_s(rec.get("time_limit"), where),
                gpus_requested=_requested_gpus(_field(rec, "tres_req_str", str, where, ""), where),
                tasks=_field(rec, "tasks", int, where, 0),
                gpus_per_task=_gpus_per_task(_field(rec, "tres_per_task", str, where, "")),
            )
        )
    return jobs


def _time_limit_s(value: object, where: str) -> int | None:
    """squeue's ``time_limit`` (minutes; null or absent: unlimited) in seconds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParseError(f"field 'time_limit' is {value!r}, not a number of minutes", source=where)
    return value * 60


def _requested_gpus(text: str, where: str) -> int:
    try:
        return tres_gpus(text)
    except ValueError:
        raise ParseError(f"field 'tres_req_str' is {text!r}: a GPU count that is not a number", source=where) from None


def parse_sinfo_json(text: str) -> list[NodeRecord]:
    """Parse ``sinfo --json`` (openapi v0.0.38, Slurm 22.05) into node records.

    Raises:
        ParseError: the output is not JSON, Slurm reported errors, or a node record is malformed.
    """
    source = "sinfo --json"
    doc = _load_document(text, source)
    nodes: list[NodeRecord] = []
    for rec in _records(doc, "nodes", source, text):
        name = _field(rec, "name", str, source)
        where = f"{source}, node {name}"
        flags = _field(rec, "state_flags", list, where, [])
        partitions = _field(rec, "partitions", list, where, [])
        if not all(isinstance(f, str) for f in flags) or not all(isinstance(p, str) for p in partitions):
            raise ParseError("state_flags/partitions must be lists of strings", source=where, text=text)
        nodes.append(
            NodeRecord(
                name=name,
                address=_field(rec, "address", str, where, ""),
                hostname=_field(rec, "hostname", str, where, ""),
                state=_field(rec, "state", str, where, "unknown").lower(),
                state_flags=tuple(f.upper() for f in flags),
                partitions=tuple(partitions),
                cpus=_field(rec, "cpus", int, where, 0),
                alloc_cpus=_field(rec, "alloc_cpus", int, where, 0),
                gpus_total=parse_gres_count(_field(rec, "gres", str, where, ""), source=where),
                gpus_used=parse_gres_count(_field(rec, "gres_used", str, where, ""), source=where),
            )
        )
    return nodes


def parse_sbatch_reply(text: str) -> int:
    """Read the job id from ``sbatch --parsable`` (``"123"`` or ``"123;cluster"``).

    Raises:
        ParseError: the reply holds no job id, with the reply quoted, so the user sees what sbatch said.
    """
    line = text.strip().splitlines()[-1].strip() if text.strip() else ""
    head = line.split(";", 1)[0]
    if not _DIGITS.fullmatch(head):
        raise ParseError("could not make sense of sbatch's reply: no job id", source="sbatch --parsable", text=text)
    return int(head)


STEP_FORMAT = "%i|%N|%j"
"""The ``squeue --steps --noheader --format`` that :func:`parse_step_lines` reads (the name last: it may hold ``|``)."""


def parse_step_lines(text: str) -> list[StepRecord]:
    """Parse ``squeue --steps --noheader --format='%i|%N|%j'`` into step records.

    Raises:
        ParseError: a line that is not ``JOB.STEP|NODES|NAME``.
    """
    steps: list[StepRecord] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("|", 2)
        if len(parts) != 3:
            raise ParseError(f"line {number} is not JOB.STEP|NODES|NAME", source="squeue --steps", text=line)
        job, _, step = parts[0].strip().partition(".")
        job = job.split("+", 1)[0]
        if not _DIGITS.fullmatch(job) or not step:
            raise ParseError(f"line {number}: {parts[0]!r} is not JOB.STEP", source="squeue --steps", text=line)
        steps.append(StepRecord(job_id=int(job), step=step, name=parts[2], nodes=tuple(expand_nodelist(parts[1]))))
    return steps


def tres_gpus(text: str) -> int:
    """GPUs in a TRES string such as ``billing=2,cpu=2,gres/gpu=2,mem=8000M,node=1`` (sacct's ``AllocTRES``): the
    untyped ``gres/gpu`` count when present, else the typed ones (``gres/gpu:a100=2``) summed; 0 when none.

    Raises:
        ValueError: a GPU count that is not a number.
    """
    total = 0
    for item in text.split(","):
        key, _, count = item.strip().partition("=")
        if key == "gres/gpu":
            return int(count)  # the untyped total, when present, is authoritative
        if key.startswith("gres/gpu:"):
            total += int(count)
    return total


def parse_past_service(text: str) -> dict[int, float]:
    """``sacct -P --format=JobID,ElapsedRaw,AllocTRES`` lines -> job id -> sum of elapsed x ``gres/gpu`` over its
    records (a heterogeneous job's components count for their leader); unreadable lines are skipped."""
    found: dict[int, float] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 3 or not fields[1].strip().isdigit():
            continue
        head = fields[0].split("+", 1)[0].split("_", 1)[0]
        if not head.isdigit():
            continue
        try:
            gpus = tres_gpus(fields[2])
        except ValueError:
            continue
        if gpus:
            found[int(head)] = found.get(int(head), 0.0) + int(fields[1]) * gpus
    return found


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config``'s ``Key = value`` lines as a mapping (other lines are skipped)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            values[key.strip()] = value.strip()
    return values
