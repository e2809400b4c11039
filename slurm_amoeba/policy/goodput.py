"""Goodput: GPUs (and, for jobs that allow it, global batch sizes) to maximise the sum of fair speedups.

The objective, after Pollux (OSDI 2021): with ``s_j(w)`` job ``j``'s speedup at ``w`` workers over its minimum size,
measured in *goodput* (throughput x statistical efficiency) for a job with an adaptive batch and in throughput
otherwise, the policy maximises

    sum_j v_j U(s_j(w_j)),   U(s) = s^p / p  (p < 0: fairness; p -> 0: log s; p = 1: the plain sum of speedups),

with ``p`` = ``fairness`` (0.5 by default; Pollux's is -1) and ``v_j = (1 + attained_j / service_scale_gpu_s) **
-service_weight`` a weight that falls with the job's attained service (Tiresias's least-attained-service idea put
into the objective: without knowing how long jobs run, favouring those that ran least lowers the mean JCT). ``U``
is concave, so GPUs handed out one worker at a time to the largest weighted marginal gain per GPU maximise it for
concave speedups (the greedy is exact for separable concave objectives); a heap keeps that at O(GPUs x log jobs).
Where one more worker is not worth ``min_gain`` (a table that dips, e.g. where a job spills onto a second node),
the policy looks up to ``lookahead`` workers ahead and may grant the jump at once (the concave hull).

Admission is 2D-LAS (Tiresias): jobs in order of attained-service queue (``thresholds_gpu_s``; within a queue
first come, first served) get their minimum size (a regular job its size) while GPUs remain; running jobs that no
longer fit are preempted. This runtime's resizes are cheap (a step-boundary switch, no restart), so a running job's
size is not frozen, only favoured: the workers it holds count ``1 + keep_bonus`` times in the greedy, and a worker
is only given when it adds at least ``min_gain`` of a worker's worth of speed. With ``pack`` (off by default) the
placements go on as few nodes as possible, moving a growing job onto one node when one holds it: a what-if for the
simulator, since the daemon leaves node choice to Slurm.

For adaptive jobs, :class:`GoodputModel` turns the runtime's report (the noise scale and the measured step times,
``slurm_amoeba.runtime.adaptive``) into goodput per size and the batch to use there (:meth:`GoodputModel.best`);
the daemon and the simulator put :func:`goodput_rates` into ``JobInfo.throughput``, so the policy itself sees one
rate table per job, whatever the job. Its answer carries the batches (:func:`with_batches`): a resize of a job whose
snapshot shows a goodput model (``JobInfo.adaptive``) and a batch (``JobInfo.batch``) carries the model's best batch
at the new size, and a running job the answer leaves at its size gets a resize to the same size carrying only a new
batch when its own has drifted from the model's best by :data:`REBATCH_FACTOR` or more (the noise scale grows as
training goes on), unless it is pinned, resizing or sharing GPUs (a job of fixed size gets such batch-only resizes
too). Jobs with a fixed batch, or whose user sets the batch (``JobInfo.batch`` None), never get one; other policies
weigh sizes only and send none (the job's runtime keeps choosing its own, docs/runtime.md section 12). Pure: imports
only ``core`` and ``policy``.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from slurm_amoeba.core.efficiency import efficiency
from slurm_amoeba.policy.actions import Action, Preempt, Resize, Start
from slurm_amoeba.policy.common import (
    SizeAction,
    admit_at_minimum,
    changed_sizes,
    las_fcfs_order,
    las_queue,
    realize,
    schedulable,
    shrink_placement,
    size_action,
)
from slurm_amoeba.policy.types import JobInfo, JobPhase, PolicyError, Snapshot

#: Attained GPU-seconds at which a job drops to the next LAS queue (1 and 16 GPU-hours).
DEFAULT_THRESHOLDS_GPU_S = (3600.0, 16 * 3600.0)
#: A job the policy keeps at its size is sent a new batch only when its own differs by this factor or more.
REBATCH_FACTOR = 1.25


@dataclasses.dataclass(frozen=True)
class GoodputModel:
    """A job's goodput as a function of workers and global batch.

    Step time ``t(w, B) = fixed_s + (sync_s if w > 1) + sample_s * B / w``; goodput
    ``B / t(w, B) * efficiency(B)``, in samples of the initial batch per second.

    Attributes:
        base_batch: the initial (smallest) global batch ``B0``.
        max_batch: the largest global batch the job allows (``B0`` for a fixed batch).
        noise_scale: the gradient noise scale ``phi`` (``None``: not measured; no batch gain is assumed).
        sample_s: seconds of compute per sample on one worker.
        fixed_s: seconds per step that do not shrink with workers (optimizer, data, launch).
        sync_s: seconds per step of gradient all-reduce with more than one worker.
    """

    base_batch: int
    max_batch: int
    noise_scale: float | None
    sample_s: float
    fixed_s: float = 0.0
    sync_s: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.base_batch <= self.max_batch:
            raise PolicyError(f"batch range {self.base_batch}..{self.max_batch} is invalid: need 1 <= base <= max")
        if self.sample_s <= 0 or self.fixed_s < 0 or self.sync_s < 0:
            raise PolicyError(
                f"step-time model sample_s={self.sample_s}, fixed_s={self.fixed_s}, sync_s={self.sync_s} is invalid: "
                "sample_s must be positive and the others not negative"
            )

    def step_time(self, workers: int, batch: int) -> float:
        """Seconds per step at ``workers`` workers and global batch ``batch``."""
        return self.fixed_s + (self.sync_s if workers > 1 else 0.0) + self.sample_s * batch / workers

    def goodput(self, workers: int, batch: int) -> float:
        """Initial-batch samples per second at ``workers`` and ``batch``."""
        return batch / self.step_time(workers, batch) * efficiency(self.noise_scale, batch, self.base_batch)

    def best(self, workers: int) -> tuple[int, float]:
        """The batch of highest goodput at ``workers`` workers (at least one sample per worker), and that goodput.

        Goodput in ``B`` is unimodal (throughput rises and saturates, efficiency falls), so the optimum is the
        closed-form stationary point ``B* = sqrt(phi * c / sample_per_worker)`` clipped to the range, with ``c`` the
        step's constant time; the integer neighbours are compared.
        """
        low = max(self.base_batch, min(workers, self.max_batch))
        if self.max_batch == self.base_batch:
            return self.base_batch, self.goodput(workers, self.base_batch)
        constant = self.fixed_s + (self.sync_s if workers > 1 else 0.0)
        phi = self.noise_scale
        if phi is None:
            best = low
        elif math.isinf(phi) or constant <= 0:
            best = self.max_batch if constant > 0 else low
        else:
            best = round(math.sqrt(phi * constant * workers / self.sample_s))
        candidates = {min(max(b, low), self.max_batch) for b in (best - 1, best, best + 1, low, self.max_batch)}
        chosen = max(sorted(candidates), key=lambda b: self.goodput(workers, b))
        return chosen, self.goodput(workers, chosen)


def goodput_rates(model: GoodputModel, max_workers: int) -> dict[int, float]:
    """``JobInfo.throughput`` for an adaptive job: the best goodput at every size from 1 to ``max_workers``."""
    return {w: model.best(w)[1] for w in range(1, max_workers + 1)}


def model_from_report(report: Mapping[str, Any]) -> GoodputModel | None:
    """The model of a job from its runtime's adaptive report (``progress["adaptive"]``), or ``None``.

    The step times measured per (world size, batch) are fitted to ``t = fixed + sync*(w>1) + sample * B / w`` by
    least squares weighted by the steps each mean was measured over (:func:`fit_step_times`).

    Args:
        report: the report of :class:`slurm_amoeba.runtime.adaptive.AdaptiveBatch`.

    Returns:
        The model, or ``None`` when the report has no step times yet or is malformed.
    """
    try:
        base, top = int(report["base_batch"]), int(report["max_batch"])
        phi = report.get("noise_scale")
        points = [(int(w), int(b), float(t), int(n)) for w, b, t, n in report["step_time_s"]]
    except (KeyError, TypeError, ValueError):
        return None
    if not points:
        return None
    sample_s, fixed_s, sync_s = fit_step_times(points)
    return GoodputModel(
        base_batch=base,
        max_batch=top,
        noise_scale=None if phi is None else float(phi),
        sample_s=sample_s,
        fixed_s=fixed_s,
        sync_s=sync_s,
    )


def fit_step_times(points: Sequence[tuple[int, int, float, int]]) -> tuple[float, float, float]:
    """``(sample_s, fixed_s, sync_s)`` of ``t = fixed + sync*(w>1) + sample * B / w`` fitted to measured step times.

    The points split into one worker and more; each kind has its own intercept and both share the slope in
    ``B / w`` (least squares with an indicator of ``w > 1``, weighted by the steps each mean was measured over).
    One worker's intercept is the fixed time and the other's excess over it the all-reduce, so a job measured at
    both kinds of size is not predicted to drop its fixed time at one worker. With one kind measured, its intercept
    is the fixed time and no all-reduce is assumed (none was seen to vanish). A slope that comes out 0 or less
    (one ``B / w`` measured, or noise) is replaced by 90 % of the mean step per sample (10 % of the step fixed).

    Args:
        points: ``(workers, global batch, mean seconds per step, steps measured)``; at least one.

    Returns:
        Seconds per sample on one worker (positive), and the fixed and all-reduce seconds per step (0 or more).
    """
    groups: dict[bool, list[tuple[float, float, float]]] = {}
    for workers, batch, seconds, steps in points:
        groups.setdefault(workers > 1, []).append((batch / workers, seconds, float(max(steps, 1))))
    means: dict[bool, tuple[float, float, float]] = {}  # kind -> (weight, mean B / w, mean seconds)
    covariance = spread = 0.0
    for multi, group in groups.items():
        weight = sum(w for _, _, w in group)
        mean_x = sum(x * w for x, _, w in group) / weight
        mean_t = sum(t * w for _, t, w in group) / weight
        means[multi] = (weight, mean_x, mean_t)
        covariance += sum(w * (x - mean_x) * (t - mean_t) for x, t, w in group)
        spread += sum(w * (x - mean_x) ** 2 for x, _, w in group)
    slope = covariance / spread if spread > 0 else 0.0
    if slope <= 0:  # the weighted means of both kinds together
        slope = 0.9 * sum(w * t for w, _, t in means.values()) / sum(w * x for w, x, _ in means.values())
    intercepts = {multi: max(mean_t - slope * mean_x, 0.0) for multi, (_, mean_x, mean_t) in means.items()}
    fixed = intercepts.get(False, intercepts.get(True, 0.0))
    sync = max(intercepts[True] - fixed, 0.0) if len(intercepts) == 2 else 0.0
    return slope, fixed, sync


def _utility(speedup: float, fairness: float) -> float:
    if speedup <= 0:
        return -math.inf
    if fairness == 0:
        return math.log(speedup)
    return float(speedup**fairness) / fairness


@dataclasses.dataclass(frozen=True)
class GoodputPolicy:
    """LAS admission at minimum sizes, then GPUs to the largest gain in the sum of fair speedups.

    Attributes:
        fairness: the exponent ``p`` of the utility ``s^p / p`` (0.5 by default; Pollux's is -1, 1 = plain sum of
            speedups, 0 = sum of logs).
        thresholds_gpu_s: attained GPU-seconds at which a job drops to the next LAS queue (ascending).
        keep_bonus: a running job's held workers count this much more in the greedy (resizes are cheap here,
            but not free).
        min_gain: a worker goes to a job only if it adds at least this fraction of a worker's speed at the job's
            minimum size.
        service_weight: how fast a job's weight falls with attained service (0: every job weighs the same).
        service_scale_gpu_s: the attained GPU-seconds at which the weight is ``2 ** -service_weight``.
        pack: place on as few nodes as possible (:func:`realize_packed`; the daemon does not place, Slurm does);
            ``False`` uses the shared rule of every policy (most free nodes first).
        lookahead: how many workers ahead a jump over a dip in a job's table may reach.
        name: ``"goodput"``.
        decides_on_events_only: ``False``: the weights move with attained service and adaptive jobs' tables with
            their epochs, so it is asked at every interval (it declares no service thresholds).
    """

    fairness: float = 0.5
    thresholds_gpu_s: tuple[float, ...] = DEFAULT_THRESHOLDS_GPU_S
    keep_bonus: float = 0.1
    min_gain: float = 0.05
    service_weight: float = 0.5
    service_scale_gpu_s: float = 4 * 3600.0
    pack: bool = False
    lookahead: int = 8
    name: str = dataclasses.field(default="goodput", init=False)
    decides_on_events_only: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.fairness > 1:
            raise PolicyError(f"fairness={self.fairness} must be at most 1 (1 is the plain sum of speedups)")
        thresholds = tuple(self.thresholds_gpu_s)
        if any(t <= 0 for t in thresholds) or list(thresholds) != sorted(thresholds):
            raise PolicyError(f"thresholds_gpu_s={thresholds} must be positive and ascending")
        if self.service_scale_gpu_s <= 0:
            raise PolicyError(f"service_scale_gpu_s={self.service_scale_gpu_s} must be positive")
        if self.lookahead < 1:
            raise PolicyError(f"lookahead={self.lookahead} must be at least 1 (1: one worker at a time)")
        if self.keep_bonus < 0 or self.min_gain < 0 or self.service_weight < 0:
            raise PolicyError(
                f"keep_bonus={self.keep_bonus}, min_gain={self.min_gain} and service_weight={self.service_weight} "
                "must be 0 or more"
            )

    def queue_key(self, job: JobInfo) -> tuple[float | str, ...]:
        """The job's place in LAS order: queue, then first come, first served."""
        return (float(las_queue(job.attained_service, self.thresholds_gpu_s)), job.submit_time, job.job_id)

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The action types it answers with: starts, preempts and resizes."""
        return frozenset({Start, Preempt, Resize})

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """Admit in LAS order at minimum sizes, then grow by the largest fair-speedup gain per GPU.

        Args:
            snapshot: the cluster now.
            now: the current time (the order depends on attained service, which the snapshot carries).

        Returns:
            Start, preempt, grow and shrink decisions.
        """
        jobs, capacity = schedulable(snapshot)
        order = las_fcfs_order(jobs, self.thresholds_gpu_s)  # sorted by queue_key
        sizes, admitted, capacity = admit_at_minimum(order, capacity)
        self._grow(admitted, sizes, capacity)
        targets, reasons = changed_sizes(order, sizes, _reason)
        if self.pack and not any(job.shared_with is not None for job in snapshot.jobs):
            return with_batches(snapshot, realize_packed(snapshot, targets, admitted, reasons))
        return with_batches(snapshot, realize(snapshot, targets, admitted, reasons))

    def _weight(self, job: JobInfo) -> float:
        """How much a job's utility counts: ``(1 + attained / service_scale) ** -service_weight`` (LAS-like)."""
        if self.service_weight == 0:
            return 1.0
        return float((1.0 + job.attained_service / self.service_scale_gpu_s) ** -self.service_weight)

    def _gain(self, job: JobInfo, size: int, base: float, weight: float = 1.0) -> float | None:
        """The utility gained per GPU by one more worker at ``size``, or ``None`` when it is not worth one.

        The hot spot of a decision (thousands of calls on a large cluster): the table is read directly, the
        interpolation of ``JobInfo.rate`` only used for sizes the table lacks.
        """
        return self._step_gain(job, size, size + 1, base, weight)

    def _step_gain(self, job: JobInfo, size: int, to: int, base: float, weight: float) -> float | None:
        """The utility gained per GPU from ``size`` to ``to`` workers, or ``None`` below ``min_gain`` a worker."""
        table = job.throughput
        now = table.get(size)
        if now is None:
            now = job.rate(size)
        nxt = table.get(to)
        if nxt is None:
            nxt = job.rate(to)
        step = to - size
        if now is None or nxt is None or base <= 0:
            now, nxt, base = float(size), float(to), float(job.min_workers)  # unknown: linear scaling
        if (nxt - now) * job.min_workers < self.min_gain * base * step:
            return None
        fairness = self.fairness
        if now > 0 and fairness != 0:
            utility = float((nxt / base) ** fairness - (now / base) ** fairness) / fairness
        else:
            utility = _utility(nxt / base, fairness) - _utility(now / base, fairness)
        gain = weight * utility / (job.gpus_per_worker * step)
        if size < job.workers and job.state is JobPhase.RUNNING:
            gain *= 1.0 + self.keep_bonus
        return gain

    def _next(self, job: JobInfo, size: int, base: float, weight: float) -> tuple[float, int] | None:
        """The best gain per GPU from ``size`` and the workers it takes: one more, or when one more is not worth it
        (a table that dips, e.g. where a job spills onto a second node), a jump of up to ``lookahead`` workers."""
        if size >= job.max_workers:
            return None
        one = self._step_gain(job, size, size + 1, base, weight)
        if one is not None:
            return one, 1
        best: tuple[float, int] | None = None
        for to in range(size + 2, min(job.max_workers, size + self.lookahead) + 1):
            gain = self._step_gain(job, size, to, base, weight)
            if gain is not None and (best is None or gain > best[0]):
                best = (gain, to - size)
        return best

    def _grow(self, jobs: Sequence[JobInfo], sizes: dict[str, int], spare: int) -> None:
        heap: list[tuple[float, int, int, JobInfo, float, float]] = []
        for index, job in enumerate(jobs):
            size = sizes[job.job_id]
            if not job.is_resizable or size >= job.max_workers:
                continue
            base = job.rate(job.min_workers) or 0.0
            weight = self._weight(job)
            first = self._next(job, size, base, weight)
            if first is not None:
                heap.append((-first[0], index, first[1], job, base, weight))
        heapq.heapify(heap)
        while heap and spare > 0:
            _, index, step, job, base, weight = heapq.heappop(heap)
            runner_up = -heap[0][0] if heap else -math.inf
            size = sizes[job.job_id]
            found: tuple[float, int] | None = None
            # The job keeps the next workers too while its gain stays ahead of every other job's (fewer heap moves).
            while spare >= step * job.gpus_per_worker:
                size += step
                spare -= step * job.gpus_per_worker
                found = self._next(job, size, base, weight)
                if found is None or found[0] < runner_up:
                    break
                step = found[1]
            sizes[job.job_id] = size
            if found is not None and spare >= found[1] * job.gpus_per_worker:
                heapq.heappush(heap, (-found[0], index, found[1], job, base, weight))


