"""Workload loaders: the jobs a simulation replays.

Two formats (``slurm_amoeba/sim/datafiles/SOURCES.md`` describes the shipped files):

- Pollux's evaluation workloads: ``name,time,application,num_replicas,batch_size`` (submit second, one of the six
  applications, the requested GPUs and the global batch);
- the Philly-derived trace ``philly.csv``: ``timestamp,duration,num_gpus,gpu_time,cluster`` (a job runs for
  ``duration`` seconds on its ``num_gpus`` GPUs; submit times are made relative to the earliest one).

Every malformed row fails with the file and the line number. :func:`make_elastic` then gives jobs a worker range so
that elastic policies have room to move.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import zlib
from collections.abc import Collection, Sequence
from pathlib import Path

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.sim.data import SimError, parse_number, read_rows

_POLLUX_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
_PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus")


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One job of a workload.

    Attributes:
        name: the job's name (unique within the workload).
        submit_time: submit second.
        requested_workers: GPUs (one worker each) the user asked for.
        application: the application (a Pollux trace) or ``None`` for a job that just runs ``duration`` seconds.
        batch_size: the global batch (kept fixed whatever the size), 0 for a duration job.
        duration: seconds the job runs on its requested GPUs, for a duration job.
        min_workers: the job's minimum size.
        max_workers: the job's maximum size.
        time_limit: the job's wall-clock limit in seconds (Slurm's ``--time``); ``None``: the simulator estimates
            one from the job's real duration (``SimConfig.time_limit_factor``, the model of user estimates).
        partition: the Slurm partition the job was submitted to (empty: the cluster's only one).
        user: the job's owner (for fair share).
        line: the line of the workload file the job comes from (0 when it was not read from a file), for messages.
        adaptive: the job lets its global batch adapt (``batch_size`` is its initial batch; ``sim/adaptive.py``).
    """

    name: str
    submit_time: float
    requested_workers: int
    application: str | None = None
    batch_size: int = 0
    duration: float = 0.0
    min_workers: int = 0
    max_workers: int = 0
    time_limit: float | None = None
    partition: str = ""
    user: str = ""
    line: int = 0
    adaptive: bool = False

    def __post_init__(self) -> None:
        if self.min_workers == 0:
            object.__setattr__(self, "min_workers", self.requested_workers)
        if self.max_workers == 0:
            object.__setattr__(self, "max_workers", self.requested_workers)
        if not 1 <= self.min_workers <= self.requested_workers <= self.max_workers:
            raise SimError(
                f"job {self.name}: worker range {self.min_workers}:{self.max_workers} must contain the requested "
                f"{self.requested_workers} with a minimum of at least 1"
            )


def load_pollux_workload(path: Path, applications: Collection[str] | None = None) -> list[JobSpec]:
    """Read a Pollux evaluation workload.

    Args:
        path: the CSV file.
        applications: the known application names; ``None`` skips the check.

    Returns:
        The jobs, in submit order (stable for equal times).

    Raises:
        ParseError: a malformed row, an unknown application or a duplicate name (with the line number).
    """
    jobs: list[JobSpec] = []
    names: dict[str, int] = {}
    for line, row in read_rows(path, _POLLUX_COLUMNS):
        name = row["name"].strip()
        if not name:
            raise ParseError(f"line {line}: the job has no name", source=str(path))
        if name in names:
            raise ParseError(f"line {line}: job name {name!r} was already used on line {names[name]}", source=str(path))
        names[name] = line
        app = row["application"].strip()
        if applications is not None and app not in applications:
            raise ParseError(
                f"line {line}: unknown application {app!r}; known applications are {', '.join(sorted(applications))}",
                source=str(path),
            )
        submit = parse_number(path, line, "time", row["time"])
        replicas = int(parse_number(path, line, "num_replicas", row["num_replicas"], integer=True))
        batch = int(parse_number(path, line, "batch_size", row["batch_size"], integer=True))
        if submit < 0 or replicas < 1 or batch < 1:
            raise ParseError(
                f"line {line}: time={row['time']}, num_replicas={row['num_replicas']}, batch_size={row['batch_size']}"
                f" must be a time of 0 or more, at least 1 replica and a batch of at least 1",
                source=str(path),
            )
        jobs.append(JobSpec(name, submit, replicas, app, batch, line=line))
    jobs.sort(key=lambda job: job.submit_time)
    return jobs


