"""The daemon's elastic backfill on top of the ``slurm`` baseline: which extras go back for the jobs Slurm starts or
the daemon admits, where those jobs land, and who grows into the GPUs left idle.

The pass after Slurm's of the ``amoebad`` policy: its hook builds one :class:`ElasticPass` per decision, which reads
the policy's layers (:mod:`slurm_amoeba.policy.amoebad_layers`) through :class:`DaemonRules` and owns what the pass
changes; ``policy/slurm_baseline.py`` decides what Slurm alone would. The rules of an admission's size
(:func:`admission_keeps`, :func:`spares`, :func:`spares_tail`) are plain functions of their knobs, shared with
the policy's own hooks.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from slurm_amoeba.policy.actions import Resize
from slurm_amoeba.policy.amoebad_layers import AdmissionLayer, ElasticLayer, WholeNodeLayer
from slurm_amoeba.policy.common import SizeAction, distribute_spare, marginal_efficiency, speedup_gain
from slurm_amoeba.policy.types import JobInfo, Snapshot

#: How far above its request's GPU-seconds a job must be to count as ahead of it (1%: a job that held exactly its
#: request is not ahead, whatever the rounding of the caller's clocks).
AHEAD_MARGIN = 0.01


class DaemonRules(Protocol):
    """What the elastic pass reads of the policy it serves
    (:class:`~slurm_amoeba.policy.amoebad.AmoebadPolicy`): its layers and the floors and holds they make."""

    @property
    def elastic(self) -> ElasticLayer: ...

    @property
    def admission(self) -> AdmissionLayer | None: ...

    @property
    def whole_node(self) -> WholeNodeLayer | None: ...

    def slurm_floor(self, job: JobInfo) -> int:
        """The workers of a running elastic job that a job Slurm starts cannot take."""
        ...

    def daemon_floor(self, job: JobInfo) -> int:
        """The fewest workers the daemon leaves a running elastic job."""
        ...

    def held_for_admission(self, job: JobInfo, now: float) -> bool:
        """Whether a pending job is held for admission now."""
        ...

    def admission_spares(self, job: JobInfo, snapshot: Snapshot, now: float) -> Callable[[JobInfo], int] | None:
        """For an admission: the fewest workers each running job keeps for it, or ``None`` (no such rule)."""
        ...


class ElasticPass:
    """One decision's elastic pass after Slurm's: extras given back for the jobs Slurm starts (on the nodes where
    they fit best, with ``compact_starts``), and the GPUs left idle grown into.

    Built by the ``amoebad`` policy's hook for one snapshot, it owns what the pass changes: ``sizes`` (job id ->
    workers so far, for the running jobs Slurm does not preempt), ``fixed`` (job id -> the placement chosen here),
    ``free_by_node`` (free GPUs per node while starts are placed), and the decision's ``targets`` and ``reasons``
    handed over by the hook (:meth:`~slurm_amoeba.policy.slurm_baseline.SlurmBaselinePolicy.after_slurm`).

    Args:
        rules: the policy's layers and floors.
        snapshot: the cluster now.
        now: the decision's time.
        running: the running jobs Slurm saw (not sharing GPUs).
        victims: the ids of those Slurm preempts.
        targets: job id -> workers, Slurm's starts and preemptions; the pass adds its own.
        reasons: job id -> why; the pass adds its own.
    """

    def __init__(
        self,
        rules: DaemonRules,
        snapshot: Snapshot,
        now: float,
        running: Sequence[JobInfo],
        victims: set[str],
        targets: dict[str, int],
        reasons: dict[str, str],
    ) -> None:
        self.rules = rules
        self.snapshot = snapshot
        self.now = now
        self.running = running
        self.victims = victims
        self.targets = targets
        self.reasons = reasons
        self.sizes = {job.job_id: job.workers for job in running if job.job_id not in victims}
        self.lenders = [
            job
            for job in running
            if job.job_id in self.sizes and job.is_resizable and job.workers > rules.daemon_floor(job)
        ]
        self.fixed: dict[str, dict[str, int]] = {}
        # while starts are placed: node -> the lenders placed there, lender -> its nodes, and what each node offers
        # under the floors the placements use, kept up to date node by node (_Rooms)
        self._on: dict[str, list[JobInfo]] = {}
        self._nodes_of: dict[str, tuple[str, ...]] = {}
        self._rooms: dict[Callable[[JobInfo], int], _Rooms] = {}
        self.free_by_node: dict[str, int] = {}

    def run(self, started: Sequence[JobInfo]) -> dict[str, dict[str, int]]:
        """Give extras back for ``started`` (Slurm's starts this round), then grow into what stays idle; ``targets``
        and ``reasons`` get the pass's sizes and reasons.

        Returns:
            job id -> placement, for the jobs whose nodes were chosen here (compact starts and the shrinks for them).
        """
        rules, running, victims, targets = self.rules, self.running, self.victims, self.targets
        sizes, lenders = self.sizes, self.lenders
        compacted: set[str] = set()
        if rules.elastic.compact_starts:
            compacted = self._place_starts(started)
        free = self.snapshot.free_gpus + sum(job.gpus for job in running if job.job_id in victims)
        free -= sum(targets[job.job_id] * job.gpus_per_worker for job in started)
        free += sum((job.workers - sizes[job.job_id]) * job.gpus_per_worker for job in lenders)
        extras = [(_give_back_key(job, sizes[job.job_id]), job.job_id, job) for job in lenders]
        extras = [entry for entry in extras if sizes[entry[1]] > rules.daemon_floor(entry[2])]
        heapq.heapify(extras)
        while free < 0 and extras:
            _, key, victim = heapq.heappop(extras)
            sizes[key] -= 1
            self.fixed.pop(key, None)
            free += victim.gpus_per_worker
            self.reasons[key] = "slurm+elastic-backfill: gives extra GPUs back for a job Slurm starts"
            if sizes[key] > rules.daemon_floor(victim):
                heapq.heappush(extras, (_give_back_key(victim, sizes[key]), key, victim))
        for job in started:
            sizes[job.job_id] = targets[job.job_id]
        growers = [job for job in running if job.job_id in sizes and job.job_id not in self.reasons]
        growers += [job for job in started if job.job_id not in compacted]
        before = dict(sizes)
        elastic = rules.elastic
        if elastic.restore_requests:
            free = self._restore_requests(growers, free)
        self.sizes = distribute_spare(growers, self.sizes, max(free, 0), elastic.min_gain, elastic.grow_by_service)
        held = {job.job_id: job.workers for job in running}
        for key, size in self.sizes.items():
            if size != before[key]:
                self.fixed.pop(key, None)
                self.reasons[key] = (
                    "slurm+elastic-backfill: idle GPUs, least attained service first"
                    if elastic.grow_by_service
                    else "slurm+elastic-backfill: idle GPUs, largest speedup gain"
                )
            if key in targets or size != held.get(key, 0):
                targets[key] = size
        return self.fixed

    def _place_starts(self, started: Sequence[JobInfo]) -> set[str]:
        """Place each of ``started`` on chosen nodes (``compact_starts``); returns the ids started smaller than
        Slurm's target (``compact_admissions``), whose new size is in ``targets``."""
        rules, snapshot, now, targets = self.rules, self.snapshot, self.now, self.targets
        self.free_by_node = dict(snapshot.free_by_node())
        for job in self.running:
            if job.job_id in self.victims:
                for name, count in job.placement.items():
                    self.free_by_node[name] = self.free_by_node.get(name, 0) + count * job.gpus_per_worker
        self._on = {}
        for lender in self.lenders:
            for name in lender.placement:
                self._on.setdefault(name, []).append(lender)
        self._nodes_of = {lender.job_id: tuple(lender.placement) for lender in self.lenders}
        self._rooms = {}
        compacted: set[str] = set()
        for job in started:
            gated = rules.held_for_admission(job, now)
            keep = self._start_keeps(job, targets[job.job_id])
            moves = None
            if rules.whole_node is not None and not gated:
                minimum = rules.whole_node.moves_minimum
                movers = [o for o in self.running if o.job_id in self.sizes and o.is_resizable]
                floor = (lambda _: 0) if minimum else rules.daemon_floor
                moves = _Moves(floor, _node_gpus(snapshot), movers if minimum else None)
            compact = gated and rules.admission is not None and rules.admission.compact_admissions
            fit = (job.min_workers, _node_gpus(snapshot)) if compact else None
            placed = self._make_room(job, targets[job.job_id], keep, moves, fit)
            if placed is not None and placed != targets[job.job_id]:
                targets[job.job_id] = placed
                compacted.add(job.job_id)
        return compacted

    def _start_keeps(self, job: JobInfo, workers: int) -> Callable[[JobInfo], int]:
        """The fewest workers each lender keeps when ``job`` starts at ``workers``: its Slurm floor for a job Slurm
        starts; for an admission its minimum (:func:`admission_keeps` with ``protect_requests``; the policy's
        ``admission_spares`` when the free GPUs and the extras above it hold the job, else its minimum)."""
        rules = self.rules
        if not rules.held_for_admission(job, self.now):
            return rules.slurm_floor
        spared = rules.admission_spares(job, self.snapshot, self.now)
        if spared is not None:
            room = sum(self.free_by_node.values()) + sum(
                max(self.sizes[o.job_id] - spared(o), 0) * o.gpus_per_worker for o in self.lenders
            )
            if room >= workers * job.gpus_per_worker:
                return spared
        protect = rules.admission is not None and rules.admission.protect_requests
        return admission_keeps(rules.elastic.min_gain) if protect else rules.daemon_floor

    def _restore_requests(self, jobs: Sequence[JobInfo], free: int) -> int:
        """Give ``free`` GPUs to the jobs below their request and behind it, most behind first, up to their request
        (``restore_requests``); returns the GPUs left. ``sizes`` is updated."""
        sizes = self.sizes
        behind = sorted(
            (job for job in jobs if job.is_resizable and 0 < sizes[job.job_id] < job.requested_workers),
            key=lambda job: (request_credit(job), job.job_id),
        )
        for job in behind:
            if request_credit(job) >= 0:
                break
            grow = min(job.requested_workers - sizes[job.job_id], max(free, 0) // job.gpus_per_worker)
            sizes[job.job_id] += grow
            free -= grow * job.gpus_per_worker
        return free

    def _make_room(
        self,
        job: JobInfo,
        workers: int,
        keep: Callable[[JobInfo], int],
        moves: _Moves | None = None,
        fit: tuple[int, int] | None = None,
    ) -> int | None:
        """Place a job Slurm starts on the fewest nodes, taking back the extras that run there (``compact_starts``).

        Nodes are tried by what they could offer (free GPUs plus extras above their jobs' minimum), best fit first
        when one node can hold the job, else the largest first. On each chosen node the free GPUs go first, then the
        least useful extras. No lender goes below ``keep`` of it. ``free_by_node``, ``sizes`` and ``fixed`` (the
        placements chosen) are updated; nothing changes when the job does not fit so (the caller's global rule then
        applies). With ``moves`` (``whole_node_starts``), a job that fits on one node but finds none whole so is
        placed on one node by moving lenders' workers off it (:meth:`_move_for_whole_node`) before it is spread.
        With ``fit`` (fewest workers, GPUs per node: ``compact_admissions``), a job that fits on one node but finds
        none whole starts with what the roomiest node offers, if that is at least the fewest workers, instead of
        spread.

        Returns:
            The size it was placed at (``workers``, or less with ``fit``), or ``None`` when no placement was chosen.
        """
        nodes, fixed = self.free_by_node, self.fixed
        per = job.gpus_per_worker
        on = self._on
        rooms = self._rooms_under(keep)
        chosen = rooms.whole(workers, per)
        if chosen is None:
            if moves is not None and self._move_for_whole_node(job, workers, moves.on(on, fixed), keep, moves):
                self._touched(nodes)  # lenders moved between nodes: every node may offer another amount now
                return workers
            classes = rooms.by_offer(per)
            best = max(names[-1] for names in classes[0])  # the most offered, then most free, then the last name
            if fit is not None and workers * per <= fit[1] and fit[0] <= rooms.offer(best, per):
                workers = rooms.offer(best, per)  # ``compact_admissions``: smaller, on one node
                chosen = [best]
            else:
                chosen = []
                total = 0
                for name in (name for lists in classes for name in heapq.merge(*lists)):
                    if total >= workers:
                        break
                    chosen.append(name)
                    total += rooms.offer(name, per)
                if total < workers:
                    return None
        offers = {name: rooms.offer(name, per) for name in chosen}
        placement: dict[str, int] = {}
        left = workers
        for name in chosen:
            take = min(left, offers[name])
            self._give_back_on(job, name, take * per, on.get(name, []), keep)
            take = min(take, nodes[name] // per)
            nodes[name] -= take * per
            self._touched((name,))
            placement[name] = take
            left -= take
        if left == 0:
            fixed[job.job_id] = placement
            return workers
        return None

    def _rooms_under(self, floor: Callable[[JobInfo], int]) -> _Rooms:
        """What every node offers a start when no lender goes below ``floor``: kept across the starts of one
        decision for the policy's own floors (``slurm_floor``, ``daemon_floor``) and the request floor, brought up
        to date for the nodes touched since; built afresh for any other floor (an admission's)."""
        rooms = self._rooms.get(floor)
        if rooms is None:
            loans = None if floor is _request_floor else self._rooms_under(_request_floor)
            rooms = _Rooms(self, floor, loans)
            if floor in (self.rules.slurm_floor, self.rules.daemon_floor, _request_floor):
                self._rooms[floor] = rooms
        rooms.refresh()
        return rooms

    def _touched(self, names: Iterable[str]) -> None:
        """Nodes whose free GPUs, or lenders' sizes or placements, changed: every kept :class:`_Rooms` reads them
        again before its next use."""
        for rooms in self._rooms.values():
            rooms.stale.update(names)

    def lent_on(self, name: str, floor: Callable[[JobInfo], int]) -> int:
        """GPUs the lenders on node ``name`` hold there above ``floor`` (what they would give back for a start)."""
        sizes, fixed = self.sizes, self.fixed
        return sum(
            min(fixed.get(o.job_id, o.placement).get(name, 0), max(sizes[o.job_id] - floor(o), 0)) * o.gpus_per_worker
            for o in self._on.get(name, [])
        )

    def _give_back_on(
        self, job: JobInfo, name: str, need: int, lenders: Sequence[JobInfo], keep: Callable[[JobInfo], int]
    ) -> None:
        """Take back lenders' extras on node ``name`` (above ``keep``; the least useful first, :func:`_give_back_key`)
        until it has ``need`` GPUs free for ``job`` or none is left."""
        nodes, sizes, fixed = self.free_by_node, self.sizes, self.fixed
        while nodes[name] < need:
            givers = [
                o for o in lenders if sizes[o.job_id] > keep(o) and fixed.get(o.job_id, o.placement).get(name, 0) > 0
            ]
            if not givers:
                return
            giver = min(givers, key=lambda o: (_give_back_key(o, sizes[o.job_id]), o.job_id))
            current = dict(fixed.get(giver.job_id, giver.placement))
            current[name] -= 1
            fixed[giver.job_id] = {key: count for key, count in current.items() if count > 0}
            sizes[giver.job_id] -= 1
            nodes[name] += giver.gpus_per_worker
            self._touched((name, *self._nodes_of.get(giver.job_id, ())))  # its extras elsewhere shrink with it
            self.reasons[giver.job_id] = f"slurm+elastic-backfill: gives extra GPUs back for job {job.job_id} on {name}"

    def _move_for_whole_node(
        self, job: JobInfo, workers: int, on: dict[str, list[JobInfo]], keep: Callable[[JobInfo], int], moves: _Moves
    ) -> bool:
        """Place a job Slurm starts on one node when no node offers it whole (``whole_node_starts``); returns whether
        it did.

        A job Slurm would otherwise spread over nodes trains up to 2.6x slower there (measured placements), while
        under Slurm alone it often lands on one node. On the node that needs the fewest GPUs moved, its free GPUs go
        first, then the lenders' extras above ``keep`` go back (as a spread start would take them), then lenders'
        workers above ``moves.floor`` move to free GPUs on other nodes (their own nodes first, then the most free): a
        lender keeps its size and pays a move. ``free_by_node``, ``sizes`` and ``fixed`` are updated only when it
        succeeds.
        """
        nodes, sizes, fixed = self.free_by_node, self.sizes, self.fixed
        need = workers * job.gpus_per_worker
        if need > moves.node_gpus:
            return False
        best: tuple[int, str, dict[str, dict[str, int]], dict[str, int]] | None = None
        for name in sorted(nodes):
            plan = self._plan_whole_node(name, need, on, keep, moves.floor)
            if plan is not None and plan[0] > 0 and (best is None or plan[0] < best[0]):
                best = (plan[0], name, plan[1], plan[2])
        if best is None:
            return False
        _, name, placements, shrunk = best
        lenders = {o.job_id: o for o in on[name]}
        for key, placement in placements.items():
            per = lenders[key].gpus_per_worker
            before = fixed.get(key, lenders[key].placement)
            for node in set(before) | set(placement):
                nodes[node] += (before.get(node, 0) - placement.get(node, 0)) * per
            fixed[key] = placement
            sizes[key] -= shrunk.get(key, 0)
            self.reasons[key] = (
                f"slurm+elastic-backfill: moves workers off {name} so that job {job.job_id} starts on one node"
                if sum(placement.values()) == sizes[key] and key not in shrunk
                else f"slurm+elastic-backfill: gives extra GPUs back for job {job.job_id} on {name}"
            )
        nodes[name] -= need
        fixed[job.job_id] = {name: workers}
        return True

    def _plan_whole_node(
        self,
        name: str,
        need: int,
        on: dict[str, list[JobInfo]],
        keep: Callable[[JobInfo], int],
        floor: Callable[[JobInfo], int],
    ) -> tuple[int, dict[str, dict[str, int]], dict[str, int]] | None:
        """How ``need`` GPUs are freed on node ``name``: (GPUs moved, the changed lenders' new placements, workers
        each gives back), or ``None`` when they cannot be (nothing changes here). Extras above ``keep`` go back first
        (the least useful first), then workers above ``floor`` move to free GPUs elsewhere."""
        nodes, sizes, fixed = self.free_by_node, self.sizes, self.fixed
        short = need - nodes[name]
        lenders = sorted(on.get(name, []), key=lambda o: (_give_back_key(o, sizes[o.job_id]), o.job_id))
        placements = {o.job_id: dict(fixed.get(o.job_id, o.placement)) for o in lenders}
        shrunk: dict[str, int] = {}
        for lender in lenders:
            if short <= 0:
                break
            per = lender.gpus_per_worker
            count = min(placements[lender.job_id].get(name, 0), max(sizes[lender.job_id] - keep(lender), 0))
            count = min(count, -(-short // per))
            if count > 0:
                shrunk[lender.job_id] = count
                placements[lender.job_id][name] -= count
                short -= count * per
        room = {node: free for node, free in nodes.items() if node != name}
        total = 0
        for lender in lenders:
            per = lender.gpus_per_worker
            placement = placements[lender.job_id]
            movable = sizes[lender.job_id] - shrunk.get(lender.job_id, 0) - floor(lender)
            while short > 0 and movable > 0 and placement.get(name, 0) > 0:
                targets = [node for node in room if room[node] >= per]
                if not targets:
                    return None
                node = min(targets, key=lambda n: (n not in placement, -room[n], n))
                room[node] -= per
                placement[name] -= 1
                placement[node] = placement.get(node, 0) + 1
                movable -= 1
                short -= per
                total += per
        if short > 0:
            return None
        changed = {
            key: {node: count for node, count in placement.items() if count > 0}
            for key, placement in placements.items()
            if placement != fixed.get(key, next(o for o in lenders if o.job_id == key).placement)
        }
        return total, changed, shrunk


def request_credit(job: JobInfo) -> float:
    """GPU-seconds a running job has held above what its requested size would have given it over its run so far
    (negative: it is behind its request; 0 for a job that always ran at its request)."""
    return job.attained_service - job.executed_time * max(job.requested_workers, job.min_workers) * job.gpus_per_worker


def ahead_of_request(job: JobInfo) -> bool:
    """Whether a running job is ahead of its request by more than ``AHEAD_MARGIN`` of what its request gave it."""
    requested = max(job.requested_workers, job.min_workers) * job.gpus_per_worker
    return request_credit(job) > job.executed_time * requested * AHEAD_MARGIN


def admission_keeps(min_gain: float) -> Callable[[JobInfo], int]:
    """The fewest workers a running job keeps when an elastic job is admitted at its request (``protect_requests``):
    its minimum, except for a job that cannot use a worker above its request (the next one adds less than
    ``min_gain``, :func:`marginal_efficiency`) and is not ahead of its request (:func:`ahead_of_request`). Such a
    job never gains from elasticity, so time below its request is a pure loss against Slurm alone: it keeps its
    request (or what it holds, when less)."""

    def keep(job: JobInfo) -> int:
        request = max(job.requested_workers, job.min_workers)
        if not job.is_resizable or ahead_of_request(job):
            return job.min_workers if job.is_resizable else job.workers
        if request < job.max_workers and marginal_efficiency(job, request) >= min_gain:
            return job.min_workers
        return max(min(job.workers, request), job.min_workers)

    return keep


def spares(min_gain: float, time_left: Callable[[JobInfo], float], limit: float) -> Callable[[JobInfo], int]:
    """The fewest workers a running job keeps when an elastic job with time limit ``limit`` is admitted at its
    request (``spare_longer_jobs``): :func:`admission_keeps` for a job with more time left than ``limit`` (the
    arrival, ending first, loses less by starting smaller than such a job, perhaps the workload's tail, by running
    below its request), else its minimum (a rigid job: what it holds)."""
    protected = admission_keeps(min_gain)

    def keep(job: JobInfo) -> int:
        if job.is_resizable and time_left(job) > limit:
            return protected(job)
        return job.min_workers if job.is_resizable else job.workers

    return keep


def spares_tail(time_left: Callable[[JobInfo], float], limit: float) -> Callable[[JobInfo], int]:
    """The fewest workers a running job keeps when an elastic job is admitted (``spare_tail_factor``): its request
    (or what it holds, when less) for a job with more than ``limit`` seconds left, else its minimum (a rigid job: what
    it holds). Such a job may be the workload's tail: every hour it runs below its request moves its end later."""

    def keep(job: JobInfo) -> int:
        if not job.is_resizable:
            return job.workers
        if time_left(job) > limit:
            return max(min(job.workers, job.requested_workers), job.min_workers)
        return job.min_workers

    return keep


def _give_back_key(job: JobInfo, size: int) -> tuple[bool, bool, float]:
    """Which extra worker goes back first: those above the job's requested size (loans of idle GPUs) before those
    below it, then those of jobs ahead of their request (:func:`ahead_of_request`), each the least useful first."""
    below = size <= job.requested_workers
    return (below, below and not ahead_of_request(job), speedup_gain(job, size - 1))


def compact_growth(action: SizeAction, job: JobInfo, node_gpus: int) -> SizeAction | None:
    """A growth (a :class:`~slurm_amoeba.policy.actions.Resize` above the job's size) kept on as few nodes as the
    job's new size needs (or no more nodes than it spans now); otherwise only its part on the job's own nodes
    (``None`` when that adds nothing). Any other action is returned as it is."""
    if not isinstance(action, Resize) or action.workers <= job.workers or not action.placement:
        return action
    fewest = -(-action.workers * job.gpus_per_worker // max(node_gpus, 1))
    if len(action.placement) <= max(fewest, len(job.placement)):
        return action
    own = {name: count for name, count in action.placement.items() if name in job.placement}
    workers = sum(own.values())
    return dataclasses.replace(action, workers=workers, placement=own) if workers > job.workers else None


def _request_floor(job: JobInfo) -> int:
    """A lender's requested size (at least its minimum): extras above it are loans."""
    return max(job.requested_workers, job.min_workers)


class _Rooms:
    """What every node offers a start under one floor, as GPUs (free, plus lenders' extras above the floor), kept in
    an index so that a start finds its nodes without reading every node (a decision places thousands of starts on
    ten thousand nodes).

    ``stale`` holds the nodes to read again (:meth:`ElasticPass._touched`). The index groups nodes by (room, free
    GPUs, loan room: the room under the request floor) and keeps each group's names sorted; every node of a group
    ranks alike for any start, so the choices below are those of reading every node, in the same order.
    """

    def __init__(self, owner: ElasticPass, floor: Callable[[JobInfo], int], loans: _Rooms | None) -> None:
        self.owner = owner
        self.floor = floor
        self.loans = loans or self  # the request floor's own index keys on itself
        self.room: dict[str, int] = {}
        self.key_of: dict[str, tuple[int, int, int]] = {}
        self.groups: dict[tuple[int, int, int], list[str]] = {}
        self.stale: set[str] = set(owner.free_by_node)

    def refresh(self) -> None:
        """Read the stale nodes again (the loans index first: a group's key holds its room)."""
        if not self.stale:
            return
        if self.loans is not self:
            self.loans.refresh()
        owner, nodes = self.owner, self.owner.free_by_node
        stale, self.stale = self.stale, set()
        for name in stale:
            self.room[name] = nodes[name] + owner.lent_on(name, self.floor)
        for name in stale:
            self._put(name, (self.room[name], nodes[name], self.loans.room[name]))

    def _put(self, name: str, key: tuple[int, int, int]) -> None:
        old = self.key_of.get(name)
        if old == key:
            return
        if old is not None:
            names = self.groups[old]
            del names[bisect.bisect_left(names, name)]
            if not names:
                del self.groups[old]
        self.key_of[name] = key
        bisect.insort(self.groups.setdefault(key, []), name)

    def offer(self, name: str, per: int) -> int:
        """Workers of ``per`` GPUs node ``name`` offers."""
        return self.room[name] // per

    def whole(self, workers: int, per: int) -> list[str] | None:
        """The node a start of ``workers`` x ``per`` GPUs takes whole, best fit first: one with the room free, then
        one whose room is loans above requests, then the smallest offer, then the name; None when no node offers
        it whole."""
        need = workers * per
        best: tuple[bool, bool, int, str] | None = None
        for (room, free, loan), names in self.groups.items():
            offer = room // per
            if offer >= workers:
                rank = (free < need, loan // per < workers, offer, names[0])
                if best is None or rank < best:
                    best = rank
        return None if best is None else [best[3]]

    def by_offer(self, per: int) -> list[list[list[str]]]:
        """The nodes in classes of equal (offer, free GPUs), most offered first, then most free; each class as the
        sorted name lists of its groups."""
        classes: dict[tuple[int, int], list[list[str]]] = {}
        for (room, free, _), names in self.groups.items():
            classes.setdefault((room // per, free), []).append(names)
        return [lists for _, lists in sorted(classes.items(), key=lambda item: (-item[0][0], -item[0][1]))]


@dataclasses.dataclass(frozen=True)
class _Moves:
    """What :meth:`ElasticPass._move_for_whole_node` may do: move a lender's workers above ``floor(lender)`` (its
    satellites; with ``movers``, those jobs' workers whatever their size) to other nodes; a job fits on one node when
    it needs at most ``node_gpus``."""

    floor: Callable[[JobInfo], int]
    node_gpus: int
    movers: Sequence[JobInfo] | None = None

    def on(self, lenders: dict[str, list[JobInfo]], fixed: dict[str, dict[str, int]]) -> dict[str, list[JobInfo]]:
        """Node -> the jobs whose workers may move off it: ``lenders``, or every job in ``movers`` when given
        (the whole-node layer's ``moves_minimum``)."""
        if self.movers is None:
            return lenders
        movers: dict[str, list[JobInfo]] = {}
        for mover in self.movers:
            for name in fixed.get(mover.job_id, mover.placement):
                movers.setdefault(name, []).append(mover)
        return movers


def _node_gpus(snapshot: Snapshot) -> int:
    return max((node.gpus_total for node in snapshot.nodes), default=1)
