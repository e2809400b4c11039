"""Whole-node moves: a layer composed around a policy that moves satellites off a node so that a pending job starts
whole on it (DESIGN.md, control flow; the simulator's ``whole_node_starts`` is the same idea inside
:mod:`slurm_amoeba.policy.elastic_room`).

A job that fits on one node (``--gres=gpu:N``: Slurm places it on one node) may find no node with N free GPUs while
satellites hold the rest of one. Slurm then starts it by preempting those satellites (a job that ignores the
SIGTERM keeps its GPUs until the elastic partition's GraceTime; an agent's satellite leaves within seconds), and
the elastic job loses their workers until it grows again. With amoebad's ``whole_node_starts`` (off by default:
measured, no gain over that on the test cluster, docs/admin.md section 8d) the round adds to the policy's answer
:func:`whole_node_moves`: the node where the fewest satellite GPUs
must go and whose satellites' workers fit in free GPUs on other nodes, and one
:class:`~slurm_amoeba.policy.actions.Move` per job whose satellites leave it (``JobInfo.lent``: node -> its workers
in satellites of one node; the job keeps its target and grows the same workers back in satellites that exclude the
node, :mod:`slurm_amoeba.agent.plan`). The pending job starts when Slurm sees the node free.

What it does not do: move for a job while the free GPUs of the whole cluster are fewer than it needs (the policy
gives elastic extras back for it then, and Slurm preempts), move a job the inner policy acts on this round, or split
a satellite (Slurm frees a satellite's GPUs only when all of it ends).

:class:`WholeNodeMoves` is the layer: the inner policy's actions, then the moves for jobs it does not act on. It
keeps no state: the jobs a move was ordered of or for lately (their node is being vacated; the daemon's ledger keeps
them for ``resize_timeout_s``) are its input, a collection the caller owns and passes in.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import ClassVar

from slurm_amoeba.policy.actions import Action, Move
from slurm_amoeba.policy.common import base_size, priority_key
from slurm_amoeba.policy.layer import PolicyLayer
from slurm_amoeba.policy.types import JobInfo, Snapshot

#: The most of one node's satellite owners tried together when choosing which jobs move (subsets of these).
MAX_OWNERS = 8


def move_reason(workers: int, node: str, for_job: str) -> str:
    """The sentence a move carries to the job's agent."""
    return f"amoebad: moves {workers} worker(s) off {node} so that job {for_job} starts on one node"


@dataclasses.dataclass(frozen=True)
class WholeNodeMoves(PolicyLayer):
    """A policy with whole-node moves added to its answer (see the module docstring).

    Attributes:
        inner: the policy whose answer the moves are added to.
        recent: ids of the jobs a move was ordered of or for lately (the caller's record, read at each call):
            neither moved again nor moved for again.
    """

    adds: ClassVar[frozenset[type[Action]]] = frozenset({Move})

    recent: Collection[str] = frozenset()

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """The inner policy's actions, then the moves of jobs it does not act on.

        Args:
            snapshot: the cluster now.
            now: the current time in seconds.

        Returns:
            The actions.
        """
        answer = list(self.inner.decide(snapshot, now))
        recent = set(self.recent)
        acted = {action.job_id for action in answer}
        return [*answer, *whole_node_moves(snapshot, exclude=acted | recent, skip=recent)]


