"""The typed inputs and outputs of every scheduling policy.

A policy sees a :class:`Snapshot` of the cluster (nodes and jobs) and the current time, and answers with typed
actions (:mod:`slurm_amoeba.policy.actions`; DESIGN.md, the control and simulation flows). Both worlds build these
types: the live daemon from ``squeue``/``sinfo`` and the agents' reports (node names, partitions, Slurm job ids as
strings), the simulator from its own state. Nothing here knows which world it is in.

Sizes are counted in *workers*; a worker holds ``gpus_per_worker`` GPUs of one node. Node capacities are counted in
GPUs.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from slurm_amoeba.core.errors import AmoebaError
from slurm_amoeba.policy.actions import Action


class PolicyError(AmoebaError, ValueError):
    """A policy was misconfigured, or a set of actions breaks an invariant of the cluster."""


@runtime_checkable
class BatchModel(Protocol):
    """A job's goodput as a function of its size, for a job whose global batch may change
    (:class:`slurm_amoeba.policy.goodput.GoodputModel` is one)."""

    def best(self, workers: int) -> tuple[int, float]:
        """The global batch of highest goodput at ``workers`` workers, and that goodput."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class MicroBatch:
    """How a job runs with one local micro-batch per step and gradient accumulation that keeps its global batch.

    The runtime measures it (or the simulator models it) for the micro-batches a job could run with; the sharing
    policies search them for a sharer (:mod:`slurm_amoeba.policy.pairing`).

    Attributes:
        speed: the job's rate with this micro-batch as a fraction of its rate with its own one (0, 1].
        memory_gib: device memory one worker needs with it (GiB).
        accumulation: micro-steps per optimizer step (1: no accumulation).
    """

    speed: float
    memory_gib: float
    accumulation: int

    def __post_init__(self) -> None:
        if not 0.0 < self.speed <= 1.0 or self.memory_gib < 0.0 or self.accumulation < 1:
            raise PolicyError(
                f"micro-batch profile speed={self.speed}, memory_gib={self.memory_gib}, "
                f"accumulation={self.accumulation} is invalid; it needs 0 < speed <= 1, memory_gib >= 0 and "
                f"accumulation >= 1"
            )


class JobPhase(str, enum.Enum):
    """Where a job stands as far as a policy is concerned: waiting for GPUs or holding them.

    This is the policy's two-valued view in both worlds, not Slurm's job state (:class:`slurm_amoeba.slurm.JobState`,
    which the daemon's observer maps onto it: a job holding GPUs is running, a job waiting for them is pending).
    ``PENDING`` jobs hold no GPUs (never started, or preempted); ``RUNNING`` jobs hold ``workers`` workers. The only
    transitions a policy asks for are PENDING -> RUNNING (start) and RUNNING -> PENDING (preempt); the job leaves the
    snapshot when it finishes.
    """

    PENDING = "pending"
    RUNNING = "running"

    def is_running(self) -> bool:
        """Whether the job holds GPUs now."""
        return self is JobPhase.RUNNING


