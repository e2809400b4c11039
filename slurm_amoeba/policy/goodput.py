"""Goodput: GPUs (and, for jobs that allow it, global batch sizes) to maximise the sum of fair speedups.

The objective, after Pollux (OSDI 2021): with ``s_j(w)`` job ``j``'s speedup at ``w`` workers over its minimum size,
measured in *goodput* (throughput x statistical efficiency) for a job with an adaptive batch and in throughput
otherwise, the policy maximises

    sum_j U(s_j(w_j)),   U(s) = s^p / p  (p < 0: fairness; p -> 0: log s; p = 1: the plain sum of speedups),

with ``p`` = ``fairness`` (Pollux's fairness exponent; -1 by default). ``U`` is concave, so GPUs handed out one
worker at a time to the largest marginal ``U`` gain per GPU maximise it for concave speedups (the greedy is exact
for separable concave objectives); a heap keeps that at O(GPUs x log jobs).

Admission is 2D-LAS (Tiresias): jobs in order of attained-service queue (``thresholds_gpu_s``; within a queue
first come, first served) get their minimum size (a regular job its size) while GPUs remain; running jobs that no
longer fit are preempted. This runtime's resizes are cheap (a step-boundary switch, no restart), so a running job's
size is not frozen, only favoured: the workers it holds count ``1 + keep_bonus`` times in the greedy, and a worker
is only given when it adds at least ``min_gain`` of a worker's worth of speed.

For adaptive jobs, :class:`GoodputModel` turns the runtime's report (the noise scale and the measured step times,
``slurm_amoeba.runtime.adaptive``) into goodput per size and the batch to use there (:meth:`GoodputModel.best`);
the daemon and the simulator put :func:`goodput_rates` into ``JobInfo.throughput``, so the policy itself sees one
rate table per job, whatever the job. Pure: imports only ``core`` and ``policy``.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from collections.abc import Mapping, Sequence
from typing import Any

from slurm_amoeba.policy.common import base_size, managed_capacity, realize
from slurm_amoeba.policy.types import Decision, JobInfo, JobPhase, PolicyError, Snapshot

#: Attained GPU-seconds at which a job drops to the next LAS queue (1 and 16 GPU-hours).
DEFAULT_THRESHOLDS_GPU_S = (3600.0, 16 * 3600.0)


def efficiency(noise_scale: float | None, batch: int, base: int) -> float:
    """Statistical efficiency of ``batch`` over ``base``: ``(phi + base) / (phi + batch)`` (``base/batch`` unknown)."""
    if noise_scale is None:
        return base / batch
    if math.isinf(noise_scale):
        return 1.0
    return (noise_scale + base) / (noise_scale + batch)


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
    least squares on ``B / w`` (fixed and sync merged when only one kind of size was measured).

    Args:
        report: the report of :class:`slurm_amoeba.runtime.adaptive.AdaptiveBatch`.

    Returns:
        The model, or ``None`` when the report has no step times yet or is malformed.
    """
    try:
        base, top = int(report["base_batch"]), int(report["max_batch"])
        phi = report.get("noise_scale")
        points = [(int(w), int(b), float(t)) for w, b, t, _ in report["step_time_s"]]
    except (KeyError, TypeError, ValueError):
        return None
    if not points:
        return None
    xs = [b / w for w, b, _ in points]
    ts = [t for _, _, t in points]
    mean_x, mean_t = sum(xs) / len(xs), sum(ts) / len(ts)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (t - mean_t) for x, t in zip(xs, ts, strict=True)) / spread if spread > 0 else 0.0
    if slope <= 0:
        slope = 0.9 * mean_t / mean_x  # one size measured: 10 % of the step assumed fixed
    constant = max(mean_t - slope * mean_x, 0.0)
    multi = any(w > 1 for w, _, _ in points)
    return GoodputModel(
        base_batch=base,
        max_batch=top,
        noise_scale=None if phi is None else float(phi),
        sample_s=slope,
        fixed_s=0.0 if multi else constant,
        sync_s=constant if multi else 0.0,
    )


def _utility(speedup: float, fairness: float) -> float:
    if speedup <= 0:
        return -math.inf
    if fairness == 0:
        return math.log(speedup)
    return float(speedup**fairness) / fairness


def las_queue(job: JobInfo, thresholds: Sequence[float]) -> int:
    """The job's LAS queue: how many of the thresholds its attained service has reached."""
    return bisect.bisect_right(thresholds, job.attained_service)


