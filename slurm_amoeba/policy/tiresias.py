"""Tiresias (2D-LAS with two queues) and Amoeba's elastic Tiresias (E-Tiresias).

Tiresias, as the Pollux artifact models it: a job's 2D attained service is the GPU time it has held; jobs below
the threshold (16 GPU-hours) form the high-priority queue, the others the low-priority queue; within a queue, first
come first served. Every interval the jobs are admitted in that order while the cluster has GPUs for their
requested size (a job that does not fit is skipped, the ones behind it may still run); running jobs that are not
admitted are preempted; new jobs go to the nodes with the most free GPUs.

E-Tiresias keeps that order but admits each job at its *minimum* size when elastic, so that a long queue compacts the
low-priority elastic jobs to their minimum instead of preempting them; running jobs then keep their size in priority
order as far as GPUs remain, and whatever is still spare goes, one worker at a time, to the job whose speed gains
most per GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from slurm_amoeba.policy.actions import Action, Preempt, Resize, Start
from slurm_amoeba.policy.common import (
    admit_at_minimum,
    admit_in_order,
    changed_sizes,
    distribute_spare,
    las_fcfs_order,
    realize,
    schedulable,
)
from slurm_amoeba.policy.types import JobInfo, JobPhase, PolicyError, Snapshot

#: The artifact's threshold between the two queues: 16 GPU-hours of attained service.
DEFAULT_QUEUE_THRESHOLD_GPU_S = 16 * 3600.0


def las_order(jobs: Sequence[JobInfo], threshold_gpu_s: float) -> list[JobInfo]:
    """Jobs in 2D-LAS order: the high-priority queue first, each queue first come first served.

    Args:
        jobs: the jobs.
        threshold_gpu_s: attained GPU-seconds at which a job moves to the low-priority queue.

    Returns:
        The jobs, highest priority first.
    """
    return las_fcfs_order(jobs, (threshold_gpu_s,))


def _check_threshold(threshold_gpu_s: float) -> None:
    if threshold_gpu_s <= 0:
        raise PolicyError(f"threshold_gpu_s={threshold_gpu_s} must be positive (the artifact uses {16 * 3600})")


@dataclasses.dataclass(frozen=True)
class TiresiasPolicy:
    """Preemptive two-queue 2D-LAS with requested sizes.

    Attributes:
        threshold_gpu_s: attained GPU-seconds that demote a job to the low-priority queue.
        name: ``"tiresias"``.
        decides_on_events_only: ``False``: demotion happens with time alone (but only at the threshold, so
            :attr:`service_thresholds` lets a caller skip the calls in between).
    """

    threshold_gpu_s: float = DEFAULT_QUEUE_THRESHOLD_GPU_S
    name: str = dataclasses.field(default="tiresias", init=False)
    decides_on_events_only: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        _check_threshold(self.threshold_gpu_s)

    @property
    def service_thresholds(self) -> tuple[float, ...]:
        """The demotion threshold: the only attained service at which the answer changes between events."""
        return (self.threshold_gpu_s,)

    def queue_key(self, job: JobInfo) -> tuple[float | str, ...]:
        """The job's place in 2D-LAS order (see :class:`slurm_amoeba.policy.types.AdmitsInOrder`)."""
        return (float(job.attained_service >= self.threshold_gpu_s), job.submit_time, job.job_id)

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The action types it answers with: starts and preempts."""
        return frozenset({Start, Preempt})

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """Admit jobs in 2D-LAS order with their requested size; preempt the running jobs left out.

        Args:
            snapshot: the cluster now.
            now: the current time (the order depends on attained service, which the snapshot carries).

        Returns:
            Start and preempt decisions.
        """
        jobs, capacity = schedulable(snapshot)
        order = las_order(jobs, self.threshold_gpu_s)
        targets = admit_in_order(order, capacity)
        reasons = {
            key: "tiresias: admitted in 2D-LAS order" if size else "tiresias: preempted by higher-priority jobs"
            for key, size in targets.items()
        }
        return realize(snapshot, targets, order, reasons)


@dataclasses.dataclass(frozen=True)
class ElasticTiresiasPolicy:
    """Amoeba's elastic Tiresias: 2D-LAS admission at minimum sizes, spare GPUs by speedup gain.

    Attributes:
        threshold_gpu_s: attained GPU-seconds that demote a job to the low-priority queue.
        min_gain: a spare worker goes to a job only if it adds at least this fraction of a worker's speed at the
            job's minimum size (keeps the policy from paying a resize for a negligible gain).
        name: ``"e-tiresias"``.
        decides_on_events_only: ``False``: demotion happens with time alone.
    """

    threshold_gpu_s: float = DEFAULT_QUEUE_THRESHOLD_GPU_S
    min_gain: float = 0.1
    name: str = dataclasses.field(default="e-tiresias", init=False)
    decides_on_events_only: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        _check_threshold(self.threshold_gpu_s)
        if self.min_gain < 0:
            raise PolicyError(f"min_gain={self.min_gain} must be 0 or more")

    @property
    def service_thresholds(self) -> tuple[float, ...]:
        """The demotion threshold: the only attained service at which the answer changes between events."""
        return (self.threshold_gpu_s,)

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The action types it answers with: starts, preempts and resizes."""
        return frozenset({Start, Preempt, Resize})

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """Admit at minimum sizes in 2D-LAS order, keep current sizes where GPUs remain, grow by gain.

        Args:
            snapshot: the cluster now.
            now: the current time (the order depends on attained service, which the snapshot carries).

        Returns:
            Start, preempt, grow and shrink decisions.
        """
        jobs, capacity = schedulable(snapshot)
        order = las_order(jobs, self.threshold_gpu_s)
        sizes, admitted, capacity = admit_at_minimum(order, capacity)
        for job in admitted:
            natural = job.workers if job.state is JobPhase.RUNNING else job.requested_workers
            extra = min(natural - sizes[job.job_id], capacity // job.gpus_per_worker)
            if extra > 0:
                sizes[job.job_id] += extra
                capacity -= extra * job.gpus_per_worker
        sizes = distribute_spare(admitted, sizes, capacity, self.min_gain)
        targets, reasons = changed_sizes(order, sizes, _reason)
        return realize(snapshot, targets, admitted, reasons)


def _reason(job: JobInfo, size: int) -> str:
    if size == 0:
        return "e-tiresias: preempted, higher-priority jobs need even the minimum sizes"
    if job.state is JobPhase.PENDING:
        return "e-tiresias: admitted in 2D-LAS order"
    if size < job.workers:
        return "e-tiresias: compacted towards its minimum for higher-priority jobs"
    return "e-tiresias: spare GPUs, largest speedup gain"