@dataclasses.dataclass(slots=True)
class JobInfo:
    """What a policy knows about one job.

    Policies treat it as read-only. It is not frozen so that a caller that asks every interval (the simulator) may
    bring the time-dependent fields of one object up to date instead of building a new one per job per interval.

    Attributes:
        job_id: the job's identifier (a Slurm job id in the daemon, the trace's name in the simulator).
        state: pending or running.
        submit_time: when the job was submitted, in the same clock as ``now`` (seconds).
        requested_workers: the size the user asked for (what a non-elastic policy gives the job).
        min_workers: the job never runs with fewer workers.
        max_workers: the job never runs with more workers. ``min_workers == max_workers`` means a regular,
            non-elastic job.
        workers: the workers it holds now (0 when pending).
        gpus_per_worker: GPUs of one node that each worker holds.
        placement: node name -> workers on it, for a running job; empty when pending (or unknown).
        throughput: workers -> rate of progress at that size (any unit, the same as ``remaining_work`` per
            second); empty when not known. The daemon fills it from the agents' measurements.
        remaining_work: work left, in the unit of ``throughput`` times seconds (an oracle in the simulator);
            ``None`` when unknown.
        priority: higher runs first where a policy honours priorities (Slurm's priority in the daemon).
        owner: the user the job belongs to.
        partition: the partition the job runs or waits in.
        attained_service: GPU-seconds the job has held so far.
        executed_time: seconds the job has held GPUs so far.
        time_limit: the job's wall-clock limit in seconds (Slurm's ``--time``), ``None`` when it has none; the
            ``slurm`` baseline computes its backfill reservations from it.
        job_type: a label for the kind of work (the application in the simulator), used to look up co-location
            slowdowns.
        resizing: a resize ordered earlier is still in flight; policies leave such a job alone.
        pinned: an operator excluded the job from policy decisions (``amoebactl pin``).
        shared_with: the job whose GPUs this job shares, or ``None`` when it has its GPUs to itself.
        adaptive: for a job whose runtime may change its global batch (docs/runtime.md section 12): its goodput
            model, whose :meth:`BatchModel.best` gives the batch to use at a size; ``None`` for a fixed batch (or
            before the runtime measured anything). ``throughput`` then holds its goodput per size.
        batch: the global batch an adaptive job runs with, or the policy's batch it is moving to; ``None`` for a
            fixed batch, or where the user sets the batch (the job then ignores a policy's).
        lent: node name -> workers the job runs there in satellites that hold one node each (the daemon's managed
            jobs; what whole-node moves can move off a node); empty elsewhere.
        held: a pending job is held (a :class:`~slurm_amoeba.policy.actions.Hold`, Slurm's ``scontrol hold``): it
            may not start until released, and policies pass it over as Slurm does (:meth:`Snapshot.startable`).
        held_since: when the daemon's admission hold of this pending job began (the hold mark in its
            ``AdminComment``, :mod:`slurm_amoeba.slurm.marks`); ``None`` for a job the daemon does not hold. A job
            with it set has as ``priority`` the priority Slurm had given it before the hold (Slurm shows 0 while
            it is held); with ``held`` False the mark outlived its hold and is cleared by the daemon's executor.
        solo_rate: the job's measured rate (samples per second) alone on its GPUs at its current size, as the
            runtime reports it; ``None`` when never measured.
        shared_rates: partner ``job_type`` -> the job's measured rate (same unit) while it shared GPUs with a job
            of that type; together with ``solo_rate`` it overrides ``Snapshot.colocation`` for the pair
            (:func:`slurm_amoeba.policy.pairing.kept_fraction`).
        micro_batches: micro-batch -> how the job runs with it (:class:`MicroBatch`), at its requested size; what
            the sharing policies search for a sharer's sub-batch. Empty when unknown: the job then keeps its own
            micro-batch beside a host, where its ``memory_gib`` (when known) fits what the host leaves.
        memory_gib: device memory one worker of the job uses now (GiB); ``None`` when unknown.
        grows_beside: a running job whose further workers may run beside another job's (the daemon: an elastic job
            that opted in as opportunistic, below its maximum, placed beside nobody yet); the sharing policies pair
            ``requested_workers`` more of its workers as they pair a waiting job. ``False`` in the simulator, whose
            sharers wait.
    """

    job_id: str
    state: JobPhase
    submit_time: float
    requested_workers: int
    min_workers: int
    max_workers: int
    workers: int = 0
    gpus_per_worker: int = 1
    placement: Mapping[str, int] = dataclasses.field(default_factory=dict)
    throughput: Mapping[int, float] = dataclasses.field(default_factory=dict)
    remaining_work: float | None = None
    priority: int = 0
    owner: str = ""
    partition: str = ""
    attained_service: float = 0.0
    executed_time: float = 0.0
    time_limit: float | None = None
    job_type: str = ""
    resizing: bool = False
    pinned: bool = False
    shared_with: str | None = None
    adaptive: BatchModel | None = None
    batch: int | None = None
    lent: Mapping[str, int] = dataclasses.field(default_factory=dict)
    held: bool = False
    held_since: float | None = None
    solo_rate: float | None = None
    shared_rates: Mapping[str, float] = dataclasses.field(default_factory=dict)
    micro_batches: Mapping[int, MicroBatch] = dataclasses.field(default_factory=dict)
    memory_gib: float | None = None
    grows_beside: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise PolicyError(
                f"job {self.job_id}: the worker range {self.min_workers}:{self.max_workers} is invalid; "
                f"it needs 1 <= min <= max"
            )
        if not self.min_workers <= self.requested_workers <= self.max_workers:
            raise PolicyError(
                f"job {self.job_id}: requested_workers={self.requested_workers} lies outside its range "
                f"{self.min_workers}:{self.max_workers}"
            )
        if self.gpus_per_worker < 1:
            raise PolicyError(f"job {self.job_id}: gpus_per_worker={self.gpus_per_worker} must be at least 1")
        if self.held and self.state is JobPhase.RUNNING:
            raise PolicyError(f"job {self.job_id} is running and held; only a pending job is held")
        if (self.workers > 0) != (self.state is JobPhase.RUNNING):
            raise PolicyError(
                f"job {self.job_id}: state {self.state.value} does not match workers={self.workers}; "
                f"a running job holds at least one worker and a pending job none"
            )

    @property
    def is_elastic(self) -> bool:
        """Whether the job's size may change at all (its range has room)."""
        return self.max_workers > self.min_workers

    @property
    def is_resizable(self) -> bool:
        """Whether a policy may order this job to a new size now (elastic, not pinned, resizing or sharing)."""
        return (
            self.max_workers > self.min_workers and not self.pinned and not self.resizing and self.shared_with is None
        )

    @property
    def gpus(self) -> int:
        """GPUs the job holds now."""
        return self.workers * self.gpus_per_worker

    def rate(self, workers: int) -> float | None:
        """The job's rate of progress with ``workers`` workers, or ``None`` when not known.

        Sizes between two known ones are interpolated linearly; sizes outside the known ones are not guessed.

        Args:
            workers: a size.

        Returns:
            The rate, in the unit of :attr:`throughput`.
        """
        table = self.throughput
        known = table.get(workers)
        if known is not None:
            return known
        if not table:
            return None
        below = [size for size in table if size < workers]
        above = [size for size in table if size > workers]
        if not below or not above:
            return None
        low, high = max(below), min(above)
        frac = (workers - low) / (high - low)
        return table[low] + frac * (table[high] - table[low])

    def remaining_time(self, workers: int | None = None) -> float | None:
        """Seconds of work left at a size (the requested one by default), or ``None`` when not known.

        Args:
            workers: the size to estimate for; ``None`` means ``requested_workers``.

        Returns:
            ``remaining_work / rate(workers)``, or ``None``.
        """
        size = self.requested_workers if workers is None else workers
        rate = self.rate(size)
        if self.remaining_work is None or rate is None or rate <= 0.0:
            return None
        return self.remaining_work / rate


