"""How an opportunistic worker paces itself so that the job that owns a shared device keeps its speed (AntMan's
computation mechanism).

A worker of an opportunistic job (a *sharer*) trains on a device a guaranteed job owns. After each of its own steps
it sleeps for a while, so that it computes only a fraction of the time (its *duty*). :class:`Pacer` chooses the
duty by feedback from the guaranteed job's own step times, never by a fixed duty cycle: whenever the guaranteed job's
recent speed falls under ``target`` of its exclusive speed (plus a margin), the duty is cut multiplicatively; while
it holds, the duty grows additively (AIMD, as TCP's congestion window). The exclusive speed is learned from the
guaranteed job's steps that ran while the sharer did not compute: before the sharer's first step, and inside its
pauses (:func:`exclusive_step_times`).

The duty alone cannot choose *when* the sharer computes: a duty cycle placed blindly against the guaranteed job's
phases overlaps its compute in proportion to the duty, so holding 0.95 of its speed leaves the sharer a few per cent.
The first mechanism is therefore a **gate** (:func:`may_compute`): the guaranteed job publishes whether it is
computing right now and its recent busy and idle durations (:class:`OwnerActivity`, kept by :class:`ActivityLog`);
the sharer cuts its step into chunks (its micro-batches, then its optimizer step) and starts one only while the
guaranteed job is idle and expected to stay idle for the chunk's length (:func:`wait_s` says how long to sleep
meanwhile). The AIMD duty stays as the safety net: with a live gate it starts at 1 and is cut only when the
guaranteed job's step times still say it is slowed.

The guaranteed job's step times and activity come from the files it writes about itself
(:mod:`~slurm_amoeba.runtime.share`); this module only decides. It is pure (no torch, no I/O, the clock passed
in) and pinned by tables in ``tests/unit/runtime/test_pacing.py`` (DESIGN.md, layer ``runtime/``, worker side).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import deque
from collections.abc import Sequence

from slurm_amoeba.runtime.errors import RuntimeConfigError


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One step of the guaranteed job: when it ended (wall clock, seconds) and how long it took."""

    end: float
    seconds: float

    @property
    def start(self) -> float:
        """When the step began."""
        return self.end - self.seconds


def exclusive_step_times(
    steps: Sequence[StepRecord], first_compute: float | None, quiet: Sequence[tuple[float, float]]
) -> list[float]:
    """The guaranteed job's step times that the sharer cannot have slowed.

    A step counts when it ended before the sharer first computed, or when it ended inside one of the sharer's
    pauses at least two typical steps (twice the median) after the pause began, so that it began inside the pause
    too. Which steps count depends on where they end, not on how long they took: asking that a step lie wholly
    inside a pause would favour short steps and make the exclusive step time look shorter than it is.

    Args:
        steps: the guaranteed job's recent steps.
        first_compute: when the sharer first computed (``None``: not yet: every step counts).
        quiet: intervals ``(start, end)`` in which the sharer slept.

    Returns:
        The durations of the steps that count, in the order given.
    """
    if not steps:
        return []
    guard = 2 * statistics.median(s.seconds for s in steps)
    kept = []
    for step in steps:
        before = first_compute is None or step.end <= first_compute
        if before or any(low + guard <= step.end <= high for low, high in quiet):
            kept.append(step.seconds)
    return kept


