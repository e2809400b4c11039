"""The gradient noise scale estimator against closed forms on a synthetic problem of known gradient variance.

Per-sample gradients are ``G + e_i`` with ``e_i ~ N(0, sigma^2 I_d)``: the per-sample covariance trace is
``S = d sigma^2`` and the noise scale ``phi = S / |G|^2``. The estimator sees only what the runtime sees: the
loss-weighted local gradients ``h_r = (b_r / B) g_r`` of uneven workers, or the accumulated micro-batches of one.
"""

from __future__ import annotations

import math

import pytest
import torch

from slurm_amoeba.runtime.gns import (
    GradientNoiseScale,
    NormPair,
    NormProbe,
    ProbeReading,
    accumulation_pair,
    efficiency,
    workers_pair,
)
from slurm_amoeba.runtime.gradients import GradientBuckets

DIM, SIGMA = 40, 1.5
NOISE = DIM * SIGMA**2  # S = tr(Sigma) = 90
TRUE_GRAD = torch.full((DIM,), 0.5, dtype=torch.float64)  # |G|^2 = 10
SIGNAL = float(TRUE_GRAD.square().sum())


def local_gradient(samples: int, generator: torch.Generator) -> torch.Tensor:
    """The mean gradient of ``samples`` samples."""
    noise = torch.randn(samples, DIM, generator=generator, dtype=torch.float64) * SIGMA
    return TRUE_GRAD + noise.mean(dim=0)


def workers_step(shares: list[int], generator: torch.Generator) -> NormPair | None:
    batch = sum(shares)
    weighted = [(b / batch) * local_gradient(b, generator) for b in shares]  # h_r, as the loader weights them
    reduced = torch.stack(weighted).sum(dim=0)
    local = sum(batch / b * float(h.square().sum()) for b, h in zip(shares, weighted, strict=True))
    return workers_pair(local, len(shares), float(reduced.square().sum()), batch)


def test_uneven_workers_give_unbiased_estimates_of_the_variance_and_the_gradient_norm() -> None:
    generator = torch.Generator().manual_seed(0)
    estimates = []
    for _ in range(4000):
        pair = workers_step([5, 4, 4], generator)  # 13 samples over 3 workers: shares differ by one
        assert pair is not None
        estimate = pair.estimate()
        assert estimate is not None
        estimates.append(estimate)
    noise = sum(e[0] for e in estimates) / len(estimates)
    signal = sum(e[1] for e in estimates) / len(estimates)
    assert noise == pytest.approx(NOISE, rel=0.04)
    assert signal == pytest.approx(SIGNAL, rel=0.04)


def test_one_worker_with_accumulation_estimates_from_the_micro_batches_before_the_last() -> None:
    generator = torch.Generator().manual_seed(1)
    noise_sum = signal_sum = 0.0
    steps = 4000
    for _ in range(steps):
        pre = local_gradient(9, generator)  # three micro-batches of 3 before a last one of 3: B = 12
        last = local_gradient(3, generator)
        step = (9 * pre + 3 * last) / 12
        pair = accumulation_pair(float(((9 / 12) * pre).square().sum()), 9, float(step.square().sum()), 12)
        assert pair is not None
        estimate = pair.estimate()
        assert estimate is not None
        noise_sum += estimate[0]
        signal_sum += estimate[1]
    assert noise_sum / steps == pytest.approx(NOISE, rel=0.05)
    assert signal_sum / steps == pytest.approx(SIGNAL, rel=0.05)


def test_smoothed_noise_scale_converges_to_the_closed_form() -> None:
    generator = torch.Generator().manual_seed(2)
    gns = GradientNoiseScale(smoothing=0.995)
    assert gns.scale is None and gns.efficiency(64, 8) == 0.125 and gns.gain(64, 8) == 1.0  # no gain assumed
    for _ in range(3000):
        assert gns.update(workers_step([8, 8, 7, 7], generator))
    assert gns.scale == pytest.approx(NOISE / SIGNAL, rel=0.1)
    phi = NOISE / SIGNAL
    assert gns.efficiency(64, 8) == pytest.approx((phi + 8) / (phi + 64), rel=0.05)
    assert gns.gain(64, 8) == pytest.approx(8 * (phi + 8) / (phi + 64), rel=0.05)
    copy = GradientNoiseScale(smoothing=0.995)
    copy.load_state_dict(gns.state_dict())
    assert copy.scale == gns.scale and copy.updates == 3000


