"""The goodput policy: the objective it maximises, LAS admission, cheap resizes, and the goodput model of adaptive
jobs (the batch each size should use, and the model read from the runtime's report)."""

from __future__ import annotations

import itertools
import math

import pytest

from slurm_amoeba.policy import JobPhase, PolicyError, check_actions, make_policy
from slurm_amoeba.policy.common import las_queue
from slurm_amoeba.policy.goodput import (
    GoodputModel,
    GoodputPolicy,
    efficiency,
    fit_step_times,
    goodput_rates,
    model_from_report,
)
from tests.unit.policy.helpers import job, sized, sizes, snapshot


def objective(rates: dict[str, dict[int, float]], alloc: dict[str, int], fairness: float) -> float:
    total = 0.0
    for key, table in rates.items():
        speedup = table[alloc[key]] / table[1]
        total += math.log(speedup) if fairness == 0 else speedup**fairness / fairness
    return total


@pytest.mark.parametrize("fairness", [-1.0, 0.0, 1.0])
def test_growth_maximises_the_sum_of_fair_speedups_like_an_exhaustive_search(fairness: float) -> None:
    rates = {
        "a": {w: 10 * w**0.9 for w in range(1, 9)},  # scales well
        "b": {w: 10 * w**0.5 for w in range(1, 9)},  # scales poorly
        "c": {w: 10 * min(w, 3) + 0.5 * w for w in range(1, 9)},  # saturates at 3
    }
    jobs = [job(key, 1, low=1, high=8, throughput=rates[key], submit=i) for i, key in enumerate(rates)]
    policy = GoodputPolicy(fairness=fairness, min_gain=0.0)
    decided = sizes(policy.decide(snapshot([4, 4], jobs), now=0.0))
    assert sum(decided.values()) == 8
    best = max(
        (dict(zip("abc", alloc, strict=True)) for alloc in itertools.product(range(1, 9), repeat=3) if sum(alloc) == 8),
        key=lambda alloc: objective(rates, alloc, fairness),
    )
    assert objective(rates, decided, fairness) == pytest.approx(objective(rates, best, fairness))


def test_las_admits_the_least_served_first_and_preempts_what_no_longer_fits() -> None:
    served = job("old", 4, placement={"n0": 4}, submit=0.0, attained_service=20 * 3600.0)
    young = job("young", 4, submit=5.0)
    decided = GoodputPolicy().decide(snapshot([4], [served, young]), now=10.0)
    assert sizes(decided) == {"old": 0, "young": 4}
    assert las_queue(served.attained_service, (3600.0, 16 * 3600.0)) == 2
    assert las_queue(young.attained_service, (3600.0,)) == 0


def test_running_jobs_keep_their_workers_unless_another_job_gains_clearly_more() -> None:
    linear = {w: float(w) for w in range(1, 9)}
    running = job("run", 2, low=1, high=8, placement={"n0": 4}, throughput=linear)
    newcomer = job("new", 1, low=1, high=8, throughput=linear, submit=1.0)
    decided = sizes(GoodputPolicy(fairness=1.0).decide(snapshot([4], [running, newcomer]), now=0.0))
    assert decided == {"new": 1, "run": 3}, "with equal gains the held worker stays (keep_bonus), one moves over"
    useless = job("flat", 1, low=1, high=8, throughput=dict.fromkeys(range(1, 9), 1.0), submit=2.0)
    assert sizes(GoodputPolicy().decide(snapshot([8], [useless]), now=0.0)) == {"flat": 1}, "no gain: minimum only"
    unknown = job("unknown", 1, low=1, high=8, placement={"n0": 1})
    assert sizes(GoodputPolicy().decide(snapshot([8], [unknown]), 0.0)) == {"unknown": 8}, "unmeasured: linear"


