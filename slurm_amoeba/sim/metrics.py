"""What a simulation run measured: per-job records, the GPU usage timeline, and their summary.

The summary has the keys of ``amoeba-sim``'s JSON: ``avg_jct_s``, ``p50_jct_s``, ``p99_jct_s``, ``makespan_s``,
``avg_queue_s``, ``gpu_util``, ``resizes`` (grows and shrinks of running jobs), plus ``preemptions``, ``jobs``,
``unfinished`` and ``wall_s``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class JobRecord:
    """What happened to one job.

    Attributes:
        name: the job's name.
        submit_time: when it was submitted.
        first_start: when it first got GPUs (``None`` if never).
        completion: when it finished (``None`` if not within the run).
        requested_workers: its requested size.
        resizes: grows and shrinks while running.
        preemptions: times it lost all its GPUs.
        restarts: resumes after preemption and moves.
    """

    name: str
    submit_time: float
    first_start: float | None
    completion: float | None
    requested_workers: int
    resizes: int = 0
    preemptions: int = 0
    restarts: int = 0

    @property
    def jct(self) -> float | None:
        """Job completion time: finish minus submit, or ``None`` when unfinished."""
        return None if self.completion is None else self.completion - self.submit_time


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` percentile of ``values`` by linear interpolation between order statistics (NaN if empty)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


@dataclasses.dataclass
class SimResult:
    """The outcome of one run.

    Attributes:
        policy: the policy's name.
        total_gpus: GPUs in the cluster.
        jobs: one record per job of the workload.
        usage: (time, GPUs held) at every change, in time order.
        decisions: how many times the policy was asked.
        wall_s: seconds the run took.
    """

    policy: str
    total_gpus: int
    jobs: list[JobRecord]
    usage: list[tuple[float, int]]
    decisions: int = 0
    wall_s: float = 0.0

    def jcts(self) -> list[float]:
        """Completion times of the finished jobs."""
        return [jct for jct in (job.jct for job in self.jobs) if jct is not None]

    def gpu_util(self) -> float:
        """GPU-seconds held divided by GPU-seconds available, from the first submit to the last finish."""
        finished = [job.completion for job in self.jobs if job.completion is not None]
        if not finished or not self.jobs:
            return 0.0
        start = min(job.submit_time for job in self.jobs)
        end = max(finished)
        if end <= start:
            return 0.0
        held = 0.0
        for (t0, used), (t1, _) in zip(self.usage, [*self.usage[1:], (end, 0)], strict=True):
            lo, hi = max(t0, start), min(t1, end)
            if hi > lo:
                held += used * (hi - lo)
        return held / (self.total_gpus * (end - start))

    def summary(self) -> dict[str, float]:
        """The run's figures (see the module docstring for the keys)."""
        jcts = self.jcts()
        finished = [job.completion for job in self.jobs if job.completion is not None]
        queue = [job.first_start - job.submit_time for job in self.jobs if job.first_start is not None]
        start = min((job.submit_time for job in self.jobs), default=0.0)
        return {
            "avg_jct_s": sum(jcts) / len(jcts) if jcts else math.nan,
            "p50_jct_s": percentile(jcts, 0.5),
            "p99_jct_s": percentile(jcts, 0.99),
            "makespan_s": max(finished) - start if finished else math.nan,
            "avg_queue_s": sum(queue) / len(queue) if queue else math.nan,
            "gpu_util": self.gpu_util(),
            "resizes": float(sum(job.resizes for job in self.jobs)),
            "preemptions": float(sum(job.preemptions for job in self.jobs)),
            "jobs": float(len(self.jobs)),
            "unfinished": float(len(self.jobs) - len(jcts)),
            "wall_s": self.wall_s,
        }
