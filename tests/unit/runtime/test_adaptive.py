"""Adaptive batch: the goodput choice, the sampler at a changing batch, the learning-rate rules, and a small task
trained to the same loss with an adaptive and a fixed batch (one worker in this process, on a one-process gloo
group; the multi-worker runs with resizes and kills are in ``test_adaptive_job.py``).
"""

from __future__ import annotations

import collections
import math
import time

import pytest
import torch
from torch.utils.data import TensorDataset

from slurm_amoeba import runtime as amoeba
from slurm_amoeba.runtime.adaptive import AdaptiveBatch, best_batch, default_rule, fit_step_time, goodput
from slurm_amoeba.runtime.gns import NormProbe
from slurm_amoeba.runtime.gradients import GradientBuckets
from slurm_amoeba.runtime.state import TorchState


def test_fit_recovers_a_linear_step_time_and_uses_the_prior_for_one_point() -> None:
    a, b = fit_step_time([(8, 0.1 + 8e-3), (32, 0.1 + 32e-3), (16, 0.1 + 16e-3)], 0.1) or (0.0, 0.0)
    assert a == pytest.approx(0.1) and b == pytest.approx(1e-3)
    assert fit_step_time([(10, 1.0)], 0.25) == (0.25, 0.075)
    assert fit_step_time([], 0.1) is None
    slope_noise = fit_step_time([(8, 0.2), (16, 0.19)], 0.1)  # a decreasing fit is noise: keep b > 0
    assert slope_noise is not None and slope_noise[1] > 0


def test_best_batch_follows_the_noise_scale_within_the_growth_limit() -> None:
    flat = [(8, 0.1)]  # a step costs the same at any batch (overhead-bound)
    assert best_batch(None, base=8, current=8, limit=256, points=flat) == 8, "no estimate: keep the batch"
    assert best_batch(50.0, base=8, current=8, limit=256, points=[]) == 8, "no step time: keep the batch"
    grown = best_batch(1e4, base=8, current=8, limit=256, points=flat, overhead_prior=0.9)
    assert grown == 16, "a large noise scale grows the batch, by at most max_growth per decision"
    assert best_batch(1e4, base=8, current=128, limit=200, points=[(128, 0.1)], overhead_prior=0.9) == 200
    assert best_batch(0.0, base=8, current=64, limit=256, points=[(64, 0.1)]) == 8, "no noise: back to B0"
    # compute-bound steps (time proportional to the batch): a larger batch buys no throughput
    linear = [(8, 0.08), (16, 0.16)]
    assert best_batch(1e4, base=8, current=16, limit=256, points=linear) == 8
    phi = 100.0
    model = (0.05, 1e-3)
    chosen = best_batch(phi, base=8, current=64, limit=256, points=[(64, 0.114), (128, 0.178)], max_growth=4)
    assert goodput(chosen, 8, phi, model) >= max(goodput(c, 8, phi, model) for c in (8, 16, 32, 64, 128, 256))


def test_sampler_changes_batch_only_where_the_loader_replans_and_keeps_every_sample_once() -> None:
    sampler = amoeba.ElasticSampler(100, 8, seed=3, max_global_batch=40, adapt_every=4)
    assert sampler.adaptive and sampler.global_batch == 8
    seen: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    sizes = [8, 24, 40, 12, 33]
    decisions = 0
    while sampler.progress.epoch < 3:
        steps = sampler.remaining_assignments(rank=0, world_size=3)
        assert 1 <= len(steps) <= 4, "an iteration ends at the next multiple of adapt_every or the epoch's end"
        for assignment in steps:
            assert assignment.plan.step_samples == min(sampler.global_batch, 100 - assignment.cursor)
            for rank in range(3):
                seen[assignment.epoch].update(sampler.assignment(rank, 3).indices)
            sampler.advance()
        with pytest.raises(amoeba.BatchPlanError, match="outside the allowed range 8..40"):
            sampler.set_global_batch(41)
        decisions += 1
        sampler.set_global_batch(sizes[decisions % len(sizes)])
    for epoch in range(3):
        assert sorted(seen[epoch]) == list(range(100)) and set(seen[epoch].values()) == {1}, f"epoch {epoch}"
    sampler.advance()
    with pytest.raises(amoeba.BatchPlanError, match="change the batch only there"):
        sampler.set_global_batch(16)
    restored = amoeba.ElasticSampler(100, 8, seed=3, max_global_batch=40, adapt_every=4)
    restored.load_state_dict(sampler.state_dict())
    assert restored.global_batch == sampler.global_batch and restored.progress == sampler.progress


def test_adaptive_settings_the_runtime_cannot_honour_are_refused_with_what_to_do() -> None:
    with pytest.raises(amoeba.BatchPlanError, match="needs even=False and max_accumulation=0"):
        amoeba.ElasticSampler(100, 8, max_global_batch=32, even=True)
    with pytest.raises(amoeba.BatchPlanError, match="is below global_batch=8"):
        amoeba.ElasticSampler(100, 8, max_global_batch=4)
    with pytest.raises(amoeba.BatchPlanError, match="on a fixed-batch sampler"):
        amoeba.ElasticSampler(100, 8).set_global_batch(8)
    model = torch.nn.Linear(2, 1)
    fixed = amoeba.ElasticSampler(100, 8)
    with pytest.raises(amoeba.RuntimeConfigError, match="needs an ElasticSampler built with max_global_batch"):
        TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), fixed, adaptive=AdaptiveBatch())
    lbfgs = torch.optim.LBFGS(model.parameters())
    with pytest.raises(amoeba.RuntimeConfigError, match="no default learning-rate rule for a LBFGS"):
        default_rule(lbfgs)
    assert default_rule(torch.optim.AdamW(model.parameters())) == "sqrt"


