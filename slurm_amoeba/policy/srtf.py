"""Shortest remaining time first, preemptive, with an oracle for the remaining time.

Every interval all jobs (running and pending) are ordered by the time they still need at their requested size
(``JobInfo.remaining_time``, which the simulator knows exactly); jobs are admitted in that order while the cluster
has GPUs left for their requested size, skipping those that do not fit; running jobs not admitted are preempted.
Jobs whose remaining time is unknown go last, in submit order.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from slurm_amoeba.policy.actions import Action, Preempt, Start
from slurm_amoeba.policy.common import admit_in_order, realize, schedulable
from slurm_amoeba.policy.types import JobInfo, Snapshot


def _remaining_key(job: JobInfo) -> tuple[float, float, str]:
    remaining = job.remaining_time()
    return (math.inf if remaining is None else remaining, job.submit_time, job.job_id)


def admit_shortest_first(snapshot: Snapshot) -> tuple[dict[str, int], list[JobInfo]]:
    """Target sizes of preemptive shortest-remaining-time-first with requested sizes.

    Jobs sharing another job's GPUs are left out (they follow their host), and held jobs.

    Args:
        snapshot: the cluster now.

    Returns:
        (job id -> target size for the jobs that change, the jobs in admission order).
    """
    jobs, capacity = schedulable(snapshot)
    order = sorted(jobs, key=_remaining_key)
    return admit_in_order(order, capacity), order


@dataclasses.dataclass(frozen=True)
class SrtfPolicy:
    """Preemptive shortest remaining time first with requested sizes.

    Attributes:
        name: ``"srtf"``.
        decides_on_events_only: ``True``: between events remaining times shrink only for running jobs, which never
            lets a pending job overtake them.
    """

    name: str = dataclasses.field(default="srtf", init=False)
    decides_on_events_only: bool = dataclasses.field(default=True, init=False)

    def queue_key(self, job: JobInfo) -> tuple[float | str, ...]:
        """The job's place in the admission order (see :class:`slurm_amoeba.policy.types.AdmitsInOrder`)."""
        return _remaining_key(job)

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The action types it answers with: starts and preempts."""
        return frozenset({Start, Preempt})

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """Admit jobs shortest-remaining first; preempt running jobs that lose their place.

        Args:
            snapshot: the cluster now.
            now: the current time (unused: the order depends only on remaining work).

        Returns:
            Start and preempt decisions.
        """
        targets, order = admit_shortest_first(snapshot)
        reasons = {
            key: "srtf: admitted by remaining time" if size else "srtf: longer than the jobs admitted"
            for key, size in targets.items()
        }
        return realize(snapshot, targets, order, reasons)
