"""The agent's decisions as a pure function: what one round observed in, the actions to apply out.

Each round the job's agent (:mod:`slurm_amoeba.agent.agent`) observes — the target size it was asked for, its worker
groups, its satellites as Slurm shows them, the coordinator's view of the workers — and calls :func:`plan`, which
returns the :data:`Action`\\ s to apply, in order. Like :mod:`slurm_amoeba.runtime.membership` it does no I/O and
reads no clock (``now`` is part of the :class:`Observation`); the tables in ``tests/unit/agent/test_plan.py`` drive it.

What a round decides, in this order (DESIGN.md, control flow: the agent's part of a resize):

1. **the end**: a signal asked the job to stop, the coordinator ended the job on a failure that a retry repeats (a
   user error on every member, or again after a rollback: :mod:`slurm_amoeba.runtime.failures`), or the main worker
   group ended -> the job ends, nothing else; but Slurm's warning before the time limit (``USR1``) saves the state
   and requeues the job (:class:`Requeue`), and a job that lost every worker holding its state restarts from its
   newest disk checkpoint while restarts are left (:class:`RestartFromCheckpoint`);
2. **satellites**, when Slurm was polled this round: a pending satellite that Slurm started runs now; one that
   ended (preempted, cancelled, failed, forgotten by squeue) is released;
3. **training over** (finished or lost) while the main worker step still runs past a grace -> stop that step;
4. **workers**, from the coordinator's view: a satellite whose workers are all gone is released (a shrink done,
   training finished, or its workers lost); a worker that left on its own no longer counts toward the size, and
   one that died retires the rest of its group (its process may hang: releasing the satellite ends it);
5. **reconcile**, never once training is over or a worker has finished it: grow toward the target by submitting
   satellites of at most a node's worth of workers each (a preemption takes one node's satellite, not every worker
   the job gained), or
   shrink by asking chosen workers to leave (:func:`~slurm_amoeba.agent.groups.choose_leavers`; a satellite that
   has not started yet is released instead, and a smaller one replaces it when only part of it had to go). A
   move the daemon asked for (``vacate``: a rigid job is to start whole on that node) asks every running
   satellite on the node to leave and grows the same workers back in satellites that exclude the node. Workers
   the daemon asked to place beside another job (``beside``: GPU sharing, :mod:`slurm_amoeba.core.sharing`) grow
   first, one satellite per worker on the named node; a shrink takes them back first
   (:func:`~slurm_amoeba.agent.groups.choose_leavers`).

Workers lost without a shrink lower the target to what the job still has, never below its minimum, when Slurm took
them back (preemption) or their own code failed: the job does not fight Slurm for them, nor burn GPUs on a bug; the
daemon or the user may grow it again. Workers lost to an **infrastructure** failure (the satellite's node failed,
``NODE_FAIL``, its workers died without a word or were killed from outside) keep the target: the job regrows at
once, its next satellites excluding (``--exclude``) every node where it lost workers that way; a node where it
happened :data:`REPEATED_NODE_FAILURES` times is named to the daemon (:class:`NodeFailing`).

The plan works on a copy of the groups, recording each action as it goes (:func:`record`) so that later decisions
of the round see earlier ones; the agent records the same actions on its own groups after applying them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from slurm_amoeba.agent.groups import (
    GroupState,
    WorkerGroup,
    choose_leavers,
    node_failures,
    planned_size,
    worker_ids,
)
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.runtime.failures import ErrorReport, FailureClass, WorkerExit, classify_exit
from slurm_amoeba.runtime.membership import Phase, WorkerStatus
from slurm_amoeba.runtime.view import CoordinatorView
from slurm_amoeba.slurm.records import JobRecord, JobState

PHASE_OVER_GRACE_S = 30.0
"""After training ended, how long the main worker step may take to exit on its own before the agent stops it."""

REPEATED_NODE_FAILURES = 2
"""Infrastructure failures of the job's groups on one node after which the agent names the node to the daemon."""

#: Slurm's states of a satellite that say what took its workers, whatever they reported.
_SLURM_FAILURES = {
    JobState.NODE_FAIL: FailureClass.INFRASTRUCTURE,
    JobState.BOOT_FAIL: FailureClass.INFRASTRUCTURE,
    JobState.OUT_OF_MEMORY: FailureClass.RESOURCE,
}


# ----------------------------------------------------------------------------------------------- observations