@dataclasses.dataclass(frozen=True)
class GoodputPolicy:
    """LAS admission at minimum sizes, then GPUs to the largest gain in the sum of fair speedups.

    Attributes:
        fairness: the exponent ``p`` of the utility ``s^p / p`` (Pollux's; -1 by default, 1 = plain sum of
            speedups, 0 = sum of logs).
        thresholds_gpu_s: attained GPU-seconds at which a job drops to the next LAS queue (ascending).
        keep_bonus: a running job's held workers count this much more in the greedy (resizes are cheap here,
            but not free).
        min_gain: a worker goes to a job only if it adds at least this fraction of a worker's speed at the job's
            minimum size.
        name: ``"goodput"``.
        decides_on_events_only: ``False``: the LAS queues change with attained service.
    """

    fairness: float = -1.0
    thresholds_gpu_s: tuple[float, ...] = DEFAULT_THRESHOLDS_GPU_S
    keep_bonus: float = 0.1
    min_gain: float = 0.05
    name: str = dataclasses.field(default="goodput", init=False)
    decides_on_events_only: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.fairness > 1:
            raise PolicyError(f"fairness={self.fairness} must be at most 1 (1 is the plain sum of speedups)")
        thresholds = tuple(self.thresholds_gpu_s)
        if any(t <= 0 for t in thresholds) or list(thresholds) != sorted(thresholds):
            raise PolicyError(f"thresholds_gpu_s={thresholds} must be positive and ascending")
        if self.keep_bonus < 0 or self.min_gain < 0:
            raise PolicyError(f"keep_bonus={self.keep_bonus} and min_gain={self.min_gain} must be 0 or more")

    @property
    def service_thresholds(self) -> tuple[float, ...]:
        """The attained services at which a job's LAS queue changes."""
        return tuple(self.thresholds_gpu_s)

    def queue_key(self, job: JobInfo) -> tuple[float | str, ...]:
        """The job's place in LAS order: queue, then first come, first served."""
        return (float(las_queue(job, self.thresholds_gpu_s)), job.submit_time, job.job_id)

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Decision]:
        """Admit in LAS order at minimum sizes, then grow by the largest fair-speedup gain per GPU.

        Args:
            snapshot: the cluster now.
            now: the current time (the order depends on attained service, which the snapshot carries).

        Returns:
            Start, preempt, grow and shrink decisions.
        """
        capacity = managed_capacity(snapshot)
        order = sorted((job for job in snapshot.jobs if job.shared_with is None), key=self.queue_key)
        sizes: dict[str, int] = {}
        admitted: list[JobInfo] = []
        for job in order:
            size = base_size(job) if job.is_resizable or job.state is JobPhase.PENDING else job.workers
            if size * job.gpus_per_worker <= capacity:
                capacity -= size * job.gpus_per_worker
                sizes[job.job_id] = size
                admitted.append(job)
            else:
                sizes[job.job_id] = 0
        self._grow(admitted, sizes, capacity)
        targets = {job.job_id: sizes[job.job_id] for job in order if sizes[job.job_id] != job.workers}
        by_id = {job.job_id: job for job in snapshot.jobs}
        reasons = {key: _reason(by_id[key], size) for key, size in targets.items()}
        return realize(snapshot, targets, admitted, reasons)

    def _gain(self, job: JobInfo, size: int, base: float) -> float | None:
        """The utility gained per GPU by one more worker at ``size``, or ``None`` when it is not worth one."""
        now = job.rate(size)
        nxt = job.rate(size + 1)
        if now is None or nxt is None or base <= 0:
            now, nxt, base = float(size), float(size + 1), float(job.min_workers)  # unknown: linear scaling
        if (nxt - now) / (base / job.min_workers) < self.min_gain:
            return None
        gain = (_utility(nxt / base, self.fairness) - _utility(now / base, self.fairness)) / job.gpus_per_worker
        if job.state is JobPhase.RUNNING and size < job.workers:
            gain *= 1.0 + self.keep_bonus
        return gain

    def _grow(self, jobs: Sequence[JobInfo], sizes: dict[str, int], spare: int) -> None:
        heap: list[tuple[float, int, JobInfo, float]] = []
        for index, job in enumerate(jobs):
            size = sizes[job.job_id]
            if not job.is_resizable or size >= job.max_workers:
                continue
            base = job.rate(job.min_workers) or 0.0
            first = self._gain(job, size, base)
            if first is not None:
                heap.append((-first, index, job, base))
        heapq.heapify(heap)
        while heap and spare > 0:
            _, index, job, base = heapq.heappop(heap)
            runner_up = -heap[0][0] if heap else -math.inf
            size = sizes[job.job_id]
            gain: float | None = 0.0
            # The job keeps the next worker too while its gain stays ahead of every other job's (fewer heap moves).
            while spare >= job.gpus_per_worker:
                size += 1
                spare -= job.gpus_per_worker
                gain = self._gain(job, size, base) if size < job.max_workers else None
                if gain is None or gain < runner_up:
                    break
            sizes[job.job_id] = size
            if gain is not None and spare >= job.gpus_per_worker:
                heapq.heappush(heap, (-gain, index, job, base))


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
    "goodput_rates",
    "las_queue",
    "model_from_report",
]
