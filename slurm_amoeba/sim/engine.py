"""The discrete-event engine: replays a workload on a model cluster, driven by a policy of ``slurm_amoeba.policy``.

Simulation flow (DESIGN.md): workload -> engine -> ``policy.decide(snapshot, now)`` -> metrics. The engine knows
nothing about any particular policy: at every scheduling tick (multiples of ``interval``) it builds the same
``Snapshot`` the daemon builds, asks the policy, checks the answer with ``check_actions`` and applies it.

Between ticks jobs progress analytically: a running job's speed is constant within an epoch, so its finish time
is known in advance and kept in a heap; arrivals and finishes are events. A policy that declares
``decides_on_events_only`` is not asked again until an event happens or its previous answer changed something, so
quiet stretches cost nothing. Every start or move pays ``restart_cost`` seconds without progress (stop-resume from
a checkpoint), every grow or shrink of a running job ``resize_cost`` seconds (the elastic runtime's pause), and a grow
takes effect only ``grow_lag`` seconds after it was ordered (the job trains at its old size meanwhile).

With ``queue_depth`` set (like Slurm's ``default_queue_depth``), the snapshot holds every running job but only the
oldest pending jobs (that many, and always enough of them to ask for more GPUs than the cluster has), so that one
round costs the same whether ten or forty thousand jobs wait: an overloaded trace then takes time linear in its
jobs. For FIFO this changes nothing (a job behind jobs asking for more than the cluster cannot start); for policies
that look further down the queue it is an approximation that can move the figures (docs/simulator.md measures it),
so the default, 0, shows every pending job.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from slurm_amoeba.policy import (
    Action,
    JobInfo,
    JobPhase,
    NodeInfo,
    Place,
    Policy,
    Preempt,
    Resize,
    Snapshot,
    Start,
    check_actions,
)
from slurm_amoeba.policy.common import place_most_free
from slurm_amoeba.policy.pairing import paced_fractions
from slurm_amoeba.policy.types import AdmitsInOrder, DemotesByService, MicroBatch
from slurm_amoeba.sim.application import Application
from slurm_amoeba.sim.data import SimError
from slurm_amoeba.sim.executor import SimExecutor
from slurm_amoeba.sim.metrics import JobRecord, SimResult
from slurm_amoeba.sim.workload import JobSpec

#: Pause of a running elastic job's training when it grows or shrinks, with slurm_amoeba's runtime: new workers warm
#: up in the background and join at a step boundary, leaving ones drop out at one. A worker loses some milliseconds
#: beyond its ordinary steps (``scripts/bench-runtime``, docs/results.md#runtime), more at a scale-out than at a
#: scale-in: 10 ms understates a scale-out a little, which is immaterial next to the grow lag below and to the
#: simulator's 60 s decision interval.
RUNTIME_RESIZE_COST_S = 0.01

#: Seconds from a grow order to the generation with the new workers, during which the job keeps training at its old
#: size (``scripts/bench-grow``, docs/results.md#grow: 6.7 s, of which Slurm 0.68 s and the runtime 5.8 s, mostly
#: starting Python and importing torch in the new processes). Shrinks take 0.03 s and are not delayed.
RUNTIME_GROW_LAG_S = 6.7

#: Pause of a job at every (re)allocation in the Pollux artifact: stop, restart, restore from a checkpoint.
ARTIFACT_RESTART_COST_S = 30.0

#: Unmeasured co-location: both jobs keep half their speed (time slicing).
DEFAULT_COLOCATION = 0.5

#: Device memory of one simulated GPU (GiB): a V100 of 16 GB, the GPU of Gavel's co-location table. A job of one of
#: Pollux's applications needs ``micro-batch / max_local_batch`` of it (the largest measured local batch per GPU is
#: bounded by memory), a model that puts all of a job's memory in its activations; a sharer's sub-batch is searched
#: within what its host leaves (:mod:`slurm_amoeba.policy.pairing`).
SIM_GPU_MEMORY_GIB = 16.0

#: The model of user estimates for workloads without time limits: a job's limit is this many times the wall time it
#: really needs at its requested size (start cost included), rounded up to whole minutes. Users ask for more than
#: they use, rarely less (a job that hits its limit is killed); 2 is a moderate overestimate, 1 a perfect user.
DEFAULT_TIME_LIMIT_FACTOR = 2.0


#: How a job that never ran elastic scales, for a site's history: speed at ``size`` GPUs is
#: ``(size / requested) ** DEFAULT_SCALING_EXPONENT`` of its speed at its requested size. 0.26 is the mean of
#: ``log2(speedup at twice the GPUs)`` over the 1,280 jobs of the eight shared Pollux workloads, from the measured
#: traces with each job's global batch kept fixed (median 0.16; it ranges from below 0 to 0.75 by application and
#: size): a conservative model, since slurm_amoeba's runtime keeps the global batch too.
DEFAULT_SCALING_EXPONENT = 0.26

#: A policy that decides every interval is refused a job that alone would need more scheduling rounds than this
#: (about 19 years of simulated time at 60 s) unless a horizon stops the run.
MAX_ROUNDS_WITHOUT_HORIZON = 10_000_000

#: Pending jobs a policy sees at least, oldest first; 0: every one (see the module docstring).
DEFAULT_QUEUE_DEPTH = 0


def estimated_time_limit(seconds: float, factor: float) -> float:
    """The time limit a user would ask for a job that needs ``seconds`` (the model of user estimates).

    Args:
        seconds: wall time the job needs at its requested size.
        factor: the overestimate (``SimConfig.time_limit_factor``).

    Returns:
        ``factor * seconds`` rounded up to whole minutes, at least one minute.
    """
    return max(60.0, math.ceil(seconds * factor / 60.0 - 1e-9) * 60.0)


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """The model cluster and its costs.

    Attributes:
        nodes: number of nodes.
        gpus_per_node: GPUs per node.
        interval: seconds between scheduling ticks.
        resize_cost: seconds without progress when a running job grows or shrinks.
        grow_lag: seconds from a grow order until the new workers train; the job keeps its old speed meanwhile
            (modelled as the equivalent pause at the new speed). The artifact's setting has none.
        restart_cost: seconds without progress when a job starts, resumes after preemption or moves.
        check: run ``check_actions`` on every answer (a policy bug then stops the run with its message).
        horizon: stop at this simulated time (jobs not done by then are reported as unfinished); ``None`` runs
            until every job is done.
        time_limit_factor: for jobs without a time limit, the limit is this many times their real wall time
            (:func:`estimated_time_limit`).
        grace_time: Slurm's ``GraceTime``: a preempted job keeps its GPUs (and trains on) for this long before it
            leaves; the ``slurm`` policy waits for it. 0 preempts at once.
        queue_depth: the policy sees the running jobs and the oldest pending ones, at least this many (and enough
            to ask for more GPUs than the cluster has); 0 shows every pending job.
        start_grow_lag: ``None``: a job starts at whatever size the policy gives it (the artifact's setting).
            Seconds: a job started above its minimum trains at its minimum until this long after its start, as
            with amoebad, where Slurm starts the job at its minimum and the daemon grows it once its agent has
            registered (the live elastic replay measures it: ``scripts/bench-sim-fidelity --elastic``); such a
            start counts as one resize.
    """

    nodes: int = 16
    gpus_per_node: int = 4
    interval: float = 60.0
    resize_cost: float = RUNTIME_RESIZE_COST_S
    grow_lag: float = RUNTIME_GROW_LAG_S
    restart_cost: float = ARTIFACT_RESTART_COST_S
    check: bool = True
    horizon: float | None = None
    time_limit_factor: float = DEFAULT_TIME_LIMIT_FACTOR
    grace_time: float = 0.0
    queue_depth: int = DEFAULT_QUEUE_DEPTH
    start_grow_lag: float | None = None

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise SimError(
                f"a cluster of {self.nodes} nodes x {self.gpus_per_node} GPUs is empty; use at least 1 of each"
            )
        if not self.interval > 0:
            raise SimError(f"interval={self.interval} s must be positive (the artifact uses 60)")
        if self.resize_cost < 0 or self.restart_cost < 0 or self.grow_lag < 0:
            raise SimError(
                f"resize_cost={self.resize_cost} s, restart_cost={self.restart_cost} s and grow_lag={self.grow_lag} s "
                f"must be 0 or more"
            )
        if self.horizon is not None and not self.horizon > 0:
            raise SimError(f"horizon={self.horizon} s must be positive (the simulated time at which to stop)")
        if not self.time_limit_factor >= 1.0:
            raise SimError(
                f"time_limit_factor={self.time_limit_factor} must be at least 1 (a job is killed at its time limit, so "
                f"users ask for at least what they need)"
            )
        if not self.grace_time >= 0:
            raise SimError(f"grace_time={self.grace_time} s must be 0 or more")
        if self.start_grow_lag is not None and not self.start_grow_lag >= 0:
            raise SimError(f"start_grow_lag={self.start_grow_lag} s must be 0 or more (or None)")
        if self.queue_depth < 0:
            raise SimError(f"queue_depth={self.queue_depth} must be 0 (every pending job) or more")

    @property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return self.nodes * self.gpus_per_node


class WorkModel:
    """How one job progresses: epoch boundaries and speed per placement.

    The base class is a job that runs for a fixed time on its requested GPUs (Philly's duration jobs, a site's
    history). At another size it runs at ``(size / requested) ** scaling_exponent`` of its speed (1: linear; see
    :data:`DEFAULT_SCALING_EXPONENT` for a job that never ran elastic).

    Attributes:
        epoch_ends: cumulative progress at the end of each epoch; the last one means done.
        job_type: label for co-location lookups.
    """

    def __init__(self, duration: float, requested: int, scaling_exponent: float = 1.0) -> None:
        """A duration job.

        Args:
            duration: seconds of work on the requested GPUs.
            requested: the requested GPUs.
            scaling_exponent: speed at another size is ``(size / requested) ** scaling_exponent``.
        """
        self.epoch_ends: list[float] = [max(duration, 0.0)]
        self.job_type = ""
        self._requested = requested
        self._exponent = scaling_exponent
        self._linear: dict[tuple[int, int], dict[int, float]] = {}

    def rate(self, placement: tuple[int, ...], epoch: int, micro_batch: int | None) -> float:
        """Progress per second on a placement during an epoch.

        Args:
            placement: workers per node.
            epoch: the current epoch (0-based).
            micro_batch: the local micro-batch per step when the job shares its GPUs (gradient accumulation keeps
                its global batch); ``None``: its own.

        Returns:
            The speed before any co-location slowdown.
        """
        return float((sum(placement) / self._requested) ** self._exponent)

    def unplanned_micro_batch(self) -> int | None:
        """The micro-batch of a job in a share whose sub-batch was not searched (``Share.sub_batch`` ``None``):
        both jobs of the pair run it. ``None``: the job has no batch to split (a duration job)."""
        return None

    def micro_batches(self, workers: int) -> dict[int, MicroBatch]:
        """The micro-batches a sharer could run at ``workers`` workers (``JobInfo.micro_batches``); none here."""
        return {}

    def memory_gib(self, workers: int, micro_batch: int | None) -> float | None:
        """Device memory per worker at ``workers`` with ``micro_batch`` (``None``: its own); unknown here."""
        return None

    def speedups(self, low: int, high: int) -> dict[int, float]:
        """Speed at each size ``low..high`` relative to the requested size (on the fewest nodes)."""
        table = self._linear.get((low, high))
        if table is None:
            table = {size: (size / self._requested) ** self._exponent for size in range(low, high + 1)}
            self._linear[(low, high)] = table
        return table

    # -- adaptive batch (sim/adaptive.py overrides these) ------------------------------------------------------

    #: Whether :meth:`table` changes from epoch to epoch (an adaptive job's goodput does).
    varies_by_epoch = False

    def table(self, low: int, high: int, epoch: int) -> dict[int, float]:
        """The rate table the policy sees in ``epoch`` (``JobInfo.throughput``): :meth:`speedups` by default."""
        return self.speedups(low, high)

    def remaining_seconds(self, epoch: int, progress: float) -> float:
        """Seconds left at the requested size from ``progress`` in ``epoch`` (the oracle)."""
        left = self.epoch_ends[-1] - progress
        return left if left > 0.0 else 0.0


class TraceWorkModel(WorkModel):
    """A job of one of Pollux's applications with a fixed global batch."""

    def __init__(self, app: Application, batch_size: int, requested: int, gpus_per_node: int) -> None:
        """Build the model and the oracle's table of remaining times.

        Args:
            app: the application.
            batch_size: the job's global batch.
            requested: the requested GPUs.
            gpus_per_node: GPUs per node (for the compact placement of the oracle and the speedups).
        """
        self.epoch_ends = app.epoch_ends()
        self.job_type = app.name
        self._requested = requested
        self._app = app
        self._batch = batch_size
        self._gpus_per_node = gpus_per_node
        self._shared_local = max(1, app.max_local_batch // 2)
        self._micro: dict[int, dict[int, MicroBatch]] = {}
        compact = self._compact(requested)
        # Seconds to finish epochs 0..e-1 at the requested size, and the speed in each epoch.
        self._req_rate = [self.rate(compact, epoch, None) for epoch in range(len(self.epoch_ends))]
        self._cum = [0.0]
        previous = 0.0
        for end, speed in zip(self.epoch_ends, self._req_rate, strict=True):
            self._cum.append(self._cum[-1] + (end - previous) / speed)
            previous = end
        self._speedups: dict[tuple[int, int], dict[int, float]] = {}

    def _compact(self, workers: int) -> tuple[int, ...]:
        full, rest = divmod(workers, self._gpus_per_node)
        return (self._gpus_per_node,) * full + ((rest,) if rest else ())

    def rate(self, placement: tuple[int, ...], epoch: int, micro_batch: int | None) -> float:
        """Progress per second (see :meth:`WorkModel.rate`)."""
        return self._app.rate(placement, self._batch, epoch, micro_batch)

    def unplanned_micro_batch(self) -> int | None:
        """Half the application's largest local batch (see :meth:`WorkModel.unplanned_micro_batch`)."""
        return self._shared_local

    def micro_batches(self, workers: int) -> dict[int, MicroBatch]:
        """Every measured local batch up to the job's own at ``workers``, with its speed in the first epoch, its
        memory (:data:`SIM_GPU_MEMORY_GIB`) and the accumulation that keeps the global batch."""
        cached = self._micro.get(workers)
        if cached is None:
            app = self._app
            own, _ = app.plan_batch(self._batch, workers)
            compact = self._compact(workers)
            base = self.rate(compact, 0, None)
            sizes = {size for size in app.measured_local_batches() if app.min_local_batch <= size < own} | {own}
            cached = {}
            for size in sorted(sizes):
                _, accumulation = app.plan_batch(self._batch, workers, size)
                speed = min(1.0, self.rate(compact, 0, size) / base)
                cached[size] = MicroBatch(speed, self.memory_gib(workers, size) or 0.0, accumulation + 1)
            self._micro[workers] = cached
        return cached

    def memory_gib(self, workers: int, micro_batch: int | None) -> float | None:
        """``micro-batch / max_local_batch`` of :data:`SIM_GPU_MEMORY_GIB` (see :meth:`WorkModel.memory_gib`)."""
        local = micro_batch if micro_batch is not None else self._app.plan_batch(self._batch, workers)[0]
        return SIM_GPU_MEMORY_GIB * min(local, self._app.max_local_batch) / self._app.max_local_batch

    def speedups(self, low: int, high: int) -> dict[int, float]:
        """Relative speeds per size, from the first epoch's step times (the gain barely depends on the size)."""
        key = (low, high)
        cached = self._speedups.get(key)
        if cached is None:
            base = self._req_rate[0]
            cached = {size: self.rate(self._compact(size), 0, None) / base for size in range(low, high + 1)}
            self._speedups[key] = cached
        return cached

    def remaining_seconds(self, epoch: int, progress: float) -> float:
        """Exact seconds left at the requested size (see :meth:`WorkModel.remaining_seconds`)."""
        if epoch >= len(self.epoch_ends):
            return 0.0
        start = self.epoch_ends[epoch - 1] if epoch > 0 else 0.0
        done_in_epoch = (progress - start) / self._req_rate[epoch]
        return max(self._cum[-1] - self._cum[epoch] - done_in_epoch, 0.0)


class _Job:
    """The engine's mutable state of one job."""

    __slots__ = (
        "attained",
        "completion",
        "epoch",
        "executed",
        "first_start",
        "grace_until",
        "held",
        "host_of",
        "info",
        "key",
        "model",
        "pace_bound",
        "pause_until",
        "placement",
        "preemptions",
        "priority",
        "progress",
        "rate",
        "resizes",
        "restarts",
        "shared_with",
        "spec",
        "sub_batch",
        "t",
        "time_limit",
        "version",
        "workers",
    )

    def __init__(self, spec: JobSpec, model: WorkModel, time_limit: float) -> None:
        self.spec = spec
        self.model = model
        self.time_limit = time_limit
        self.grace_until: float | None = None
        self.held = False
        self.priority = 0
        self.key = (spec.submit_time, spec.name)  # submit order, the order of every snapshot
        self.placement: dict[str, int] = {}
        self.workers = 0
        self.shared_with: str | None = None
        self.host_of: str | None = None
        self.sub_batch: int | None = None
        self.pace_bound: float | None = None
        self.progress = 0.0
        self.epoch = 0
        self.t = spec.submit_time
        self.pause_until = 0.0
        self.rate = 0.0
        self.attained = 0.0
        self.executed = 0.0
        self.first_start: float | None = None
        self.completion: float | None = None
        self.resizes = 0
        self.preemptions = 0
        self.restarts = 0
        self.version = 0
        self.info: JobInfo | None = None

    def as_info(self) -> JobInfo:
        """The job as the policy sees it.

        One ``JobInfo`` per job is kept (``info``) until the job changes state, size, placement or partner (the
        engine then sets ``info`` to ``None``); in between, the snapshot brings the fields that move with time up to
        date (``Simulator._snapshot``). Policies keep nothing between calls, so reusing the object is safe, and it
        keeps snapshots of hundreds of running jobs cheap.
        """
        info = self.info
        if info is not None:
            return info
        spec = self.spec
        info = JobInfo(
            job_id=spec.name,
            state=JobPhase.RUNNING if self.placement else JobPhase.PENDING,
            submit_time=spec.submit_time,
            requested_workers=spec.requested_workers,
            min_workers=spec.min_workers,
            max_workers=spec.max_workers,
            workers=self.workers,
            placement=self.placement,
            throughput=self.model.table(spec.min_workers, spec.max_workers, self.epoch),
            remaining_work=self.model.remaining_seconds(self.epoch, self.progress),
            attained_service=self.attained,
            executed_time=self.executed,
            time_limit=self.time_limit,
            owner=spec.user,
            partition=spec.partition,
            job_type=self.model.job_type,
            shared_with=self.shared_with,
            priority=self.priority,
            held=self.held,
            micro_batches=self.model.micro_batches(spec.requested_workers),
            memory_gib=self.model.memory_gib(self.workers or spec.requested_workers, self.sub_batch),
        )
        self.info = info
        return info

    def place(self, placement: dict[str, int]) -> None:
        """Set the job's placement (a new dict every time: snapshots share the old one)."""
        self.placement = placement
        self.workers = sum(placement.values())


ModelFactory = Callable[[JobSpec], WorkModel]


def trace_models(
    applications: Mapping[str, Application], gpus_per_node: int, scaling_exponent: float = 1.0
) -> ModelFactory:
    """A factory of work models for Pollux workloads and duration jobs.

    Args:
        applications: name -> application model.
        gpus_per_node: GPUs per node of the simulated cluster.
        scaling_exponent: how duration jobs scale with their size (see :class:`WorkModel`).

    Returns:
        A function from a job to its work model.

    Raises:
        SimError: (from the returned function) a job names an unknown application.
    """

    def build(spec: JobSpec) -> WorkModel:
        if spec.application is None:
            return WorkModel(spec.duration, spec.requested_workers, scaling_exponent)
        app = applications.get(spec.application)
        if app is None:
            raise SimError(
                f"job {spec.name}: unknown application {spec.application!r}; known applications are "
                f"{', '.join(sorted(applications))}"
            )
        return TraceWorkModel(app, spec.batch_size, spec.requested_workers, gpus_per_node)

    return build


def _check_workload(jobs: Sequence[JobSpec], config: SimConfig) -> None:
    """Refuse a job larger than the cluster (with its line) and two jobs of one name, before anything runs."""
    for spec in jobs:
        if spec.requested_workers > config.total_gpus:
            where = f" (line {spec.line})" if spec.line else ""
            raise SimError(
                f"job {spec.name}{where} requests {spec.requested_workers} GPUs but the cluster has "
                f"{config.total_gpus} ({config.nodes} nodes x {config.gpus_per_node}); use more --nodes or "
                f"drop the job"
            )
    if len({spec.name for spec in jobs}) != len(jobs):
        raise SimError("the workload has two jobs with the same name; names must be unique")


def _new_job(spec: JobSpec, model: WorkModel, config: SimConfig) -> _Job:
    """The engine's state of a job, with its time limit (given, or from the model of user estimates)."""
    limit = spec.time_limit
    if limit is None:
        needs = model.remaining_seconds(0, 0.0)
        if spec.min_workers < spec.requested_workers:
            # An elastic job may run at its minimum throughout: its user asks for enough time for that.
            needs /= model.speedups(spec.min_workers, spec.max_workers)[spec.min_workers]
        needs += config.restart_cost
        limit = estimated_time_limit(needs, config.time_limit_factor)
    return _Job(spec, model, limit)


def _check_rounds(jobs: Iterable[_Job], policy: Policy, interval: float) -> None:
    """Refuse a run that would tick for ever: a policy deciding every interval and a job lasting ages."""
    for job in jobs:
        seconds = job.model.remaining_seconds(0, 0.0)
        if seconds / interval > MAX_ROUNDS_WITHOUT_HORIZON:
            where = f" (line {job.spec.line})" if job.spec.line else ""
            raise SimError(
                f"job {job.spec.name}{where} runs {seconds:.3g} s at its requested size; policy {policy.name} "
                f"decides every {interval:g} s, so the run would take {seconds / interval:.3g} rounds; pass "
                f"--horizon SECONDS to stop the run there (unfinished jobs are reported) or fix the job"
            )


#: A policy's own order of pending jobs (:class:`slurm_amoeba.policy.types.AdmitsInOrder`).
QueueKey = tuple[float | str, ...]

#: Pending jobs shown at least to a policy that admits in its own order: the first this many in that order, more when
#: the running jobs reach further down it, every one when its answer leaves GPUs a hidden job could use (exact).
ORDERED_WINDOW = 64


class _Queue:
    """The jobs that hold GPUs and those that wait for them, kept up to date as jobs change.

    Waiting jobs are kept in submit order, and with ``key_of`` (a policy that admits in its own order) in that order
    too, with a count of the GPUs they ask for, so that a round can show the policy the part of the queue it needs.
    """

    def __init__(self, key_of: Callable[[_Job], QueueKey] | None = None) -> None:
        self.running: dict[str, _Job] = {}
        self.waiting: list[tuple[float, str]] = []  # pending jobs' keys, oldest first
        self._is_waiting: set[str] = set()
        self._key_of = key_of
        self.ordered: list[tuple[QueueKey, str]] = []  # pending jobs in the policy's order (with key_of)
        self._entries: dict[str, tuple[QueueKey, str]] = {}
        self.needs: dict[int, int] = {}  # GPUs a pending job asks for -> how many such jobs wait (with key_of)

    def sync(self, job: _Job) -> None:
        """File the job under running, waiting or neither (finished) after any change of its state."""
        name = job.spec.name
        if job.placement and job.completion is None:
            self.running[name] = job
        else:
            self.running.pop(name, None)
        waiting = not job.placement and job.completion is None
        if waiting and name not in self._is_waiting:
            self._is_waiting.add(name)
            bisect.insort(self.waiting, job.key)
            if self._key_of is not None:
                entry = (self._key_of(job), name)
                self._entries[name] = entry
                bisect.insort(self.ordered, entry)
                need = job.spec.requested_workers
                self.needs[need] = self.needs.get(need, 0) + 1
        elif not waiting and name in self._is_waiting:
            self._is_waiting.discard(name)
            del self.waiting[bisect.bisect_left(self.waiting, job.key)]
            if self._key_of is not None:
                entry = self._entries.pop(name)
                del self.ordered[bisect.bisect_left(self.ordered, entry)]
                need = job.spec.requested_workers
                self.needs[need] -= 1
                if not self.needs[need]:
                    del self.needs[need]

    def visible(self, jobs: Mapping[str, _Job], depth: int, enough: int) -> list[tuple[float, str]]:
        """Keys of the running jobs and the oldest waiting ones (all with ``depth`` 0), in submit order."""
        keys: list[tuple[float, str]] = []
        if depth == 0:
            keys = list(self.waiting)
        else:
            demand = 0
            for key in self.waiting:
                if len(keys) >= depth and demand > enough:
                    break
                keys.append(key)
                demand += jobs[key[1]].spec.requested_workers
        keys.extend(job.key for job in self.running.values())
        keys.sort()
        return keys

    def visible_in_order(
        self, jobs: Mapping[str, _Job], last_running: QueueKey | None, window: int
    ) -> tuple[list[tuple[float, str]], int]:
        """Keys (in submit order) of the running jobs and of the first waiting ones in the policy's order.

        Args:
            jobs: every job by name.
            last_running: the policy's key of the running job furthest down its order (``None``: none runs).
            window: waiting jobs to show at least.

        Returns:
            The keys, and how many waiting jobs are left out: the shown ones reach past every running job.
        """
        cut = min(window, len(self.ordered))
        if last_running is not None:
            cut = max(cut, bisect.bisect_right(self.ordered, (last_running,)))
        keys = [jobs[name].key for _, name in self.ordered[:cut]]
        keys.extend(job.key for job in self.running.values())
        keys.sort()
        return keys, len(self.ordered) - cut


class _Crossings:
    """When running jobs' attained service reaches the thresholds of a policy that demotes by it.

    Attributes:
        thresholds: attained GPU-seconds at which the policy's order changes (empty: the policy has none).
    """

    def __init__(self, thresholds: tuple[float, ...]) -> None:
        self.thresholds = thresholds
        self._heap: list[tuple[float, int, str]] = []

    def push(self, job: _Job) -> None:
        """After a change of a job (its version bumped, its clock at now): when it reaches its next threshold."""
        if not job.workers:
            return
        for threshold in self.thresholds:
            if job.attained < threshold:
                at = job.t + (threshold - job.attained) / job.workers
                heapq.heappush(self._heap, (at, job.version, job.spec.name))
                return

    def due(self, now: float, jobs: Mapping[str, _Job], advance: Callable[[_Job, float], None]) -> int:
        """Take the crossings due by ``now``; returns how many (a job short of it by rounding is due again)."""
        count = 0
        while self._heap and self._heap[0][0] <= now:
            _, version, name = heapq.heappop(self._heap)
            job = jobs[name]
            if version == job.version and job.completion is None and job.workers:
                advance(job, now)
                self.push(job)
                count += 1
        return count

    def soonest(self, jobs: Mapping[str, _Job]) -> float:
        """The time of the next crossing (``inf``: none)."""
        while self._heap:
            at, version, name = self._heap[0]
            job = jobs[name]
            if version == job.version and job.completion is None and job.workers:
                return at
            heapq.heappop(self._heap)
        return math.inf


# shape: one object per run; the event loop and the cluster state its executor changes (SimCluster) share its fields
class Simulator:
    """One simulation run: a workload, a policy and a cluster."""

    def __init__(
        self,
        jobs: Sequence[JobSpec],
        policy: Policy,
        config: SimConfig,
        models: ModelFactory,
        colocation: Mapping[tuple[str, str], float] | None = None,
    ) -> None:
        """Prepare a run.

        Args:
            jobs: the workload.
            policy: the policy that decides.
            config: the cluster and its costs.
            models: builds each job's work model.
            colocation: ``(type, partner type)`` -> fraction of speed kept while sharing (empty: unmeasured pairs
                keep :data:`DEFAULT_COLOCATION`).

        Raises:
            SimError: a job needs more GPUs than the cluster has, or names an unknown application.
        """
        self.config = config
        self.policy = policy
        self.colocation = dict(colocation or {})
        _check_workload(jobs, config)
        self._jobs = {spec.name: _new_job(spec, models(spec), config) for spec in jobs}
        if config.horizon is None and not policy.decides_on_events_only:
            _check_rounds(self._jobs.values(), policy, config.interval)
        self._arrivals = sorted(self._jobs.values(), key=lambda job: (job.spec.submit_time, job.spec.name))
        self._node_names = [f"node{i:03d}" for i in range(config.nodes)]
        self._free = dict.fromkeys(self._node_names, config.gpus_per_node)
        self._node_infos = {
            name: NodeInfo(name, config.gpus_per_node, config.gpus_per_node, gpu_memory_gib=SIM_GPU_MEMORY_GIB)
            for name in self._node_names
        }
        self._nodes_tuple: tuple[NodeInfo, ...] | None = None
        self._heap: list[tuple[float, int, str]] = []
        self._graces: list[tuple[float, str]] = []
        key_of = None
        if isinstance(policy, AdmitsInOrder) and config.queue_depth == 0:
            key_of = lambda job: policy.queue_key(job.as_info())  # noqa: E731
        self._queue = _Queue(key_of)
        self._ordered = policy if key_of is not None and isinstance(policy, AdmitsInOrder) else None
        self._crossings = _Crossings(policy.service_thresholds if isinstance(policy, DemotesByService) else ())
        self._events_only = policy.decides_on_events_only or bool(self._crossings.thresholds)
        self._used = 0
        self._usage: list[tuple[float, int]] = []
        self._decisions = 0
        self._executor = SimExecutor(self)

    # -- progress -------------------------------------------------------------------------------------------

    def _speed(self, job: _Job, epoch: int | None = None) -> float:
        """The job's progress per second now: its micro-batch's rate times what it keeps beside its partner.

        A sharer runs its searched sub-batch and its host its own; in a share whose sub-batch was not searched both
        run :meth:`WorkModel.unplanned_micro_batch`. A paced sharer and its host keep
        :func:`~slurm_amoeba.policy.pairing.paced_fractions` of the measured co-location factors.
        """
        if not job.placement:
            return 0.0
        at = job.epoch if epoch is None else epoch
        partner_id = job.shared_with or job.host_of
        if partner_id is None:
            return job.model.rate(tuple(job.placement.values()), at, None)
        partner = self._jobs[partner_id]
        guest, host = (job, partner) if job.shared_with is not None else (partner, job)
        if guest.sub_batch is None:
            micro = job.model.unplanned_micro_batch()
        else:
            micro = guest.sub_batch if job is guest else None
        speed = job.model.rate(tuple(job.placement.values()), at, micro)
        keep_guest = self.colocation.get((guest.model.job_type, host.model.job_type), DEFAULT_COLOCATION)
        keep_host = self.colocation.get((host.model.job_type, guest.model.job_type), DEFAULT_COLOCATION)
        if guest.pace_bound is not None:
            keep_host, keep_guest = paced_fractions(keep_host, keep_guest, guest.pace_bound)
        return speed * (keep_guest if job is guest else keep_host)

    def _advance(self, job: _Job, now: float) -> None:
        """Move a running job's progress and service forward to ``now`` (never past its end)."""
        if now <= job.t:
            return
        if job.placement:
            span = now - job.t
            job.executed += span
            job.attained += span * job.workers
            start = job.pause_until if job.pause_until > job.t else job.t
            ends = job.model.epoch_ends
            while start < now and job.epoch < len(ends):
                need = ends[job.epoch] - job.progress
                if job.rate * (now - start) < need:
                    job.progress += job.rate * (now - start)
                    break
                start += need / job.rate if job.rate > 0 else math.inf
                job.progress = ends[job.epoch]
                job.epoch += 1
                if job.epoch < len(ends):
                    job.rate = self._speed(job)
        job.t = now

    def _predict(self, job: _Job) -> None:
        """Push the job's finish time (at its current speeds) onto the heap, invalidating earlier entries."""
        job.version += 1
        self._crossings.push(job)
        if not job.placement or job.rate <= 0:
            return
        ends = job.model.epoch_ends
        at = max(job.t, job.pause_until)
        progress = job.progress
        for epoch in range(job.epoch, len(ends)):
            speed = job.rate if epoch == job.epoch else self._speed(job, epoch)
            at += (ends[epoch] - progress) / speed
            progress = ends[epoch]
        heapq.heappush(self._heap, (at, job.version, job.spec.name))

    def _record_usage(self, now: float) -> None:
        if self._usage and self._usage[-1][0] == now:
            self._usage[-1] = (now, self._used)
        else:
            self._usage.append((now, self._used))

    def _set_free(self, name: str, delta: int) -> None:
        self._free[name] += delta
        self._used -= delta
        self._node_infos[name] = NodeInfo(
            name, self.config.gpus_per_node, self._free[name], gpu_memory_gib=SIM_GPU_MEMORY_GIB
        )
        self._nodes_tuple = None

    # -- events ---------------------------------------------------------------------------------------------

    def _finish_due(self, until: float, active: dict[str, _Job]) -> int:
        """Complete every job whose finish time is at or before ``until``; returns how many finished."""
        finished = 0
        while self._heap and self._heap[0][0] <= until:
            at, version, name = heapq.heappop(self._heap)
            job = self._jobs[name]
            if version != job.version or job.completion is not None:
                continue
            self._advance(job, at)
            job.progress = job.model.epoch_ends[-1]
            job.epoch = len(job.model.epoch_ends)
            job.completion = at
            self._release(job, at)
            self._queue.sync(job)
            del active[name]
            finished += 1
        return finished

    def _end_graces(self, until: float, active: dict[str, _Job]) -> int:
        """Preempt every job whose grace time ended at or before ``until``; returns how many left."""
        left = 0
        while self._graces and self._graces[0][0] <= until:
            at, name = heapq.heappop(self._graces)
            job = self._jobs[name]
            if job.grace_until != at or job.completion is not None or not job.placement:
                continue
            job.grace_until = None
            self._advance(job, max(at, job.t))
            self._release(job, max(at, job.t))
            job.preemptions += 1
            self._predict(job)
            left += 1
        return left

    def _release(self, job: _Job, now: float) -> None:
        """Give a finished or preempted job's GPUs back; a job sharing its GPUs keeps running on them alone."""
        if job.shared_with is None:
            kept: dict[str, int] = {}
            if job.host_of is not None:
                guest = self._jobs[job.host_of]
                self._advance(guest, now)
                guest.shared_with = None
                guest.sub_batch = None
                guest.pace_bound = None
                job.host_of = None
                guest.rate = self._speed(guest)
                guest.info = None
                self._predict(guest)
                kept = guest.placement
            for name, count in job.placement.items():
                if count > kept.get(name, 0):
                    self._set_free(name, count - kept.get(name, 0))
        else:
            host = self._jobs[job.shared_with]
            self._advance(host, now)
            host.host_of = None
            host.rate = self._speed(host)
            host.info = None
            self._predict(host)
            job.shared_with = None
        job.sub_batch = None
        job.pace_bound = None
        job.place({})
        job.rate = 0.0
        job.info = None
        self._queue.sync(job)
        self._record_usage(now)

    # -- the state the executor changes (sim/executor.py's SimCluster) ----------------------------------------

    def workers_of(self, job_id: str) -> int:
        """Workers the job holds now."""
        return self._jobs[job_id].workers

    def placement_of(self, job_id: str) -> Mapping[str, int]:
        """Node -> the job's workers there."""
        return self._jobs[job_id].placement

    def free_by_node(self) -> Mapping[str, int]:
        """Node -> free GPUs now."""
        return self._free

    def mark_held(self, job_id: str, held: bool) -> None:
        """Hold a pending job (policies pass it over) or release it."""
        job = self._jobs[job_id]
        job.held = held
        job.info = None

    def set_priority(self, job_id: str, priority: int) -> None:
        """Set a pending job's priority (what the policy sees in ``JobInfo.priority``)."""
        job = self._jobs[job_id]
        job.priority = priority
        job.info = None

    def size_job(
        self,
        job_id: str,
        workers: int,
        placement: Mapping[str, int],
        host_id: str | None,
        now: float,
        moved: bool = False,
        sub_batch: int | None = None,
        pace_bound: float | None = None,
    ) -> None:
        """Give a job ``workers`` workers on ``placement`` and charge what the change costs.

        Args:
            job_id: the job.
            workers: its new size; 0 preempts it (after ``grace_time``).
            placement: node -> workers; empty: the nodes with the most free GPUs.
            host_id: the job whose GPUs it shares, or ``None``.
            now: the current time.
            moved: a move at the same size, which costs a resize instead of a restart.
            sub_batch: with ``host_id``, the sharer's searched micro-batch (``None``: not searched).
            pace_bound: with ``host_id``, the host's allowed slowdown the sharer paces itself to (``None``: none).

        Raises:
            SimError: the workers do not fit (a policy over-committed).
        """
        job = self._jobs[job_id]
        self._advance(job, now)  # a pending job's clock catches up, so its waiting time never counts as service
        before = job.workers
        if workers == 0 and before > 0 and self.config.grace_time > 0:
            # Slurm's GraceTime: the job is signalled now and leaves when the grace time is over.
            if job.grace_until is None:
                job.grace_until = now + self.config.grace_time
                heapq.heappush(self._graces, (job.grace_until, job.spec.name))
            return
        job.grace_until = None
        old_speed = self._speed(job) if before else 0.0
        # A host that keeps running keeps its guest (the policy placed the guest inside the host's new nodes).
        guest = job.host_of if workers > 0 else None
        if before > 0:
            job.host_of = None
            self._release(job, now)
            job.host_of = guest
        if workers == 0:
            job.preemptions += 1
            self._predict(job)
            self._queue.sync(job)
            return
        placement = dict(placement)
        if not placement:
            found = place_most_free(self._free, workers)
            if found is None:
                raise SimError(f"job {job.spec.name}: no room for {workers} workers; the policy over-committed")
            placement = found
        job.place(placement)
        if host_id is not None:
            host = self._jobs[host_id]
            self._advance(host, now)
            job.shared_with = host.spec.name
            job.sub_batch = sub_batch
            job.pace_bound = pace_bound
            host.host_of = job.spec.name
            host.rate = self._speed(host)
            host.info = None
            self._predict(host)
        else:
            for name, count in placement.items():
                self._set_free(name, -count)
        cost = self._change_cost(job, before, workers, old_speed, now, moved)
        job.pause_until = now + cost
        job.rate = self._speed(job)
        job.info = None
        self._predict(job)
        self._queue.sync(job)
        self._record_usage(now)

    def _change_cost(self, job: _Job, before: int, workers: int, old_speed: float, now: float, moved: bool) -> float:
        """The pause a start, resize, move or restart costs the job, counted in its record."""
        if before == 0:
            cost = self.config.restart_cost
            if self.config.start_grow_lag is not None and workers > job.spec.min_workers:
                cost += self._start_growth_cost(job, workers)
                job.resizes += 1  # the daemon's grow of a job Slurm started at its minimum
            if job.first_start is None:
                job.first_start = now
            else:
                job.restarts += 1
        elif workers != before or moved:
            cost = self.config.resize_cost
            job.resizes += 1
            new_speed = self._speed(job)
            if workers > before and new_speed > old_speed > 0.0:
                # Training goes on at the old speed until the new workers join: the same progress as pausing for
                # this long at the new speed.
                cost += self.config.grow_lag * (1.0 - old_speed / new_speed)
        else:
            cost = self.config.restart_cost
            job.restarts += 1
        return cost

    def _start_growth_cost(self, job: _Job, workers: int) -> float:
        """With ``start_grow_lag``: the pause equivalent to training at the minimum until the extras join."""
        lag = self.config.start_grow_lag or 0.0
        low = job.spec.min_workers
        speeds = job.model.speedups(low, max(workers, job.spec.max_workers))
        if not speeds[workers] > speeds[low] > 0.0:
            return 0.0
        return max(0.0, lag - self.config.restart_cost) * (1.0 - speeds[low] / speeds[workers])

    # -- snapshot -------------------------------------------------------------------------------------------

    def _snapshot(self, everything: bool = False) -> tuple[Snapshot, int]:
        """Every running job and the pending ones the policy is shown, in submit order; and how many are left out.

        The pending jobs shown are the oldest ones (``queue_depth``), or for a policy that admits in its own order
        the first :data:`ORDERED_WINDOW` in that order and every one up to its last running job (all of them with
        ``everything``); otherwise all of them.
        """
        if self._nodes_tuple is None:
            self._nodes_tuple = tuple(self._node_infos.values())
        every = self._jobs
        for job in self._queue.running.values():  # the fields that move with time (see _Job.as_info): the hot loop
            info = job.info
            if info is not None:
                info.remaining_work = job.model.remaining_seconds(job.epoch, job.progress)
                info.attained_service = job.attained
                info.executed_time = job.executed
                if job.model.varies_by_epoch:  # an adaptive job's goodput per size moves with its epoch
                    info.throughput = job.model.table(job.spec.min_workers, job.spec.max_workers, job.epoch)
        hidden = 0
        if self._ordered is not None:
            order = self._ordered
            last = max((order.queue_key(job.as_info()) for job in self._queue.running.values()), default=None)
            window = len(every) if everything else ORDERED_WINDOW
            keys, hidden = self._queue.visible_in_order(every, last, window)
        else:
            keys = self._queue.visible(every, self.config.queue_depth, self.config.total_gpus)
        infos = [every[name].as_info() for _, name in keys]
        return Snapshot(self._nodes_tuple, tuple(infos), self.colocation), hidden

    def _ask(self, now: float) -> tuple[Snapshot, Sequence[Action]]:
        """One round: the snapshot and the policy's answer (asked again with every pending job when needed)."""
        snapshot, hidden = self._snapshot()
        decisions = self.policy.decide(snapshot, now)
        self._decisions += 1
        if hidden:
            free = self.config.total_gpus - self._used
            for action in decisions:
                if isinstance(action, Preempt):
                    free += self._jobs[action.job_id].workers
                elif isinstance(action, (Start, Resize, Place)):
                    free -= action.workers - self._jobs[action.job_id].workers
            if free >= min(self._queue.needs):  # a hidden job might have started: ask with all of them
                snapshot, _ = self._snapshot(everything=True)
                decisions = self.policy.decide(snapshot, now)
        return snapshot, decisions

    # -- main loop ------------------------------------------------------------------------------------------

    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        """Run the simulation to the end (or the horizon).

        Args:
            progress: called now and then with the fraction of jobs done.

        Returns:
            The per-job records and the usage timeline.

        Raises:
            PolicyError: the policy broke an invariant (with ``config.check``).
        """
        started = time.perf_counter()
        interval = self.config.interval
        horizon = self.config.horizon if self.config.horizon is not None else math.inf
        active: dict[str, _Job] = {}
        next_arrival = 0
        total = len(self._arrivals)
        done = 0
        now = 0.0
        dirty = True
        while done < total:
            if next_arrival < total and not active:
                first = self._arrivals[next_arrival].spec.submit_time
                now = max(now, math.ceil(first / interval) * interval)
            if now > horizon:
                break
            finished = self._finish_due(now, active)
            done += finished
            finished += self._end_graces(now, active)
            finished += self._crossings.due(now, self._jobs, self._advance)
            arrived = 0
            while next_arrival < total and self._arrivals[next_arrival].spec.submit_time <= now:
                job = self._arrivals[next_arrival]
                active[job.spec.name] = job
                self._queue.sync(job)
                next_arrival += 1
                arrived += 1
            dirty = dirty or finished > 0 or arrived > 0
            if active and (dirty or not self._events_only):
                for job in self._queue.running.values():
                    self._advance(job, now)
                snapshot, decisions = self._ask(now)
                if self.config.check:
                    check_actions(snapshot, decisions)
                for action in sorted(decisions, key=self._executor.order):
                    self._executor.apply(action, now)
                dirty = bool(decisions)
                if not decisions and next_arrival == total and not self._queue.running:
                    raise SimError(
                        f"policy {self.policy.name} starts none of the {len(active)} waiting jobs on an idle cluster "
                        f"at t={now:.0f} s and no job is left to arrive; the run would never end"
                    )
            if progress is not None and finished:
                progress(done / total)
            now = self._next_tick(now, next_arrival, dirty)
        return self._result(time.perf_counter() - started)

    def _next_tick(self, now: float, next_arrival: int, dirty: bool) -> float:
        interval = self.config.interval
        following = now + interval
        if dirty or not self._events_only:
            return following
        # Nothing can change before the next arrival or finish: jump to the tick at or after it.
        soonest = min(self._graces[0][0] if self._graces else math.inf, self._crossings.soonest(self._jobs))
        if next_arrival < len(self._arrivals):
            soonest = min(soonest, self._arrivals[next_arrival].spec.submit_time)
        while self._heap:
            at, version, name = self._heap[0]
            if version == self._jobs[name].version and self._jobs[name].completion is None:
                soonest = min(soonest, at)
                break
            heapq.heappop(self._heap)
        if soonest == math.inf:
            return following
        return max(following, math.ceil(soonest / interval) * interval)

    def _result(self, wall: float) -> SimResult:
        records = [_record(job) for job in self._jobs.values()]
        return SimResult(self.policy.name, self.config.total_gpus, records, list(self._usage), self._decisions, wall)


def _record(job: _Job) -> JobRecord:
    """What happened to one job, for the result."""
    spec = job.spec
    return JobRecord(
        spec.name,
        spec.submit_time,
        job.first_start,
        job.completion,
        spec.requested_workers,
        job.resizes,
        job.preemptions,
        job.restarts,
    )