@dataclasses.dataclass(frozen=True)
class CoordinatorSeen:
    """What the plan needs of the coordinator's view: the job's phase, every known worker's status, the workers'
    error reports (oldest first), and the class of the failure that ended the job (None: none did) with why."""

    phase: Phase
    workers: Mapping[str, WorkerStatus]
    errors: tuple[ErrorReport, ...] = ()
    failure: FailureClass | None = None
    lost_reason: str = ""

    @classmethod
    def of(cls, view: CoordinatorView) -> CoordinatorSeen:
        """The part of ``view`` the plan reads."""
        return cls(
            view.phase, {w: v.status for w, v in view.workers.items()}, view.errors, view.failure, view.lost_reason
        )

    def worker_failure(self, worker: str) -> FailureClass | None:
        """The class of a gone worker's end: what it reported when it failed (a user error when it said nothing
        more), an infrastructure failure when it died without a word; None when it left or finished."""
        status = self.workers.get(worker)
        if status is WorkerStatus.DEAD:
            return classify_exit(WorkerExit(returncode=None))
        if status is WorkerStatus.FAILED:
            reported = next((e.failure for e in reversed(self.errors) if e.worker == worker), None)
            return classify_exit(WorkerExit(returncode=1, reported=reported))
        return None

    def ending_error(self) -> ErrorReport | None:
        """The error report behind the failure that ended the job: the first of its class in the latest
        generation that had one."""
        matching = [e for e in self.errors if e.failure is self.failure]
        if not matching:
            return None
        latest = max(e.generation for e in matching)
        return next(e for e in matching if e.generation == latest)


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the agent saw in one round.

    Attributes:
        now: the round's time (Unix seconds, the clock of the groups' ``requested_at``).
        target: the workers the job was asked to have.
        groups: the job's worker groups, main group first (the plan reads them, never changes them).
        coordinator: the coordinator's view of the job.
        satellites: the live satellites' squeue records by Slurm job id when Slurm was polled this round (a live
            satellite missing from it is gone from squeue), or None when it was not polled or the poll failed.
        training_over_since: when the agent first saw training over (None while it is not).
        main_step_status: the main worker step's exit status, None while it runs.
        stop_reason: why the job was asked to stop (a signal), or empty.
        requeue_reason: why the job was asked to save its state and requeue itself (Slurm's warning before the
            time limit, ``USR1``), or empty.
        checkpoint_step: the step of the newest complete disk checkpoint, when the agent looked (it looks once the
            job is lost or its main group ended), else None.
        restarts_left: how many more times the job may restart from a disk checkpoint in this allocation.
        vacate: a node the daemon asked the job's running satellites to leave this round, the size kept, or "".
        beside: where the daemon asked this round's growth to go beside another job (GPU sharing), or None.
    """

    now: float
    target: int
    groups: Sequence[WorkerGroup]
    coordinator: CoordinatorSeen
    satellites: Mapping[int, JobRecord] | None = None
    training_over_since: float | None = None
    main_step_status: int | None = None
    stop_reason: str = ""
    requeue_reason: str = ""
    checkpoint_step: int | None = None
    restarts_left: int = 0
    vacate: str = ""
    beside: PlaceBeside | None = None


@dataclasses.dataclass(frozen=True)
class PlaceBeside:
    """The daemon's order to place new workers beside another job (a directive's ``place_beside``).

    Attributes:
        host: the job whose GPUs they share.
        partition: the sharing partition the host runs in.
        nodes: node name -> workers to place there.
        role: the new workers' part (:class:`~slurm_amoeba.core.sharing.ShareRole` value).
        host_uid: the host owner's uid: the owner the new workers require of its status file (-1: none given).
        status_path: the host's node-local status file they pace against ("": they do not pace).
        pace_bound: the share of its exclusive speed the host may lose (0: the runtime's default bound).
        sub_batch: the new workers' local micro-batch (0: the runtime fits its own).
        memory_cap_bytes: the device memory each new worker may hold (0: no cap; the runtime fits its micro-batch
            under it, :class:`~slurm_amoeba.runtime.share.ShareDirective`).
    """

    host: str
    partition: str
    nodes: Mapping[str, int]
    role: str
    host_uid: int = -1
    status_path: str = ""
    pace_bound: float = 0.0
    sub_batch: int = 0
    memory_cap_bytes: int = 0

    @classmethod
    def from_body(cls, place: Mapping[str, Any]) -> PlaceBeside:
        """The order a directive's ``place_beside`` object carries (checked by the protocol:
        :func:`~slurm_amoeba.core.messages.check_place_beside`)."""
        return cls(
            str(place["host"]),
            str(place["partition"]),
            {str(node): int(count) for node, count in place["nodes"].items()},
            str(place["role"]),
            host_uid=int(place["host_uid"]),
            status_path=str(place["status_path"]),
            pace_bound=float(place["pace_bound"]),
            sub_batch=int(place["sub_batch"]),
            memory_cap_bytes=int(place.get("memory_cap_bytes", 0)),
        )


@dataclasses.dataclass(frozen=True)
class Limits:
    """The job's fixed bounds on a plan.

    Attributes:
        min_workers: the job never shrinks below this, and a loss never lowers the target below it.
        workers_per_satellite: the most workers one satellite holds (one node's worth; see
            :func:`workers_per_satellite`).
        over_grace_s: how long the main step may outlive the end of training.
    """

    min_workers: int
    workers_per_satellite: int
    over_grace_s: float = PHASE_OVER_GRACE_S


def workers_per_satellite(spec: ElasticSpec, node_gpus: int | None) -> int:
    """How many workers one satellite holds: those that fit on one node of the elastic partition.

    Args:
        spec: the job's per-worker resources.
        node_gpus: GPUs of the elastic partition's largest node, None when Slurm could not be asked.

    Returns:
        At least 1; the job's maximum for CPU-only workers; 1 while the node size is unknown.
    """
    if spec.gpus_per_worker == 0:
        return spec.max_workers
    if node_gpus is None:
        return 1
    return max(1, node_gpus // spec.gpus_per_worker)


# ----------------------------------------------------------------------------------------------- actions


@dataclasses.dataclass(frozen=True)
class Stop:
    """A signal asked the job to stop: stop the workers, release the satellites, exit with 143."""

    reason: str


@dataclasses.dataclass(frozen=True)
class JobFailed:
    """The coordinator ended the job on a failure that a retry repeats: print ``error``'s traceback in the job's
    output, record the class in its history, stop the workers, release the satellites, exit non-zero."""

    failure: FailureClass
    reason: str
    error: ErrorReport | None


@dataclasses.dataclass(frozen=True)
class MainGroupEnded:
    """The main worker step exited: the job ends with its status; ``failure`` is the class of a non-zero one
    (:func:`~slurm_amoeba.runtime.failures.classify_exit`: 1 a user error, 137 killed from outside), for the history
    (not compared: the status says it)."""

    status: int
    failure: FailureClass | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class Requeue:
    """Save the state and requeue: every worker leaves at a step boundary (all at one, so the coordinator asks them
    for a final disk checkpoint), the satellites are released, and the job requeues itself (``scontrol requeue``,
    bounded); it resumes from that checkpoint. Ends the loop."""

    reason: str


@dataclasses.dataclass(frozen=True)
class RestartFromCheckpoint:
    """Every member holding the state is gone but a complete disk checkpoint of ``step`` exists: release the
    satellites, stop what is left of the main group, and start a fresh coordinator and main group, which resume from
    the checkpoint (the loop goes on)."""

    reason: str
    step: int


@dataclasses.dataclass(frozen=True)
class StopMainStep:
    """Training is over but the main worker step lingers (a hung or dead worker): stop it; its status ends the job."""

    phase: Phase


@dataclasses.dataclass(frozen=True)
class SatelliteStarted:
    """Slurm started a satellite: its group runs from ``at`` on ``nodes``."""

    group: str
    slurm_job: int
    at: float
    nodes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ReleaseSatellite:
    """Cancel a satellite's allocation, tell the coordinator that its live workers are gone, end its group
    (``failure``: the class of what took its workers, if a failure did)."""

    group: str
    slurm_job: int
    reason: str
    mark_dead: tuple[str, ...]
    at: float
    failure: FailureClass | None = None


@dataclasses.dataclass(frozen=True)
class AskToLeave:
    """A shrink: ask these workers of a running group to leave at the next step boundary."""

    group: str
    workers: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class WorkerLost:
    """A worker left on its own (preemption's SIGTERM, a failure of class ``failure``): it no longer counts toward
    the size."""

    group: str
    worker: str
    status: WorkerStatus
    failure: FailureClass | None = None


@dataclasses.dataclass(frozen=True)
class RetireGroup:
    """A worker of this group died: the rest leave gracefully, then releasing the satellite ends any hung process."""

    group: str
    workers: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class SubmitSatellite:
    """Grow: submit a satellite for ``workers`` more workers as group ``group``.

    If Slurm refuses it, the target becomes ``target_if_refused`` (what the job has and is getting without it) and
    the round's further submissions are dropped: the daemon or the user asks again. ``exclude``: nodes where the
    job lost workers to an infrastructure failure. ``beside``: the order it follows to run beside another job on
    ``node`` (one shard of a GPU there), or None for a satellite on GPUs of its own.
    """

    group: str
    workers: int
    at: float
    target_if_refused: int
    exclude: tuple[str, ...] = ()
    beside: PlaceBeside | None = None
    node: str = ""


@dataclasses.dataclass(frozen=True)
class NodeFailing:
    """The job lost workers to infrastructure failures on ``node`` ``failures`` times: name it to the daemon."""

    node: str
    failures: int


@dataclasses.dataclass(frozen=True)
class LowerTarget:
    """Workers were lost without a shrink: the job aims for what it still has (never below its minimum)."""

    target: int
    previous: int


Action = (
    Stop
    | JobFailed
    | MainGroupEnded
    | StopMainStep
    | SatelliteStarted
    | ReleaseSatellite
    | AskToLeave
    | WorkerLost
    | RetireGroup
    | SubmitSatellite
    | LowerTarget
    | NodeFailing
    | Requeue
    | RestartFromCheckpoint
)
"""One thing the agent does; :func:`plan` returns them in the order they are to be applied."""

ENDING_ACTIONS = (Stop, Requeue, JobFailed, MainGroupEnded, StopMainStep)
"""Actions after which the agent's loop ends."""


# ----------------------------------------------------------------------------------------------- bookkeeping


def new_satellite_group(action: SubmitSatellite, slurm_job: int) -> WorkerGroup:
    """The group of a satellite that Slurm accepted as job ``slurm_job``."""
    return WorkerGroup(
        action.group,
        True,
        worker_ids(action.group, action.workers),
        slurm_job,
        GroupState.PENDING,
        action.at,
        beside=action.beside.host if action.beside is not None else "",
    )


def record(groups: Sequence[WorkerGroup], action: Action) -> None:
    """Record an applied action in the groups' bookkeeping (a submission is recorded by adding its group).

    Args:
        groups: the job's groups; the one the action names is changed in place.
        action: the action; those that name no group change nothing.
    """
    name = getattr(action, "group", None)
    group = next((g for g in groups if g.name == name), None)
    if group is None:
        return
    if isinstance(action, SatelliteStarted):
        group.running_at = action.at
        group.nodes = action.nodes or group.nodes
        if group.state is GroupState.PENDING:
            group.state = GroupState.RUNNING
    elif isinstance(action, ReleaseSatellite):
        group.state = GroupState.ENDED
        group.ended_at = action.at
        group.end_reason = action.reason
        group.failure = group.failure or action.failure
    elif isinstance(action, AskToLeave | RetireGroup):
        group.leaving.update(action.workers)
        if isinstance(action, RetireGroup) or group.leaving >= set(group.worker_ids):
            group.state = GroupState.LEAVING
    elif isinstance(action, WorkerLost):
        group.leaving.add(action.worker)
        group.failure = group.failure or action.failure


def release(
    group: WorkerGroup, reason: str, coordinator: CoordinatorSeen, now: float, failure: FailureClass | None = None
) -> ReleaseSatellite:
    """Release ``group``'s satellite; its workers the coordinator still counts are marked dead."""
    alive = tuple(w for w in group.worker_ids if w in coordinator.workers and not coordinator.workers[w].is_gone())
    return ReleaseSatellite(group.name, group.slurm_job, reason, alive, now, failure)


def final_releases(groups: Sequence[WorkerGroup], coordinator: CoordinatorSeen, now: float) -> list[ReleaseSatellite]:
    """When the job ends: release every satellite not released yet (no satellite outlives its job)."""
    return [
        release(g, g.end_reason or "job ended", coordinator, now)
        for g in groups
        if g.satellite and g.state is not GroupState.ENDED
    ]


# ----------------------------------------------------------------------------------------------- the plan


def plan(seen: Observation, limits: Limits) -> list[Action]:
    """Decide one round (see the module docstring for what and in which order).

    Args:
        seen: what the agent observed.
        limits: the job's bounds.

    Returns:
        The actions to apply, in order; empty when nothing is to be done. An ending action
        (:data:`ENDING_ACTIONS`) is always the last.
    """
    if seen.stop_reason:
        return [Stop(seen.stop_reason)]
    if seen.requeue_reason:
        return [Requeue(seen.requeue_reason)]
    failure = seen.coordinator.failure
    if failure is not None:
        return [JobFailed(failure, seen.coordinator.lost_reason, seen.coordinator.ending_error())]
    restart = restart_from_checkpoint(seen)
    if restart is not None:
        return [restart]
    if seen.main_step_status is not None:
        return [MainGroupEnded(seen.main_step_status, classify_exit(WorkerExit(seen.main_step_status)))]
    round_ = _Round(seen, limits)
    if seen.satellites is not None:
        round_.watch_satellites(seen.satellites)
    over = seen.coordinator.phase.is_over()
    if over and seen.training_over_since is not None and seen.now - seen.training_over_since > limits.over_grace_s:
        round_.emit(StopMainStep(seen.coordinator.phase))
        return round_.actions
    round_.watch_workers()
    # Nothing to grow into or shrink from once training has ended, nor once a worker has finished it: train()
    # returns on every member at the same step, and the coordinator may see the last of them a round later (a
    # satellite's workers finishing first made the job submit a satellite at its very end).
    finishing = any(status is WorkerStatus.DONE for status in seen.coordinator.workers.values())
    if not over and not finishing:
        round_.reconcile()
    return round_.actions


def restart_from_checkpoint(seen: Observation) -> RestartFromCheckpoint | None:
    """Restart when the job lost its state (the coordinator says lost, or the main group ended with an error before
    training finished), a complete disk checkpoint exists and restarts are left; a failure that a retry repeats never
    comes here (it ends the job first)."""
    phase = seen.coordinator.phase
    if phase is Phase.FINISHED or seen.checkpoint_step is None or seen.restarts_left <= 0:
        return None
    if phase is Phase.LOST:
        reason = seen.coordinator.lost_reason or "every worker holding the state is gone"
    elif seen.main_step_status not in (None, 0):
        reason = f"the main worker group ended with status {seen.main_step_status}"
    else:
        return None
    return RestartFromCheckpoint(reason, seen.checkpoint_step)


class _Round:
    """One round's working copy of the groups and target, and the actions decided so far."""

    def __init__(self, seen: Observation, limits: Limits) -> None:
        self.seen = seen
        self.limits = limits
        self.groups = [g.copy() for g in seen.groups]
        self.target = seen.target
        self.actions: list[Action] = []

    def emit(self, action: Action) -> None:
        self.actions.append(action)
        if isinstance(action, SubmitSatellite):
            self.groups.append(new_satellite_group(action, 0))
        elif isinstance(action, LowerTarget):
            self.target = action.target
        else:
            before = node_failures(self.groups)
            record(self.groups, action)
            for node, count in node_failures(self.groups).items():
                if count >= REPEATED_NODE_FAILURES and count > before.get(node, 0):
                    self.emit(NodeFailing(node, count))

    def release(self, group: WorkerGroup, reason: str, failure: FailureClass | None = None) -> None:
        self.emit(release(group, reason, self.seen.coordinator, self.seen.now, failure))

    def follow_losses(self, failure: FailureClass | None = None) -> None:
        """Lower the target to what the job has, unless the workers went with their node: the job regrows."""
        if failure is FailureClass.INFRASTRUCTURE:
            return
        target = max(self.limits.min_workers, min(self.target, planned_size(self.groups)))
        if target != self.target:
            self.emit(LowerTarget(target, self.target))

    def group_failure(self, group: WorkerGroup) -> FailureClass | None:
        """What took a group's gone workers: an infrastructure failure if any worker's was one, else the first
        failure found, else None (they left: preemption's SIGTERM)."""
        failures = [self.seen.coordinator.worker_failure(w) for w in group.worker_ids]
        if FailureClass.INFRASTRUCTURE in failures:
            return FailureClass.INFRASTRUCTURE
        return next((f for f in failures if f is not None), None)

    def live_satellites(self) -> list[WorkerGroup]:
        return [g for g in self.groups if g.satellite and g.state is not GroupState.ENDED]

    def watch_satellites(self, records: Mapping[int, JobRecord]) -> None:
        for group in self.live_satellites():
            found = records.get(group.slurm_job)
            state = found.state if found is not None else JobState.UNKNOWN
            if state is JobState.RUNNING and group.running_at is None:
                self.emit(SatelliteStarted(group.name, group.slurm_job, self.seen.now, found.nodes if found else ()))
            elif not state.is_active():
                failure: FailureClass | None = None
                if found is None or state is JobState.UNKNOWN:
                    reason = "satellite gone"
                elif found.was_preempted:
                    reason = "preempted"
                else:
                    reason = f"satellite {state.value.lower()}"
                    failure = _SLURM_FAILURES.get(state)
                if reason != "preempted" and failure is None:
                    failure = self.group_failure(group)
                self.release(group, reason, failure)
                self.follow_losses(failure)

    def watch_workers(self) -> None:
        workers = self.seen.coordinator.workers
        for group in self.live_satellites():
            statuses = [workers.get(w) for w in group.worker_ids]
            if all(s is not None and s.is_gone() for s in statuses):
                if group.leaving >= set(group.worker_ids):
                    self.release(group, "shrink")
                elif all(s is WorkerStatus.DONE for s in statuses):
                    self.release(group, "training finished")
                else:
                    failure = self.group_failure(group)
                    self.release(group, "its workers left (preempted or failed)", failure)
                    self.follow_losses(failure)
            elif group.state is GroupState.RUNNING:
                for worker, status in zip(group.worker_ids, statuses, strict=True):
                    if status is None or not status.is_gone() or worker in group.leaving:
                        continue
                    failure = self.seen.coordinator.worker_failure(worker)
                    self.emit(WorkerLost(group.name, worker, status, failure))
                    if status in (WorkerStatus.DEAD, WorkerStatus.FAILED):
                        self.emit(RetireGroup(group.name, tuple(group.active_workers)))
                    self.follow_losses(failure)

    def reconcile(self) -> None:
        avoid = self.vacate(self.seen.vacate) if self.seen.vacate else ()
        if self.target < planned_size(self.groups):
            self.shrink(planned_size(self.groups) - self.target)
        # A shrink by part of a pending satellite releases all of it: a smaller one replaces it.
        if self.target > planned_size(self.groups) and self.seen.beside is not None:
            self.grow_beside(self.seen.beside, self.target - planned_size(self.groups))
        if self.target > planned_size(self.groups):
            self.grow(self.target - planned_size(self.groups), avoid)

    def vacate(self, node: str) -> tuple[str, ...]:
        """A move: every running satellite on ``node`` is asked to leave (whole, so that Slurm gets the node's GPUs
        back); the grow that follows replaces its workers elsewhere. Returns the nodes new satellites avoid."""
        moving = [g for g in self.live_satellites() if g.state is GroupState.RUNNING and node in g.nodes]
        for group in moving:
            if group.active_workers:
                self.emit(AskToLeave(group.name, tuple(group.active_workers)))
        return (node,) if moving else ()

    def grow(self, count: int, avoid: tuple[str, ...] = ()) -> None:
        while count > 0:
            chunk = min(count, self.limits.workers_per_satellite)
            name = f"g{len(self.groups)}"
            exclude = tuple(sorted({*node_failures(self.groups), *avoid}))
            self.emit(SubmitSatellite(name, chunk, self.seen.now, planned_size(self.groups), exclude))
            count -= chunk

    def grow_beside(self, order: PlaceBeside, count: int) -> None:
        """Up to ``count`` workers beside ``order.host``: one satellite per worker (Slurm gives a job's shards on a
        node from one GPU), on the nodes the order names."""
        for node, workers in sorted(order.nodes.items()):
            for _ in range(min(workers, count)):
                name = f"g{len(self.groups)}"
                self.emit(SubmitSatellite(name, 1, self.seen.now, planned_size(self.groups), beside=order, node=node))
                count -= 1

    def shrink(self, count: int) -> None:
        for group, leavers in choose_leavers(self.groups, count):
            if group.state is GroupState.PENDING:
                self.release(group, "shrink before it started")
            else:
                self.emit(AskToLeave(group.name, tuple(leavers)))