@dataclasses.dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a policy knows about one node.

    Attributes:
        name: the node's name (a Slurm node name in the daemon).
        gpus_total: GPUs the node has.
        gpus_free: GPUs nobody holds now (Slurm's view in the daemon; every job counts, managed or not).
        partition: the partition the node serves (empty when the cluster has one).
        gpu_memory_gib: device memory of one of its GPUs (GiB); ``None`` when unknown (sharing policies then
            place a sharer only where memory does not bound it).
    """

    name: str
    gpus_total: int
    gpus_free: int
    partition: str = ""
    gpu_memory_gib: float | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.gpus_free <= self.gpus_total:
            raise PolicyError(
                f"node {self.name}: gpus_free={self.gpus_free} must lie between 0 and gpus_total={self.gpus_total}"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster as a policy sees it at one moment.

    Attributes:
        nodes: every node a policy may place workers on.
        jobs: every job that has been submitted and has not finished.
        colocation: ``(job_type, partner_type)`` -> fraction of its solo rate a job of ``job_type`` keeps while it
            shares GPUs with a job of ``partner_type`` (measured; empty when GPU sharing is not modelled).
        left_to_slurm: pending jobs that are not in :attr:`jobs` because nobody is to make room for them yet (live:
            regular jobs younger than ``make_room_after_s`` with no GPU free, which Slurm starts or preempts for by
            itself). They still wait in Slurm's queue: a layer that orders the queue orders them too; placement and
            resizing never see them.
    """

    nodes: tuple[NodeInfo, ...]
    jobs: tuple[JobInfo, ...]
    colocation: Mapping[tuple[str, str], float] = dataclasses.field(default_factory=dict)
    left_to_slurm: tuple[JobInfo, ...] = ()
    _by_id: dict[str, JobInfo] | None = dataclasses.field(default=None, init=False, repr=False, compare=False)
    _total_gpus: int | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    @property
    def total_gpus(self) -> int:
        """GPUs on all nodes (summed once per snapshot, on the first call: decisions ask for it per job, and a
        snapshot never changes)."""
        total = self._total_gpus
        if total is None:
            total = sum(node.gpus_total for node in self.nodes)
            object.__setattr__(self, "_total_gpus", total)
        return total

    @property
    def free_gpus(self) -> int:
        """GPUs nobody holds now."""
        return sum(node.gpus_free for node in self.nodes)

    def free_by_node(self) -> dict[str, int]:
        """Node name -> free GPUs, in the order of :attr:`nodes`."""
        return {node.name: node.gpus_free for node in self.nodes}

    def by_id(self) -> Mapping[str, JobInfo]:
        """Job id -> job, for every job (built once per snapshot, on the first call: a decision looks jobs up by id
        in several places, and a snapshot never changes)."""
        index = self._by_id
        if index is None:
            index = {job.job_id: job for job in self.jobs}
            object.__setattr__(self, "_by_id", index)
        return index

    def queued_by_id(self) -> dict[str, JobInfo]:
        """Job id -> job, for every job and every job left to Slurm (:attr:`left_to_slurm`): all that Slurm's queue
        and nodes hold, as the daemon's executor applies a round to them (a fresh mapping on each call)."""
        return {**self.by_id(), **{job.job_id: job for job in self.left_to_slurm}}

    def job(self, job_id: str) -> JobInfo:
        """The job with this id.

        Raises:
            PolicyError: no job in the snapshot has this id.
        """
        job = self.by_id().get(job_id)
        if job is None:
            raise PolicyError(f"job {job_id!r} is not in the snapshot; known jobs are the ones squeue/the trace lists")
        return job

    def running(self) -> list[JobInfo]:
        """The running jobs, in snapshot order."""
        return [job for job in self.jobs if job.state is JobPhase.RUNNING]

    def pending(self) -> list[JobInfo]:
        """The pending jobs, in snapshot order."""
        return [job for job in self.jobs if job.state is JobPhase.PENDING]

    def startable(self) -> list[JobInfo]:
        """The pending jobs a policy may start: not held, in snapshot order."""
        return [job for job in self.jobs if job.state is JobPhase.PENDING and not job.held]


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy: a pure function of a snapshot and the current time.

    Implementations keep no state between calls, read no clock and do no I/O, so that the daemon and the simulator
    get the same answer from the same inputs.

    Attributes:
        name: the name the policy is registered under.
        decides_on_events_only: ``True`` when the policy's answer cannot change while no job arrives, finishes or
            changes size, so a caller may skip a call in which nothing happened; ``False`` when time alone matters
            (e.g. a queue that demotes jobs by attained service).
    """

    @property
    def name(self) -> str:
        """The name the policy is registered under."""
        ...

    @property
    def decides_on_events_only(self) -> bool:
        """Whether only arrivals, departures and size changes can change the policy's answer."""
        ...

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The action types the policy can answer with (the daemon refuses a policy that emits one it cannot apply,
        when it is configured)."""
        ...

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """Decide what should change.

        Args:
            snapshot: the cluster now.
            now: the current time in seconds, in the clock of ``JobInfo.submit_time``.

        Returns:
            The actions (:func:`~slurm_amoeba.policy.check.check_actions` says which sets are valid: at most one
            size-changing action per job); jobs without an action keep what they have.
        """
        ...


@runtime_checkable
class DemotesByService(Protocol):
    """A policy whose answer changes with time only when a running job's attained service crosses a threshold.

    Such a policy (Tiresias's two queues) is otherwise as event-driven as one that declares
    ``decides_on_events_only``: a caller may skip the calls in which no job arrived, finished or changed size and
    no running job's ``attained_service`` reached one of :attr:`service_thresholds` since the previous call.
    """

    @property
    def service_thresholds(self) -> tuple[float, ...]:
        """Attained GPU-seconds at which a job's place in the order changes, ascending."""
        ...


@runtime_checkable
class AdmitsInOrder(Protocol):
    """A policy that admits jobs with their exact sizes down one order, skipping those that do not fit.

    For such a policy (Tiresias, SRTF) a pending job far down the order can only start if GPUs are left over when
    every job ahead of it has been served. A caller with a long queue may therefore show it the running jobs and only
    a prefix of the pending ones in :meth:`queue_key` order, provided the prefix reaches past the last running job:
    the answer is the same as with every pending job whenever the GPUs left free by the answer are fewer than any
    hidden job needs (otherwise the caller asks again with all of them). The key of a pending job must not change
    while it waits.
    """

    def queue_key(self, job: JobInfo) -> tuple[float | str, ...]:
        """The job's place in the admission order (smaller first); unique per job."""
        ...