def test_steps_without_two_sizes_or_with_overflow_add_nothing() -> None:
    gns = GradientNoiseScale()
    assert workers_pair(1.0, 1, 1.0, 8) is None  # one worker: no second size
    assert accumulation_pair(1.0, 0, 1.0, 8) is None  # one micro-batch
    assert not gns.update(None)
    assert not gns.update(NormPair(math.inf, 0.5, 1.0, 0.1))  # a GradScaler overflow step
    assert gns.updates == 0 and gns.scale is None
    assert efficiency(0.0, 32, 8) == pytest.approx(0.25) and efficiency(math.inf, 32, 8) == 1.0
    with pytest.raises(ValueError, match="smoothing=1.0 is invalid"):
        GradientNoiseScale(1.0)


class Centre(torch.nn.Module):
    """Loss 0.5 |w - x|^2 per sample: the gradient of a micro-batch is ``w - mean(x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(DIM, dtype=torch.float64))
        self.head = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (self.w - x).square().sum(dim=1).mean() + 0.5 * (self.head - 1).square().sum()


def test_probe_reads_the_norms_in_the_bucket_slots_and_leaves_gradients_and_control_word_alone(
    single_process_group: None,
) -> None:
    readings: list[ProbeReading] = []
    model = Centre()
    buckets = GradientBuckets(model, first_bucket_bytes=16, bucket_bytes=64, probe=NormProbe(readings.append))
    assert len(buckets.buckets) == 2
    x = torch.randn(12, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    buckets.probe.prepare(1.0, step_time_s=0.25, want_pre=True)  # type: ignore[union-attr]
    (model(x[:8]) * (8 / 12)).backward()
    pre = torch.cat([p.grad.detach().clone() for p in model.parameters() if p.grad is not None])
    buckets.arm(1.0)
    (model(x[8:]) * (4 / 12)).backward()
    assert buckets.finish(1.0) == 1.0, "the control word is still the last element"
    full = torch.cat([p.grad.detach() for p in model.parameters() if p.grad is not None])
    torch.testing.assert_close(model.w.grad, model.w.detach() - x.mean(dim=0))
    (reading,) = readings
    assert reading.global_sq == pytest.approx(float(full.square().sum()), rel=1e-12)
    assert reading.weighted_local == pytest.approx(reading.global_sq, rel=1e-12)  # one worker: local = global
    assert reading.pre_sq == pytest.approx(float(pre.square().sum()), rel=1e-12)
    assert (reading.pieces, reading.timed, reading.step_time_s) == (1, 1, 0.25)
    buckets.zero()
    buckets.probe.prepare(0.0, step_time_s=None, want_pre=True)  # type: ignore[union-attr]
    (model(x) * 1.0).backward()
    buckets.finish(0.0)  # never armed: the whole local gradient is not a "before the last" measurement
    assert (readings[-1].pre_sq, readings[-1].pieces, readings[-1].timed) == (0.0, 0, 0)
    buckets.zero()
    buckets.probe.prepare(1.0, step_time_s=0.5, want_pre=True, measure=False)  # type: ignore[union-attr]
    buckets.arm(0.0)
    (model(x) * 1.0).backward()
    buckets.finish(0.0)  # a step left out of the estimate (measure_every): only its time rides along
    assert math.isnan(readings[-1].global_sq) and (readings[-1].pieces, readings[-1].timed) == (0, 1)
    assert not GradientNoiseScale().update(workers_pair(readings[-1].weighted_local, 2, readings[-1].global_sq, 8))
