"""Adaptive batches in the simulator: the efficiency model against the traces, the batch choice, and a tiny run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from slurm_amoeba.policy import make_policy
from slurm_amoeba.policy.goodput import efficiency
from slurm_amoeba.sim.adaptive import (
    AdaptiveBatch,
    AdaptiveWorkModel,
    adaptive_models,
    mark_adaptive,
    noise_scale,
    widen_adaptive,
)
from slurm_amoeba.sim.application import Application, load_applications
from slurm_amoeba.sim.data import SimError
from slurm_amoeba.sim.engine import SimConfig, Simulator, TraceWorkModel, trace_models
from slurm_amoeba.sim.workload import JobSpec

# cifar10, epoch 1 (first row) of validation-512.csv: grad_sqr and grad_var; the initial batch is 128.
SQR_512, VAR_512 = 8.220063889732206, 8.914520446545186


@pytest.fixture(scope="module")
def apps(data_dir: Path) -> dict[str, Application]:
    return load_applications(data_dir / "pollux" / "traces")


def test_the_gain_of_a_trace_row_is_its_batch_ratio_times_the_efficiency(apps: dict[str, Application]) -> None:
    app = apps["cifar10"]
    # By hand: gain = (var + sqr) / (var / 4 + sqr) = 17.134584 / 10.448694 = 1.639878...
    assert app.gain(512, 0) == pytest.approx(1.6398780875421575, rel=1e-12)
    phi = 128 * VAR_512 / SQR_512  # 138.81 samples
    assert noise_scale(app, 512, 0) == pytest.approx(phi, rel=1e-12)
    # (phi + M0) / (phi + M) = 266.81 / 650.81 = 0.40997: the policy's efficiency is the same rule.
    assert efficiency(phi, 512, 128) == pytest.approx(0.40996952188553937, rel=1e-12)
    assert app.gain(512, 0) == pytest.approx(4 * efficiency(phi, 512, 128), rel=1e-12)


def test_the_best_batch_is_at_least_as_good_as_every_feasible_batch(apps: dict[str, Application]) -> None:
    app = apps["cifar10"]
    model = AdaptiveBatch(app)
    placement, epoch = (4,), 50
    batch, rate = model.best(placement, epoch)
    # Brute force over every per-replica batch the range allows (one node: no accumulation below 1024 a replica).
    brute = 0.0
    for per_replica in range(app.init_batch // 4, app.max_batch // 4 + 1):
        local, accum = model.plan(4, per_replica)
        step, sync = app.step_time(placement, local)
        total = 4 * local * (accum + 1)
        brute = max(brute, app.gain(min(total, app.max_batch), epoch) / (step + (step - sync) * accum))
    assert rate == pytest.approx(brute, rel=0.01)
    assert rate >= app.rate(placement, app.init_batch, epoch)
    assert app.init_batch <= batch <= app.max_batch


def test_late_in_training_the_noise_scale_grows_and_so_does_the_batch(apps: dict[str, Application]) -> None:
    model = AdaptiveBatch(apps["imagenet"])
    early, late = model.best((4, 4), 0)[0], model.best((4, 4), 80)[0]
    assert noise_scale(apps["imagenet"], 200, 80) > noise_scale(apps["imagenet"], 200, 0)
    assert late > early


def _one_job(adaptive: bool, apps: dict[str, Application]) -> Simulator:
    spec = JobSpec("cifar10-0", 0.0, 2, "cifar10", 128, min_workers=1, max_workers=16, adaptive=adaptive)
    models = adaptive_models(apps, 4, trace_models(apps, 4))
    return Simulator([spec], make_policy("goodput"), SimConfig(nodes=4, gpus_per_node=4), models)


def test_an_adaptive_job_uses_more_gpus_and_finishes_sooner_than_the_same_job_with_a_fixed_batch(
    apps: dict[str, Application],
) -> None:
    fixed, adaptive = _one_job(False, apps), _one_job(True, apps)
    fixed_result, result = fixed.run(), adaptive.run()
    assert result.jcts()[0] < 0.5 * fixed_result.jcts()[0]
    assert max(used for _, used in result.usage) > max(used for _, used in fixed_result.usage)


def test_fixed_batch_jobs_keep_their_model_and_a_fraction_of_zero_marks_nothing(
    apps: dict[str, Application],
) -> None:
    jobs = [JobSpec(f"cifar10-{i}", 0.0, 2, "cifar10", 128) for i in range(20)]
    assert mark_adaptive(jobs, 0.0) == jobs
    marked = mark_adaptive(jobs, 0.5)
    assert 0 < sum(job.adaptive for job in marked) < 20
    models = adaptive_models(apps, 4, trace_models(apps, 4))
    for job in marked:
        model = models(job)
        assert type(model) is (AdaptiveWorkModel if job.adaptive else TraceWorkModel)
    fixed = models(jobs[0])
    assert fixed.rate((2,), 3, False) == apps["cifar10"].rate((2,), 128, 3)
    with pytest.raises(SimError, match="adaptive fraction 2"):
        mark_adaptive(jobs, 2.0)


def test_an_elastic_adaptive_job_ranges_from_one_worker_to_what_its_largest_batch_allows() -> None:
    jobs = [JobSpec("a", 0.0, 4, "cifar10", 128, adaptive=True), JobSpec("b", 0.0, 4, "cifar10", 128)]
    widened = widen_adaptive(jobs, {"a": 128, "b": 4}, 1.0, 64)
    assert (widened[0].min_workers, widened[0].max_workers) == (1, 64)
    assert widened[1] == jobs[1]


def test_the_policy_sees_goodput_per_size_of_the_current_epoch(apps: dict[str, Application]) -> None:
    model = AdaptiveWorkModel(apps["imagenet"], 200, 4, 4)
    early, late = model.table(1, 16, 0), model.table(1, 16, 80)
    assert early[4] == pytest.approx(1.0) and late[4] == pytest.approx(1.0)
    assert late[16] > early[16], "a larger noise scale later in training makes more GPUs worth more"
    assert math.isclose(model.table(1, 16, 0)[16], early[16])