@dataclasses.dataclass(frozen=True)
class PacingConfig:
    """Settings of the pacing controller.

    Attributes:
        target: the share of its exclusive speed the guaranteed job must keep (0.95: at most 5 % slower).
        margin: the controller aims this much above ``target``, so that noise does not cross it. Once gated (the
            gate keeps the sharer out of the guaranteed job's compute) the duty is cut only under ``target``: at
            once more than ``margin`` under it, else on the second decision in a row under it.
        backoff: on a violation the duty is multiplied by this (0 < backoff < 1).
        increase: while the guaranteed job keeps its speed, the duty grows by this per decision.
        min_duty: the least duty (the sharer never stops entirely: it must measure its own step time).
        window: the fewest new steps of the guaranteed job a decision judges (their mean step time).
        max_pause_s: the longest pause after one step (a new directive ends a pause at once, see
            :class:`~slurm_amoeba.runtime.shared_device.SharedDevice`; the limit keeps the sharer measuring its own
            step time).
        poll_s: the gate's shortest sleep between two looks at the guaranteed job's activity.
        long_idle_s: an idle spell at least this long (and four of the guaranteed job's short recent ones) is
            not a gap between its steps: it stopped, and the gate opens.
        stale_s: a busy flag older than this (and ten of the guaranteed job's mean busy spells) is stale (the job
            hung or died while computing), and the gate opens; the duty still guards the job.
        reprobe_ratio: a gated sharer that measures the guaranteed job faster than this times its exclusive speed
            takes the baseline for stale (learned from warm-up steps, or before the load changed) and probes again.
        reprobe_every: a gated sharer probes again after this many decisions in any case (its baseline follows the
            load of the machine).
    """

    target: float = 0.95
    margin: float = 0.02
    backoff: float = 0.5
    increase: float = 0.1
    min_duty: float = 0.02
    window: int = 10
    max_pause_s: float = 5.0
    poll_s: float = 0.001
    long_idle_s: float = 0.05
    stale_s: float = 1.0
    reprobe_ratio: float = 1.25
    reprobe_every: int = 30

    def __post_init__(self) -> None:
        checks = (
            ("target", self.target, 0.0 < self.target <= 1.0, "a fraction in (0, 1]"),
            ("margin", self.margin, 0.0 <= self.margin < 1.0, "a fraction in [0, 1)"),
            ("backoff", self.backoff, 0.0 < self.backoff < 1.0, "a factor in (0, 1)"),
            ("increase", self.increase, 0.0 < self.increase <= 1.0, "a step in (0, 1]"),
            ("min_duty", self.min_duty, 0.0 < self.min_duty <= 1.0, "a fraction in (0, 1]"),
            ("window", self.window, self.window >= 1, "at least 1"),
            ("max_pause_s", self.max_pause_s, self.max_pause_s > 0, "positive"),
            ("poll_s", self.poll_s, 0 < self.poll_s <= 0.1, "positive, at most 0.1 s"),
            ("long_idle_s", self.long_idle_s, self.long_idle_s > 0, "positive"),
            ("stale_s", self.stale_s, self.stale_s > 0, "positive"),
            ("reprobe_ratio", self.reprobe_ratio, self.reprobe_ratio > 1.0, "above 1"),
            ("reprobe_every", self.reprobe_every, self.reprobe_every >= 1, "at least 1"),
        )
        for name, value, ok, what in checks:
            if not ok:
                raise RuntimeConfigError(f"pacing {name}={value!r} is invalid: it must be {what}")