def test_decisions_respect_the_invariants_on_a_busy_cluster() -> None:
    jobs = [
        job(f"e{i}", 2, low=1, high=6, placement={f"n{i % 3}": 2}, throughput={w: w**0.8 for w in range(1, 7)})
        for i in range(3)
    ]
    jobs += [job(f"r{i}", 4, submit=10.0 + i) for i in range(3)]
    snap = snapshot([8, 8, 8], jobs)
    decisions = make_policy("goodput").decide(snap, now=100.0)
    check_actions(snap, decisions)
    after = {j.job_id: j.workers for j in jobs} | sizes(decisions)
    assert sum(after[j.job_id] * j.gpus_per_worker for j in jobs) <= 24


def test_goodput_model_picks_the_stationary_batch_and_grows_it_with_workers() -> None:
    model = GoodputModel(base_batch=32, max_batch=4096, noise_scale=2000.0, sample_s=1e-3, fixed_s=0.05, sync_s=0.05)
    for workers in (1, 4, 16):
        batch, rate = model.best(workers)
        exhaustive = max(range(32, 4097), key=lambda b: model.goodput(workers, b))
        assert batch == exhaustive and model.goodput(workers, exhaustive) == pytest.approx(rate, rel=1e-12)
    assert model.best(16)[0] > model.best(4)[0] > model.best(1)[0]
    fixed = GoodputModel(base_batch=64, max_batch=64, noise_scale=None, sample_s=1e-3)
    assert fixed.best(8)[0] == 64 and fixed.best(8)[1] == pytest.approx(64 / (64e-3 / 8))
    rates = goodput_rates(model, 8)
    assert sorted(rates) == list(range(1, 9)) and all(rates[w + 1] > rates[w] for w in range(1, 8))
    assert efficiency(None, 64, 32) == 0.5 and efficiency(math.inf, 64, 32) == 1.0
    with pytest.raises(PolicyError, match="batch range 64..32 is invalid"):
        GoodputModel(base_batch=64, max_batch=32, noise_scale=None, sample_s=1.0)


def test_model_is_read_from_the_runtime_report() -> None:
    report = {
        "base_batch": 8,
        "max_batch": 256,
        "noise_scale": 500.0,
        "step_time_s": [[2, 16, 0.1 + 0.01 * 8, 30], [4, 32, 0.1 + 0.01 * 8, 10], [2, 64, 0.1 + 0.01 * 32, 5]],
    }
    model = model_from_report(report)
    assert model is not None
    # Only sizes above one measured: the constant time is fixed (nothing showed it vanish at one worker).
    assert model.sample_s == pytest.approx(0.01) and model.fixed_s == pytest.approx(0.1) and model.sync_s == 0.0
    assert model.noise_scale == 500.0 and (model.base_batch, model.max_batch) == (8, 256)
    assert model_from_report({"base_batch": 8, "max_batch": 8, "step_time_s": []}) is None
    assert model_from_report({"noise_scale": 1.0}) is None


def test_a_job_measured_at_one_worker_and_more_keeps_its_fixed_time_at_one_worker() -> None:
    # A live job's report (CPU, gloo): most steps at one worker and batch 8, a few at two workers after a grow.
    # Each kind of size has its own intercept and both share the slope, so one worker is not predicted to drop
    # the step's fixed 20 ms, and two workers stay the better size.
    fixed, sync, sample = 0.02, 0.001, 1e-4
    sizes = [(1, 8, 4000), (1, 16, 13), (1, 32, 2), (2, 27, 3), (2, 38, 39)]
    measured = [(w, b, fixed + (sync if w > 1 else 0.0) + sample * b / w, n) for w, b, n in sizes]
    model = model_from_report({"base_batch": 8, "max_batch": 64, "noise_scale": 9.0, "step_time_s": measured})
    assert model is not None
    assert (model.fixed_s, model.sync_s, model.sample_s) == pytest.approx((fixed, sync, sample))
    assert model.best(2)[1] > model.best(1)[1] and model.best(2)[0] > model.best(1)[0] > 8
    # Weighted by the steps measured: a slow mean over one step moves the fit little, over 1,000 steps a lot.
    once, often = fit_step_times([*measured, (1, 16, 0.03, 1)]), fit_step_times([*measured, (1, 16, 0.03, 1000)])
    assert once[1] == pytest.approx(fixed, rel=0.02) and often[1] < 0.7 * fixed
    # One B / w measured: the slope is assumed (90 % of the step per sample), the intercepts follow from it.
    assert fit_step_times([(1, 8, 0.1, 10), (2, 16, 0.1, 10)]) == pytest.approx((0.9 * 0.1 / 8, 0.01, 0.0))


