"""Adaptive batch in real local jobs (CPU, gloo): a batch that changes every few steps, a joiner and a SIGKILL, and
still every sample applied exactly once per epoch; with a fixed schedule of batch sizes the resized run ends with
the fixed-size run's parameters, and rank 0's progress report carries the gradient statistics to the coordinator.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest
import torch

from slurm_amoeba.agent.status import adaptive_fields
from slurm_amoeba.core.messages import Message, decode, encode
from slurm_amoeba.local import LocalJob, LocalJobResult
from tests.unit.runtime.adaptive_train import DELAY_KEY
from tests.unit.runtime.jobs import ToyJob, applied_ledger, epoch_counts, final_params, read_ledgers

SCRIPT = Path(__file__).with_name("adaptive_train.py")
EPOCHS, DATASET, ADAPT_EVERY = 6, 120, 3
SCHEDULE = (8, 16, 12, 24)
DEADLINE_S = 90.0
WARM_UP_DELAY_S = 2.0  # a step's least length while a joiner warms up


class AdaptiveJob(ToyJob):
    """A local job of ``adaptive_train.py``: slowed down while the test resizes it (no holds), then let go."""

    def __init__(self, out: Path, *, workers: int, extra: list[str], delay_s: float = 0.4) -> None:
        self.out = out
        self.delay_s = delay_s
        out.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, str(SCRIPT), "--out", str(out), "--epochs", str(EPOCHS)]
        command += ["--dataset-size", str(DATASET), "--adapt-every", str(ADAPT_EVERY), *extra]
        self.job = LocalJob(
            command,
            initial_workers=workers,
            job_id="adaptive",
            log_dir=out / "logs",
            collective_timeout_s=20,
            report_timeout_s=10,
            heartbeat_timeout_s=15,
            poll_s=0.01,
        )
        self.hold = False

    def __enter__(self) -> AdaptiveJob:
        self.job.start_coordinator()
        self.slow(self.delay_s)  # before any worker reads it
        self.job.start()
        return self

    def slow(self, seconds: float) -> None:
        """Make every step last at least ``seconds`` more (0: full speed)."""
        self.job.coordinator.store.set(DELAY_KEY, repr(seconds))

    def wait_step(self, step: int) -> None:
        """Wait until rank 0 reported step ``step`` or later."""
        self.job.wait_for(lambda v: int(v.progress.get("step", 0)) >= step, DEADLINE_S, f"step {step}")


def resized_run(out: Path, extra: list[str], delay_s: float = 0.4) -> LocalJobResult:
    """2 workers; a third joins; one is SIGKILLed (the survivors roll back and redo from the last commit)."""
    with AdaptiveJob(out, workers=2, extra=["--slow", *extra], delay_s=delay_s) as job:
        job.wait_step(2)
        job.slow(WARM_UP_DELAY_S)
        (joiner,) = job.job.add(1)
        job.wait_ready([joiner])  # at 2 s a step, the job waits for a slow warm-up on a loaded machine
        job.slow(delay_s)  # ends the 2 s step under way at once
        view = job.wait_members(3)
        job.wait_step(view.progress.get("step", 0) + 5)
        assert view.plan is not None
        job.job.kill(view.plan.members[1])
        job.wait_members(2)
        job.slow(0.0)
        result = job.job.wait(DEADLINE_S)
    assert result.phase.value == "finished", result
    assert [r.plan.world_size for r in result.view.history][:2] == [2, 3]
    assert result.view.history[-1].plan.rollback
    return result


def applied_batches(out: Path, result: LocalJobResult) -> dict[int, int]:
    """Samples applied at each step of the final timeline, after checking exactly-once per epoch."""
    entries = applied_ledger(read_ledgers(out), result.view.history)
    counts = epoch_counts(entries)
    assert sorted(counts) == list(range(EPOCHS))
    for epoch, counter in counts.items():
        assert sorted(counter) == list(range(DATASET)), f"epoch {epoch} misses samples"
        assert set(counter.values()) == {1}, f"epoch {epoch} applied some samples twice"
    per_step: dict[int, int] = collections.Counter()
    for entry in entries:
        per_step[entry.step] += len(entry.indices)
        assert all(m <= 4 for m in entry.micro), "a micro-batch exceeded the memory cap"
    assert sorted(per_step) == list(range(len(per_step)))
    return per_step


@pytest.mark.timeout(240)
def test_scheduled_batch_changes_with_a_joiner_and_a_kill_apply_every_sample_once_and_match_fixed_size(
    tmp_path: Path,
) -> None:
    with AdaptiveJob(tmp_path / "fixed", workers=2, extra=[]) as fixed_job:
        fixed = fixed_job.finish()
    assert fixed.phase.value == "finished"
    resized = resized_run(tmp_path / "resized", [])
    expected = applied_batches(tmp_path / "fixed", fixed)
    assert applied_batches(tmp_path / "resized", resized) == expected
    assert len(set(expected.values()) & set(SCHEDULE)) >= 3, f"the schedule did not change the batch: {expected}"
    reference = next(iter(final_params(tmp_path / "fixed").values()))
    ends = final_params(tmp_path / "resized")
    assert len(ends) == 2
    for worker, params in ends.items():
        for name, tensor in reference.items():
            torch.testing.assert_close(params[name], tensor, rtol=1e-9, atol=1e-11, msg=f"{worker} {name}")
    report = resized.view.progress["adaptive"]
    assert report["lr_rule"] == "sqrt" and report["measured_steps"] > 0
    assert report["noise_scale"] is None or report["noise_scale"] >= 0
    assert any(w == 2 for w, _, _, _ in report["step_time_s"]), "step times per (world size, batch) are reported"


@pytest.mark.timeout(200)
def test_runtime_chosen_batch_with_a_joiner_and_a_kill_applies_every_sample_once(tmp_path: Path) -> None:
    result = resized_run(tmp_path / "chosen", ["--choose", "--max-global-batch", "32"], delay_s=0.8)
    per_step = applied_batches(tmp_path / "chosen", result)
    assert max(per_step.values()) > 8, f"the runtime never grew the batch: {per_step}"
    assert sum(per_step.values()) == EPOCHS * DATASET


@pytest.mark.timeout(120)
def test_the_policys_batch_from_the_coordinator_replaces_the_runtimes_choice_on_every_worker(tmp_path: Path) -> None:
    out = tmp_path / "policy"
    with AdaptiveJob(out, workers=2, extra=["--slow", "--choose", "--max-global-batch", "32"], delay_s=0.2) as job:
        job.job.coordinator.set_policy_batch(24, world_size=2)
        job.wait_step(4)
        job.slow(0.0)
        result = job.finish()
    assert result.phase.value == "finished", result
    per_step = applied_batches(out, result)  # every sample once per epoch, on both workers alike
    batches = [per_step[step] for step in sorted(per_step)]
    assert batches[-10:] == [24] * 10, f"the policy's batch did not hold: {batches}"
    report = result.view.progress["adaptive"]
    assert report["batch_source"] == "policy" and report["policy_batch"] == 24 and report["global_batch"] == 24
    fields = adaptive_fields(result.view.progress)  # what the agent sends on: the daemon's door takes it
    assert fields is not None and fields["global_batch"] == 24 and fields["step_time_s"]
    body = {"job_id": "7", "size": 2, "generation": 1, "target": 2, "throughput": {}, "history": [], "satellites": []}
    assert decode(encode(Message("report", {**body, "adaptive": fields}))).body["adaptive"] == fields