@dataclasses.dataclass
class Pacer:
    """The AIMD controller of a sharer's duty (see the module docstring).

    Args:
        config: its settings.
        duty: the starting duty; the least one by default (a sharer starts gently and earns its share).

    Attributes:
        duty: the fraction of time the sharer computes, ``min_duty`` to 1.
        baseline_s: the guaranteed job's exclusive step time as learned so far (``None``: not yet known).
        ratio: the guaranteed job's last measured speed over its exclusive speed (``None``: not measured yet).
        violations: decisions at which the guaranteed job was under ``target``.
        decisions: decisions taken.
        ratio_mean: the mean of ``ratio`` over them (``None`` before the first).
        gated: the sharer computes only in the guaranteed job's idle time (:meth:`engage_gate`).
    """

    config: PacingConfig = dataclasses.field(default_factory=PacingConfig)
    duty: float = -1.0
    baseline_s: float | None = None
    ratio: float | None = None
    violations: int = 0
    decisions: int = 0
    ratio_mean: float | None = None
    gated: bool = False
    _last_seen: float = dataclasses.field(default=float("-inf"), repr=False)
    _was_below: bool = dataclasses.field(default=False, repr=False)

    def __post_init__(self) -> None:
        if self.duty < 0:
            self.duty = self.config.min_duty
        if not self.config.min_duty <= self.duty <= 1.0:
            raise RuntimeConfigError(f"duty={self.duty!r} is invalid: it must be in [{self.config.min_duty}, 1]")

    def bound(self, pace_bound: float, configured: PacingConfig) -> None:
        """Keep the guaranteed job at ``1 - pace_bound`` of its exclusive speed from the next decision on (a share
        directive's bound); ``pace_bound`` 0 restores ``configured``'s target.

        Raises:
            RuntimeConfigError: ``pace_bound`` is not a fraction from 0 to under 1.
        """
        target = configured.target if pace_bound == 0 else 1.0 - pace_bound
        self.config = dataclasses.replace(self.config, target=target)

    def engage_gate(self) -> None:
        """The guaranteed job publishes its activity and the sharer computes only in its idle time: the duty starts
        at 1 (the gate already keeps the sharer out of the job's compute) and falls only on measured slowdowns.
        Nothing changes when it is already engaged."""
        if not self.gated:
            self.gated = True
            self.duty = 1.0

    def learn_baseline(self, exclusive: Sequence[float]) -> None:
        """Set the exclusive step time to the mean of ``exclusive`` (the median once gated; nothing when it is
        empty): the statistic a decision compares it with, so that step times skewed by other load (a few long
        steps) weigh the same on both sides."""
        if exclusive:
            self.baseline_s = self._center(exclusive)

    def decide(self, steps: Sequence[StepRecord]) -> float:
        """One decision from the guaranteed job's recent steps: cut the duty if it is slowed, else grow it.

        A decision needs at least ``window`` steps newer than those of the previous decision and a known baseline;
        until then the duty stays. It judges every new step (the guaranteed job's throughput since the last
        decision: the mean step time, so a few slowed steps count), never the same step twice, and not only the
        latest ones, which would be those that ran beside the sharer's own last step. A gated pacer forgets its
        baseline, and so probes at its next pause, when the job is measured implausibly fast (``reprobe_ratio``)
        and every ``reprobe_every`` decisions.

        Args:
            steps: the guaranteed job's recent steps, oldest first.

        Returns:
            The new duty.
        """
        fresh = [s for s in steps if s.end > self._last_seen]
        if len(fresh) < self.config.window or self.baseline_s is None:
            return self.duty
        self._last_seen = fresh[-1].end
        recent = self._center([s.seconds for s in fresh])
        self.ratio = self.baseline_s / recent if recent > 0 else 1.0
        self.decisions += 1
        self.ratio_mean = (
            self.ratio if self.ratio_mean is None else self.ratio_mean + (self.ratio - self.ratio_mean) / self.decisions
        )
        if self.gated and (self.ratio > self.config.reprobe_ratio or self.decisions % self.config.reprobe_every == 0):
            self.baseline_s = None  # the next pause is a probe (pause_s); the duty stays
            return self.duty
        below = self.ratio < self.config.target
        if below:
            self.violations += 1
        if self.gated:
            # the gate keeps the sharer out of the job's compute: a dip within the margin, once, is the machine's
            # noise; the duty is cut on a deeper one, or on a second in a row
            cut = self.ratio < self.config.target - self.config.margin or (below and self._was_below)
        else:
            cut = self.ratio < self.config.target + self.config.margin
        self._was_below = below
        if cut:
            self.duty = max(self.config.min_duty, self.duty * self.config.backoff)
        elif not below:
            self.duty = min(1.0, self.duty + self.config.increase)
        return self.duty

    def _center(self, seconds: Sequence[float]) -> float:
        """The step time a decision compares: the mean (the job's throughput: a few slowed steps count); once
        gated, the median, since the gate bounds each overlap and the safety net watches for a slowdown of the
        typical step, which a few steps delayed by other processes on the machine do not move."""
        return statistics.median(seconds) if self.gated else statistics.fmean(seconds)

    def pause_s(self, busy_s: float) -> float:
        """How long to sleep after a step that computed for ``busy_s`` so that computing is ``duty`` of the time.

        A gated sharer that does not know the guaranteed job's exclusive step time yet pauses ``max_pause_s`` (a
        probe: its caller ends it once the job's steps inside it gave the baseline), so that the safety net can
        judge from the next decision on."""
        if self.gated and self.baseline_s is None:
            return self.config.max_pause_s
        if busy_s <= 0:
            return 0.0
        return min(self.config.max_pause_s, busy_s * (1.0 / self.duty - 1.0))


