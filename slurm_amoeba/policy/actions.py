"""What a policy may ask for: frozen, typed actions, and nothing else (DESIGN.md, the control and simulation flows).

A policy (or a layer composed around one: drain, admission, whole-node moves, queue order) answers a
:class:`~slurm_amoeba.policy.types.Snapshot` with a sequence of actions. One executor per world applies them: the
simulator's (:mod:`slurm_amoeba.sim.executor`) to its own state, the daemon's (:mod:`slurm_amoeba.daemon.executor`)
through directives to the jobs' agents and the Slurm controls it was given. Every action type is applied by both
executors, or a policy that can emit it is refused when the daemon is configured, with the reason
(:data:`ACTION_TYPES` is the list both executors are tested against).

The actions:

========================  ======================================================================================
:class:`Start`            a pending job starts with ``workers`` workers (Slurm's part in the live world)
:class:`Resize`           a running job goes to ``workers`` workers (grow or shrink), optionally with a new batch
:class:`Preempt`          a running job gives all its GPUs back and waits again (Slurm's part in the live world)
:class:`Place`            a running job keeps its size but its workers take ``placement`` (a migration)
:class:`Move`             a running job's workers on ``node`` leave it and grow back elsewhere, for ``for_job``
:class:`Hold`             a pending job is held: it may not start until released
:class:`Release`          a held job may start again
:class:`SetPriority`      a pending job's place in the scheduler's queue
:class:`Share`            a job runs on GPUs another job (``host``) holds, beside it
========================  ======================================================================================

Actions carry a ``reason``: a short sentence for logs, sent to the job's agent where one is told.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TypeAlias


@dataclasses.dataclass(frozen=True, slots=True)
class Start:
    """A pending job starts.

    Attributes:
        job_id: the job.
        workers: its size at the start (at least its minimum).
        placement: node name -> workers on it; empty when the executor (Slurm) picks the nodes.
        reason: why.
    """

    job_id: str
    workers: int
    placement: Mapping[str, int] = dataclasses.field(default_factory=dict)
    reason: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Resize:
    """A running job changes size (or, with the same size, only its global batch).

    Attributes:
        job_id: the job.
        workers: its new size (within its range).
        placement: node name -> workers on it afterwards; empty when the executor picks the nodes.
        reason: why.
        batch: the global batch the job should use at its new size (an adaptive job under ``goodput``); ``None``
            leaves the batch to the job's runtime.
    """

    job_id: str
    workers: int
    placement: Mapping[str, int] = dataclasses.field(default_factory=dict)
    reason: str = ""
    batch: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Preempt:
    """A running job gives its GPUs back and waits in the queue again.

    Attributes:
        job_id: the job.
        reason: why.
    """

    job_id: str
    reason: str = ""

    @property
    def workers(self) -> int:
        """The job's size afterwards: none."""
        return 0

    @property
    def placement(self) -> Mapping[str, int]:
        """The job's placement afterwards: none."""
        return {}


@dataclasses.dataclass(frozen=True, slots=True)
class Place:
    """A running job keeps its size; its workers are placed anew.

    Attributes:
        job_id: the job.
        placement: node name -> workers on it afterwards; adds up to the job's size.
        reason: why.
    """

    job_id: str
    placement: Mapping[str, int]
    reason: str = ""

    @property
    def workers(self) -> int:
        """The job's size, unchanged."""
        return sum(self.placement.values())


@dataclasses.dataclass(frozen=True, slots=True)
class Move:
    """A running job's workers on ``node`` leave it and the same number grows back on other nodes.

    Attributes:
        job_id: the job that moves.
        node: the node its workers leave.
        workers: its workers there.
        for_job: the pending job the node is vacated for.
        reason: why.
    """

    job_id: str
    node: str
    workers: int
    for_job: str
    reason: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Hold:
    """A pending job may not start until it is released.

    Attributes:
        job_id: the job.
        reason: why.
        wants_gpus: the GPUs it waits for (its requested size, as the policy counted it); 0 when not stated.
    """

    job_id: str
    reason: str = ""
    wants_gpus: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Release:
    """A held job may start again.

    Attributes:
        job_id: the job.
        reason: why.
        starved: released because it was held for the longest hold allowed, not because its size is free.
    """

    job_id: str
    reason: str = ""
    starved: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class SetPriority:
    """A pending job's place in the scheduler's queue.

    Attributes:
        job_id: the job.
        priority: the scheduler's priority value (higher is tested first).
        reason: why.
    """

    job_id: str
    priority: int
    reason: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Share:
    """A job runs on GPUs that another job holds, beside it.

    A share for a job that already shares the host's GPUs changes its sub-batch in place (it shrinks to give the
    host memory back).

    Attributes:
        job_id: the job that joins.
        host: the job whose GPUs it runs on (it keeps them).
        workers: the sharer's size.
        placement: node name -> the sharer's workers there, a subset of the host's nodes.
        reason: why.
        sub_batch: the sharer's local micro-batch per step, searched so that it fits the memory the host leaves
            (:func:`slurm_amoeba.policy.pairing.plan_pair`); ``None``: not searched (both jobs halve their
            micro-batch, the time-slicing model of ``sjf-ffs``).
        accumulation: the sharer's micro-steps per optimizer step with ``sub_batch``, so that its global batch
            stays the same; ``None`` with ``sub_batch``.
        pace_bound: the sharer is opportunistic: it paces itself so that the host keeps at least
            ``1 - pace_bound`` of its exclusive speed (AntMan); ``None``: both run at their co-located speeds.
    """

    job_id: str
    host: str
    workers: int
    placement: Mapping[str, int] = dataclasses.field(default_factory=dict)
    reason: str = ""
    sub_batch: int | None = None
    accumulation: int | None = None
    pace_bound: float | None = None


#: Any action.
Action: TypeAlias = Start | Resize | Preempt | Place | Move | Hold | Release | SetPriority | Share

#: Every action type, in the order of the module's table (both executors are tested against it).
ACTION_TYPES: tuple[type[Action], ...] = (Start, Resize, Preempt, Place, Move, Hold, Release, SetPriority, Share)

#: The actions that change which GPUs a job holds (at most one of these per job in one answer).
SIZE_ACTIONS: tuple[type[Action], ...] = (Start, Resize, Preempt, Place, Share)


def action_name(kind: type[Action]) -> str:
    """The name of an action type in logs, metrics and errors (``"set-priority"`` for :class:`SetPriority`)."""
    name = kind.__name__
    return "".join(f"-{char.lower()}" if char.isupper() and index else char.lower() for index, char in enumerate(name))
