"""Slurm's queue in 2D-LAS order (Tiresias' least attained service), and the job priorities that make Slurm use it.

The daemon's queue ordering (docs/admin.md, "Ordering Slurm's queue by attained service") is a layer composed around
its policy, :class:`QueueOrderLayer`, which answers with :class:`~slurm_amoeba.policy.actions.SetPriority` actions;
the simulator's ``amoebad`` policy orders its modelled queue with the same key (:func:`las_key`,
:class:`~slurm_amoeba.policy.amoebad.LasOrderLayer`). The clock is passed in, nothing here reads Slurm. Three steps:

1. :func:`account`: each job's **attained service**, in GPU-seconds, from what Slurm shows of its runs (a run is one
   record: an ordinary job, a heterogeneous component, or a satellite of an elastic job, counted for its parent):
   elapsed time of the run times the GPUs it holds, plus what the job's earlier runs attained (a requeued job keeps
   its service: the run is banked when Slurm stops showing it running). The book is the caller's state, handed in
   and returned, so that the function stays pure (the daemon keeps it in its snapshot step and hands it in as
   ``JobInfo.attained_service``).
2. :func:`las_order`: the pending jobs in 2D-LAS order (:func:`las_key`): by queue (the number of thresholds the
   job's attained service has reached; one threshold of 16 GPU-hours is the Pollux artifact's Tiresias), then by
   submit time, then by job id.
3. :func:`las_priorities`: priorities along that order that Slurm's scheduler (``priority/basic`` or
   ``priority/multifactor``: both test jobs in priority order within a partition tier) turns back into it. The jobs'
   own current priorities are *permuted*: the highest one goes to the first job in LAS order, the next to the
   second, and so on (ties are spread so that every job's value is distinct, never below 1: 0 would hold the job).
   The band of values the ordered jobs hold stays what Slurm gave them, so jobs the daemon leaves alone (other
   partitions, held jobs) keep their place relative to the band. :func:`priority_updates` lists the changes that
   remain, first in LAS order, and none while the queue is in order already. The per-round bound and the backoff
   of a job Slurm refused are the daemon's executor's (:mod:`slurm_amoeba.daemon.executor`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import ClassVar

from slurm_amoeba.policy.actions import Action, SetPriority
from slurm_amoeba.policy.common import las_queue
from slurm_amoeba.policy.layer import PolicyLayer
from slurm_amoeba.policy.types import JobInfo, JobPhase, Snapshot

#: The Pollux artifact's Tiresias threshold between its two queues: 16 GPU-hours.
DEFAULT_THRESHOLDS_GPU_S = (16 * 3600.0,)
#: The highest priority Slurm accepts (a 32-bit value; 0xffffffff means "not set").
MAX_PRIORITY = 0xFFFFFFFE


@dataclasses.dataclass(frozen=True)
class RunSample:
    """One record of a job as Slurm shows it now, for accounting.

    Attributes:
        job: the job whose service it counts for (a satellite's parent, a heterogeneous job's leader).
        record: the record's own Slurm id (a satellite's, a component's).
        running: whether it holds its resources now.
        start_time: when the run started (seconds, the caller's clock); ignored when not running.
        gpus: GPUs the run holds now.
    """

    job: str
    record: str
    running: bool
    start_time: float
    gpus: int


@dataclasses.dataclass(frozen=True)
class JobService:
    """What one job has attained, in GPU-seconds.

    Attributes:
        banked: service of runs that ended (earlier runs of a requeued job, satellites that left).
        runs: record id -> (start time, service so far) of the runs going on.
    """

    banked: float = 0.0
    runs: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)

    @property
    def total(self) -> float:
        """Everything the job has attained."""
        return self.banked + sum(value for _, value in self.runs.values())


#: The service of a job the book has not seen.
_NOTHING = JobService()


def account(book: Mapping[str, JobService], samples: Iterable[RunSample], now: float) -> dict[str, JobService]:
    """The book brought up to ``now``: each job's runs from ``samples``, ended runs banked.

    A run's service is ``(now - start) x gpus`` (Slurm's elapsed time times the GPUs it holds: the GPUs of a run
    do not change in this project, a resize adds or ends a satellite, which is a run of its own). A run that no
    longer shows as running, or shows with another start time (requeued and started again), is banked at its last
    value. Jobs without any sample are gone from Slurm and dropped.

    Args:
        book: the previous book (job -> service).
        samples: every record of the jobs Slurm shows now.
        now: the caller's clock.

    Returns:
        The new book.
    """
    seen: dict[str, dict[str, tuple[float, float]]] = {}
    for sample in samples:
        runs = seen.setdefault(sample.job, {})
        if sample.running and sample.gpus > 0:
            runs[sample.record] = (sample.start_time, max(0.0, now - sample.start_time) * sample.gpus)
    fresh: dict[str, JobService] = {}
    for job, runs in seen.items():
        old = book.get(job, _NOTHING)
        if not runs and not old.runs:  # a pending job: its book as it was (most of a queue, every round)
            fresh[job] = old
            continue
        banked = old.banked
        for record, (start, value) in old.runs.items():
            current = runs.get(record)
            if current is None or current[0] != start:
                banked += value
        fresh[job] = JobService(banked, runs)
    return fresh


def _id_key(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (-1, job_id)


def las_key(job: JobInfo, thresholds_gpu_s: Sequence[float]) -> tuple[int, float, tuple[int, str]]:
    """A pending job's place in 2D-LAS order: its queue, then its submit time, then its id (numeric ids by number).

    The one LAS key of the project: the live layer (:class:`QueueOrderLayer`) and the simulator's ``amoebad`` policy
    (:class:`~slurm_amoeba.policy.amoebad.LasOrderLayer`) both sort by it.
    """
    return (las_queue(job.attained_service, thresholds_gpu_s), job.submit_time, _id_key(job.job_id))


def las_order(jobs: Iterable[JobInfo], thresholds_gpu_s: Sequence[float]) -> list[JobInfo]:
    """The pending jobs in 2D-LAS order (:func:`las_key`)."""
    return sorted(jobs, key=lambda job: las_key(job, thresholds_gpu_s))


def las_priorities(order: Sequence[JobInfo]) -> dict[str, int]:
    """Distinct priorities, decreasing along ``order``, made of the jobs' own priorities (see the module docstring).

    The current values sorted from high to low are handed out along the order; where two are equal (or too low to
    stay distinct and at least 1) the higher one is raised just enough, from the end of the order up, never above
    :data:`MAX_PRIORITY` (where it cannot rise, the lower ones are lowered instead).

    Returns:
        job id -> the priority it should have.
    """
    values = sorted((job.priority for job in order), reverse=True)
    out = [0] * len(values)
    floor = 1
    for index in range(len(values) - 1, -1, -1):
        out[index] = max(values[index], floor)
        floor = out[index] + 1
    excess = out[0] - MAX_PRIORITY if out else 0
    if excess > 0:  # only when values sit at Slurm's ceiling: shift the band down, keeping it distinct
        out = [max(1, value - excess) for value in out]
    return {job.job_id: value for job, value in zip(order, out, strict=True)}


def priority_updates(order: Sequence[JobInfo], wanted: Mapping[str, int]) -> list[tuple[str, int]]:
    """The priority changes still to make, first in LAS order; none while the current priorities already decrease
    strictly along the order (a job leaving the queue costs no update).

    Args:
        order: the jobs in LAS order, with their current priorities.
        wanted: job id -> the priority it should have (:func:`las_priorities`).

    Returns:
        The changes (job id, priority).
    """
    if all(first.priority > second.priority >= 1 for first, second in itertools.pairwise(order)):
        return []
    return [(job.job_id, wanted[job.job_id]) for job in order if job.priority != wanted[job.job_id]]


def orders(job: JobInfo, partitions: Collection[str], users: Collection[str]) -> bool:
    """Whether queue ordering sets a job's priority: pending, not held (priority above 0), of ``partitions`` and
    ``users`` (empty: all)."""
    return (
        job.state is JobPhase.PENDING
        and not job.held
        and job.priority > 0
        and (not partitions or job.partition in partitions)
        and (not users or job.owner in users)
    )


@dataclasses.dataclass(frozen=True)
class QueueOrderLayer(PolicyLayer):
    """A policy with the priorities of 2D-LAS order added to its answer (live: ``queue_order.enabled``).

    The pending jobs it orders are those Slurm does not hold, with a priority above 0, of ``partitions`` and
    ``users``; their ``attained_service`` is the daemon's service book. The band of priorities is the one Slurm gave
    them: a job whose priority the daemon set already counts with its own (``own_priorities``), so that a round cut
    short by the executor's bound does not push the band up.

    Attributes:
        inner: the policy whose answer the priorities are added to.
        thresholds_gpu_s: attained GPU-seconds at which a job moves to the next queue.
        partitions: the partitions whose pending jobs it orders (empty: every partition).
        users: only these users' jobs (empty: everyone's).
        own_priorities: job id -> the priority Slurm had given it before the daemon set one (the executor's
            record, read at each call).
    """

    adds: ClassVar[frozenset[type[Action]]] = frozenset({SetPriority})
    #: Attained service grows with time.
    changes_with_time: ClassVar[bool] = True

    thresholds_gpu_s: Sequence[float] = DEFAULT_THRESHOLDS_GPU_S
    partitions: Collection[str] = frozenset()
    users: Collection[str] = frozenset()
    own_priorities: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def ordered(self, snapshot: Snapshot) -> list[JobInfo]:
        """The pending jobs it orders (:func:`orders`), in 2D-LAS order: those of the snapshot's jobs and those it
        left to Slurm (young jobs nobody makes room for yet still wait in Slurm's queue)."""
        queued = itertools.chain(snapshot.jobs, snapshot.left_to_slurm)
        jobs = [job for job in queued if orders(job, self.partitions, self.users)]
        return las_order(jobs, self.thresholds_gpu_s)

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """The inner policy's actions, then one priority per pending job whose priority differs from its place in
        LAS order, first in that order (none while the queue is in order already)."""
        order = self.ordered(snapshot)
        band = [dataclasses.replace(job, priority=self.own_priorities.get(job.job_id, job.priority)) for job in order]
        wanted = las_priorities(band)
        queues = {job.job_id: las_queue(job.attained_service, self.thresholds_gpu_s) for job in order}
        priorities = [
            SetPriority(job_id, priority, f"LAS queue {queues[job_id]}")
            for job_id, priority in priority_updates(order, wanted)
        ]
        return [*self.inner.decide(snapshot, now), *priorities]
