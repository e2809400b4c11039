"""Invariants every set of actions must keep, checked in one place.

Both callers of a policy run :func:`check_actions` before acting (the daemon before its executor applies the
actions, the simulator before its executor does), and the policy tests run it on random snapshots. A violation is a
bug in a policy, so it raises :class:`~slurm_amoeba.policy.types.PolicyError` with the offending job and numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import slurm_amoeba.policy.actions as act
from slurm_amoeba.policy.types import JobInfo, JobPhase, PolicyError, Snapshot

#: The actions that change which GPUs a job holds, as the check sees them.
_Sized = act.Start | act.Resize | act.Preempt | act.Place | act.Share


def check_actions(snapshot: Snapshot, actions: Sequence[act.Action]) -> None:
    """Raise if applying ``actions`` to ``snapshot`` would break an invariant.

    The invariants: every action names a job of the snapshot; a job gets at most one action that changes its size
    or nodes (start, resize, preempt, place, share, move) and at most one of hold and release; a start, hold,
    release or set-priority is for a pending job, a resize, preempt, place or move for a running one; no job is
    sized outside ``min_workers..max_workers``; a non-elastic, pinned, resizing or sharing job is never resized; a
    place keeps the job's size; a move names a node where the job runs and at most its workers there, for a job of
    the snapshot; a placement names known nodes and adds up to the size; no node and no cluster ends up with more
    GPUs held than it has; a sharing job shares with a job that runs exclusively afterwards, on a subset of its
    nodes, one sharer per job; a share's sub-batch and accumulation come together, each at least 1, and its pace
    bound lies in [0, 1).

    Args:
        snapshot: the cluster the actions were decided for.
        actions: the policy's answer.

    Raises:
        PolicyError: the first broken invariant, named with the job and the numbers.
    """
    jobs = snapshot.by_id()
    in_queue = snapshot.queued_by_id() if snapshot.left_to_slurm else jobs  # a priority may go to a job left to Slurm
    gpus = _GpuLedger(snapshot)
    placed: set[str] = set()
    queued: set[str] = set()
    sized: dict[str, _Sized] = {}
    for action in actions:
        job = (in_queue if isinstance(action, act.SetPriority) else jobs).get(action.job_id)
        if job is None:
            raise PolicyError(
                f"{act.action_name(type(action))} for job {action.job_id!r}, which is not in the snapshot"
            )
        if isinstance(action, (act.Start, act.Resize)):  # the common answers, without the general dispatch below
            if job.state is not _PHASE_OF[type(action)]:
                _check_phase(job, action)
            if action.job_id in placed:
                raise PolicyError(
                    f"two actions change the size or nodes of job {action.job_id!r}; a policy answers once per job"
                )
            placed.add(action.job_id)
            sized[action.job_id] = action
            _check_size(job, action, action.workers)
            gpus.check_placement(job, action.workers, action.placement)
            gpus.size(job, action.workers, action.placement, shares=False)
            continue
        _check_phase(job, action)
        if isinstance(action, (act.Hold, act.Release, act.SetPriority)):
            if isinstance(action, (act.Hold, act.Release)):
                if action.job_id in queued:
                    raise PolicyError(f"job {job.job_id} is both held and released (or twice) in one answer")
                queued.add(action.job_id)
            continue
        if action.job_id in placed:
            raise PolicyError(
                f"two actions change the size or nodes of job {action.job_id!r}; a policy answers once per job"
            )
        placed.add(action.job_id)
        if isinstance(action, act.Move):
            _check_move(job, action, jobs)
            gpus.move(job, action)
            continue
        sized[action.job_id] = action
        if isinstance(action, act.Share):
            _check_share_plan(action)
        workers, placement = _size_after(action)
        _check_size(job, action, workers)
        gpus.check_placement(job, workers, placement)
        gpus.size(job, workers, placement, shares=isinstance(action, act.Share))
    gpus.check()
    _check_sharing(jobs, sized)


#: The phase a start or a resize is for (the fast path of :func:`check_actions`).
_PHASE_OF: dict[type[act.Action], JobPhase] = {act.Start: JobPhase.PENDING, act.Resize: JobPhase.RUNNING}


class _GpuLedger:
    """Free GPUs per node, and GPUs asked for without a placement, as the actions are applied one by one."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.nodes = {node.name: node for node in snapshot.nodes}
        self.free = {name: node.gpus_free for name, node in self.nodes.items()}
        self.unplaced = 0

    def _release(self, job: JobInfo, release: Mapping[str, int]) -> None:
        """The GPUs a job gives up (none for a job on another job's GPUs)."""
        if job.shared_with is not None:
            return
        for name, count in release.items():
            if name in self.free:
                self.free[name] += count * job.gpus_per_worker
        if not job.placement:
            self.unplaced -= job.gpus

    def move(self, job: JobInfo, move: act.Move) -> None:
        """A move: its workers leave the node and take as many GPUs on nodes the executor picks."""
        self._release(job, {move.node: move.workers})
        self.unplaced += move.workers * job.gpus_per_worker

    def size(self, job: JobInfo, workers: int, placement: Mapping[str, int], shares: bool) -> None:
        """A size action: the job gives up what it holds and takes its new placement (not when it shares)."""
        if job.placement or job.shared_with is not None:
            self._release(job, job.placement)
        else:  # nothing held on a node (a pending job): only what it held without a placement comes back
            self.unplaced -= job.gpus
        if shares:
            return
        free, per_worker = self.free, job.gpus_per_worker
        for name, count in placement.items():
            free[name] -= count * per_worker
        if not placement:
            self.unplaced += workers * job.gpus_per_worker

    def check_placement(self, job: JobInfo, workers: int, placement: Mapping[str, int]) -> None:
        """A placement names known nodes, puts workers on each, and adds up to the size."""
        nodes = self.nodes
        for name, count in placement.items():
            if name not in nodes:
                raise PolicyError(f"job {job.job_id}: placement names node {name!r}, which is not in the snapshot")
            if count <= 0:
                raise PolicyError(f"job {job.job_id}: placement puts {count} workers on node {name}")
        if placement and sum(placement.values()) != workers:
            raise PolicyError(
                f"job {job.job_id}: placement {dict(placement)} holds {sum(placement.values())} workers, "
                f"not the decided {workers}"
            )

    def check(self) -> None:
        """No node and no cluster holds more GPUs than it has."""
        for name, left in self.free.items():
            if left < 0:
                raise PolicyError(
                    f"node {name} would hold {self.nodes[name].gpus_total - left} GPUs after these actions "
                    f"but has {self.nodes[name].gpus_total}"
                )
        if self.unplaced > sum(self.free.values()):
            raise PolicyError(
                f"the actions ask for {self.unplaced} GPUs without a placement but only {sum(self.free.values())} "
                f"would be free"
            )


