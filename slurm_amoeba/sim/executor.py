"""The simulator's executor: what each typed action does to the simulated cluster (DESIGN.md, the simulation flow).

The engine (:class:`slurm_amoeba.sim.engine.Simulator`) asks the policy, checks the answer with
:func:`~slurm_amoeba.policy.check_actions` and hands every action to :class:`SimExecutor`, which owns the meaning of
each action type; the engine owns the cluster's state and changes it only through the few methods of
:class:`SimCluster`. The daemon's executor does the same for the live world; both are tested against
:data:`~slurm_amoeba.policy.actions.ACTION_TYPES` (:attr:`SimExecutor.applies`).

========================  ======================================================================================
:class:`Start`            the job takes its placement (or the nodes with the most free GPUs) and pays a restart
:class:`Resize`           the job goes to its new size (and placement) and pays a resize
:class:`Preempt`          the job gives its GPUs back (after the partition's grace time) and waits again
:class:`Place`            the job keeps its size on new nodes and pays a restart
:class:`Share`            the job runs on its host's GPUs, beside it, with the action's sub-batch and pace bound
:class:`Move`             its workers on ``node`` leave it for the other nodes with the most free GPUs; a resize's cost
:class:`Hold`             the pending job is held: policies pass it over until it is released
:class:`Release`          the hold is lifted
:class:`SetPriority`      the pending job's ``priority`` is set
========================  ======================================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import slurm_amoeba.policy.actions as act
from slurm_amoeba.policy.common import place_most_free
from slurm_amoeba.sim.data import SimError


class SimCluster(Protocol):
    """The engine's state as the executor changes it (implemented by the simulator)."""

    def workers_of(self, job_id: str) -> int:
        """Workers the job holds now."""
        ...

    def placement_of(self, job_id: str) -> Mapping[str, int]:
        """Node -> the job's workers there."""
        ...

    def free_by_node(self) -> Mapping[str, int]:
        """Node -> free GPUs now."""
        ...

    def size_job(
        self,
        job_id: str,
        workers: int,
        placement: Mapping[str, int],
        host: str | None,
        now: float,
        moved: bool = False,
        sub_batch: int | None = None,
        pace_bound: float | None = None,
    ) -> None:
        """Give the job ``workers`` workers on ``placement`` (0: preempt; empty placement: the most free nodes;
        ``host``: on that job's GPUs, with the sharer's ``sub_batch`` and ``pace_bound``; ``moved``: a same-size
        move that costs a resize)."""
        ...

    def mark_held(self, job_id: str, held: bool) -> None:
        """Hold a pending job or release it."""
        ...

    def set_priority(self, job_id: str, priority: int) -> None:
        """Set a pending job's priority."""
        ...


class SimExecutor:
    """Applies actions to a :class:`SimCluster`, one handler per action type (see the module)."""

    def __init__(self, cluster: SimCluster) -> None:
        """Bind the executor to the engine whose state it changes."""
        self._cluster = cluster
        self._handlers: dict[type[act.Action], Callable[[act.Action, float], None]] = {
            act.Start: self._size,
            act.Resize: self._size,
            act.Preempt: self._size,
            act.Place: self._size,
            act.Share: self._size,
            act.Move: self._move,
            act.Hold: self._queue,
            act.Release: self._queue,
            act.SetPriority: self._queue,
        }

    @property
    def applies(self) -> frozenset[type[act.Action]]:
        """The action types this executor applies."""
        return frozenset(self._handlers)

    def apply(self, action: act.Action, now: float) -> None:
        """Apply one action at ``now``.

        Raises:
            SimError: an action type this executor does not apply, or a move that finds no room.
        """
        handler = self._handlers.get(type(action))
        if handler is None:
            raise SimError(f"the simulator does not apply {act.action_name(type(action))} actions ({action})")
        handler(action, now)

    def order(self, action: act.Action) -> int:
        """When an action is applied among one answer's: queue changes and releases first (so that nodes never look
        over-full), then exclusive starts, growth, places and moves, then sharers."""
        if isinstance(action, (act.Hold, act.Release, act.SetPriority, act.Preempt)):
            return 0
        if isinstance(action, act.Move):
            return 1
        shrinks = action.workers < self._cluster.workers_of(action.job_id)
        if isinstance(action, act.Share):
            return 0 if shrinks else 2
        return 0 if shrinks else 1

    def _size(self, action: act.Action, now: float) -> None:
        assert isinstance(action, (act.Start, act.Resize, act.Preempt, act.Place, act.Share))
        if isinstance(action, act.Share):
            self._cluster.size_job(
                action.job_id,
                action.workers,
                action.placement,
                action.host,
                now,
                sub_batch=action.sub_batch,
                pace_bound=action.pace_bound,
            )
            return
        self._cluster.size_job(action.job_id, action.workers, action.placement, None, now)

    def _move(self, action: act.Action, now: float) -> None:
        assert isinstance(action, act.Move)
        placement = dict(self._cluster.placement_of(action.job_id))
        free = {name: gpus for name, gpus in self._cluster.free_by_node().items() if name != action.node}
        found = place_most_free(free, action.workers)
        if found is None:
            raise SimError(
                f"job {action.job_id}: no room on other nodes for its {action.workers} workers on {action.node}; "
                f"the policy over-committed"
            )
        placement[action.node] -= action.workers
        for name, count in found.items():
            placement[name] = placement.get(name, 0) + count
        placement = {name: count for name, count in placement.items() if count > 0}
        self._cluster.size_job(action.job_id, sum(placement.values()), placement, None, now, moved=True)

    def _queue(self, action: act.Action, now: float) -> None:
        if isinstance(action, act.SetPriority):
            self._cluster.set_priority(action.job_id, action.priority)
        else:
            self._cluster.mark_held(action.job_id, isinstance(action, act.Hold))
