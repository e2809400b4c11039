"""The coordinator's membership logic as a pure state machine: events in, assignments out.

:class:`Membership` holds what the coordinator knows about every worker of one job and decides generations. It
does no I/O and reads no clock: the :class:`~slurm_amoeba.runtime.coordinator.Coordinator` feeds it worker events
and the time, and applies the :class:`Action`\\ s it returns (write an assignment, ask the current generation to
end). Tests drive it as a plain object.

A generation's life: ``RUNNING`` until the first worker reports its end (a switch at a step boundary, a graceful
leave, or a failed collective), then ``ENDING`` until every member has reported, is known dead, or the report
deadline passed; then the next generation is formed from the members that stay (in their old order, so rank 0
keeps its rank) plus warm joiners, sized to what the job's global batch accepts.

No wait without a deadline, no retry without progress: when a member of the current generation dies or reports a
failure, the members still forming its process group or waiting for its state are told to give up at once
(:class:`AbortGeneration`); a worker that did not show up to form ``formation_attempts`` generations in a row is
evicted (declared dead, so that its launcher fences it).
"""

from __future__ import annotations

import dataclasses
import enum

from slurm_amoeba.runtime.errors import RuntimeConfigError
from slurm_amoeba.runtime.failures import ErrorReport, FailureClass, user_error_verdict
from slurm_amoeba.runtime.protocol import (
    AssignAction,
    Assignment,
    EventKind,
    GenerationPlan,
    WorkerEvent,
)


class WorkerStatus(str, enum.Enum):
    """A worker's lifecycle as the coordinator sees it (the name of its :data:`Standing`).

    Transitions: ``registered -> ready -> member -> reported -> member`` (next generation) ... and from any state to
    ``left``, ``done``, ``dead`` or ``failed``. A ``reported`` worker put on standby becomes ``ready`` again.
    """

    REGISTERED = "registered"
    READY = "ready"
    MEMBER = "member"
    REPORTED = "reported"
    LEFT = "left"
    DONE = "done"
    DEAD = "dead"
    FAILED = "failed"

    def is_gone(self) -> bool:
        """Whether the worker will never take part again."""
        return self in (WorkerStatus.LEFT, WorkerStatus.DONE, WorkerStatus.DEAD, WorkerStatus.FAILED)


class Phase(str, enum.Enum):
    """The job's phase: ``starting -> running <-> ending`` and finally ``finished`` or ``lost``."""

    STARTING = "starting"
    RUNNING = "running"
    ENDING = "ending"
    FINISHED = "finished"
    LOST = "lost"

    def is_over(self) -> bool:
        """Whether the job has ended."""
        return self in (Phase.FINISHED, Phase.LOST)


@dataclasses.dataclass(frozen=True)
class Present:
    """A worker that takes part or waits to: registered, ready or member (it holds no end report)."""

    status: WorkerStatus

    def __post_init__(self) -> None:
        if self.status is WorkerStatus.REPORTED or self.status.is_gone():
            raise ValueError(f"{self.status.value!r} is no present standing: use Reported or Gone")


@dataclasses.dataclass(frozen=True)
class Reported:
    """A member that reported the end of its generation: it holds that report until the next one forms."""

    report: WorkerEvent
    status: WorkerStatus = dataclasses.field(default=WorkerStatus.REPORTED, init=False)


@dataclasses.dataclass(frozen=True)
class Gone:
    """A worker that will never take part again (left, done, dead or failed), with the end report it sent for the
    ending generation before it went, if it sent one (a failed report still aborts that generation, and its missing
    members still count)."""

    status: WorkerStatus
    report: WorkerEvent | None = None

    def __post_init__(self) -> None:
        if not self.status.is_gone():
            raise ValueError(f"{self.status.value!r} is no gone standing: use Present or Reported")


Standing = Present | Reported | Gone
"""A worker's standing: its status, with the data that status carries."""


