"""Elastic backfill: the daemon's default policy.

Slurm keeps scheduling as it always does; this policy only moves the *extra* workers of elastic jobs (those above
their minimum, which live in preemptible satellite allocations):

- **shrink ahead of preemption**: when a pending job's base allocation (its requested size, or its minimum when
  elastic) does not fit in the free GPUs but would fit in the free GPUs plus the elastic extras, extras are given
  back, the least useful worker first, until it fits; Slurm would preempt those satellites anyway, this makes the
  exit graceful;
- **grow into idle GPUs**: GPUs that no pending job can use now go to the elastic jobs with the least attained
  service first (each while an extra worker adds at least ``min_gain`` of a worker's speed), or with
  ``grow_by_service=False`` one worker at a time to the job whose speed gains most per GPU. Least attained service
  is Tiresias's idea applied to growth: in heavy-tailed workloads the young jobs are mostly the short ones, and
  growing them first lowered the average JCT on the shared Pollux workloads at 1.0x-2.0x load (docs/simulator.md).

In the live daemon Slurm starts pending jobs itself (``start_pending=False``): the policy then only reserves the GPUs
those jobs will take. The simulator has no Slurm, so there the policy also plays Slurm's part (``start_pending=True``):
pending jobs start in priority order, first fit, without reservations.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

from slurm_amoeba.policy.actions import Action, Preempt, Resize, Start
from slurm_amoeba.policy.common import base_size, distribute_spare, priority_order, realize, speedup_gain
from slurm_amoeba.policy.types import JobInfo, PolicyError, Snapshot


@dataclasses.dataclass(frozen=True)
class ElasticBackfillPolicy:
    """Grow elastic jobs into GPUs nobody else can use; shrink them before Slurm would preempt them.

    Attributes:
        start_pending: also start pending jobs (the simulator); ``False`` in the daemon, where Slurm starts them.
        min_gain: a spare worker goes to a job only if it adds at least this fraction of a worker's speed at the
            job's minimum size (keeps the policy from paying a resize for a negligible gain).
        grow_by_service: idle GPUs go to the jobs with the least attained service first (each while its extra
            workers pass ``min_gain``); ``False``: to the largest speedup gain.
        name: ``"elastic-backfill"``.
        decides_on_events_only: ``True``: only arrivals, departures and size changes change the answer.
    """

    start_pending: bool = True
    min_gain: float = 0.1
    grow_by_service: bool = True
    name: str = dataclasses.field(default="elastic-backfill", init=False)
    decides_on_events_only: bool = dataclasses.field(default=True, init=False)

    def __post_init__(self) -> None:
        if self.min_gain < 0:
            raise PolicyError(f"min_gain={self.min_gain} must be 0 or more")

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The action types it answers with: resizes, preemptions (of a job sharing the GPUs of a job that shrinks)
        and, with ``start_pending``, starts."""
        kinds: frozenset[type[Action]] = frozenset({Resize, Preempt})
        return kinds | {Start} if self.start_pending else kinds

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """Make room for pending jobs out of elastic extras, then grow elastic jobs into what is left.

        Args:
            snapshot: the cluster now.
            now: the current time (unused: the answer depends on the queue and the sizes only).

        Returns:
            Shrink and grow decisions, and start decisions when ``start_pending``.
        """
        free = snapshot.free_gpus
        running_jobs = snapshot.running()
        sizes = {job.job_id: job.workers for job in running_jobs}
        # The extra workers that may be given back, least useful first.
        extras: list[tuple[float, str, JobInfo]] = [
            (speedup_gain(job, job.workers - 1), job.job_id, job)
            for job in running_jobs
            if job.is_resizable and job.workers > job.min_workers
        ]
        heapq.heapify(extras)
        reclaimable = sum((job.workers - job.min_workers) * job.gpus_per_worker for _, _, job in extras)
        reasons: dict[str, str] = {}
        started: list[JobInfo] = []
        for job in priority_order(snapshot.startable()):
            need = base_size(job) * job.gpus_per_worker
            if need > free + reclaimable:
                continue
            while need > free:
                _, key, victim = heapq.heappop(extras)
                sizes[key] -= 1
                free += victim.gpus_per_worker
                reclaimable -= victim.gpus_per_worker
                reasons[key] = f"elastic-backfill: gives GPUs back for pending job {job.job_id}"
                if sizes[key] > victim.min_workers:
                    heapq.heappush(extras, (speedup_gain(victim, sizes[key] - 1), key, victim))
            free -= need
            if self.start_pending:
                sizes[job.job_id] = base_size(job)
                reasons[job.job_id] = "elastic-backfill: fits (priority order, first fit)"
                started.append(job)
        growers = [job for job in running_jobs if job.job_id not in reasons] + started
        before = sizes
        sizes = distribute_spare(growers, sizes, free, self.min_gain, self.grow_by_service)
        for key, size in sizes.items():
            if size != before[key]:
                reasons[key] = (
                    "elastic-backfill: idle GPUs, least attained service first"
                    if self.grow_by_service
                    else "elastic-backfill: idle GPUs, largest speedup gain"
                )
        running = {job.job_id: job.workers for job in running_jobs}
        targets = {key: size for key, size in sizes.items() if size != running.get(key, 0)}
        order = priority_order(running_jobs) + started
        return realize(snapshot, targets, order, reasons)
