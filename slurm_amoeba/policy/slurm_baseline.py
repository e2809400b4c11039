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

The baseline models Slurm and nothing more. The daemon on top of it (``amoebad``, :mod:`slurm_amoeba.policy.amoebad`)
is a subclass that fills the hooks this class leaves neutral: which GPUs of a running job Slurm counts as taken
(:meth:`SlurmBaselinePolicy.slurm_holds`), the size a job starts at (:meth:`~SlurmBaselinePolicy.start_size`),
which pending jobs are held for admission (:meth:`~SlurmBaselinePolicy.held_for_admission`), the queue order, and
the pass after Slurm's (:meth:`~SlurmBaselinePolicy.after_slurm`, :meth:`~SlurmBaselinePolicy.finish`).

Each knob is a ``slurm.conf`` parameter; ``slurm_amoeba.sim.slurmconf`` reads them from a slurm.conf-like file.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Callable, Sequence

from slurm_amoeba.policy.actions import Action, Preempt, Start
from slurm_amoeba.policy.common import SizeAction, realize
from slurm_amoeba.policy.types import JobInfo, JobPhase, PolicyError, Snapshot

#: How long the daemon holds an elastic job for its requested size before it lets it start at its minimum: the live
#: daemon's ``admission.max_hold_s`` and the ``amoebad`` policy's ``admission.max_hold_s`` (docs/simulator.md).
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
class SlurmRound:
    """What Slurm's model decided in one decision, handed to the pass after Slurm's
    (:meth:`SlurmBaselinePolicy.after_slurm`), which may add to ``targets`` and ``reasons``.

    Attributes:
        snapshot: the cluster now.
        now: the decision's time.
        running: the running jobs Slurm saw (not sharing GPUs).
        started: the jobs Slurm starts, in queue order.
        victims: the ids of the running jobs Slurm preempts.
        targets: job id -> workers, Slurm's starts and preemptions.
        reasons: job id -> why.
    """

    snapshot: Snapshot
    now: float
    running: Sequence[JobInfo]
    started: Sequence[JobInfo]
    victims: set[str]
    targets: dict[str, int]
    reasons: dict[str, str]


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

    @classmethod
    def with_releases(cls, now: float, free: int, releases: Sequence[tuple[float, int]]) -> Profile:
        """The profile of ``free`` GPUs now, ``gpus`` more from each release's ``at`` on: what :meth:`add` of each
        release until ``inf`` makes, built in one pass (sorted, then summed) instead of one pass per release; a
        release at or before ``now`` counts now, one at ``inf`` never."""
        gained: dict[float, int] = {}
        for at, gpus in releases:
            if not math.isinf(at):
                key = max(at, now)
                gained[key] = gained.get(key, 0) + gpus
        profile = cls(now, free + gained.pop(now, 0))
        for at in sorted(gained):
            profile.times.append(at)
            profile.free.append(profile.free[-1] + gained[at])
        return profile

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
        free = self.free
        free[first:last] = map(gpus.__add__, free[first:last])

    def earliest(self, need: int, duration: float, latest: float) -> float | None:
        """The earliest time at or before ``latest`` from which ``need`` GPUs stay free for ``duration``.

        One pass: a start whose window meets a step with too few GPUs fails, and so does every later start up to
        that step (their windows hold it too), so the next start tried is the step after it."""
        times, free = self.times, self.free
        count = len(times)
        start = 0
        while start < count:
            at = times[start]
            if at > latest:
                return None
            until = at + duration
            index = start
            while index < count and times[index] < until and free[index] >= need:
                index += 1
            if index == count or times[index] >= until:
                return at
            start = index + 1
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
    name: str = dataclasses.field(default="slurm", init=False)
    decides_on_events_only: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        for knob in (
            "weight_age",
            "weight_job_size",
            "weight_fairshare",
            "weight_partition",
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
        priority = self.priorities(snapshot, now)
        return sorted(
            snapshot.startable(),
            key=lambda job: (-self._partition(job).priority_tier, -priority[job.job_id], job.submit_time, job.job_id),
        )

    # -- hooks: what the daemon on top changes (``amoebad``); neutral here ------------------------------------

    def slurm_holds(self, job: JobInfo) -> int:
        """GPUs of a running job that Slurm counts as taken: all of them (the daemon counts an elastic job's loans
        as free)."""
        return job.gpus

    def admission_holds(self) -> Callable[[JobInfo], int] | None:
        """GPUs of each running job that an admission held for its request cannot take, when that differs from
        :meth:`slurm_holds` (a second profile is kept for admissions); ``None``: no such difference."""
        return None

    def start_size(self, job: JobInfo, now: float) -> int:
        """The workers a pending job starts with when Slurm starts it: its requested size."""
        return job.requested_workers

    def held_for_admission(self, job: JobInfo, now: float) -> bool:
        """Whether a pending job is held until its requested size is available now (never, under Slurm alone): a
        held job starts only when that size is free now, and holds no reservation."""
        return False

    def lendable_for_admissions(self, snapshot: Snapshot, running: Sequence[JobInfo]) -> float:
        """GPUs a job held for admission may take now beyond what the profile says: no bound here."""
        return math.inf

    def admission_size(
        self, job: JobInfo, snapshot: Snapshot, running: Sequence[JobInfo], taken: int, now: float
    ) -> int | None:
        """The size a job held for admission starts at when it is admitted now (``taken``: GPUs started this round),
        or ``None`` for the size :meth:`start_size` gave."""
        return None

    def after_slurm(self, slurm: SlurmRound) -> dict[str, dict[str, int]]:
        """The pass after Slurm's starts and preemptions: may change ``slurm.targets`` and ``slurm.reasons``; returns
        the placements it chose (job id -> node -> workers). Nothing, under Slurm alone."""
        return {}

    def finish(self, actions: list[SizeAction], snapshot: Snapshot) -> list[SizeAction]:
        """The last look at the realized actions (the daemon keeps growths compact); here they stay as they are."""
        return actions

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The action types it answers with: Slurm's starts and preemptions."""
        return frozenset({Start, Preempt})

    # -- decisions ------------------------------------------------------------------------------------------

    def time_left(self, job: JobInfo) -> float:
        """Seconds the job may still run (never less than one: a job past its limit is about to end)."""
        limit = self.default_time_s if job.time_limit is None else job.time_limit
        return max(limit - job.executed_time, 1.0)

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """Start, reserve and preempt as Slurm would, then run the pass after Slurm's (:meth:`after_slurm`).

        Args:
            snapshot: the cluster now.
            now: the current time (priorities age with it; reservations are placed on its clock).

        Returns:
            Starts and preemptions (and what the pass after Slurm's adds).
        """
        running = [job for job in snapshot.running() if job.shared_with is None]
        profile = self._profile(snapshot, running, now, self.slurm_holds)
        admissions = profile
        admission_holds = self.admission_holds()
        if admission_holds is not None:
            admissions = self._profile(snapshot, running, now, admission_holds)
        targets: dict[str, int] = {}
        reasons: dict[str, str] = {}
        victims: set[str] = set()
        started: list[JobInfo] = []
        reserved = 0
        lendable = self.lendable_for_admissions(snapshot, running)
        taken = 0
        for job in self.queue_order(snapshot, now)[: self.bf_max_job_test]:
            size = self.start_size(job, now)
            need = size * job.gpus_per_worker
            if need > snapshot.total_gpus:
                continue
            duration = self.time_left(job)
            gated = self.held_for_admission(job, now)
            at = (admissions if gated else profile).earliest(need, duration, now + self.bf_window_s)
            if at is not None and gated and need > lendable:
                at = None
            admitted_now = gated and at is not None and at <= now
            spared = self.admission_size(job, snapshot, running, taken, now) if admitted_now else None
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
        fixed = self.after_slurm(SlurmRound(snapshot, now, running, started, victims, targets, reasons))
        by_id = snapshot.by_id()
        changed = {key: size for key, size in targets.items() if size != by_id[key].workers}
        for key, placement in fixed.items():
            if key not in changed and by_id[key].state is JobPhase.RUNNING and placement != by_id[key].placement:
                changed[key] = by_id[key].workers  # a move (the daemon's whole-node starts)
        order = [job for job in running if job.job_id in changed] + started
        return self.finish(realize(snapshot, changed, order, reasons, fixed), snapshot)

    def _profile(
        self, snapshot: Snapshot, running: Sequence[JobInfo], now: float, held: Callable[[JobInfo], int]
    ) -> Profile:
        """Free GPUs over time when each running job holds ``held(job)`` GPUs until its time limit (and its other
        GPUs count as free now)."""
        free = snapshot.free_gpus + sum(job.gpus - min(held(job), job.gpus) for job in running)
        releases = [(now + self.time_left(job), min(held(job), job.gpus)) for job in running]
        return Profile.with_releases(now, free, releases)

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
            trial.add(now + self._partition(victim).grace_time, now + self.time_left(victim), self.slurm_holds(victim))
            chosen.append(victim)
            at = trial.earliest(need, duration, now + grace)
            if at is not None:
                profile.times, profile.free = trial.times, trial.free
                for victim_job in chosen:
                    victims.add(victim_job.job_id)
                    reasons[victim_job.job_id] = f"slurm: preempted for job {job.job_id} of a higher PriorityTier"
                return at
        return None