@dataclasses.dataclass
class WorkerInfo:
    """What the coordinator knows about one worker.

    Attributes:
        worker_id: the id.
        standing: its lifecycle status with what that status carries (a reported worker's report).
        pid: process id, when registered.
        host: host name, when registered.
        registered_at: when it registered.
        ready_at: when it last became ready.
        last_heartbeat: time of its last heartbeat (or event).
        leave_requested: the coordinator's user asked it to leave at the next step boundary.
        assignments_sent: number of assignments written to it (the next one gets this sequence number).
        reason: why it left, died or failed.
    """

    worker_id: str
    standing: Standing = Present(WorkerStatus.REGISTERED)
    pid: int = 0
    host: str = ""
    registered_at: float = 0.0
    ready_at: float = 0.0
    last_heartbeat: float = 0.0
    leave_requested: bool = False
    assignments_sent: int = 0
    reason: str = ""

    @property
    def status(self) -> WorkerStatus:
        """Its lifecycle status."""
        return self.standing.status

    @property
    def end_report(self) -> WorkerEvent | None:
        """The end report it sent for the ending generation, if it holds one (reported, or gone since)."""
        return None if isinstance(self.standing, Present) else self.standing.report

    def become(self, status: WorkerStatus, reason: str | None = None) -> None:
        """Move to ``status`` (not ``reported``: see :meth:`report`); a worker that goes keeps its end report, one
        that takes part again (ready, member) drops it. ``reason``: why, when given."""
        if status.is_gone():
            self.standing = Gone(status, self.end_report)
        else:
            self.standing = Present(status)
        if reason is not None:
            self.reason = reason

    def report(self, event: WorkerEvent) -> None:
        """Hold ``event``, its end report for the ending generation: reported, or still dead with it (a dead
        worker's late report does not bring it back)."""
        dead = self.status is WorkerStatus.DEAD
        self.standing = Gone(WorkerStatus.DEAD, event) if dead else Reported(event)


@dataclasses.dataclass(frozen=True)
class SetWant:
    """Ask the members of ``generation`` to end it at their next step boundary."""

    generation: int


@dataclasses.dataclass(frozen=True)
class SendAssignment:
    """Write ``assignment`` as the ``seq``-th assignment of ``worker``."""

    worker: str
    seq: int
    assignment: Assignment


@dataclasses.dataclass(frozen=True)
class AbortGeneration:
    """Tell the members of ``generation`` that it cannot form: give up forming its group or waiting for its state."""

    generation: int
    reason: str


Action = SetWant | SendAssignment | AbortGeneration


@dataclasses.dataclass(frozen=True)
class GenerationRecord:
    """History: one formed generation.

    Attributes:
        plan: the plan.
        formed_at: when it was formed (coordinator clock).
        ended_at: when its first end report arrived (``None`` while it runs).
        end_reason: ``switch``, ``failure``, ``finished`` or empty.
    """

    plan: GenerationPlan
    formed_at: float
    ended_at: float | None = None
    end_reason: str = ""


@dataclasses.dataclass(frozen=True)
class MembershipConfig:
    """Settings of the membership logic.

    Attributes:
        initial_workers: ready workers needed to form the first generation.
        max_workers: the job never runs with more members.
        report_timeout_s: after a generation's first end report, how long to wait for the other members.
        heartbeat_timeout_s: a worker whose heartbeat is older than this is declared dead.
        admit_batch_window_s: while other joiners are still warming up, ready joiners wait for them up to this long,
            so that workers added together join in one switch (one pause) instead of one switch each.
        formation_attempts: a worker named missing by the members of this many generations in a row that failed
            to form is evicted.
    """

    initial_workers: int = 1
    max_workers: int = 1 << 16
    report_timeout_s: float = 10.0
    heartbeat_timeout_s: float = 10.0
    admit_batch_window_s: float = 30.0
    formation_attempts: int = 3

    def __post_init__(self) -> None:
        if not 1 <= self.initial_workers <= self.max_workers:
            raise RuntimeConfigError(
                f"initial_workers={self.initial_workers} must be between 1 and max_workers={self.max_workers}"
            )
        if self.report_timeout_s <= 0 or self.heartbeat_timeout_s <= 0:
            raise RuntimeConfigError(
                f"report_timeout_s={self.report_timeout_s} and heartbeat_timeout_s={self.heartbeat_timeout_s} "
                "must be positive numbers of seconds"
            )
        if self.formation_attempts < 1:
            raise RuntimeConfigError(f"formation_attempts={self.formation_attempts} must be at least 1")


@dataclasses.dataclass(frozen=True, eq=False)
class Survivor:
    """A member that reported the end of its generation and stays a candidate for the next one, with its report.

    Attributes:
        info: the worker.
        report: its end report (the step it is at, the step it last committed).
    """

    info: WorkerInfo
    report: WorkerEvent

    def holds_state(self) -> bool:
        """Whether it holds a commit (a reporter without one never received the state: its generation failed while
        forming)."""
        return self.report.committed_step >= 0