@dataclasses.dataclass(frozen=True)
class OwnerActivity:
    """What the guaranteed job says about its device use right now (the sharer's gate reads it).

    Attributes:
        busy: it is computing (between fetching its step's first micro-batch and the end of its step).
        since: when it last became busy or idle (wall clock, seconds).
        busy_s: the mean of its recent busy spells (0: none yet).
        idle_s: a short one of its recent idle spells (:class:`ActivityLog`; 0: none yet): the room a sharer counts
            on.
        pid: the process that writes it.
    """

    busy: bool
    since: float
    busy_s: float = 0.0
    idle_s: float = 0.0
    pid: int = 0


@dataclasses.dataclass
class ActivityLog:
    """The guaranteed job's side of the gate: its transitions between computing and idling, and the durations of
    its recent spells of each (the last ``keep``): it publishes the mean busy spell and a short idle spell.

    Attributes:
        current: what it published last (``None``: it has not marked itself busy yet).
    """

    pid: int
    keep: int = 8
    current: OwnerActivity | None = None
    _busy: deque[float] = dataclasses.field(default_factory=deque, repr=False)
    _idle: deque[float] = dataclasses.field(default_factory=deque, repr=False)

    def mark(self, busy: bool, now: float) -> OwnerActivity | None:
        """Record that the job is busy (or idle) from ``now`` on.

        Returns:
            The activity to publish when this is a transition; ``None`` when nothing changed (or the job marks
            itself idle before it ever computed: a job that never marks itself busy publishes nothing).
        """
        current = self.current
        if (current is None and not busy) or (current is not None and current.busy == busy):
            return None
        if current is not None:
            spells = self._busy if current.busy else self._idle
            spells.append(max(0.0, now - current.since))
            if len(spells) > self.keep:
                spells.popleft()
        busy_s = statistics.fmean(self._busy) if self._busy else 0.0
        self.current = OwnerActivity(busy, now, busy_s, self._short_idle(), self.pid)
        return self.current

    def _short_idle(self) -> float:
        """A short one of the recent idle spells: the second shortest once there are 4 (one unusually short spell
        does not close the gate), the shortest before; 0 before the first."""
        spells = sorted(self._idle)
        return spells[1] if len(spells) >= 4 else min(spells, default=0.0)


def may_compute(activity: OwnerActivity | None, now: float, chunk_s: float, config: PacingConfig) -> bool:
    """Whether a sharer may start a chunk of work expected to take ``chunk_s`` now (AntMan's yield, between the
    sharer's micro-batches).

    It may when the guaranteed job publishes nothing (``None``: the duty alone paces it), when the job is idle and
    its short recent idle spell leaves room for the chunk (a chunk longer than that spell: while the spell is in
    its first half, so that the overlap is bounded and the sharer still progresses), when the job has been idle
    far longer than between its steps (it stopped or ended), or when its busy flag is stale (see
    :class:`PacingConfig`). Never while a fresh flag says busy.
    """
    if activity is None:
        return True
    if activity.busy:
        return not owner_busy(activity, now, config)
    elapsed = now - activity.since
    if elapsed >= max(config.long_idle_s, 4 * activity.idle_s):
        return True
    if chunk_s > activity.idle_s:  # no spell holds it: it starts in a spell's first half, or it would never run
        return elapsed <= activity.idle_s / 2
    return activity.idle_s - elapsed >= chunk_s


def owner_busy(activity: OwnerActivity | None, now: float, config: PacingConfig) -> bool:
    """Whether the guaranteed job computes now by a fresh flag (a busy flag older than ``stale_s`` and ten of its
    mean busy spells is stale: the job hung or died while computing). What a sharer checks between the layers of
    a chunk it already started."""
    if activity is None or not activity.busy:
        return False
    return now - activity.since <= max(config.stale_s, 10 * activity.busy_s)


def wait_s(activity: OwnerActivity | None, now: float, config: PacingConfig) -> float:
    """How long a sharer that :func:`may_compute` refused sleeps before it looks again: until the guaranteed job is
    expected to become idle (its mean busy spell after it became busy; after an idle spell too short to use, the
    next one), at least ``poll_s``, at most 20 ``poll_s`` (a look is cheap; a late one wastes the room)."""
    if activity is None:
        return config.poll_s
    left = activity.since + activity.busy_s - now
    if not activity.busy:
        left += activity.idle_s
    return min(20 * config.poll_s, max(config.poll_s, left - config.poll_s))