def _size_after(action: _Sized) -> tuple[int, Mapping[str, int]]:
    """The job's size and placement after a size action."""
    if isinstance(action, act.Preempt):
        return 0, {}
    return action.workers, action.placement


def _check_phase(job: JobInfo, action: act.Action) -> None:
    """Starts, holds, releases and priorities are for pending jobs; resizes, preemptions, places and moves for
    running ones."""
    for_pending = (act.Start, act.Hold, act.Release, act.SetPriority)
    for_running = (act.Resize, act.Preempt, act.Place, act.Move)
    if isinstance(action, for_pending) and job.state is not JobPhase.PENDING:
        raise PolicyError(
            f"job {job.job_id} is running; a {act.action_name(type(action))} is only for a pending job"
            + ("" if not isinstance(action, act.Start) else " (resize it instead)")
        )
    if isinstance(action, for_running) and job.state is not JobPhase.RUNNING:
        raise PolicyError(
            f"job {job.job_id} is pending; a {act.action_name(type(action))} is only for a running job"
            + ("" if not isinstance(action, act.Resize) else " (start it instead)")
        )


def _check_size(job: JobInfo, action: _Sized, workers: int) -> None:
    if isinstance(action, act.Preempt):
        return
    if isinstance(action, act.Place) and workers != job.workers:
        raise PolicyError(
            f"job {job.job_id}: a place keeps the job's {job.workers} workers but its placement holds {workers}"
        )
    resized = job.state is JobPhase.RUNNING and workers != job.workers
    if resized and not job.is_elastic:
        raise PolicyError(f"job {job.job_id} is not elastic and cannot be resized to {workers} workers")
    if not job.min_workers <= workers <= job.max_workers:
        raise PolicyError(
            f"job {job.job_id}: {workers} workers lies outside its range {job.min_workers}:{job.max_workers}"
        )
    if resized and (job.pinned or job.resizing or job.shared_with is not None):
        why = "pinned by an operator" if job.pinned else "still resizing" if job.resizing else "sharing GPUs"
        raise PolicyError(f"job {job.job_id} is {why} and cannot be resized to {workers} workers")


