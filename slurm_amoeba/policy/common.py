"""Building blocks the policies share: placement on nodes, queue orders, and turning target sizes into actions.

Every policy in this package decides *target sizes* (workers per job, 0 for preempted or still pending) and hands
them to :func:`realize`, which frees what shrinks first, then places growth and starts on the nodes with the most
free GPUs, and answers with typed actions (:func:`size_action`: start, resize, preempt or place). Keeping this in
one place means one placement rule for all policies and one place to test it.
"""

from __future__ import annotations

import heapq
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeAlias

from slurm_amoeba.policy.actions import Place, Preempt, Resize, Start
from slurm_amoeba.policy.types import JobInfo, JobPhase, Snapshot

#: The actions a size decision turns into (what :func:`realize` answers with).
SizeAction: TypeAlias = Start | Resize | Preempt | Place

#: The action types :func:`realize` emits.
SIZE_CHANGES: frozenset[type[SizeAction]] = frozenset({Start, Resize, Preempt, Place})


def size_action(job: JobInfo, workers: int, placement: Mapping[str, int], reason: str) -> SizeAction:
    """The action that gives ``job`` (as the snapshot shows it) ``workers`` workers on ``placement``.

    A pending job starts; a running job goes to 0 (preempted), to another size (resized) or, at its size, to new
    nodes (placed).

    Args:
        job: the job.
        workers: its size afterwards (0: preempted).
        placement: node name -> workers afterwards; empty when the executor picks the nodes.
        reason: why.

    Returns:
        The action.
    """
    if job.state is JobPhase.PENDING:
        return Start(job.job_id, workers, placement, reason)
    if workers == 0:
        return Preempt(job.job_id, reason)
    if workers == job.workers:
        return Place(job.job_id, placement, reason)
    return Resize(job.job_id, workers, placement, reason)


