"""A site's own history as a workload: jobs read from Slurm accounting exports (``sacct``).

Simulation flow (DESIGN.md): an export -> :class:`~slurm_amoeba.sim.workload.JobSpec` duration jobs -> the engine.
Two export forms are read:

- ``sacct --json -a -S <start> -E <end>`` of any supported release (22.05's ``openapi/dbv0.0.38`` through 25.11's
  ``data_parser/v0.0.44``; slurmrestd's ``/slurmdb/.../jobs`` replies too), read by
  :func:`~slurm_amoeba.slurm.parsers.parse_sacct_json`;
- ``sacct -a -P -X -S <start> -E <end> --format=JobID,Submit,Start,End,Partition,User,Timelimit,AllocTRES,State``
  (:data:`PARSABLE_FIELDS`; the header line ``sacct -P`` prints names the columns, any order, extra columns ignored).

Each job becomes: submit = its submission (seconds after the earliest one), duration = end - start (what it really
ran, whether it completed, failed, timed out or was cancelled while running), GPUs = the ``gres/gpu`` count of its
allocated TRES (requested when nothing was allocated), partition, user, and time limit (``None`` for UNLIMITED).
Jobs that never started, are still running or hold no GPU are left out and counted in :class:`History`.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.sim.slurmconf import parse_slurm_time
from slurm_amoeba.sim.workload import JobSpec
from slurm_amoeba.slurm.parsers import parse_sacct_json, tres_gpus

#: The ``--format`` fields the parsable reader needs (``sacct -P`` prints them as a header line).
PARSABLE_FIELDS = ("JobID", "Submit", "Start", "End", "Partition", "User", "Timelimit", "AllocTRES", "State")


@dataclasses.dataclass(frozen=True)
class History:
    """The jobs of an export and what was left out.

    Attributes:
        jobs: the jobs, in submit order, submit times relative to the earliest submission.
        never_started: jobs cancelled (or still pending) before they started.
        unfinished: jobs still running when the export was taken.
        without_gpus: jobs that held no GPU (CPU-only work does not compete for GPUs).
        recorded_jcts: what the kept jobs' completion times really were (end - submit), in ``jobs`` order.
        recorded_waits: what their queueing really was (start - submit).
    """

    jobs: list[JobSpec]
    never_started: int = 0
    unfinished: int = 0
    without_gpus: int = 0
    recorded_jcts: list[float] = dataclasses.field(default_factory=list)
    recorded_waits: list[float] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        """One sentence: jobs kept and jobs left out, by reason."""
        return (
            f"{len(self.jobs)} jobs with GPUs; left out: {self.never_started} never started, {self.unfinished} still "
            f"running, {self.without_gpus} without GPUs"
        )


@dataclasses.dataclass(frozen=True)
class _Row:
    job_id: str
    submit: float
    start: float | None
    end: float | None
    gpus: int
    partition: str
    user: str
    time_limit: float | None
    where: int


def load_history(path: Path, form: str = "auto") -> History:
    """Read an accounting export.

    Args:
        path: the file.
        form: ``"json"``, ``"parsable"`` or ``"auto"`` (JSON when the file starts with ``{``).

    Returns:
        The history.

    Raises:
        ParseError: the file cannot be read or understood (with the line or the job), or it holds no job with GPUs.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ParseError(
            f"cannot read the accounting export ({exc.strerror}); check the path", source=str(path)
        ) from None
    if form == "auto":
        form = "json" if text.lstrip().startswith("{") else "parsable"
    if form == "json":
        rows = _json_rows(text, str(path))
    elif form == "parsable":
        rows = _parsable_rows(text, str(path))
    else:
        raise ParseError(f"export format {form!r} is unknown; use json, parsable or auto", source=str(path))
    return _history(rows, str(path))


def _history(rows: Sequence[_Row], source: str) -> History:
    kept = [row for row in rows if row.start is not None and row.end is not None and row.gpus > 0]
    never = sum(1 for row in rows if row.start is None)
    unfinished = sum(1 for row in rows if row.start is not None and row.end is None)
    without = sum(1 for row in rows if row.start is not None and row.end is not None and row.gpus == 0)
    if not kept:
        raise ParseError(
            f"the export holds no finished job with GPUs ({len(rows)} records: {never} never started, {unfinished} "
            f"still running, {without} without GPUs); export a longer window with -S/-E and -a",
            source=source,
        )
    origin = min(row.submit for row in kept)
    kept.sort(key=lambda row: (row.submit, row.job_id))
    jobs = [
        JobSpec(
            name=row.job_id,
            submit_time=row.submit - origin,
            requested_workers=row.gpus,
            duration=max((row.end or 0.0) - (row.start or 0.0), 0.0),
            time_limit=row.time_limit,
            partition=row.partition,
            user=row.user,
            line=row.where,
        )
        for row in kept
    ]
    jcts = [(row.end or 0.0) - row.submit for row in kept]
    waits = [(row.start or 0.0) - row.submit for row in kept]
    return History(jobs, never, unfinished, without, jcts, waits)


def _json_rows(text: str, source: str) -> list[_Row]:
    try:
        records = parse_sacct_json(text)
    except ParseError as exc:
        raise ParseError(f"{exc}; expected the output of sacct --json", source=source) from None
    return [
        _Row(
            job_id=record.display_id,
            submit=float(record.submit_time),
            start=float(record.start_time) if record.start_time else None,
            end=float(record.end_time) if record.end_time else None,
            gpus=record.gpus_allocated or record.gpus_requested,
            partition=record.partition,
            user=record.user,
            time_limit=None if record.time_limit_s is None else float(record.time_limit_s),
            where=index + 1,
        )
        for index, record in enumerate(records)
    ]


def _parsable_rows(text: str, source: str) -> list[_Row]:
    lines = text.splitlines()
    if not lines:
        raise ParseError("the export is empty; it needs the header line sacct -P prints", source=source)
    header = lines[0].split("|")
    missing = [field for field in PARSABLE_FIELDS if field not in header]
    if missing:
        raise ParseError(
            f"line 1: the header lacks {', '.join(missing)}; export with sacct -a -P -X "
            f"--format={','.join(PARSABLE_FIELDS)}",
            source=source,
        )
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != len(header):
            raise ParseError(f"line {number}: {len(fields)} fields where the header has {len(header)}", source=source)
        value = dict(zip(header, fields, strict=True))
        if "." in value["JobID"]:
            continue  # a step (the export was taken without -X)
        try:
            rows.append(_parsable_row(value, number))
        except ValueError as exc:
            raise ParseError(f"line {number}: job {value['JobID']}: {exc}", source=source) from None
    return rows


def _parsable_row(value: Mapping[str, str], number: int) -> _Row:
    limit = value["Timelimit"].strip()
    return _Row(
        job_id=value["JobID"],
        submit=_stamp(value["Submit"], "Submit") or 0.0,
        start=_stamp(value["Start"], "Start"),
        end=_stamp(value["End"], "End"),
        gpus=tres_gpus(value["AllocTRES"]),
        partition=value["Partition"],
        user=value["User"],
        time_limit=None if limit in ("", "UNLIMITED", "Partition_Limit", "INFINITE") else parse_slurm_time(limit),
        where=number,
    )


def _stamp(text: str, field: str) -> float | None:
    """Seconds since the epoch of a sacct time (``2026-11-23T15:09:38``), ``None`` for Unknown/None."""
    if text.strip() in ("", "Unknown", "None"):
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{field}={text!r} is not a time like 2026-11-23T15:09:38") from None
    return moment.replace(tzinfo=datetime.timezone.utc).timestamp()
