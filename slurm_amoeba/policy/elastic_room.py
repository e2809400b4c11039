"""The daemon's elastic backfill on top of the ``slurm`` baseline: which extras go back for the jobs Slurm starts or
the daemon admits, where those jobs land, and who grows into the GPUs left idle.

The pass after Slurm's of the ``amoebad`` policy (:class:`~slurm_amoeba.policy.amoebad.AmoebadPolicy`, whose layers
hold the knobs read here); ``policy/slurm_baseline.py`` decides what Slurm alone would.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from slurm_amoeba.policy.actions import Resize
from slurm_amoeba.policy.common import SizeAction, distribute_spare, marginal_efficiency, speedup_gain
from slurm_amoeba.policy.types import JobInfo, Snapshot

if TYPE_CHECKING:
    from slurm_amoeba.policy.amoebad import AmoebadPolicy

#: How far above its request's GPU-seconds a job must be to count as ahead of it (1%: a job that held exactly its
#: request is not ahead, whatever the rounding of the caller's clocks).
AHEAD_MARGIN = 0.01


def elastic_layer(
    policy: AmoebadPolicy,
    snapshot: Snapshot,
    now: float,
    running: Sequence[JobInfo],
    started: Sequence[JobInfo],
    victims: set[str],
    targets: dict[str, int],
    reasons: dict[str, str],
) -> dict[str, dict[str, int]]:
    """The daemon's elastic backfill on top of ``policy``'s decisions: give extras back for the starts, grow into
    what stays idle.

    Returns:
        job id -> placement, for the jobs whose nodes were chosen here (compact starts and the shrinks for them).
    """
    sizes = {job.job_id: job.workers for job in running if job.job_id not in victims}
    lenders = [
        job for job in running if job.job_id in sizes and job.is_resizable and job.workers > policy.daemon_floor(job)
    ]
    fixed: dict[str, dict[str, int]] = {}
    compacted: set[str] = set()
    if policy.elastic.compact_starts:
        nodes = dict(snapshot.free_by_node())
        for job in running:
            if job.job_id in victims:
                for name, count in job.placement.items():
                    nodes[name] = nodes.get(name, 0) + count * job.gpus_per_worker
        for job in started:
            gated = policy.held_for_admission(job, now)
            keep = _start_keeps(policy, job, targets[job.job_id], nodes, lenders, sizes, snapshot, now)
            moves = None
            if policy.whole_node is not None and not gated:
                minimum = policy.whole_node.moves_minimum
                movers = [o for o in running if o.job_id in sizes and o.is_resizable]
                floor = (lambda _: 0) if minimum else policy.daemon_floor
                moves = _Moves(floor, _node_gpus(snapshot), movers if minimum else None)
            compact = gated and policy.admission is not None and policy.admission.compact_admissions
            fit = (job.min_workers, _node_gpus(snapshot)) if compact else None
            placed = _make_room(job, targets[job.job_id], nodes, lenders, sizes, fixed, reasons, keep, moves, fit)
            if placed is not None and placed != targets[job.job_id]:
                targets[job.job_id] = placed
                compacted.add(job.job_id)
    free = snapshot.free_gpus + sum(job.gpus for job in running if job.job_id in victims)
    free -= sum(targets[job.job_id] * job.gpus_per_worker for job in started)
    free += sum((job.workers - sizes[job.job_id]) * job.gpus_per_worker for job in lenders)
    extras = [(_give_back_key(job, sizes[job.job_id]), job.job_id, job) for job in lenders]
    extras = [entry for entry in extras if sizes[entry[1]] > policy.daemon_floor(entry[2])]
    heapq.heapify(extras)
    while free < 0 and extras:
        _, key, victim = heapq.heappop(extras)
        sizes[key] -= 1
        fixed.pop(key, None)
        free += victim.gpus_per_worker
        reasons[key] = "slurm+elastic-backfill: gives extra GPUs back for a job Slurm starts"
        if sizes[key] > policy.daemon_floor(victim):
            heapq.heappush(extras, (_give_back_key(victim, sizes[key]), key, victim))
    for job in started:
        sizes[job.job_id] = targets[job.job_id]
    growers = [job for job in running if job.job_id in sizes and job.job_id not in reasons]
    growers += [job for job in started if job.job_id not in compacted]
    before = dict(sizes)
    if policy.elastic.restore_requests:
        free = _restore_requests(growers, sizes, free)
    distribute_spare(growers, sizes, max(free, 0), policy.elastic.min_gain, policy.elastic.grow_by_service)
    held = {job.job_id: job.workers for job in running}
    for key, size in sizes.items():
        if size != before[key]:
            fixed.pop(key, None)
            reasons[key] = (
                "slurm+elastic-backfill: idle GPUs, least attained service first"
                if policy.elastic.grow_by_service
                else "slurm+elastic-backfill: idle GPUs, largest speedup gain"
            )
        if key in targets or size != held.get(key, 0):
            targets[key] = size
    return fixed


def _start_keeps(
    policy: AmoebadPolicy,
    job: JobInfo,
    workers: int,
    nodes: dict[str, int],
    lenders: Sequence[JobInfo],
    sizes: dict[str, int],
    snapshot: Snapshot,
    now: float,
) -> Callable[[JobInfo], int]:
    """The fewest workers each lender keeps when ``job`` starts at ``workers``: its Slurm floor for a job Slurm
    starts; for an admission its minimum (:func:`admission_keeps` with ``protect_requests``; :func:`admission_spares`
    when the free GPUs and the extras above it hold the job, else its minimum)."""
    if not policy.held_for_admission(job, now):
        return policy.slurm_floor
    spared = admission_spares(policy, job, snapshot, now)
    if spared is not None:
        room = sum(nodes.values()) + sum(max(sizes[o.job_id] - spared(o), 0) * o.gpus_per_worker for o in lenders)
        if room >= workers * job.gpus_per_worker:
            return spared
    protect = policy.admission is not None and policy.admission.protect_requests
    return admission_keeps(policy.elastic.min_gain) if protect else policy.daemon_floor


def admission_spares(
    policy: AmoebadPolicy, job: JobInfo, snapshot: Snapshot, now: float
) -> Callable[[JobInfo], int] | None:
    """For an elastic job the daemon admits: the fewest workers each running job keeps for it when the free GPUs and
    the others' extras hold it, or ``None`` (no such rule: every elastic job down to its minimum).

    ``spare_tail_factor``: :func:`spares_tail`, while the other pending jobs ask for at most
    ``spare_tail_queue_share`` of the cluster's GPUs; ``spare_longer_jobs``: :func:`spares`.
    """
    admission = policy.admission
    if admission is None or not policy.held_for_admission(job, now):
        return None
    if admission.spare_tail_factor > 0:
        queued = sum(o.requested_workers * o.gpus_per_worker for o in snapshot.pending() if o.job_id != job.job_id)
        if queued <= admission.spare_tail_queue_share * snapshot.total_gpus:
            return spares_tail(policy.time_left, admission.spare_tail_factor * policy.time_left(job))
    if admission.spare_longer_jobs:
        return spares(policy.elastic.min_gain, policy.time_left, policy.time_left(job))
    return None


def spared_size(
    policy: AmoebadPolicy, job: JobInfo, snapshot: Snapshot, running: Sequence[JobInfo], taken: int, now: float
) -> int | None:
    """The size an elastic job admitted at its request starts at under :func:`admission_spares` (``None`` when no
    such rule applies): its request when the free GPUs (less ``taken`` this round) and the extras the running jobs
    may give hold it, else what they hold if that is at least its minimum, else its request (taking from every job,
    as without the rule: an admission held until such jobs end waited for hours, docs/simulator.md)."""
    keep = admission_spares(policy, job, snapshot, now)
    if keep is None:
        return None
    extras = sum(max(other.workers - keep(other), 0) * other.gpus_per_worker for other in running)
    size = min(job.requested_workers, (snapshot.free_gpus + extras - taken) // job.gpus_per_worker)
    return size if size >= job.min_workers else job.requested_workers


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


def _restore_requests(jobs: Sequence[JobInfo], sizes: dict[str, int], free: int) -> int:
    """Give ``free`` GPUs to the jobs below their request and behind it, most behind first, up to their request
    (``restore_requests``); returns the GPUs left. ``sizes`` is updated."""
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


def _keeps_minimum(job: JobInfo) -> int:
    """The fewest workers a lender keeps when a job Slurm starts needs room: its minimum."""
    return job.min_workers


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


def _make_room(
    job: JobInfo,
    workers: int,
    nodes: dict[str, int],
    lenders: Sequence[JobInfo],
    sizes: dict[str, int],
    fixed: dict[str, dict[str, int]],
    reasons: dict[str, str],
    keep: Callable[[JobInfo], int] = _keeps_minimum,
    moves: _Moves | None = None,
    fit: tuple[int, int] | None = None,
) -> int | None:
    """Place a job Slurm starts on the fewest nodes, taking back the extras that run there (``compact_starts``).

    Nodes are tried by what they could offer (free GPUs plus extras above their jobs' minimum), best fit first
    when one node can hold the job, else the largest first. On each chosen node the free GPUs go first, then the
    least useful extras. No lender goes below ``keep`` of it. ``nodes`` (free GPUs per node), ``sizes`` and
    ``fixed`` (the placements chosen) are updated; nothing changes when the job does not fit so (the caller's global
    rule then applies). With ``moves`` (``whole_node_starts``), a job that fits on one node but finds none whole so
    is placed on one node by moving lenders' workers off it (:func:`_move_for_whole_node`) before it is spread.
    With ``fit`` (fewest workers, GPUs per node: ``compact_admissions``), a job that fits on one node but finds none
    whole starts with what the roomiest node offers, if that is at least the fewest workers, instead of spread.

    Returns:
        The size it was placed at (``workers``, or less with ``fit``), or ``None`` when no placement was chosen.
    """
    per = job.gpus_per_worker
    on: dict[str, list[JobInfo]] = {}
    for lender in lenders:
        for name in lender.placement:
            on.setdefault(name, []).append(lender)

    def offer(name: str, floor: Callable[[JobInfo], int]) -> int:
        lent = sum(
            min(fixed.get(o.job_id, o.placement).get(name, 0), max(sizes[o.job_id] - floor(o), 0)) * o.gpus_per_worker
            for o in on.get(name, [])
        )
        return (nodes[name] + lent) // per

    offers = {name: offer(name, keep) for name in nodes}
    loans = {name: offer(name, lambda o: max(o.requested_workers, o.min_workers)) for name in nodes}
    whole = [name for name in offers if offers[name] >= workers]
    if whole:
        # Best fit: a node with room free first, then one whose room is lent GPUs above requests, the smallest.
        chosen = [min(whole, key=lambda n: (nodes[n] < workers * per, loans[n] < workers, offers[n], n))]
    else:
        if moves is not None and _move_for_whole_node(
            job, workers, nodes, moves.on(on, fixed), sizes, fixed, reasons, keep, moves
        ):
            return workers
        best = max(offers, key=lambda n: (offers[n], nodes[n], n))
        if fit is not None and workers * per <= fit[1] and fit[0] <= offers[best]:
            workers = offers[best]  # ``compact_admissions``: smaller, on one node
            chosen = [best]
        else:
            chosen = []
            total = 0
            for name in sorted(offers, key=lambda name: (-offers[name], -nodes[name], name)):
                if total >= workers:
                    break
                chosen.append(name)
                total += offers[name]
            if total < workers:
                return None
    placement: dict[str, int] = {}
    left = workers
    for name in chosen:
        take = min(left, offers[name])
        _give_back_on(job, name, take * per, nodes, on.get(name, []), sizes, fixed, reasons, keep)
        take = min(take, nodes[name] // per)
        nodes[name] -= take * per
        placement[name] = take
        left -= take
    if left == 0:
        fixed[job.job_id] = placement
        return workers
    return None


def _give_back_on(
    job: JobInfo,
    name: str,
    need: int,
    nodes: dict[str, int],
    lenders: Sequence[JobInfo],
    sizes: dict[str, int],
    fixed: dict[str, dict[str, int]],
    reasons: dict[str, str],
    keep: Callable[[JobInfo], int],
) -> None:
    """Take back lenders' extras on node ``name`` (above ``keep``; the least useful first, :func:`_give_back_key`)
    until it has ``need`` GPUs free for ``job`` or none is left."""
    while nodes[name] < need:
        givers = [o for o in lenders if sizes[o.job_id] > keep(o) and fixed.get(o.job_id, o.placement).get(name, 0) > 0]
        if not givers:
            return
        giver = min(givers, key=lambda o: (_give_back_key(o, sizes[o.job_id]), o.job_id))
        current = dict(fixed.get(giver.job_id, giver.placement))
        current[name] -= 1
        fixed[giver.job_id] = {key: count for key, count in current.items() if count > 0}
        sizes[giver.job_id] -= 1
        nodes[name] += giver.gpus_per_worker
        reasons[giver.job_id] = f"slurm+elastic-backfill: gives extra GPUs back for job {job.job_id} on {name}"


@dataclasses.dataclass(frozen=True)
class _Moves:
    """What :func:`_move_for_whole_node` may do: move a lender's workers above ``floor(lender)`` (its satellites; with
    ``movers``, those jobs' workers whatever their size) to other nodes; a job fits on one node when it needs at most
    ``node_gpus``."""

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


def _move_for_whole_node(
    job: JobInfo,
    workers: int,
    nodes: dict[str, int],
    on: dict[str, list[JobInfo]],
    sizes: dict[str, int],
    fixed: dict[str, dict[str, int]],
    reasons: dict[str, str],
    keep: Callable[[JobInfo], int],
    moves: _Moves,
) -> bool:
    """Place a job Slurm starts on one node when no node offers it whole (``whole_node_starts``); returns whether
    it did.

    A job Slurm would otherwise spread over nodes trains up to 2.6x slower there (measured placements), while under
    Slurm alone it often lands on one node. On the node that needs the fewest GPUs moved, its free GPUs go first,
    then the lenders' extras above ``keep`` go back (as a spread start would take them), then lenders' workers above
    ``moves.floor`` move to free GPUs on other nodes (their own nodes first, then the most free): a lender keeps its
    size and pays a move. ``nodes``, ``sizes`` and ``fixed`` are updated only when it succeeds.
    """
    need = workers * job.gpus_per_worker
    if need > moves.node_gpus:
        return False
    best: tuple[int, str, dict[str, dict[str, int]], dict[str, int]] | None = None
    for name in sorted(nodes):
        plan = _plan_whole_node(name, need, nodes, on, sizes, fixed, keep, moves.floor)
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
        reasons[key] = (
            f"slurm+elastic-backfill: moves workers off {name} so that job {job.job_id} starts on one node"
            if sum(placement.values()) == sizes[key] and key not in shrunk
            else f"slurm+elastic-backfill: gives extra GPUs back for job {job.job_id} on {name}"
        )
    nodes[name] -= need
    fixed[job.job_id] = {name: workers}
    return True


def _plan_whole_node(
    name: str,
    need: int,
    nodes: dict[str, int],
    on: dict[str, list[JobInfo]],
    sizes: dict[str, int],
    fixed: dict[str, dict[str, int]],
    keep: Callable[[JobInfo], int],
    floor: Callable[[JobInfo], int],
) -> tuple[int, dict[str, dict[str, int]], dict[str, int]] | None:
    """How ``need`` GPUs are freed on node ``name``: (GPUs moved, the changed lenders' new placements, workers
    each gives back), or ``None`` when they cannot be. Extras above ``keep`` go back first (the least useful first),
    then workers above ``floor`` move to free GPUs elsewhere."""
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