def test_learning_rate_is_scaled_inside_the_optimizer_step_only() -> None:
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    sampler = amoeba.ElasticSampler(100, 8, max_global_batch=32, adapt_every=1)
    state = TorchState(model, optimizer, sampler, schedulers=[schedule])
    assert state.adaptive is not None and state.adaptive.lr_rule == "sqrt"
    sampler.set_global_batch(32)
    seen: list[float] = []
    optimizer.register_step_post_hook(lambda opt, args, kwargs: seen.append(0.0))  # after the runtime's hooks
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: seen.append(opt.param_groups[0]["lr"]))
    model.weight.grad = torch.ones_like(model.weight)
    optimizer.step()
    assert seen[0] == pytest.approx(0.2), "sqrt(32 / 8) x 0.1 while the optimizer steps"
    assert model.weight[0, 0].item() == pytest.approx(-0.2), "Adam's first step moves by the learning rate"
    assert optimizer.param_groups[0]["lr"] == 0.1, "the schedule's learning rate is put back"
    schedule.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    tree = state.as_tree()
    assert tree["progress"]["global_batch"] == 32 and tree["adaptive"]["scaled_steps"] == 1.0  # no estimate: no gain


class OneWorker:
    """The runtime's step for a lone worker in this process (the StepDriver that ``run()`` would bind)."""

    rank, world_size = 0, 1

    def __init__(self, state: TorchState) -> None:
        self.grad = state.gradient_reducer(None)

    def check_boundary(self) -> None:
        pass

    def before_last_micro_batch(self) -> None:
        self.grad.arm(0.0)

    def reduce_gradients(self) -> None:
        self.grad.finish(0.0)

    def apply_step(self, state: TorchState) -> None:
        self.reduce_gradients()
        state.optimizer.step()
        self.end_step(state)

    def end_step(self, state: TorchState) -> None:
        self.grad.zero()
        state.sampler.advance()

    def agree_on_commit(self, step: int, snapshot: object = None) -> None:
        pass


DATASET, EPOCHS, NOISE_STD = 2048, 4, 0.5
STEP_OVERHEAD_S = 0.002


def regression() -> tuple[TensorDataset, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(DATASET, 10, generator=generator, dtype=torch.float64)
    w = torch.randn(10, 1, generator=generator, dtype=torch.float64)
    y = x @ w + NOISE_STD * torch.randn(DATASET, 1, generator=generator, dtype=torch.float64)
    return TensorDataset(x, y), x, y


def train(max_batch: int | None) -> tuple[float, int, list[int]]:
    """Train the regression for EPOCHS epochs; returns the final loss, the steps taken and the batches used."""
    dataset, x, y = regression()
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 1, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
    sampler = amoeba.ElasticSampler(DATASET, 8, seed=5, max_local_batch=4, max_global_batch=max_batch, adapt_every=16)
    adaptive = AdaptiveBatch(overhead_prior=0.5, measure_every=1) if max_batch else None
    state = TorchState(model, optimizer, sampler, adaptive=adaptive)
    loader = amoeba.ElasticDataLoader(dataset, sampler)
    driver = OneWorker(state)
    state.bind(driver)
    state.run_reset_callbacks()
    batches = []
    loss_fn = torch.nn.MSELoss()
    while state.epoch < EPOCHS:
        for step in loader:
            for (xb, yb), weight in step:
                (loss_fn(model(xb), yb) * weight).backward()
            batches.append(step.assignment.plan.step_samples)
            time.sleep(STEP_OVERHEAD_S)  # what a step costs beside the samples (the all-reduce of a larger job)
            state.step()
    state.bind(None)
    with torch.no_grad():
        return float(loss_fn(model(x), y)), state.step_index, batches


@pytest.mark.timeout(120)
def test_adaptive_batch_reaches_the_fixed_batch_loss_in_fewer_steps(single_process_group: None) -> None:
    fixed_loss, fixed_steps, _ = train(None)
    adaptive_loss, adaptive_steps, batches = train(256)
    floor = NOISE_STD**2
    assert fixed_loss < 1.1 * floor, f"the fixed run did not converge ({fixed_loss:.4f})"
    # The stated tolerance: the same number of epochs ends within 5 % of the fixed batch's loss.
    assert math.isclose(adaptive_loss, fixed_loss, rel_tol=0.05), (adaptive_loss, fixed_loss)
    assert sum(batches) == EPOCHS * DATASET, "every epoch applied every sample once"
    assert max(batches) >= 32 and adaptive_steps < fixed_steps / 2, (max(batches), adaptive_steps, fixed_steps)


def test_reducer_of_an_adaptive_state_carries_the_probe_and_its_slots() -> None:
    model = torch.nn.Linear(4, 2)
    sampler = amoeba.ElasticSampler(64, 8, max_global_batch=32)
    state = TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), sampler)
    reducer = state.gradient_reducer(None)
    assert isinstance(reducer, GradientBuckets) and state.adaptive is not None
    assert reducer.probe is state.adaptive.probe
    assert reducer.flats[-1].numel() == sum(p.numel() for p in model.parameters()) + 1 + NormProbe.SLOTS
    assert state.progress_report()["adaptive"]["global_batch"] == 8
    plain = TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), amoeba.ElasticSampler(64, 8))
    manifest, _ = plain.encode()
    problem = state.check_compatible(manifest)
    assert problem is not None and "batch is adaptive but the running workers' is not" in problem