def whole_node_moves(snapshot: Snapshot, exclude: Collection[str] = (), skip: Collection[str] = ()) -> list[Move]:
    """The moves that let pending jobs start whole on one node (see the module docstring); a held job cannot start
    and gets none.

    Pending jobs are taken in Slurm's priority order; one that a node can hold now takes that node's free GPUs (best
    fit, as Slurm's placement would); one that none can hold, that fits on one node and whose need the free GPUs of
    the cluster cover, gets the node needing the fewest satellite GPUs moved (ties: the lower name). A node is
    vacated and a job moved at most once a round.

    Args:
        snapshot: the round's snapshot (nodes with free GPUs, pending jobs, running jobs with ``lent`` workers).
        exclude: running jobs not to move (the inner policy acts on them this round, or they moved lately).
        skip: pending jobs not to move for (one was ordered for them lately: their node is being vacated).

    Returns:
        The moves, one per job.
    """
    movable = [job for job in snapshot.running() if job.is_resizable and job.lent and job.job_id not in exclude]
    satellites = {job.job_id: {node: w * job.gpus_per_worker for node, w in job.lent.items()} for job in movable}
    free = dict(snapshot.free_by_node())
    node_gpus = max((node.gpus_total for node in snapshot.nodes), default=0)
    jobs = {job.job_id: job for job in movable}
    moves: list[Move] = []
    for pending in sorted(snapshot.startable(), key=priority_key):
        need = base_size(pending) * pending.gpus_per_worker
        if need <= 0 or need > node_gpus or pending.job_id in skip:
            continue
        whole = [name for name, gpus in free.items() if gpus >= need]
        if whole:
            free[min(whole, key=lambda name: (free[name], name))] -= need
            continue
        if sum(free.values()) < need:
            continue
        chosen = _best_node(need, node_gpus, free, jobs, satellites, {move.node for move in moves})
        if chosen is None:
            continue
        node, owners, room = chosen
        for job_id in owners:
            workers = satellites[job_id][node] // jobs[job_id].gpus_per_worker
            moves.append(Move(job_id, node, workers, pending.job_id, move_reason(workers, node, pending.job_id)))
            del jobs[job_id]
        free = room
        free[node] += sum(satellites[job_id][node] for job_id in owners) - need
    return moves


def _best_node(
    need: int,
    node_gpus: int,
    free: Mapping[str, int],
    jobs: Mapping[str, JobInfo],
    satellites: Mapping[str, Mapping[str, int]],
    vacated: Collection[str],
) -> tuple[str, tuple[str, ...], dict[str, int]] | None:
    """(node, the jobs whose satellites leave it, free GPUs per node after their workers regrow elsewhere) of the
    cheapest move that frees ``need`` GPUs on one node, or None."""
    best: tuple[int, str, tuple[str, ...], dict[str, int]] | None = None
    for node in sorted(free):
        if node in vacated:
            continue
        owners = sorted(job_id for job_id in jobs if satellites.get(job_id, {}).get(node, 0) > 0)[:MAX_OWNERS]
        for count in range(1, len(owners) + 1):
            for group in itertools.combinations(owners, count):
                moved = sum(satellites[job_id][node] for job_id in group)
                if free[node] + moved < need or (best is not None and moved >= best[0]):
                    continue
                room = _regrow(node, group, node_gpus, free, jobs, satellites)
                if room is not None:
                    best = (moved, node, group, room)
    return None if best is None else (best[1], best[2], best[3])


def _regrow(
    node: str,
    owners: Iterable[str],
    node_gpus: int,
    free: Mapping[str, int],
    jobs: Mapping[str, JobInfo],
    satellites: Mapping[str, Mapping[str, int]],
) -> dict[str, int] | None:
    """Free GPUs per node once the owners' workers on ``node`` grew back elsewhere in satellites of at most a node's
    worth each (as their agents submit them), each on the node that fits it best; None when one does not fit."""
    room = dict(free)
    for job_id in owners:
        per = max(jobs[job_id].gpus_per_worker, 1)
        chunk_most = max(1, node_gpus // per)  # the agent's workers_per_satellite
        left = satellites[job_id][node] // per
        while left > 0:
            chunk = min(left, chunk_most)
            fits = [name for name, gpus in room.items() if name != node and gpus >= chunk * per]
            if not fits:
                return None
            target = min(fits, key=lambda name: (room[name], name))
            room[target] -= chunk * per
            left -= chunk
    return room
