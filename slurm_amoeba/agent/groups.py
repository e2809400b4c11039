"""Worker groups: the unit in which an elastic job gains and loses workers on Slurm.

A worker group is one Slurm step of workers: the main group runs in component 1 of the job's heterogeneous
allocation and lives as long as the job; every other group runs in a **satellite**, a job of its own in the
preemptible elastic partition, linked to its parent by name (``amoeba-sat-<parent>-<group>``) and comment
(``amoeba-parent=<parent>``) so that anyone sees it in ``squeue``. This module holds the bookkeeping and the pure
choice of which workers leave on a shrink; :mod:`slurm_amoeba.agent.plan` decides with them and
:mod:`slurm_amoeba.agent.agent` acts.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Sequence

from slurm_amoeba.runtime.failures import FailureClass


class GroupState(str, enum.Enum):
    """A worker group's lifecycle: ``pending -> running -> leaving -> ended`` (``ended`` from any state)."""

    PENDING = "pending"  # the satellite waits for resources
    RUNNING = "running"  # its step runs; its workers warm up or train
    LEAVING = "leaving"  # its workers were asked to leave at the next step boundary
    ENDED = "ended"  # its workers are gone and its allocation is released

    def holds_workers(self) -> bool:
        """Whether the group's workers count toward the job's size now or soon."""
        return self in (GroupState.PENDING, GroupState.RUNNING)


@dataclasses.dataclass
class WorkerGroup:
    """One worker group (see the module docstring).

    Attributes:
        name: ``g0`` (the main group), ``g1``, ...
        satellite: whether it runs in a satellite job (the main group does not).
        worker_ids: its workers, ``<name>-<task>``.
        slurm_job: the Slurm job id holding its allocation (the parent's id for the main group).
        state: its lifecycle state.
        requested_at: when it was asked for (agent clock, Unix seconds).
        running_at: when its allocation started.
        ended_at: when it ended.
        end_reason: why it ended (``finished``, ``shrink``, ``preempted``, ``failed``, ...).
        leaving: workers asked to leave (a shrink may take part of a group).
        nodes: the nodes its satellite ran on, as squeue showed them when it started (empty while unknown).
        failure: the class of the failure that took its workers (runtime/failures.py), None when none did (a
            shrink, the end of training, a preemption).
        beside: the job whose GPU the group's satellite shares (GPU sharing, :mod:`slurm_amoeba.core.sharing`), or
            "" for a group on GPUs of its own.
    """

    name: str
    satellite: bool
    worker_ids: list[str]
    slurm_job: int
    state: GroupState
    requested_at: float
    running_at: float | None = None
    ended_at: float | None = None
    end_reason: str = ""
    leaving: set[str] = dataclasses.field(default_factory=set)
    nodes: tuple[str, ...] = ()
    failure: FailureClass | None = None
    beside: str = ""

    @property
    def active_workers(self) -> list[str]:
        """Workers that count toward the job's size (not asked to leave)."""
        if not self.state.holds_workers():
            return []
        return [w for w in self.worker_ids if w not in self.leaving]

    def copy(self) -> WorkerGroup:
        """An independent copy (its ``leaving`` set is not shared), for planning on what-if bookkeeping."""
        return dataclasses.replace(self, worker_ids=list(self.worker_ids), leaving=set(self.leaving))

    def to_json(self) -> dict[str, object]:
        """A JSON-able summary for the status file and reports."""
        return {
            "name": self.name,
            "satellite": self.satellite,
            "slurm_job": self.slurm_job,
            "state": self.state.value,
            "workers": list(self.worker_ids),
            "leaving": sorted(self.leaving),
            "requested_at": self.requested_at,
            "running_at": self.running_at,
            "ended_at": self.ended_at,
            "end_reason": self.end_reason,
            "nodes": list(self.nodes),
            "failure": self.failure.value if self.failure is not None else None,
            "beside": self.beside,
        }


def worker_ids(group: str, count: int) -> list[str]:
    """The worker ids of a group of ``count`` tasks (task ``i`` is ``<group>-<i>``)."""
    return [f"{group}-{i}" for i in range(count)]


def planned_size(groups: Sequence[WorkerGroup]) -> int:
    """Workers the job has or is getting: those of groups that hold workers, less those asked to leave."""
    return sum(len(g.active_workers) for g in groups)


def node_failures(groups: Sequence[WorkerGroup]) -> dict[str, int]:
    """Per node, how many of the job's groups lost their workers to an infrastructure failure there (a node that
    failed, a process killed from outside): the nodes the job's next satellites exclude."""
    counts: collections.Counter[str] = collections.Counter()
    for group in groups:
        if group.failure is FailureClass.INFRASTRUCTURE:
            counts.update(group.nodes)
    return dict(sorted(counts.items()))


def choose_leavers(groups: list[WorkerGroup], remove: int) -> list[tuple[WorkerGroup, list[str]]]:
    """Pick the workers that leave when the job shrinks by ``remove``.

    Satellites beside another job go first (a shrink gives a shared GPU back to its host before a GPU of the job's
    own), then pending satellites (they cost no training), then the newest running satellites, whole groups before
    parts of groups (a whole group frees its allocation). The main group never loses workers: it holds the
    job's minimum.

    Args:
        groups: the job's groups.
        remove: how many workers to take away.

    Returns:
        ``(group, workers)`` pairs; a pending group's workers are all of it.
    """
    chosen: list[tuple[WorkerGroup, list[str]]] = []
    candidates = [g for g in groups if g.satellite and g.state.holds_workers() and g.active_workers]
    pending = [g for g in candidates if g.state is GroupState.PENDING]
    running = [g for g in candidates if g.state is GroupState.RUNNING]
    newest_first = sorted(pending, key=lambda g: -g.requested_at) + sorted(running, key=lambda g: -g.requested_at)
    newest_first.sort(key=lambda g: not g.beside)  # stable: beside another job first, each kind in the order above
    # Whole groups that fit entirely first, newest first; then a part of the newest remaining group.
    for group in newest_first:
        active = group.active_workers
        if remove <= 0:
            break
        if len(active) <= remove:
            chosen.append((group, active))
            remove -= len(active)
    if remove > 0:
        for group in newest_first:
            if any(g is group for g, _ in chosen):
                continue
            active = group.active_workers
            take = active[len(active) - min(remove, len(active)) :]
            chosen.append((group, take))
            remove -= len(take)
            if remove <= 0:
                break
    return chosen
