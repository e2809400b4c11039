"""The gradient noise scale, measured online from gradients the runtime already has.

For a loss that is a mean over samples, a gradient ``g_b`` over ``b`` samples drawn from the data satisfies

    E |g_b|^2 = |G|^2 + S / b,

where ``G`` is the true gradient and ``S = tr(Sigma)`` the trace of the per-sample gradient covariance. Two
measurements of the same step at different batch sizes give unbiased estimates of both unknowns (McCandlish et
al., "An Empirical Model of Large-Batch Training", 2018, appendix A; Pollux, OSDI 2021, uses the same pair): the
*small* one from gradients the workers hold before the all-reduce, the *large* one from the all-reduced gradient.

* With ``K >= 2`` workers, worker ``r`` holds ``h_r = (b_r / B) g_r`` (the loss weights of the loader) and the
  all-reduce gives ``g = sum_r h_r`` over ``B = sum_r b_r`` samples. With weights ``b_r / B``,
  ``E sum_r (b_r/B) |g_r|^2 = |G|^2 + S K / B``, so the small measurement is ``sum_r (B / b_r) |h_r|^2`` (each
  worker adds its own term to the all-reduce) with coefficient ``K / B``: uneven local batches need nothing else.
* With one worker and gradient accumulation, the small measurement is the gradient of the micro-batches before the
  last (``b_pre`` samples, read when the last micro-batch starts), with coefficient ``1 / b_pre``.
* With one worker and one micro-batch there is no second size: the step adds nothing and the estimate is kept.

The per-step estimates are noisy (and may be negative); :class:`GradientNoiseScale` smooths ``S`` and ``|G|^2``
separately with a bias-corrected exponential moving average and reports their ratio ``phi = S / |G|^2``, McCandlish's
"simple" noise scale (Pollux's, with the identity as preconditioner). From ``phi`` follow the statistical efficiency
of a batch ``B`` relative to the initial ``B0``, ``(phi + B0) / (phi + B)``, and AdaScale's gain
``(phi + B0) B / ((phi + B) B0)``, i.e. ``B/B0`` times that efficiency.

:class:`NormProbe` is the torch side: :class:`~slurm_amoeba.runtime.gradients.GradientBuckets` calls it just before
each bucket's all-reduce (the local squared norm, on the device, no synchronisation) and once the reduce is done
(the global squared norm); its few numbers ride in extra slots at the end of the last bucket, next to the control
word, so the measurement adds no collective. A step costs two reads of the gradient on the device and one small
device-to-host copy, next to the control word's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from slurm_amoeba.core.efficiency import efficiency


@dataclasses.dataclass(frozen=True)
class NormPair:
    """One step's two squared-norm measurements: ``E small = |G|^2 + S c_small``, ``E large = |G|^2 + S c_large``.

    Attributes:
        small: the squared norm measured at the small batch size (or its weighted mean over workers).
        small_coefficient: ``c_small``, the expected noise per unit of ``S`` in ``small`` (``K/B`` or ``1/b_pre``).
        large: the squared norm of the whole step's gradient.
        large_coefficient: ``c_large = 1/B``.
    """

    small: float
    small_coefficient: float
    large: float
    large_coefficient: float

    def estimate(self) -> tuple[float, float] | None:
        """Unbiased estimates ``(S, |G|^2)`` from this step, or ``None`` where the two sizes coincide."""
        spread = self.small_coefficient - self.large_coefficient
        if spread <= 0 or not (math.isfinite(self.small) and math.isfinite(self.large)):
            return None
        noise = (self.small - self.large) / spread
        signal = (self.small_coefficient * self.large - self.large_coefficient * self.small) / spread
        return noise, signal


def workers_pair(weighted_local: float, pieces: int, global_sq: float, batch: int) -> NormPair | None:
    """The pair of a step over ``pieces`` workers (see the module docstring); ``None`` with fewer than two.

    Args:
        weighted_local: ``sum_r (B / b_r) |h_r|^2`` over the workers that had samples.
        pieces: how many workers had samples.
        global_sq: ``|g|^2`` of the all-reduced gradient.
        batch: ``B``, the step's samples.
    """
    if pieces < 2 or batch < 2:
        return None
    return NormPair(weighted_local, pieces / batch, global_sq, 1.0 / batch)


def accumulation_pair(pre_sq: float, pre_samples: int, global_sq: float, batch: int) -> NormPair | None:
    """The pair of a one-worker step whose micro-batches before the last held ``pre_samples`` of ``batch`` samples.

    Args:
        pre_sq: ``|h_pre|^2``, the accumulated (loss-weighted) gradient before the last micro-batch.
        pre_samples: ``b_pre``.
        global_sq: ``|g|^2`` of the whole step.
        batch: ``B``.
    """
    if not 0 < pre_samples < batch:
        return None
    scale = batch / pre_samples  # h_pre is (b_pre / B) g_pre
    return NormPair(pre_sq * scale * scale, 1.0 / pre_samples, global_sq, 1.0 / batch)


class GradientNoiseScale:
    """Smoothed estimates of ``S = tr(Sigma)`` and ``|G|^2``, and what follows from them.

    Args:
        smoothing: the weight of the past in the moving averages, per measured step (0.99: a horizon of about
            100 steps).

    Raises:
        ValueError: ``smoothing`` is not in [0, 1).
    """

    def __init__(self, smoothing: float = 0.99) -> None:
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing={smoothing} is invalid: it must be in [0, 1) (0.99 keeps ~100 steps)")
        self.smoothing = smoothing
        self._noise = 0.0
        self._signal = 0.0
        self._weight = 0.0  # 1 - smoothing**n: the bias correction of the averages after n updates
        self.updates = 0

    def update(self, pair: NormPair | None) -> bool:
        """Add one step's measurement; returns whether it counted (``None`` and non-finite ones do not)."""
        estimate = None if pair is None else pair.estimate()
        if estimate is None or not all(math.isfinite(v) for v in estimate):
            return False
        keep = self.smoothing
        self._noise = keep * self._noise + (1 - keep) * estimate[0]
        self._signal = keep * self._signal + (1 - keep) * estimate[1]
        self._weight = keep * self._weight + (1 - keep)
        self.updates += 1
        return True

    @property
    def noise(self) -> float | None:
        """``S``, the per-sample gradient variance (trace), or ``None`` before the first measurement."""
        return None if self._weight == 0 else self._noise / self._weight

    @property
    def signal(self) -> float | None:
        """``|G|^2``, the squared norm of the true gradient, or ``None`` before the first measurement."""
        return None if self._weight == 0 else self._signal / self._weight

    @property
    def scale(self) -> float | None:
        """The noise scale ``phi = S / |G|^2`` (samples), or ``None`` before a usable measurement.

        A non-positive ``|G|^2`` estimate (all noise) reads as an infinite scale; a non-positive ``S`` as zero.
        """
        noise, signal = self.noise, self.signal
        if noise is None or signal is None:
            return None
        if signal <= 0:
            return math.inf
        return max(noise, 0.0) / signal

    def efficiency(self, batch: int, base: int) -> float:
        """Statistical efficiency of ``batch`` relative to ``base``: progress per sample, 1 at ``base``."""
        return efficiency(self.scale, batch, base)

    def gain(self, batch: int, base: int) -> float:
        """AdaScale's gain at ``batch`` over ``base``: how many ``base``-steps one ``batch``-step is worth."""
        return batch / base * self.efficiency(batch, base)

    def state_dict(self) -> dict[str, float]:
        """The averages as JSON numbers."""
        return {"noise": self._noise, "signal": self._signal, "weight": self._weight, "updates": self.updates}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the averages from :meth:`state_dict`."""
        self._noise = float(state["noise"])
        self._signal = float(state["signal"])
        self._weight = float(state["weight"])
        self.updates = int(state["updates"])


@dataclasses.dataclass(frozen=True)
class ProbeReading:
    """What :class:`NormProbe` read after one step's all-reduce (sums over the workers where it says so).

    Attributes:
        global_sq: ``|g|^2`` of the reduced gradient.
        weighted_local: ``sum_r w_r |h_r|^2`` with each worker's weight (``B / b_r``).
        pieces: workers that had samples.
        pre_sq: this worker's ``|h_pre|^2`` when it was asked for, else 0.
        step_time_s: the sum over the workers of the previous step's duration.
        timed: how many workers timed the previous step.
        policy_batch: the policy's batch rank 0 put on this step's all-reduce (0: none); the same on every worker.
    """

    global_sq: float
    weighted_local: float
    pieces: int
    pre_sq: float
    step_time_s: float
    timed: int
    policy_batch: int = 0


def _squared_norm(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype in (torch.float32, torch.float64):
        return torch.dot(tensor, tensor).to(torch.float64)
    norm: torch.Tensor = torch.linalg.vector_norm(tensor, dtype=torch.float32)
    return norm.to(torch.float64).square()


class NormProbe:
    """The squared norms of the gradient before and after the all-reduce, for :class:`GradientNoiseScale`.

    :class:`~slurm_amoeba.runtime.gradients.GradientBuckets` reserves :attr:`SLOTS` elements before its control
    word and calls :meth:`bind`, :meth:`on_arm`, :meth:`before_launch` and :meth:`after_reduce`; the owner
    (:class:`~slurm_amoeba.runtime.adaptive.AdaptiveBatch`) calls :meth:`prepare` before each step and receives a
    :class:`ProbeReading` after it.

    Args:
        consumer: called with each step's reading (on every worker, with the same summed values).
    """

    # weighted local squared norm, workers with samples, previous step's time, workers that timed it, and the
    # policy's batch as three bytes (low first; only rank 0 writes them, so the sums are exact in any dtype)
    SLOTS = 7

    def __init__(self, consumer: Callable[[ProbeReading], None]) -> None:
        self.consumer = consumer
        self._slots: torch.Tensor | None = None
        self._local: torch.Tensor | None = None
        self._pre: torch.Tensor | None = None
        self._weight = 0.0
        self._step_time_s = 0.0
        self._want_pre = False
        self._measure = True
        self._policy_bytes = (0.0, 0.0, 0.0)

    def bind(self, slots: torch.Tensor) -> None:
        """Take the reducer's slots (a view of :attr:`SLOTS` elements of its last buffer)."""
        self._slots = slots

    def prepare(
        self, weight: float, *, step_time_s: float | None, want_pre: bool, measure: bool = True, policy_batch: int = 0
    ) -> None:
        """Set this worker's part of the next step's measurement.

        Args:
            weight: ``B / b_r`` for this worker's local batch ``b_r`` (0 when it has no samples).
            step_time_s: the previous step's duration, or ``None`` when it is not to be counted.
            want_pre: read the accumulated gradient when the last micro-batch starts (one worker, accumulation).
            measure: compute the norms in this step; ``False`` sends only the step time (the reading's norms are
                then NaN and the estimate skips the step).
            policy_batch: the policy's batch that this worker (rank 0 only) puts on the all-reduce, so that every
                worker reads the same one (:attr:`ProbeReading.policy_batch`); 0: none. At most ``2**24 - 1``.
        """
        if not 0 <= policy_batch < 1 << 24:
            raise ValueError(f"policy_batch={policy_batch} does not fit three bytes")
        self._policy_bytes = (float(policy_batch & 255), float(policy_batch >> 8 & 255), float(policy_batch >> 16))
        self._weight = weight if measure else 0.0
        self._step_time_s = -1.0 if step_time_s is None else step_time_s
        self._want_pre = want_pre and measure
        self._measure = measure

    def on_arm(self, flats: list[torch.Tensor] | None, tail: int) -> None:
        """The last micro-batch starts (``flats`` = the gradient buffers), or ``None``: the step was never armed."""
        self._local = None
        self._pre = None
        if flats is not None and self._want_pre:
            with torch.no_grad():
                self._pre = _sum_squares(flats, tail)

    def before_launch(self, bucket: torch.Tensor, *, last: bool, tail: int) -> None:
        """Add a bucket's local squared norm; before the last bucket, write this worker's slots."""
        with torch.no_grad():
            if self._measure:
                data = bucket[: bucket.numel() - tail] if last else bucket
                square = _squared_norm(data)
                self._local = square if self._local is None else self._local + square
            if last and self._slots is not None:
                slots = self._slots
                if self._local is not None:
                    slots[0].copy_(self._local * self._weight)
                else:
                    slots[0].fill_(0.0)
                slots[1].fill_(1.0 if self._weight > 0 else 0.0)
                slots[2].fill_(max(self._step_time_s, 0.0))
                slots[3].fill_(1.0 if self._step_time_s >= 0 else 0.0)
                for index, value in enumerate(self._policy_bytes):
                    slots[4 + index].fill_(value)

    def after_reduce(self, flats: list[torch.Tensor], tail: int) -> None:
        """Read the reduced gradient's squared norm and the summed slots, and hand them to the consumer."""
        if self._slots is None:
            return
        with torch.no_grad():
            if self._measure:
                total = _sum_squares(flats, tail)
            else:
                total = torch.full((), math.nan, dtype=torch.float64, device=self._slots.device)
            pre = self._pre if self._pre is not None else torch.zeros((), dtype=torch.float64, device=total.device)
            values = torch.cat([total.reshape(1), self._slots.to(torch.float64), pre.reshape(1).to(total.device)])
            read = values.tolist()
        self._local = None
        self._pre = None
        self.consumer(
            ProbeReading(
                global_sq=read[0],
                weighted_local=read[1],
                pieces=round(read[2]),
                pre_sq=read[8],
                step_time_s=read[3],
                timed=round(read[4]),
                policy_batch=round(read[5]) + 256 * round(read[6]) + 65536 * round(read[7]),
            )
        )


def _sum_squares(flats: list[torch.Tensor], tail: int) -> torch.Tensor:
    """The squared norm of the gradient buffers, leaving out the last buffer's ``tail`` (control word, slots)."""
    total: torch.Tensor | None = None
    for index, flat in enumerate(flats):
        data = flat[: flat.numel() - tail] if index == len(flats) - 1 else flat
        square = _squared_norm(data)
        total = square if total is None else total + square.to(total.device)
    return total if total is not None else torch.zeros((), dtype=torch.float64)


__all__ = [
    "GradientNoiseScale",
    "NormPair",
    "NormProbe",
    "ProbeReading",
    "accumulation_pair",
    "efficiency",
    "workers_pair",
]