class Membership:
    """Pure membership state machine of one job (see the module docstring).

    Args:
        config: the settings.
    """

    def __init__(self, config: MembershipConfig) -> None:
        self.config = config
        self.workers: dict[str, WorkerInfo] = {}
        self.phase = Phase.STARTING
        self.generation = 0
        self.plan: GenerationPlan | None = None
        self.history: list[GenerationRecord] = []
        self.allowed_sizes: tuple[int, ...] = ()
        self.lost_reason = ""
        self.errors: list[ErrorReport] = []  # every worker's error event, oldest first
        self.failure: FailureClass | None = None  # set when a failure that a retry repeats ended the job
        self._want_sent = 0
        self._abort_sent = 0
        self._no_show_streak: dict[str, int] = {}
        self._leave_on_arrival: set[str] = set()  # asked to leave before they registered
        self._ending_since = 0.0
        self._actions: list[Action] = []

    # ----------------------------------------------------------------------------------------------- inputs

    def _info(self, worker_id: str, now: float) -> WorkerInfo:
        info = self.workers.get(worker_id)
        if info is None:
            info = WorkerInfo(worker_id=worker_id, registered_at=now, last_heartbeat=now)
            info.leave_requested = worker_id in self._leave_on_arrival
            self.workers[worker_id] = info
        return info

    def _assign(self, info: WorkerInfo, assignment: Assignment) -> None:
        self._actions.append(SendAssignment(info.worker_id, info.assignments_sent, assignment))
        info.assignments_sent += 1

    def handle(self, event: WorkerEvent, now: float) -> bool:
        """Take in one worker event.

        Only members of the current generation may change what members share: a ``ready`` event of another worker
        after the first generation formed makes it ready, but its ``allowed_sizes`` are not taken.

        Args:
            event: the event.
            now: the coordinator's clock.

        Returns:
            False when a part of the event was refused (the caller counts it), else True.
        """
        info = self._info(event.worker, now)
        info.last_heartbeat = max(info.last_heartbeat, now)
        kind = event.kind
        if kind is EventKind.REGISTERED:
            info.pid, info.host = event.pid, event.host
            if not info.status.is_gone():
                info.become(WorkerStatus.REGISTERED)
        elif kind is EventKind.READY:
            shares = self.phase is Phase.STARTING or event.worker in self.live_members()
            if event.allowed_sizes and event.allowed_sizes != self.allowed_sizes and not shares:
                self._make_ready(info, now)
                return False
            if event.allowed_sizes:
                self.allowed_sizes = event.allowed_sizes
            self._make_ready(info, now)
        elif kind is EventKind.REPORT:
            self._on_report(info, event, now)
        elif kind is EventKind.LEFT:
            info.become(WorkerStatus.LEFT, event.message or "left")
        elif kind is EventKind.ERROR:
            info.become(WorkerStatus.FAILED, event.message)
            self.errors.append(ErrorReport.of(event, self.generation))
        elif kind is EventKind.DONE:
            info.become(WorkerStatus.DONE)
            if self.plan is not None and all(self.workers[m].status is WorkerStatus.DONE for m in self.plan.members):
                self._finish(now, "finished", Phase.FINISHED)
        return True

    def _make_ready(self, info: WorkerInfo, now: float) -> None:
        info.become(WorkerStatus.READY)
        info.ready_at = now
        if self.phase.is_over():
            self._assign(info, Assignment(AssignAction.FINISH, reason=f"the job is {self.phase.value}"))
        elif info.leave_requested:
            info.become(WorkerStatus.LEFT)
            self._assign(info, Assignment(AssignAction.LEAVE, reason="leave requested"))

    def _on_report(self, info: WorkerInfo, event: WorkerEvent, now: float) -> None:
        plan = self.plan
        current = plan is not None and event.generation == self.generation and info.worker_id in plan.members
        if current and self.phase in (Phase.RUNNING, Phase.ENDING):
            if self.phase is Phase.RUNNING:
                self.phase, self._ending_since = Phase.ENDING, now
                record = self.history[-1]
                self.history[-1] = dataclasses.replace(
                    record, ended_at=now, end_reason="failure" if event.failed else "switch"
                )
            info.report(event)
            if event.leaving:  # decided with the others' reports: it may first hand the state to joiners
                info.leave_requested = True
            return
        # A report for a generation that has already moved on: the worker missed the deadline but is alive and
        # warm, so it waits as a joiner (it will receive fresh state when admitted).
        if event.leaving:
            info.become(WorkerStatus.LEFT, "left after its generation ended")
        else:
            self._make_ready(info, now)

    def heartbeat(self, worker_id: str, when: float) -> None:
        """Record a heartbeat time read from the store."""
        info = self.workers.get(worker_id)
        if info is not None:
            info.last_heartbeat = max(info.last_heartbeat, when)

    def request_leave(self, worker_id: str, *, unstarted: bool = False) -> None:
        """Ask a worker to leave at the next step boundary (or at once, if it is not a member).

        Args:
            worker_id: the worker.
            unstarted: the worker may not have registered yet (its launcher started it): if it has not, it is
                told to leave as soon as it is ready, instead of joining.

        Raises:
            KeyError: the worker is unknown (and not ``unstarted``) or already gone.
        """
        info = self.workers.get(worker_id)
        if info is None and unstarted:
            self._leave_on_arrival.add(worker_id)
            return
        if info is None or info.status.is_gone():
            known = sorted(w for w, i in self.workers.items() if not i.status.is_gone())
            raise KeyError(f"worker {worker_id!r} is not a live worker of this job; live workers: {known}")
        info.leave_requested = True
        if info.status is WorkerStatus.READY:
            info.become(WorkerStatus.LEFT, "leave requested while waiting")
            self._assign(info, Assignment(AssignAction.LEAVE, reason="leave requested"))

    def mark_dead(self, worker_id: str, reason: str) -> None:
        """Record that a worker's process is gone (seen by its launcher, or a stale heartbeat).

        Args:
            worker_id: the worker.
            reason: why, for the history.
        """
        info = self.workers.get(worker_id)
        if info is None:  # died before it could register
            info = self.workers[worker_id] = WorkerInfo(worker_id=worker_id)
        if info.status.is_gone():  # the first reason stays (e.g. an eviction, not the fencing kill after it)
            return
        info.become(WorkerStatus.DEAD, reason)

    # ----------------------------------------------------------------------------------------------- decisions

    def _target_size(self, available: int) -> int:
        limit = min(self.config.max_workers, available)
        if self.allowed_sizes:
            fitting = [s for s in self.allowed_sizes if s <= limit]
            return max(fitting) if fitting else 0
        return limit

    def _ready_pool(self, exclude: set[str]) -> list[WorkerInfo]:
        pool = [i for i in self.workers.values() if i.status is WorkerStatus.READY and i.worker_id not in exclude]
        return sorted(pool, key=lambda i: (i.ready_at, i.worker_id))

    def decide(self, now: float) -> list[Action]:
        """Advance the state machine to ``now`` and return what the coordinator must do.

        Args:
            now: the coordinator's clock.

        Returns:
            The actions, in order.
        """
        for info in self.workers.values():
            alive = info.status in (
                WorkerStatus.REGISTERED,
                WorkerStatus.READY,
                WorkerStatus.MEMBER,
                WorkerStatus.REPORTED,
            )
            if alive and now - info.last_heartbeat > self.config.heartbeat_timeout_s:
                info.become(WorkerStatus.DEAD, f"no heartbeat for {now - info.last_heartbeat:.1f} s")
        self._maybe_end_on_failure(now)
        if self.phase is Phase.STARTING:
            pool = self._ready_pool(set())
            warming = any(i.status is WorkerStatus.REGISTERED for i in self.workers.values())
            # Start with the initial workers, or with every worker still alive once one of them died early.
            lost_one = any(i.status.is_gone() for i in self.workers.values())
            if len(pool) >= self.config.initial_workers or (pool and lost_one and not warming):
                size = self._target_size(len(pool))
                if size:
                    self._form(pool[:size], survivors=[], now=now, reason="first generation")
            elif len(self.workers) >= self.config.initial_workers and all(
                i.status.is_gone() for i in self.workers.values()
            ):  # no wait without an end: nobody is left to start the job (e.g. the script fails at import)
                self._finish(now, "every worker exited before the first generation formed", Phase.LOST)
        elif self.phase is Phase.RUNNING:
            self._maybe_abort()
            self._maybe_want(now)
        elif self.phase is Phase.ENDING:
            self._maybe_abort()
            self._maybe_form_next(now)
        actions, self._actions = self._actions, []
        return actions

    def _maybe_end_on_failure(self, now: float) -> None:
        """End the job (lost) when its members' errors are ones a retry repeats (runtime/failures.py)."""
        if self.plan is None or self.phase.is_over() or not self.errors:
            return
        current = [e for e in self.errors if e.generation == self.generation]
        earlier = [e for e in self.errors if e.generation != self.generation]
        verdict = user_error_verdict(current, self.plan.members, earlier)
        if verdict is not None:
            self.failure = verdict.failure
            self._finish(now, verdict.reason, Phase.LOST)

    def _maybe_abort(self) -> None:
        """Release the members forming (or receiving the state of) a generation that lost a member."""
        if self.plan is None or self._abort_sent == self.generation:
            return
        dead = [m for m in self.plan.members if self.workers[m].status in (WorkerStatus.DEAD, WorkerStatus.FAILED)]
        failed = [
            m
            for m in self.plan.members
            if (report := self.workers[m].end_report) is not None
            and report.generation == self.generation
            and report.failed
        ]
        if dead or failed:
            self._abort_sent = self.generation
            why = f"member {dead[0]} is gone" if dead else f"member {failed[0]} failed"
            self._actions.append(AbortGeneration(self.generation, why))

    def _evict_no_shows(self, reports: list[WorkerEvent]) -> None:
        """Count, per worker, the generations in a row that failed to form without it; evict at the limit."""
        named = {w for r in reports for w in r.missing}
        if not named:
            if reports:  # the generation formed (or failed later): a fresh start for everyone
                self._no_show_streak.clear()
            return
        self._no_show_streak = {w: self._no_show_streak.get(w, 0) + 1 for w in named}
        for worker_id, streak in self._no_show_streak.items():
            info = self.workers.get(worker_id)
            if streak < self.config.formation_attempts or info is None or info.status.is_gone():
                continue
            info.become(WorkerStatus.DEAD, f"evicted: did not show up to form {streak} generations in a row")
            self._assign(info, Assignment(AssignAction.LEAVE, reason=info.reason))

    def _maybe_want(self, now: float) -> None:
        assert self.plan is not None
        members = [self.workers[m] for m in self.plan.members]
        if all(m.status.is_gone() for m in members):
            # Training ended when one member finished it; members that died at the very end do not undo that.
            if any(m.status is WorkerStatus.DONE for m in members):
                self._finish(now, "finished", Phase.FINISHED)
            else:
                self._finish(now, f"every member of generation {self.generation} is gone", Phase.LOST)
            return
        if self._want_sent == self.generation:
            return
        staying = [m for m in members if not m.leave_requested and not m.status.is_gone()]
        pool = self._ready_pool(set(self.plan.members))
        target = self._target_size(len(staying) + len(pool))
        warming = any(i.status is WorkerStatus.REGISTERED for i in self.workers.values())
        waited = now - min((i.ready_at for i in pool), default=now)
        admit = bool(pool) and target > len(staying) and (not warming or waited >= self.config.admit_batch_window_s)
        if admit or any(m.leave_requested for m in members):
            self._want_sent = self.generation
            self._actions.append(SetWant(self.generation))

    def _maybe_form_next(self, now: float) -> None:
        assert self.plan is not None
        members = [self.workers[m] for m in self.plan.members]
        waiting = [m for m in members if m.status is WorkerStatus.MEMBER]
        if waiting and now - self._ending_since < self.config.report_timeout_s:
            return
        for info in waiting:
            info.become(WorkerStatus.DEAD, f"did not report within report_timeout_s={self.config.report_timeout_s}")
        reports = [r for m in members if (r := m.end_report) is not None and r.generation == self.generation]
        self._evict_no_shows(reports)
        # A member that died mid-step may have left the others' state half-updated: roll back. A member that
        # failed with an error of its own (e.g. a joiner whose model does not match) left the state untouched.
        rollback = any(r.failed for r in reports) or any(m.status is WorkerStatus.DEAD for m in members)
        survivors = [Survivor(m, m.standing.report) for m in members if isinstance(m.standing, Reported)]
        handover = self._handover(survivors)
        leavers = [s.info for s in survivors if s.info.leave_requested and s is not handover]
        # Every member leaves here and none failed (a stop, a time limit): the state would be lost, so each first
        # writes its shard of a final disk checkpoint (runtime/checkpoint.py; nothing when the job writes none).
        final = not rollback and len(leavers) == len(members)
        for info in leavers:
            info.become(WorkerStatus.LEFT, "leave requested")
            self._assign(info, Assignment(AssignAction.LEAVE, reason="leave requested", checkpoint=final))
        survivors = [s for s in survivors if s.info not in leavers]
        holds = any(s.holds_state() for s in survivors)
        # A generation that started from the workers' initial state (no start step: the first one) and failed before
        # any member committed (the runtime commits as it enters a generation) trained nothing: start it over.
        fresh = not holds and self.plan.start_step is None and bool(survivors)
        if not holds and not fresh:
            self._finish(now, f"no worker of generation {self.generation} that holds the state is left", Phase.LOST)
            return
        pool = self._ready_pool({s.info.worker_id for s in survivors})
        size = self._target_size(len(survivors) + len(pool))
        if size == 0:
            self._finish(now, f"no allowed world size fits {len(survivors)} workers", Phase.LOST)
            return
        if fresh:  # nothing to roll back to, and nobody to hand over: no survivor holds a commit
            reason, rollback = "first generation again: the last one failed before it trained", False
        else:
            reason = f"{handover.info.worker_id} hands the state over before it leaves" if handover else ""
        chosen = ([s.info for s in survivors] + pool)[:size]
        self._form(chosen, survivors=survivors, now=now, reason=reason, rollback=rollback)

    def _handover(self, survivors: list[Survivor]) -> Survivor | None:
        """A leaving member kept for one more generation, as the source that hands the state to warm joiners, when
        every survivor holding the state is leaving (else the job would be lost); it leaves at the next boundary."""
        holders = [s for s in survivors if s.holds_state()]
        if not holders or not all(s.info.leave_requested for s in holders):
            return None
        if not self._ready_pool({s.info.worker_id for s in survivors}):
            return None
        return max(holders, key=lambda s: (s.report.committed_step, s.report.step))

    def _form(
        self,
        chosen: list[WorkerInfo],
        *,
        survivors: list[Survivor],
        now: float,
        reason: str,
        rollback: bool = False,
    ) -> None:
        # A reporter without a commit never received the state (its generation failed while forming): a joiner.
        staying = [s for s in survivors if s.info in chosen and s.holds_state()]
        joiners = [c.worker_id for c in chosen if c not in [s.info for s in staying]]
        source: WorkerInfo
        if staying:
            if rollback:
                first = max(staying, key=lambda s: (s.report.committed_step, -staying.index(s)))
                start: int | None = first.report.committed_step
            else:
                first = staying[0]
                start = first.report.step
            source = first.info
            # A member at another step than the source's holds no valid state either: it receives it like a joiner.
            at = {s.info.worker_id: s.report.committed_step if rollback else s.report.step for s in staying}
            staying_infos = [s.info for s in staying]
            joiners = [c.worker_id for c in chosen if c not in staying_infos or at[c.worker_id] != start]
            sync = bool(joiners)
        else:
            source, start, sync = chosen[0], None, len(chosen) > 1
            joiners = [c.worker_id for c in chosen[1:]]
        if not reason:
            parts = []
            if rollback:
                parts.append("rollback after a failure")
            if joiners:
                parts.append(f"{len(joiners)} joined")
            reason = ", ".join(parts) or "resize"
        self.generation += 1
        plan = GenerationPlan(
            generation=self.generation,
            members=tuple(c.worker_id for c in chosen),
            hosts=tuple(c.host for c in chosen),
            source=source.worker_id,
            joiners=tuple(joiners),
            rollback=rollback,
            sync=sync,
            start_step=start,
            reason=reason,
        )
        self.plan = plan
        self.phase = Phase.RUNNING
        self.history.append(GenerationRecord(plan=plan, formed_at=now))
        for info in chosen:
            info.become(WorkerStatus.MEMBER)
            self._assign(info, Assignment(AssignAction.JOIN, plan=plan))
        for survivor in survivors:
            if survivor.info not in chosen:
                survivor.info.become(WorkerStatus.READY)
                survivor.info.ready_at = now
                self._assign(survivor.info, Assignment(AssignAction.STANDBY, reason="the global batch does not fit"))

    def _finish(self, now: float, reason: str, phase: Phase) -> None:
        self.phase = phase
        if phase is Phase.LOST:
            self.lost_reason = reason
        if self.history and self.history[-1].ended_at is None:
            self.history[-1] = dataclasses.replace(self.history[-1], ended_at=now, end_reason=phase.value)
        for info in self.workers.values():
            if info.status in (WorkerStatus.READY, WorkerStatus.REPORTED):
                self._assign(info, Assignment(AssignAction.FINISH, reason=f"the job is {phase.value}: {reason}"))

    def live_members(self) -> list[str]:
        """Members of the current generation that are not gone."""
        if self.plan is None:
            return []
        return [m for m in self.plan.members if not self.workers[m].status.is_gone()]