class _Packer:
    """Free GPUs per node, bucketed by count, for placements on as few nodes as possible (best fit).

    A job's speed on several nodes is far below its speed on one (all-reduce across nodes; the Pollux traces show
    8 workers on two nodes slower than 4 on one for some applications), and the rate tables the policy reads are for
    the fewest nodes, so the goodput policy packs: a job that fits in a node goes to the fullest node that holds it,
    a larger one takes the emptiest nodes whole and puts its rest by best fit. Each lookup costs O(GPUs per node).
    """

    def __init__(self, free: Mapping[str, int], top: int) -> None:
        self.free = dict(free)
        self.top = max(top, *self.free.values()) if self.free else top
        self._buckets: list[dict[str, None]] = [{} for _ in range(self.top + 1)]
        for name, count in self.free.items():
            self._buckets[count][name] = None

    def change(self, name: str, delta: int) -> None:
        """Add ``delta`` free GPUs to a node (negative: take them)."""
        del self._buckets[self.free[name]][name]
        self.free[name] += delta
        self._buckets[self.free[name]][name] = None

    def best_fit(self, gpus: int, avoid: Collection[str] = ()) -> str | None:
        """The node with the fewest free GPUs that still holds ``gpus`` (not one of ``avoid``), or ``None``."""
        for count in range(max(gpus, 1), self.top + 1):
            for name in self._buckets[count]:
                if name not in avoid:
                    return name
        return None

    def place(self, workers: int, gpus_per_worker: int, avoid: Collection[str] = ()) -> dict[str, int] | None:
        """Place workers on as few nodes as possible and take their GPUs; ``None`` (nothing taken) if they don't fit."""
        placement: dict[str, int] = {}
        need = workers
        while need > 0:
            name = self.best_fit(need * gpus_per_worker, avoid)
            if name is not None:
                placement[name] = placement.get(name, 0) + need
                self.change(name, -need * gpus_per_worker)
                need = 0
                break
            name = next(
                (
                    n
                    for count in range(self.top, gpus_per_worker - 1, -1)
                    for n in self._buckets[count]
                    if n not in avoid
                ),
                None,
            )
            if name is None:
                break
            take = min(self.free[name] // gpus_per_worker, need)
            placement[name] = placement.get(name, 0) + take
            self.change(name, -take * gpus_per_worker)
            need -= take
        if need > 0:
            for name, count in placement.items():
                self.change(name, count * gpus_per_worker)
            return None
        return placement

    def grow(self, job: JobInfo, target: int) -> dict[str, int] | None:
        """The job's placement at ``target`` workers: on one node if any holds it (moving there), else its own
        nodes first and the rest packed; ``None`` when it does not fit. The GPUs it leaves stay taken this round."""
        per = job.gpus_per_worker
        if target * per <= self.top:
            for name, held in job.placement.items():
                if self.free.get(name, 0) >= (target - held) * per:
                    self.change(name, -(target - held) * per)
                    return {name: target}
            if len(job.placement) > 0:
                other = self.best_fit(target * per, avoid=job.placement)
                if other is not None:
                    self.change(other, -target * per)
                    return {other: target}
        own: dict[str, int] = dict(job.placement)
        need = target - job.workers
        for name in job.placement:
            take = min(self.free.get(name, 0) // per, need)
            if take > 0:
                own[name] += take
                self.change(name, -take * per)
                need -= take
        more = self.place(need, per) if need > 0 else {}
        if more is None:
            for name, count in own.items():
                self.change(name, -(job.placement[name] - count) * per)
            return None
        for name, count in more.items():
            own[name] = own.get(name, 0) + count
        return own


def with_batches(snapshot: Snapshot, actions: Sequence[SizeAction]) -> list[SizeAction]:
    """The answer with the policy's global batches (see the module docstring).

    Args:
        snapshot: the cluster now (an adaptive job's ``adaptive`` model and ``batch``).
        actions: the sizes decided.

    Returns:
        ``actions`` with each adaptive job's resize carrying its batch, then the batch-only resizes of drifted jobs.
    """
    by_id = snapshot.by_id()
    out: list[SizeAction] = []
    for action in actions:
        if isinstance(action, Resize):
            job = by_id[action.job_id]
            if job.adaptive is not None and job.batch is not None:
                action = dataclasses.replace(action, batch=job.adaptive.best(action.workers)[0])
        out.append(action)
    acted = {action.job_id for action in actions}
    for job in snapshot.running():
        model = job.adaptive
        if model is None or job.batch is None or job.job_id in acted:
            continue
        if job.pinned or job.resizing or job.shared_with is not None:  # its size need not be elastic
            continue
        best = model.best(job.workers)[0]
        if max(best, job.batch) >= REBATCH_FACTOR * min(best, job.batch):
            reason = f"goodput: global batch {best} at {job.workers} workers (it runs {job.batch})"
            out.append(Resize(job.job_id, job.workers, reason=reason, batch=best))
    return out


def realize_packed(
    snapshot: Snapshot, targets: Mapping[str, int], order: Sequence[JobInfo], reasons: Mapping[str, str]
) -> list[SizeAction]:
    """:func:`~slurm_amoeba.policy.common.realize` with placements on as few nodes as possible (:class:`_Packer`).

    Shrinks and preemptions free their GPUs first; growth and starts follow ``order``. A grown job may move to one
    node that holds all of it (a resize in this runtime: the new workers join, the old ones leave at a step
    boundary); the GPUs it leaves are not reused in the same round, so every decision fits whatever order the
    executor applies them in. Sharing jobs are not handled here: the caller uses ``realize`` when any job shares.
    """
    packer = _Packer(snapshot.free_by_node(), max((node.gpus_total for node in snapshot.nodes), default=0))
    by_id = snapshot.by_id()
    decisions: list[SizeAction] = []
    for job_id, target in targets.items():
        job = by_id[job_id]
        if job.state is not JobPhase.RUNNING or target >= job.workers:
            continue
        new = shrink_placement(job.placement, job.workers - target) if target else {}
        for name, count in job.placement.items():
            if name in packer.free:
                packer.change(name, (count - new.get(name, 0)) * job.gpus_per_worker)
        decisions.append(size_action(job, target, new, reasons.get(job_id, "")))
    for job in order:
        target = targets.get(job.job_id, job.workers)
        if target <= job.workers:
            continue
        running = job.state is JobPhase.RUNNING
        grown = packer.grow(job, target) if running else packer.place(target, job.gpus_per_worker)
        if grown is not None:
            decisions.append(size_action(job, target, grown, reasons.get(job.job_id, "")))
    return decisions


def _reason(job: JobInfo, size: int) -> str:
    if size == 0:
        return "goodput: preempted, jobs ahead in LAS order need even their minimum sizes"
    if job.state is JobPhase.PENDING:
        return "goodput: admitted in LAS order"
    if size < job.workers:
        return "goodput: its workers gain more fair speedup in other jobs"
    return "goodput: the largest gain in the sum of fair speedups"


__all__ = [
    "DEFAULT_THRESHOLDS_GPU_S",
    "GoodputModel",
    "GoodputPolicy",
    "efficiency",
    "fit_step_times",
    "goodput_rates",
    "model_from_report",
]
