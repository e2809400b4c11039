"""The ``slurm`` baseline: what Slurm's own scheduler would do, so that elastic policies are measured against it.

A model of Slurm 22.05 with ``PriorityType=priority/multifactor``, ``SchedulerType=sched/backfill`` and
``PreemptType=preempt/partition_prio`` (the settings of most GPU sites):

- **multifactor priority**: ``PriorityWeightAge * min(age, PriorityMaxAge) / PriorityMaxAge
  + PriorityWeightJobSize * size + PriorityWeightFairshare * 2^(-usage/shares) + PriorityWeightPartition * tier``,
  plus the job's own ``priority`` (a site offset). ``size`` is the job's share of the cluster's GPUs (one minus it
  with ``PriorityFavorSmall=YES``); fair share divides the cluster equally between the owners present and counts as
  usage the GPU-seconds their jobs in the snapshot attained (no decay: the policy keeps no history). The queue is
  ordered by partition ``PriorityTier`` first, then priority, then submit time, as Slurm does.
- **backfill with reservations from time limits**: jobs are tested in that order (at most ``bf_max_job_test``); a
  job starts now when it fits for its whole time limit without delaying any reservation made before it; otherwise
  it gets a reservation at its earliest possible start if that lies within ``bf_window`` (Slurm reserves for every
  tested job; ``bf_reservations=1`` gives EASY backfill, where only the top blocked job holds one). Running jobs are
  expected to end at their start plus their time limit, never earlier: Slurm does not know the real durations.
  GPUs are counted as one pool (the simulator places a job's workers on any nodes).
- **partition-priority preemption with GraceTime**: a job of a partition with a higher ``PriorityTier`` that cannot
  start takes GPUs from running jobs of lower-tier partitions whose ``PreemptMode`` is not ``off`` (lowest tier,
  lowest priority first). A victim whose partition has a ``GraceTime`` is only told to leave (a preempt decision);
  it keeps its GPUs for the grace time (the caller enforces it: the simulator's ``grace_time``) and the preemptor
  holds a reservation until then. Without a grace time the preemptor starts in the same round.

With ``grow_elastic`` the policy adds the daemon's ``elastic-backfill`` on top: elastic jobs start at their minimum
(the daemon's jobs are submitted so), their loans above their request count as free GPUs for Slurm's decisions
(they live in a preemptible partition; ``slurm_takes_loans_only``), are given back, least useful first, when a job
Slurm starts needs them, and the GPUs left idle go to the elastic jobs with the least attained service first. This
is what a site running ``amoebad`` would see. ``las_queue_s`` is a what-if on top: Slurm's queue in 2D-LAS order, as
a daemon with operator rights could set it through job priorities (not built).

Each knob is a ``slurm.conf`` parameter; ``slurm_amoeba.sim.slurmconf`` reads them from a slurm.conf-like file.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Callable, Sequence

from slurm_amoeba.policy.actions import Action, Place, Preempt, Resize, Start
from slurm_amoeba.policy.common import base_size, realize
from slurm_amoeba.policy.elastic_room import admission_keeps, compact_growth, elastic_layer, spared_size
from slurm_amoeba.policy.types import JobInfo, JobPhase, PolicyError, Snapshot

#: How long the daemon holds an elastic job for its requested size before it lets it start at its minimum: the live
#: daemon's ``admission.max_hold_s`` and the simulated default's ``max_hold_s`` (docs/simulator.md, the default).
DEFAULT_MAX_HOLD_S = 8 * 3600.0
#: Slurm's default ``PriorityMaxAge`` (7 days).
DEFAULT_MAX_AGE_S = 7 * 86400.0

#: Slurm's default ``bf_window`` (one day).
DEFAULT_BF_WINDOW_S = 86400.0

#: Slurm's default ``bf_max_job_test``.
DEFAULT_BF_MAX_JOB_TEST = 500

#: The time limit assumed for a job that has none (Slurm's ``UNLIMITED``, as a year).
UNLIMITED_S = 365 * 86400.0

#: Partition ``PreemptMode`` values the model knows (``suspend`` and ``gang`` are not modelled).
PREEMPT_MODES = ("off", "requeue", "cancel")


@dataclasses.dataclass(frozen=True)
class SlurmPartition:
    """The scheduling settings of one partition (a ``PartitionName=`` line of slurm.conf).

    Attributes:
        name: the partition's name (jobs name it in ``JobInfo.partition``).
        priority_tier: ``PriorityTier``; jobs of higher tiers are scheduled first and may preempt lower tiers.
        preempt_mode: ``PreemptMode``: ``off`` (its jobs are never preempted), ``requeue`` or ``cancel``.
        grace_time: ``GraceTime`` in seconds: how long a preempted job keeps its GPUs after the signal.
    """

    name: str
    priority_tier: int = 1
    preempt_mode: str = "off"
    grace_time: float = 0.0

    def __post_init__(self) -> None:
        if self.preempt_mode not in PREEMPT_MODES:
            raise PolicyError(
                f"partition {self.name}: PreemptMode={self.preempt_mode!r} is not modelled; use one of "
                f"{', '.join(PREEMPT_MODES)}"
            )
        if self.grace_time < 0 or self.priority_tier < 0:
            raise PolicyError(
                f"partition {self.name}: GraceTime={self.grace_time} and PriorityTier={self.priority_tier} must be "
                f"0 or more"
            )


class Profile:
    """Free GPUs over time, a step function: ``free[i]`` GPUs from ``times[i]`` until ``times[i + 1]``."""

    def __init__(self, now: float, free: int) -> None:
        self.times = [now]
        self.free = [free]

    def _split(self, at: float) -> int:
        """Index of the step that starts at ``at`` (made so when needed)."""
        index = bisect.bisect_right(self.times, at) - 1
        if self.times[index] == at:
            return index
        self.times.insert(index + 1, at)
        self.free.insert(index + 1, self.free[index])
        return index + 1

    def add(self, start: float, end: float, gpus: int) -> None:
        """Add ``gpus`` (negative: take) from ``start`` until ``end`` (``inf``: for ever)."""
        if end <= start:
            return
        first = self._split(max(start, self.times[0]))
        last = len(self.times) if math.isinf(end) else self._split(end)
        for index in range(first, last):
            self.free[index] += gpus

    def earliest(self, need: int, duration: float, latest: float) -> float | None:
        """The earliest time at or before ``latest`` from which ``need`` GPUs stay free for ``duration``."""
        count = len(self.times)
        for start in range(count):
            at = self.times[start]
            if at > latest:
                return None
            index = start
            while index < count and self.times[index] < at + duration and self.free[index] >= need:
                index += 1
            if index == count or self.times[index] >= at + duration:
                return at
        return None

    def copy(self) -> Profile:
        """An independent copy."""
        other = Profile(self.times[0], 0)
        other.times = list(self.times)
        other.free = list(self.free)
        return other


@dataclasses.dataclass(frozen=True)
class SlurmBaselinePolicy:
    """Slurm's multifactor priority, backfill with reservations and partition preemption (see the module).

    Attributes:
        weight_age: ``PriorityWeightAge``.
        weight_job_size: ``PriorityWeightJobSize``.
        weight_fairshare: ``PriorityWeightFairshare`` (0 switches fair share off).
        weight_partition: ``PriorityWeightPartition``.
        max_age_s: ``PriorityMaxAge`` in seconds.
        favor_small: ``PriorityFavorSmall=YES``.
        bf_window_s: ``bf_window`` in seconds: reservations lie at most this far ahead.
        bf_max_job_test: ``bf_max_job_test``: pending jobs tested per round.
        bf_reservations: how many blocked jobs hold a reservation (0: every tested one, as Slurm; 1: EASY).
        default_time_s: the time limit of a job without one (``DefaultTime``/``MaxTime``).
        partitions: the partitions' tiers, preempt modes and grace times; unnamed partitions get tier 1 and
            ``PreemptMode=off``.
        grow_elastic: run the daemon's elastic backfill on top (see the module).
        min_gain: with ``grow_elastic``, the smallest marginal efficiency worth a grow (as ``elastic-backfill``).
        grow_by_service: with ``grow_elastic``, idle GPUs go to the elastic jobs with the least attained service
            first (``False``: the largest speedup gain), as ``elastic-backfill`` does.
        admit_at_request: with ``grow_elastic``, an elastic job is admitted only once its *requested* size is
            available now (free GPUs and other jobs' extras above their minimum, without delaying a reservation) and
            starts at that size; until then it is held and holds no reservation. Its extras above the minimum stay
            reclaimable for later starts. The daemon needs operator rights for it (``scontrol hold``/``release``);
            ``False``, the default, is the plain daemon, under which Slurm starts an elastic job at its minimum.
        protect_requests: with ``admit_at_request``, an admission does not take below its request a running job
            that cannot use a worker above its request and is not ahead of it (:func:`admission_keeps`); default
            ``False``: it fixed every p99 at 0.5x but held admissions so long at 1.0x that one workload's average
            JCT went 43% above Slurm alone (docs/simulator.md). Whatever this knob, extras below requests of jobs
            ahead of their request go back before those of jobs behind (:func:`_give_back_key`).
        restore_requests: with ``grow_elastic``, idle GPUs go first to running jobs that are below their requested
            size *and* behind it (:func:`request_credit` negative), the most behind first, up to their request; the
            rest as ``grow_by_service`` says. Default ``False``, a measured what-if: it cut the p99 misses at 0.5x
            but cost 1.0x workload 6 half its gain (-45% -> -23% avg, p99 +7%) and the half-elastic family more
            (docs/simulator.md).
        submit_at_request: with ``grow_elastic``, elastic jobs are submitted at their requested size (a plain
            daemon's choice, no operator rights needed): Slurm starts each at that size, with its own reservation,
            and counts it as taken; the daemon only lends idle GPUs above requests and takes back only those. No job
            ever runs below its request. ``False``: submitted at their minimum (Slurm starts them as soon as that
            fits).
        slurm_takes_loans_only: with ``admit_at_request``, a job Slurm starts (a rigid one) may take only the loans
            above running elastic jobs' requests: their workers up to the request count as taken, as in Slurm alone
            (live: those satellites run in a partition Slurm does not preempt; only the loans run in the preemptible
            one). Only the daemon's own admissions take a job below its request. ``False``: every extra above a
            job's minimum is Slurm's to take (the rule before this round: a 48-GPU rigid job started on an elastic
            job's workers below its request left that job at half size for hours and 28 jobs waited behind both).
            The plain daemon (no ``admit_at_request``) keeps the rule before: with it, its 1.0x average went from
            -20% to +6% against Slurm alone (docs/simulator.md).
        compact_starts: with ``grow_elastic``, the extras given back for a job Slurm starts are taken on the nodes
            where the job then fits on the fewest nodes (best fit), instead of the least useful extras wherever they
            run: a job spread over nodes whose GPUs were lent out trains up to 2.5x slower (measured placements).
        compact_growth: with ``grow_elastic``, a job grows only onto as few nodes as its new size needs (or no more
            nodes than it spans already): a worker count's measured speed assumes a compact placement, and a job
            regrown across nodes after a shrink can train slower than before its growth.
        whole_node_starts: with ``admit_at_request`` and ``compact_starts``, a job Slurm starts that fits on one node
            but finds no node whole with free GPUs and loans is put on one node by moving elastic jobs' workers above
            their minimum off it to free GPUs elsewhere (same size, one move each; live, a satellite given back and
            one lent on another node): spread over nodes it trains up to 2.6x slower (measured placements). Measured
            over the study's families it changed no average for the worse and removed p99 misses
            (docs/simulator.md). Default ``False``, as the live daemon's ``whole_node_starts`` (off there: no gain
            on the test cluster, docs/admin.md 8d), so that the simulated default is the daemon a site runs.
        compact_admissions: with ``admit_at_request`` and ``compact_starts``, an elastic job admitted at its request
            that fits on one node but finds none whole starts smaller on the node with the most room (at least its
            minimum) instead of spread. A measured what-if, off: p99 misses 6 -> 5 of 64, but single workloads swing
            both ways (docs/simulator.md).
        whole_node_moves_minimum: with ``whole_node_starts``, the workers that may move off a node for such a start
            are every worker of the running elastic jobs there, not only those above their minimum (a moved job
            keeps its size and pays one move): with every elastic job at its minimum, a rigid job was spread 2 + 2
            and trained at less than half speed. Measured over the study's families it changed no average or p99
            to worse than the baseline and removed two p99 misses (docs/simulator.md). Live this is a requeue of
            the elastic job's own allocation, which the daemon does not do: a what-if, ``False`` by default (only
            satellites move, as live).
        spare_longer_jobs: with ``admit_at_request``, an admission takes below its request no running job that
            cannot use a worker above it and is not ahead of it (:func:`admission_keeps`) and has more time left
            than the arrival's time limit (:func:`spares`): the arrival starts smaller instead (at least its
            minimum), or, when even its minimum does not fit so, takes from every job as without the rule. A
            measured what-if, off: p99 misses 6 -> 4 of 64, but a new one and single workloads swing both ways
            (docs/simulator.md).
        spare_tail_factor: with ``admit_at_request``, while the other pending jobs ask for at most
            ``spare_tail_queue_share`` of the cluster's GPUs (a light load), an admission takes below its request no
            running job with more than this many times the arrival's time limit left (:func:`spares_tail`): the
            arrival starts smaller instead (at least its minimum), or, when even its minimum does not fit so, takes
            from every job as without the rule. Such a long job may be the workload's tail, which the baseline never
            shrinks. A what-if of the simulator, 0 (off) by default: the live admission does not start an arrival
            smaller to spare such jobs. At 5, with ``whole_node_starts`` and ``whole_node_moves_minimum``, holding
            without bound: p99 misses 4 -> 1 of 64, no average worse than the baseline (3 and 10 did worse); with
            the 8 h ``max_hold_s``: 5 -> 3 (docs/simulator.md).
        spare_tail_queue_share: with ``spare_tail_factor``, the largest share of the cluster's GPUs the other pending
            jobs may ask for while the rule applies (without this bound, at factor 5: 3 p99 misses instead of 1 and
            single averages up to +67% against the last default, docs/simulator.md).
        max_hold_s: with ``admit_at_request``, a pending elastic job submitted this many seconds ago or more is no
            longer held: Slurm starts it at its minimum with its own reservation, as the live daemon's
            ``admission.max_hold_s`` releases it. Default 8 h, the live default (at 1 h, the live default before
            26 Nov, 7 of the 64 Pollux workload-loads were worse than the baseline on average; docs/simulator.md);
            0 holds without bound.
        las_queue_s: when positive, the pending jobs of a partition tier are tested in 2D-LAS order instead of by
            multifactor priority: those below this many attained GPU-seconds first, each group by submit time. A
            what-if: the order a daemon with operator rights would set through job priorities (Tiresias's queue
            without its preemptions); 0, the default, is Slurm's own order.
        name: ``"slurm"``.
        decides_on_events_only: ``False``: priorities age with time.
    """

    weight_age: float = 1000.0
    weight_job_size: float = 1000.0
    weight_fairshare: float = 0.0
    weight_partition: float = 0.0
    max_age_s: float = DEFAULT_MAX_AGE_S
    favor_small: bool = False
    bf_window_s: float = DEFAULT_BF_WINDOW_S
    bf_max_job_test: int = DEFAULT_BF_MAX_JOB_TEST
    bf_reservations: int = 0
    default_time_s: float = UNLIMITED_S
    partitions: tuple[SlurmPartition, ...] = ()
    grow_elastic: bool = False
    min_gain: float = 0.1
    grow_by_service: bool = True
    las_queue_s: float = 0.0
    admit_at_request: bool = False
    protect_requests: bool = False
    restore_requests: bool = False
    submit_at_request: bool = False
    slurm_takes_loans_only: bool = True
    compact_starts: bool = True
    compact_growth: bool = True
    whole_node_starts: bool = False
    compact_admissions: bool = False
    whole_node_moves_minimum: bool = False
    spare_longer_jobs: bool = False
    spare_tail_factor: float = 0.0
    spare_tail_queue_share: float = 0.25
    max_hold_s: float = DEFAULT_MAX_HOLD_S
    name: str = dataclasses.field(default="slurm", init=False)
    decides_on_events_only: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        for knob in (
            "weight_age",
            "weight_job_size",
            "weight_fairshare",
            "weight_partition",
            "min_gain",
            "las_queue_s",
            "spare_tail_factor",
            "spare_tail_queue_share",
            "max_hold_s",
        ):
            if not getattr(self, knob) >= 0:
                raise PolicyError(f"{knob}={getattr(self, knob)} must be 0 or more")
        for knob in ("max_age_s", "bf_window_s", "default_time_s"):
            if not getattr(self, knob) > 0:
                raise PolicyError(f"{knob}={getattr(self, knob)} must be positive (seconds)")
        for knob in ("bf_max_job_test", "bf_reservations"):
            value = getattr(self, knob)
            if value != int(value) or value < (1 if knob == "bf_max_job_test" else 0):
                raise PolicyError(f"{knob}={value} must be a whole number of at least {int(knob == 'bf_max_job_test')}")
        object.__setattr__(self, "bf_max_job_test", int(self.bf_max_job_test))
        object.__setattr__(self, "bf_reservations", int(self.bf_reservations))
        names = [partition.name for partition in self.partitions]
        if len(set(names)) != len(names):
            raise PolicyError(f"partitions {names} name one partition twice")

    # -- priority -------------------------------------------------------------------------------------------

    def _partition(self, job: JobInfo) -> SlurmPartition:
        for partition in self.partitions:
            if partition.name == job.partition:
                return partition
        return SlurmPartition(job.partition)

    def priorities(self, snapshot: Snapshot, now: float) -> dict[str, float]:
        """Every job's multifactor priority now.

        Args:
            snapshot: the cluster now.
            now: the current time.

        Returns:
            job id -> priority (higher is scheduled first within a partition tier).
        """
        total = max(snapshot.total_gpus, 1)
        top_tier = max((partition.priority_tier for partition in self.partitions), default=1) or 1
        shares = self._fairshare(snapshot.jobs) if self.weight_fairshare > 0 else {}
        result: dict[str, float] = {}
        for job in snapshot.jobs:
            age = min(max(now - job.submit_time, 0.0), self.max_age_s) / self.max_age_s
            size = min(job.requested_workers * job.gpus_per_worker / total, 1.0)
            if self.favor_small:
                size = 1.0 - size
            tier = self._partition(job).priority_tier / top_tier
            result[job.job_id] = (
                self.weight_age * age
                + self.weight_job_size * size
                + self.weight_fairshare * shares.get(job.owner, 1.0)
                + self.weight_partition * tier
                + job.priority
            )
        return result

    @staticmethod
    def _fairshare(jobs: Sequence[JobInfo]) -> dict[str, float]:
        usage: dict[str, float] = {}
        for job in jobs:
            usage[job.owner] = usage.get(job.owner, 0.0) + job.attained_service
        total = sum(usage.values())
        if total <= 0:
            return dict.fromkeys(usage, 1.0)
        share = 1.0 / len(usage)
        return {owner: 2.0 ** (-(used / total) / share) for owner, used in usage.items()}

    def queue_order(self, snapshot: Snapshot, now: float) -> list[JobInfo]:
        """The pending jobs in the order Slurm tests them: partition tier, priority, submit time, id (a held job is
        not tested, as in Slurm)."""
        if self.las_queue_s > 0:
            return sorted(
                snapshot.startable(),
                key=lambda job: (
                    -self._partition(job).priority_tier,
                    job.attained_service >= self.las_queue_s,
                    job.submit_time,
                    job.job_id,
                ),
            )
        priority = self.priorities(snapshot, now)
        return sorted(
            snapshot.startable(),
            key=lambda job: (-self._partition(job).priority_tier, -priority[job.job_id], job.submit_time, job.job_id),
        )

    # -- decisions ------------------------------------------------------------------------------------------

    def time_left(self, job: JobInfo) -> float:
        """Seconds the job may still run (never less than one: a job past its limit is about to end)."""
        limit = self.default_time_s if job.time_limit is None else job.time_limit
        return max(limit - job.executed_time, 1.0)

    def _held(self, job: JobInfo) -> int:
        """GPUs of a running job that Slurm counts as taken (an elastic job's extras are free under the daemon)."""
        if self.grow_elastic and job.is_resizable:
            return min(self.slurm_floor(job), job.workers) * job.gpus_per_worker
        return job.gpus

    def slurm_floor(self, job: JobInfo) -> int:
        """The workers of a running elastic job that a job Slurm starts cannot take: its request with
        ``slurm_takes_loans_only`` (under ``admit_at_request``) or ``submit_at_request``, else its minimum."""
        if (self.slurm_takes_loans_only and self.admit_at_request) or self.submit_at_request:
            return max(job.requested_workers, job.min_workers)
        return job.min_workers

    def daemon_floor(self, job: JobInfo) -> int:
        """The fewest workers the daemon leaves a running elastic job: its minimum, or with ``submit_at_request``
        its requested size (Slurm allocated that much; only the loans above it are the daemon's)."""
        return max(job.requested_workers, job.min_workers) if self.submit_at_request else job.min_workers

    def gated(self, job: JobInfo, now: float) -> bool:
        """Whether the daemon holds this job until its requested size is available (``admit_at_request``); with
        ``max_hold_s`` not a pending job submitted that long before ``now``."""
        if 0 < self.max_hold_s <= now - job.submit_time and job.state is JobPhase.PENDING:
            return False
        return self.grow_elastic and self.admit_at_request and job.is_elastic

    def _start_size(self, job: JobInfo, now: float) -> int:
        if not self.grow_elastic or self.gated(job, now) or self.submit_at_request:
            return job.requested_workers
        return base_size(job)

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The action types it answers with: Slurm's starts and preemptions; with ``grow_elastic`` the daemon's
        resizes; with ``whole_node_starts`` its moves of running jobs to other nodes (places)."""
        kinds: set[type[Action]] = {Start, Preempt}
        if self.grow_elastic:
            kinds.add(Resize)
            if self.whole_node_starts:
                kinds.add(Place)
        return frozenset(kinds)

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """Start, reserve and preempt as Slurm would; with ``grow_elastic`` also shrink and grow elastic jobs.

        Args:
            snapshot: the cluster now.
            now: the current time (priorities age with it; reservations are placed on its clock).

        Returns:
            Starts and preemptions (and resizes and places with ``grow_elastic``).
        """
        running = [job for job in snapshot.running() if job.shared_with is None]
        profile = self._profile(snapshot, running, now, self._held)
        admissions = profile
        loans_only = self.grow_elastic and self.admit_at_request and self.slurm_takes_loans_only
        if loans_only and not self.submit_at_request:
            admissions = self._profile(snapshot, running, now, lambda job: self.daemon_floor(job) * job.gpus_per_worker)
        targets: dict[str, int] = {}
        reasons: dict[str, str] = {}
        victims: set[str] = set()
        started: list[JobInfo] = []
        reserved = 0
        lendable = self._lendable_for_admissions(snapshot, running)
        taken = 0
        for job in self.queue_order(snapshot, now)[: self.bf_max_job_test]:
            size = self._start_size(job, now)
            need = size * job.gpus_per_worker
            if need > snapshot.total_gpus:
                continue
            duration = self.time_left(job)
            gated = self.gated(job, now)
            at = (admissions if gated else profile).earliest(need, duration, now + self.bf_window_s)
            if at is not None and gated and need > lendable:
                at = None
            admitted_now = gated and at is not None and at <= now
            spared = spared_size(self, job, snapshot, running, taken, now) if admitted_now else None
            if spared is not None:
                size, need = spared, spared * job.gpus_per_worker
            if at is None or at > now:
                preempted = self._preempt_for(job, need, duration, running, victims, profile, now, reasons)
                at = at if preempted is None else preempted
            if at is not None and at <= now:
                profile.add(now, now + duration, -need)
                if admissions is not profile:
                    admissions.add(now, now + duration, -need)
                lendable -= need
                taken += need
                targets[job.job_id] = size
                reasons[job.job_id] = "slurm: starts without delaying any reservation"
                started.append(job)
            elif at is not None and not gated and (self.bf_reservations == 0 or reserved < self.bf_reservations):
                profile.add(at, at + duration, -need)
                if admissions is not profile:
                    admissions.add(at, at + duration, -need)
                reserved += 1
        for key in victims:
            targets[key] = 0
        fixed = (
            elastic_layer(self, snapshot, now, running, started, victims, targets, reasons) if self.grow_elastic else {}
        )
        by_id = {job.job_id: job for job in snapshot.jobs}
        changed = {key: size for key, size in targets.items() if size != by_id[key].workers}
        for key, placement in fixed.items():
            if key not in changed and by_id[key].state is JobPhase.RUNNING and placement != by_id[key].placement:
                changed[key] = by_id[key].workers  # a move (``whole_node_starts``)
        order = [job for job in running if job.job_id in changed] + started
        decisions = realize(snapshot, changed, order, reasons, fixed)
        if self.grow_elastic and self.compact_growth:
            node_gpus = max((node.gpus_total for node in snapshot.nodes), default=1)
            kept = (compact_growth(decision, by_id[decision.job_id], node_gpus) for decision in decisions)
            decisions = [decision for decision in kept if decision is not None]
        return decisions

    def _lendable_for_admissions(self, snapshot: Snapshot, running: Sequence[JobInfo]) -> float:
        """GPUs an elastic job admitted at its request may take now: free ones and running jobs' extras above what
        they keep (their minimum; with ``protect_requests``, :func:`admission_keeps`). Infinite when the rule is
        off (the profile alone decides)."""
        if not self.protect_requests:
            return math.inf
        keep = admission_keeps(self.min_gain)
        extras = sum(max(job.workers - keep(job), 0) * job.gpus_per_worker for job in running if job.is_resizable)
        return snapshot.free_gpus + extras

    def _profile(
        self, snapshot: Snapshot, running: Sequence[JobInfo], now: float, held: Callable[[JobInfo], int]
    ) -> Profile:
        """Free GPUs over time when each running job holds ``held(job)`` GPUs until its time limit (and its other
        GPUs count as free now)."""
        profile = Profile(now, snapshot.free_gpus + sum(job.gpus - min(held(job), job.gpus) for job in running))
        for job in running:
            profile.add(now + self.time_left(job), math.inf, min(held(job), job.gpus))
        return profile

    def _preempt_for(
        self,
        job: JobInfo,
        need: int,
        duration: float,
        running: Sequence[JobInfo],
        victims: set[str],
        profile: Profile,
        now: float,
        reasons: dict[str, str],
    ) -> float | None:
        """Pick running jobs of lower, preemptible tiers whose GPUs let ``job`` start; returns its start or ``None``.

        The profile is changed (and ``victims`` grown) only when the preemption succeeds: the victims' GPUs come
        back at now plus their grace time instead of at their expected ends.
        """
        tier = self._partition(job).priority_tier
        candidates = [
            other
            for other in running
            if other.job_id not in victims
            and self._partition(other).preempt_mode != "off"
            and self._partition(other).priority_tier < tier
        ]
        if not candidates:
            return None
        candidates.sort(key=lambda other: (self._partition(other).priority_tier, other.priority, other.executed_time))
        trial = profile.copy()
        chosen: list[JobInfo] = []
        grace = 0.0
        for victim in candidates:
            grace = max(grace, self._partition(victim).grace_time)
            trial.add(now + self._partition(victim).grace_time, now + self.time_left(victim), self._held(victim))
            chosen.append(victim)
            at = trial.earliest(need, duration, now + grace)
            if at is not None:
                profile.times, profile.free = trial.times, trial.free
                for victim_job in chosen:
                    victims.add(victim_job.job_id)
                    reasons[victim_job.job_id] = f"slurm: preempted for job {job.job_id} of a higher PriorityTier"
                return at
        return None