def place_most_free(free: Mapping[str, int], workers: int, gpus_per_worker: int = 1) -> dict[str, int] | None:
    """Place ``workers`` workers on the nodes with the most free GPUs first.

    Each step takes the node with the most free GPUs (the earlier node in ``free`` on a tie) and puts as many of the
    remaining workers there as fit. This is Tiresias's rule in the Pollux artifact.

    Args:
        free: node -> free GPUs (not modified).
        workers: workers to place.
        gpus_per_worker: GPUs each worker needs on one node.

    Returns:
        node -> workers, or ``None`` when they do not fit.
    """
    slots = {name: gpus // gpus_per_worker for name, gpus in free.items() if gpus >= gpus_per_worker}
    if sum(slots.values()) < workers:
        return None
    order = sorted(slots, key=lambda name: -slots[name])
    placement: dict[str, int] = {}
    need = workers
    for name in order:
        if need == 0:
            break
        take = min(slots[name], need)
        placement[name] = take
        need -= take
    return placement


def shrink_placement(current: Mapping[str, int], remove: int) -> dict[str, int]:
    """Take ``remove`` workers away, from the nodes where the job has the fewest workers first.

    Emptying its smallest pieces first keeps a job on as few nodes as possible.

    Args:
        current: node -> workers the job holds now.
        remove: workers to take away (at most the job's size).

    Returns:
        The new placement, without nodes left empty.
    """
    result = dict(current)
    left = remove
    for name in sorted(result, key=lambda node: result[node]):
        if left == 0:
            break
        take = min(result[name], left)
        result[name] -= take
        left -= take
    return {name: count for name, count in result.items() if count > 0}


class FreeGpus:
    """Free GPUs per node, with the node that has the most of them always at hand.

    A heap keyed by (most free, earlier node) makes each placement cost O(nodes used x log nodes) instead of a sort
    of all nodes; a count of nodes by free GPUs answers "do these workers fit at all?" in O(GPUs per node) before
    any node is looked at, so a job that does not fit (most pending jobs on a full cluster) costs no scan of the
    nodes. Together they keep a decision over n jobs and m nodes within O((n + m) log m).

    Each heap entry is one integer, ``index - free * nodes`` (``index``: the node's place in the mapping), so the
    heap compares integers, not tuples; an entry is current while its node's free count is still the one it was
    pushed with, and the others are dropped when they come up (two current entries of one node are the same).
    """

    def __init__(self, free: Mapping[str, int]) -> None:
        """Start from node -> free GPUs (the mapping's order breaks ties).

        Only the nodes with free GPUs enter the heap (on a busy cluster, few): a full node can take nothing, and a
        node that frees GPUs later enters it then (:meth:`change`).
        """
        self.free = dict(free)
        self._names = list(self.free)
        self._index = {name: i for i, name in enumerate(self._names)}
        self._stride = max(len(self._names), 1)
        self._heap = [i - gpus * self._stride for i, gpus in enumerate(self.free.values()) if gpus > 0]
        heapq.heapify(self._heap)
        self._nodes_with: dict[int, int] = dict(Counter(self.free.values()))
        self._single_slots = sum(gpus for gpus in self.free.values() if gpus > 0)

    def change(self, name: str, delta: int) -> None:
        """Add ``delta`` GPUs (negative: take) to a node's free count."""
        before = self.free.get(name)
        if before is not None and delta != 0:
            heapq.heappush(self._heap, self._count(name, before, before + delta))

    def _count(self, name: str, before: int, after: int) -> int:
        """Record a node's new free count (``before`` -> ``after``); returns its heap entry, for the caller to put in
        the heap (its entries before that one are stale from now on, unless the count comes back to theirs)."""
        self.free[name] = after
        nodes_with = self._nodes_with
        nodes_with[before] -= 1
        nodes_with[after] = nodes_with.get(after, 0) + 1
        self._single_slots += (after if after > 0 else 0) - (before if before > 0 else 0)
        return self._index[name] - after * self._stride

    def slots(self, gpus_per_worker: int = 1) -> int:
        """How many workers of ``gpus_per_worker`` GPUs fit on the free GPUs (each worker on one node)."""
        if gpus_per_worker == 1:
            return self._single_slots
        return sum(
            count * (gpus // gpus_per_worker) for gpus, count in self._nodes_with.items() if gpus >= gpus_per_worker
        )

    def place(self, workers: int, gpus_per_worker: int = 1) -> dict[str, int] | None:
        """Place workers on the nodes with the most free GPUs first, and take those GPUs.

        Args:
            workers: workers to place.
            gpus_per_worker: GPUs each worker needs on one node.

        Returns:
            node -> workers, or ``None`` (nothing taken) when they do not fit.
        """
        if (self._single_slots if gpus_per_worker == 1 else self.slots(gpus_per_worker)) < workers:
            return None
        heap, names, free, stride = self._heap, self._names, self.free, self._stride
        while heap:  # stale entries on top: drop them for good
            taken, index = divmod(heap[0], stride)  # taken: minus the free count the entry was pushed with
            name = names[index]
            if free[name] == -taken:
                if workers > 0 and -taken // gpus_per_worker >= workers:
                    # The most free node holds them all (most starts): one heap move instead of a pop and two pushes.
                    heapq.heapreplace(heap, self._count(name, -taken, -taken - workers * gpus_per_worker))
                    return {name: workers}
                break
            heapq.heappop(heap)
        placement: dict[str, int] = {}
        popped: list[int] = []
        need = workers
        while need > 0 and heap:
            entry = heapq.heappop(heap)
            taken, index = divmod(entry, stride)
            name = names[index]
            if free[name] != -taken or name in placement:  # stale, or a second entry of a node already taken
                continue
            popped.append(entry)
            slots = -taken // gpus_per_worker
            if slots == 0:  # every node after this one has no more free GPUs
                break
            take = min(slots, need)
            placement[name] = take
            need -= take
        for entry in popped:
            heapq.heappush(heap, entry)
        if need > 0:
            return None
        for name, count in placement.items():
            self.change(name, -count * gpus_per_worker)
        return placement

    def grow(self, current: Mapping[str, int], extra: int, gpus_per_worker: int = 1) -> dict[str, int] | None:
        """Add workers to a placement, on its own nodes first, then on the most free nodes; take those GPUs.

        Returns:
            The new placement, or ``None`` (nothing taken) when the extra workers do not fit.
        """
        own: dict[str, int] = {}
        need = extra
        for name in current:
            take = min(self.free.get(name, 0) // gpus_per_worker, need)
            if take > 0:
                own[name] = take
                need -= take
        for name, count in own.items():
            self.change(name, -count * gpus_per_worker)
        more = self.place(need, gpus_per_worker) if need > 0 else {}
        if more is None:
            for name, count in own.items():
                self.change(name, count * gpus_per_worker)
            return None
        result = dict(current)
        for part in (own, more):
            for name, count in part.items():
                result[name] = result.get(name, 0) + count
        return result


def admit_in_order(order: Sequence[JobInfo], capacity: int) -> dict[str, int]:
    """Exact-size admission down a priority order (Tiresias, SRTF): jobs that fit keep or get their GPUs.

    Args:
        order: the jobs, highest priority first.
        capacity: GPUs the policy may hand out.

    Returns:
        job id -> target size for the jobs that change: a pending job that fits starts at its requested size, a
        running job that no longer fits is preempted (0).
    """
    targets: dict[str, int] = {}
    for job in order:
        need = job.gpus if job.state is JobPhase.RUNNING else job.requested_workers * job.gpus_per_worker
        if need <= capacity:
            capacity -= need
            if job.state is JobPhase.PENDING:
                targets[job.job_id] = job.requested_workers
        elif job.state is JobPhase.RUNNING:
            targets[job.job_id] = 0
    return targets


def admit_at_minimum(order: Iterable[JobInfo], capacity: int) -> tuple[dict[str, int], list[JobInfo], int]:
    """Admission down a priority order at minimum sizes (E-Tiresias, goodput): a pending job or a resizable running
    one is admitted at :func:`base_size`, any other running job at its size, while the GPUs last.

    Args:
        order: the jobs, highest priority first.
        capacity: GPUs the policy may hand out.

    Returns:
        (job id -> its admitted size, 0 when it does not fit; the admitted jobs in order; the GPUs left).
    """
    sizes: dict[str, int] = {}
    admitted: list[JobInfo] = []
    pending = JobPhase.PENDING
    for job in order:
        size = base_size(job) if job.state is pending or job.is_resizable else job.workers
        if size * job.gpus_per_worker <= capacity:
            capacity -= size * job.gpus_per_worker
            sizes[job.job_id] = size
            admitted.append(job)
        else:
            sizes[job.job_id] = 0
    return sizes, admitted, capacity


def schedulable(snapshot: Snapshot) -> tuple[list[JobInfo], int]:
    """The jobs a policy orders and sizes, and the GPUs it may hand out, in one pass over the jobs.

    The jobs: all but those on another job's GPUs (they follow their host) and the held ones (they may not start
    until released, as in Slurm), in snapshot order. The GPUs: the free ones plus those held exclusively by running
    jobs; in the simulator this is every GPU, in the daemon GPUs held by work the policy does not manage are left out.
    """
    jobs: list[JobInfo] = []
    held = 0
    for job in snapshot.jobs:
        if job.shared_with is None:
            held += job.workers * job.gpus_per_worker
            if not job.held:
                jobs.append(job)
    return jobs, snapshot.free_gpus + held


def las_queue(attained_gpu_s: float, thresholds_gpu_s: Sequence[float]) -> int:
    """The 2D-LAS queue of a job (Tiresias): how many of the thresholds its attained GPU-seconds have reached (0 is
    served first)."""
    queue = 0
    for threshold in thresholds_gpu_s:  # a loop, not sum() over a generator: a decision calls this once per job
        if attained_gpu_s >= threshold:
            queue += 1
    return queue


#: Sort key for first come, first served: submit time, then id (``operator.attrgetter``: a decision sorts every job
#: by it, and a key read in C costs a fraction of a Python call).
arrival_key: Callable[[JobInfo], tuple[float, str]] = operator.attrgetter("submit_time", "job_id")


def las_fcfs_order(jobs: Iterable[JobInfo], thresholds_gpu_s: Sequence[float]) -> list[JobInfo]:
    """Jobs by 2D-LAS queue (:func:`las_queue`), first come, first served within a queue (:data:`arrival_key`).

    The order of the key ``(las_queue(...), submit_time, job_id)``, built as one sort by arrival and a stable split
    into the queues: the sort's key is read in C, and the queue of each job is counted once.
    """
    queues: list[list[JobInfo]] = [[] for _ in range(len(thresholds_gpu_s) + 1)]
    for job in sorted(jobs, key=arrival_key):
        attained, queue = job.attained_service, 0
        for threshold in thresholds_gpu_s:  # las_queue, inline: this runs once per job of the cluster
            if attained >= threshold:
                queue += 1
        queues[queue].append(job)
    return [job for queue in queues for job in queue]


def priority_key(job: JobInfo) -> tuple[int, float, str]:
    """Sort key for Slurm-like priority order: higher priority first, then first come, first served."""
    return (-job.priority, job.submit_time, job.job_id)


def priority_order(jobs: Iterable[JobInfo]) -> list[JobInfo]:
    """Jobs sorted by :func:`priority_key`, as two sorts keyed in C: by arrival, then stably by priority, highest
    first (``reverse`` keeps a sort stable)."""
    return sorted(sorted(jobs, key=arrival_key), key=operator.attrgetter("priority"), reverse=True)


def base_size(job: JobInfo) -> int:
    """The size a job starts with: its minimum when elastic, its requested size otherwise."""
    return job.min_workers if job.is_elastic else job.requested_workers


def speedup_gain(job: JobInfo, workers: int) -> float:
    """The gain in speed of one more worker at size ``workers``, in units of the job's speed at its minimum.

    Without a measured rate the job is assumed to scale linearly (a gain of ``1 / min_workers``).

    Args:
        job: the job.
        workers: its size before the extra worker.

    Returns:
        ``(rate(workers + 1) - rate(workers)) / rate(min_workers)``, per GPU of the worker.
    """
    base = job.rate(job.min_workers)
    now = job.rate(workers)
    nxt = job.rate(workers + 1)
    if base is None or now is None or nxt is None or base <= 0.0:
        return 1.0 / (job.min_workers * job.gpus_per_worker)
    return (nxt - now) / base / job.gpus_per_worker


def marginal_efficiency(job: JobInfo, workers: int) -> float:
    """What one more worker at size ``workers`` adds, as a fraction of a worker's speed at the minimum size.

    1.0 means the extra worker is as useful as each worker is at the minimum (linear scaling); without a measured
    rate the job is assumed to scale linearly.

    Args:
        job: the job.
        workers: its size before the extra worker.

    Returns:
        ``(rate(workers + 1) - rate(workers)) / (rate(min_workers) / min_workers)``.
    """
    return speedup_gain(job, workers) * job.min_workers * job.gpus_per_worker


def distribute_spare(
    jobs: Sequence[JobInfo], sizes: Mapping[str, int], spare_gpus: int, min_gain: float, by_service: bool = False
) -> dict[str, int]:
    """Give spare GPUs, one worker at a time, to the jobs whose speed gains most per GPU.

    The order is by :func:`speedup_gain` (relative to each job's speed at its minimum, which favours the jobs whose
    completion time shrinks most); a job stops growing once an extra worker would add less than ``min_gain`` of a
    worker's worth (:func:`marginal_efficiency`).

    Args:
        jobs: the candidates (only resizable jobs with a size below their maximum grow).
        sizes: job id -> size so far (left as it is).
        spare_gpus: GPUs to hand out at most.
        min_gain: the smallest marginal efficiency worth a resize.
        by_service: rank by least attained service instead (the least-attained-service idea of Tiresias applied
            to growth: young jobs, mostly the short ones of heavy-tailed workloads, grow first), each job growing
            while its extra workers pass ``min_gain``.

    Returns:
        A copy of ``sizes``, in its order, with the growth added.
    """
    grown = dict(sizes)

    def entry(index: int, job: JobInfo, size: int) -> tuple[float, int, float, JobInfo]:
        """The job's heap entry at ``size``: its rank, its index (unique: ties never compare further), and the gain
        of its next worker (:func:`speedup_gain`, worked out once per size for both the rank and the threshold)."""
        gain = speedup_gain(job, size)
        return (job.attained_service if by_service else -gain, index, gain, job)

    heap = [
        entry(index, job, grown.get(job.job_id, 0))
        for index, job in enumerate(jobs)
        if job.is_resizable and 0 < grown.get(job.job_id, 0) < job.max_workers
    ]
    heapq.heapify(heap)
    while heap and spare_gpus > 0:
        _, index, gain, job = heapq.heappop(heap)
        size = grown[job.job_id]
        # marginal_efficiency(job, size), from the gain the entry carries
        if job.gpus_per_worker > spare_gpus or gain * job.min_workers * job.gpus_per_worker < min_gain:
            continue
        grown[job.job_id] = size + 1
        spare_gpus -= job.gpus_per_worker
        if size + 1 < job.max_workers:
            heapq.heappush(heap, entry(index, job, size + 1))
    return grown


def changed_sizes(
    order: Iterable[JobInfo], sizes: Mapping[str, int], why: Callable[[JobInfo, int], str]
) -> tuple[dict[str, int], dict[str, str]]:
    """The targets and reasons for :func:`realize`, in one walk of the jobs.

    Args:
        order: the jobs, in the order the targets should keep.
        sizes: job id -> the size decided, for every job of ``order``.
        why: the reason for a job's new size.

    Returns:
        (job id -> size, job id -> reason) for the jobs whose size differs from the one they hold.
    """
    targets: dict[str, int] = {}
    reasons: dict[str, str] = {}
    for job in order:
        size = sizes[job.job_id]
        if size != job.workers:
            targets[job.job_id] = size
            reasons[job.job_id] = why(job, size)
    return targets, reasons


def realize(
    snapshot: Snapshot,
    targets: Mapping[str, int],
    order: Iterable[JobInfo],
    reason: Mapping[str, str],
    fixed: Mapping[str, Mapping[str, int]] | None = None,
) -> list[SizeAction]:
    """Turn target sizes into actions with placements (:func:`size_action`).

    Shrinks and preemptions free their GPUs first; then running jobs grow and pending jobs start, in ``order``,
    on their own nodes first and then the nodes with the most free GPUs. A job whose growth or start does not fit
    (a placement the node sizes cannot hold) keeps what it has.

    Args:
        snapshot: the cluster now.
        targets: job id -> target size (0 = preempt or stay pending); jobs not named keep their size.
        order: the jobs in the order in which growth and starts are placed.
        reason: job id -> why (for the action's ``reason``); a missing entry gives an empty reason.
        fixed: job id -> the placement it gets, for jobs whose nodes the policy chose itself (a shrink off given
            nodes, a start on given nodes); these are applied before any other growth or start. A fixed start or
            growth that the free GPUs cannot hold falls back to the default placement.

    Returns:
        One action per job whose size (or, for a fixed placement, whose nodes) changes.
    """
    free = FreeGpus(snapshot.free_by_node())
    decisions: list[SizeAction] = []
    by_id = snapshot.by_id()
    guests = {job.shared_with: job.job_id for job in snapshot.jobs if job.shared_with is not None}
    releases = dict(targets)
    if guests:
        left: dict[str, str] = {}
        for job_id, target in targets.items():
            guest = guests.get(job_id)
            if guest is not None and target < by_id[job_id].workers and releases.get(guest, 1) != 0:
                # A guest cannot stay on GPUs its host gives up.
                releases[guest] = 0
                left[guest] = f"its host {job_id} gives up the GPUs it shares"
        if left:
            reason = {**reason, **left}
    growing: dict[str, int] = {}  # job id -> its size, for the jobs that grow or start
    for job_id, target in releases.items():
        job = by_id[job_id]
        if target > job.workers:
            if job.shared_with is None:
                growing[job_id] = target
            continue
        if job.state is not JobPhase.RUNNING or target == job.workers:
            continue
        if target == 0:
            new: dict[str, int] = {}
        elif fixed is not None and job_id in fixed:
            new = dict(fixed[job_id])
        else:
            new = shrink_placement(job.placement, job.workers - target)
        if job.shared_with is None:  # a fixed shrink may also move workers to nodes the job was not on
            for name in {**job.placement, **new}:
                free.change(name, (job.placement.get(name, 0) - new.get(name, 0)) * job.gpus_per_worker)
        decisions.append(size_action(job, target, new, reason.get(job_id, "")))
    pinned = _place_fixed(free, by_id, releases, fixed or {}, reason)
    decisions.extend(pinned.values())
    for job in order:
        size = growing.get(job.job_id)
        if size is None or job.job_id in pinned:
            continue
        if job.state is JobPhase.RUNNING:
            grown = free.grow(job.placement, size - job.workers, job.gpus_per_worker)
        else:
            grown = free.place(size, job.gpus_per_worker)
        if grown is None:
            continue
        decisions.append(size_action(job, size, grown, reason.get(job.job_id, "")))
    return decisions


def _place_fixed(
    free: FreeGpus,
    jobs: Mapping[str, JobInfo],
    targets: Mapping[str, int],
    fixed: Mapping[str, Mapping[str, int]],
    reason: Mapping[str, str],
) -> dict[str, SizeAction]:
    """Place the growth and starts whose placement the policy chose (taking their GPUs from ``free``); returns
    job id -> the action, for those placed so, in ``fixed``'s order."""
    placed: dict[str, SizeAction] = {}
    for job_id, placement in fixed.items():
        job = jobs[job_id]
        target = targets.get(job_id, job.workers)
        if target < job.workers or job.shared_with is not None or sum(placement.values()) != target:
            continue
        moved = target == job.workers
        if moved and (job.state is not JobPhase.RUNNING or placement == job.placement):
            continue
        added = {name: count - job.placement.get(name, 0) for name, count in placement.items()}
        if any(
            (count < 0 and not moved) or free.free.get(name, 0) < count * job.gpus_per_worker
            for name, count in added.items()
        ):
            continue
        if moved:  # a running job's workers move: the nodes it leaves free up
            added.update({name: -count for name, count in job.placement.items() if name not in placement})
        for name, count in added.items():
            if count:
                free.change(name, -count * job.gpus_per_worker)
        placed[job_id] = size_action(job, target, dict(placement), reason.get(job_id, ""))
    return placed