def _check_share_plan(share: act.Share) -> None:
    """A share's sub-batch and accumulation come together and are positive; a pace bound lies in [0, 1)."""
    if (share.sub_batch is None) != (share.accumulation is None):
        raise PolicyError(
            f"job {share.job_id}: a share gives sub_batch={share.sub_batch} and accumulation={share.accumulation}; "
            f"give both or neither"
        )
    if share.sub_batch is not None and share.accumulation is not None and min(share.sub_batch, share.accumulation) < 1:
        raise PolicyError(
            f"job {share.job_id}: a share's sub_batch={share.sub_batch} and accumulation={share.accumulation} "
            f"must be at least 1"
        )
    if share.pace_bound is not None and not 0.0 <= share.pace_bound < 1.0:
        raise PolicyError(f"job {share.job_id}: a share's pace_bound={share.pace_bound} must lie in [0, 1)")


def _check_move(job: JobInfo, move: act.Move, jobs: Mapping[str, JobInfo]) -> None:
    there = job.placement.get(move.node, 0)
    if there == 0:
        raise PolicyError(
            f"job {job.job_id}: a move off node {move.node!r}, where it runs no worker "
            f"(it runs on {dict(job.placement)})"
        )
    if not 1 <= move.workers <= there:
        raise PolicyError(
            f"job {job.job_id}: a move of {move.workers} workers off node {move.node}, where it runs {there}"
        )
    if job.shared_with is not None or job.pinned or job.resizing:
        why = "pinned by an operator" if job.pinned else "still resizing" if job.resizing else "sharing GPUs"
        raise PolicyError(f"job {job.job_id} is {why} and cannot move off node {move.node}")
    if move.for_job not in jobs:
        raise PolicyError(
            f"job {job.job_id} moves off node {move.node} for job {move.for_job!r}, which is not in the snapshot"
        )


def _check_sharing(jobs: Mapping[str, JobInfo], decided: dict[str, _Sized]) -> None:
    def final(job_id: str) -> tuple[int, Mapping[str, int], str | None]:
        action = decided.get(job_id)
        if action is not None:
            workers, placement = _size_after(action)
            return workers, placement, action.host if isinstance(action, act.Share) else None
        job = jobs[job_id]
        return job.workers, job.placement, job.shared_with

    sharers = [key for key, action in decided.items() if isinstance(action, act.Share)]
    sharers += [job.job_id for job in jobs.values() if job.shared_with is not None and job.job_id not in decided]
    partners: Counter[str] = Counter()
    for job_id in sharers:
        workers, placement, share_with = final(job_id)
        if share_with is None or workers == 0:
            continue
        if share_with not in jobs or final(share_with)[0] == 0:
            raise PolicyError(f"job {job_id} shares the GPUs of {share_with!r}, which does not run")
        _, target_placement, target_share = final(share_with)
        if target_share is not None:
            raise PolicyError(f"job {job_id} shares with {share_with}, which itself shares another job's GPUs")
        for name, count in placement.items():
            held = target_placement.get(name, 0)
            if count * jobs[job_id].gpus_per_worker > held * jobs[share_with].gpus_per_worker:
                raise PolicyError(
                    f"job {job_id} shares with {share_with} but puts {count} workers on node {name}, "
                    f"where {share_with} holds {held}"
                )
        partners[share_with] += 1
        if partners[share_with] > 1:
            raise PolicyError(f"job {share_with} would share its GPUs with more than one job")