def test_settings_are_checked_and_registered() -> None:
    with pytest.raises(PolicyError, match="fairness=2"):
        GoodputPolicy(fairness=2)
    with pytest.raises(PolicyError, match="ascending"):
        GoodputPolicy(thresholds_gpu_s=(10.0, 5.0))
    policy = make_policy("goodput", fairness=0.0)
    assert policy.name == "goodput" and not policy.decides_on_events_only
    pending = job("p", 2)
    assert pending.state is JobPhase.PENDING


def test_packing_puts_a_job_on_the_fullest_node_that_holds_it_and_a_grown_job_moves_onto_one_node() -> None:
    flat = dict.fromkeys(range(1, 5), 1.0)
    fixed = job("fixed", 2, placement={"n0": 2})  # leaves n0 with 2 free; n1 and n2 have 4
    newcomer = job("new", 2, throughput=flat, submit=1.0)
    decided = sized(GoodputPolicy(pack=True).decide(snapshot([4, 4, 4], [fixed, newcomer]), now=0.0))
    assert [(d.job_id, d.placement) for d in decided] == [("new", {"n0": 2})], "best fit, not the emptiest node"
    linear = {w: float(w) for w in range(1, 5)}
    split = job("split", 2, low=1, high=4, placement={"n0": 1, "n1": 1}, throughput=linear)
    nodes = snapshot([4, 4, 4], [split])
    grown = sized(GoodputPolicy(fairness=1.0, pack=True).decide(nodes, now=0.0))
    assert [(d.workers, len(d.placement)) for d in grown] == [(4, 1)], "4 workers fit on one node: no spread"
    check_actions(nodes, grown)
    spread = sized(GoodputPolicy(fairness=1.0, pack=False).decide(nodes, now=0.0))
    assert len(spread[0].placement) > 1, "the shared rule (most free first, own nodes first) keeps it spread"


def test_a_table_that_dips_on_a_second_node_is_jumped_over_with_the_look_ahead() -> None:
    # A job on one 4-GPU node: 5..7 workers are slower than 4 (a second node), 8 is much faster.
    dipping = {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0, 5: 3.0, 6: 3.5, 7: 3.8, 8: 7.5}
    running = job("dip", 4, low=1, high=8, placement={"n0": 4}, throughput=dipping)
    nodes = snapshot([4, 4], [running])
    assert sizes(GoodputPolicy(fairness=1.0).decide(nodes, now=0.0)) == {"dip": 8}
    assert sizes(GoodputPolicy(fairness=1.0, lookahead=1).decide(nodes, now=0.0)) == {}, "one worker at a time stops"


def test_less_attained_service_weighs_more_in_the_growth() -> None:
    linear = {w: float(w) for w in range(1, 5)}
    old = job("old", 1, low=1, high=4, placement={"n0": 1}, throughput=linear, attained_service=40 * 3600.0)
    young = job("young", 1, low=1, high=4, placement={"n0": 1}, throughput=linear, submit=1.0, attained_service=60.0)
    nodes = snapshot([6], [old, young])
    assert sizes(GoodputPolicy(fairness=0.5).decide(nodes, now=0.0)) == {"young": 4, "old": 2}
    assert sizes(GoodputPolicy(fairness=0.5, service_weight=0.0).decide(nodes, now=0.0)) == {"old": 3, "young": 3}