def load_philly(path: Path, limit: int | None = None) -> list[JobSpec]:
    """Read the Philly-derived trace as duration jobs.

    Args:
        path: ``philly.csv``.
        limit: keep only the first ``limit`` jobs in submit order.

    Returns:
        The jobs, in submit order, submit times in seconds after the earliest one.

    Raises:
        ParseError: a malformed row (with the line number).
    """
    raw: list[tuple[float, int, float, int]] = []
    for line, row in read_rows(path, _PHILLY_COLUMNS):
        try:
            stamp = datetime.datetime.fromisoformat(row["timestamp"].strip())
        except ValueError:
            raise ParseError(
                f"line {line}: timestamp={row['timestamp']!r} is not a date like 2017-10-09 07:01:55",
                source=str(path),
            ) from None
        duration = parse_number(path, line, "duration", row["duration"])
        gpus = int(parse_number(path, line, "num_gpus", row["num_gpus"], integer=True))
        if duration < 0 or gpus < 1:
            raise ParseError(
                f"line {line}: duration={row['duration']} and num_gpus={row['num_gpus']} must be 0 or more and "
                f"at least 1",
                source=str(path),
            )
        raw.append((stamp.replace(tzinfo=datetime.timezone.utc).timestamp(), gpus, duration, line))
    if not raw:
        return []
    raw.sort()
    start = raw[0][0]
    if limit is not None:
        raw = raw[:limit]
    return [
        JobSpec(f"philly-{line}", stamp - start, gpus, duration=duration, line=line)
        for stamp, gpus, duration, line in raw
    ]


def is_elastic_pick(name: str, fraction: float) -> bool:
    """Whether a job is among the ``fraction`` of jobs made elastic (a stable choice by name hash)."""
    return zlib.crc32(name.encode()) % 10_000 < round(fraction * 10_000)


def make_elastic(
    jobs: Sequence[JobSpec],
    max_replicas: dict[str, int],
    fraction: float = 1.0,
    factor: float = 2.0,
    cluster_gpus: int | None = None,
    duration_jobs: bool = False,
) -> list[JobSpec]:
    """Give a fraction of the jobs a worker range around their requested size.

    An elastic job runs with ``ceil(requested / factor)`` to ``requested * factor`` workers, the maximum capped so
    that each replica keeps at least the application's smallest measured local batch (``max_replicas``) and by the
    cluster size. Duration jobs stay as they are (their speed at other sizes is not known) unless ``duration_jobs``
    (a site's history, whose speed at other sizes comes from a scaling model).

    Args:
        jobs: the workload.
        max_replicas: application -> most replicas its batch allows, per job batch: see
            :meth:`~slurm_amoeba.sim.application.Application.max_replicas`; keyed by job name.
        fraction: the share of jobs made elastic, 0..1 (picked by a hash of the name, so stable across runs).
        factor: how far the range extends below and above the requested size (>= 1).
        cluster_gpus: cap on the maximum.
        duration_jobs: give duration jobs ranges too.

    Returns:
        The jobs with their ranges.

    Raises:
        SimError: ``fraction`` or ``factor`` out of range.
    """
    if not 0.0 <= fraction <= 1.0:
        raise SimError(f"elastic fraction {fraction} must lie between 0 and 1")
    if factor < 1.0:
        raise SimError(f"elastic factor {factor} must be at least 1 (1 keeps every job at its requested size)")
    result = []
    for job in jobs:
        if (job.application is None and not duration_jobs) or not is_elastic_pick(job.name, fraction):
            result.append(job)
            continue
        low = max(1, math.ceil(job.requested_workers / factor - 1e-9))
        high = max(job.requested_workers, math.floor(job.requested_workers * factor + 1e-9))
        high = min(high, max(job.requested_workers, max_replicas.get(job.name, high)))
        if cluster_gpus is not None:
            high = max(job.requested_workers, min(high, cluster_gpus))
        result.append(dataclasses.replace(job, min_workers=low, max_workers=high))
    return result
