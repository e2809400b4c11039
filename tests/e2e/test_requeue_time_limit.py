"""A job that reaches its time limit on the local Slurm cluster: final checkpoint, requeue, the same job finishes.

An executor job of two workers has a two-minute time limit and asks for Slurm's warning 45 s before it
(``--signal=B:USR1@45``; Slurm sends it at its first periodic time-limit check, every 30 s, after 120 - 45 - 30 s:
45-75 s into the job). Its first run trains slowly, so the warning always falls inside training, after the workers
started even on a loaded machine (they took up to 40 s there); the agent then has every worker leave at one step
boundary, the coordinator asks each for its shard of a final checkpoint, and the agent requeues its own job. The
second run (the same job id: ``job.result()`` simply waits) resumes at the saved step and finishes at full speed.
The test checks the result, the job's history, and that every sample of every epoch was trained on exactly once
over the two runs.

Slurm keeps a requeued job pending for its credential lifetime (``cred_expire``, 120 s) before it may run again; a
site that wants its jobs back sooner lowers it (``AuthInfo=cred_expire=30``). The shared test cluster keeps the
default, so this test moves the pending job's start time to now once Slurm requeued it, as its owner may
(``scontrol update StartTime=now``): what is tested is the job, not Slurm's wait.
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.elastic_mlp import train
from slurm_amoeba.launcher import ElasticExecutor
from slurm_amoeba.slurm import CliSlurmClient, JobState
from slurm_amoeba.slurm.runner import SlurmCommandError, run_command
from tests.conftest import ClusterHandle
from tests.e2e.test_elastic_jobs import job_env, wait_until  # noqa: F401 - job_env is a fixture

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

DATASET, GLOBAL_BATCH, EPOCHS = 1024, 64, 16  # 256 steps
FIRST_RUN_STEP_S = 0.4  # 102 s of training: the warning always comes first


def train_in_runs(ledger: Path) -> dict[str, object]:
    """The example's training, slow in the job's first run (so that the time limit interrupts it), each run's
    ledger in its own directory (``run<SLURM_RESTART_COUNT>``)."""
    run = os.environ.get("SLURM_RESTART_COUNT", "0") or "0"
    return train(
        epochs=EPOCHS,
        dataset_size=DATASET,
        global_batch=GLOBAL_BATCH,
        step_delay=FIRST_RUN_STEP_S if run == "0" else 0.0,
        ledger=ledger / f"run{run}",
    )


def ledger_entries(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in directory.glob("ledger-*.jsonl") for line in path.read_text().splitlines()]


def assert_every_sample_once_over_the_runs(ledger: Path, steps: int, dataset: int, epochs: int) -> list[int]:
    """Each attempt's ledger directory holds the steps it trained; an attempt's steps from where the next one resumed
    on were lost with it. Over what stays, every step was trained by both ranks and every sample of every epoch
    once. Returns where each attempt started, in order."""
    attempts = sorted(
        (ledger_entries(d) for d in ledger.iterdir() if d.is_dir()), key=lambda a: min(e["step"] for e in a)
    )
    starts = [min(e["step"] for e in attempt) for attempt in attempts]
    kept = [e for attempt, end in zip(attempts, [*starts[1:], steps], strict=True) for e in attempt if e["step"] < end]
    per_step = collections.Counter(e["step"] for e in kept)
    assert sorted(per_step) == list(range(steps)) and set(per_step.values()) == {2}, starts
    counts: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for entry in kept:
        counts[entry["epoch"]].update(entry["indices"])
    assert sorted(counts) == list(range(epochs))
    for epoch, counter in counts.items():
        assert sorted(counter) == list(range(dataset)) and set(counter.values()) == {1}, f"epoch {epoch}"
    return starts


@pytest.fixture
def start_when_requeued(job_env: dict[str, str]) -> Iterator[list[int]]:  # noqa: F811 - the fixture
    """Append a job id to the yielded list: once Slurm holds that job pending after a requeue (``BeginTime``), its
    start time is moved to now (see the module docstring). Returns how many times it did so, in ``moved``."""
    jobs: list[int] = []
    stop = threading.Event()
    client = CliSlurmClient(job_env, timeout=10)

    held_since: dict[int, float] = {}

    def completing() -> bool:
        """Whether a node still cleans up after a job (the requeued run's own nodes among them): a run started on
        such a node fails at once (seen: the second run FAILED in 0 s when its start was moved the same second)."""
        states = run_command(["sinfo", "-h", "-N", "-o", "%T"], timeout=10, env=job_env).stdout
        return "comp" in states.lower()

    def watch() -> None:
        while not stop.wait(0.5):
            for job_id in list(jobs):
                try:
                    record = client.job(job_id)
                    if record is None or record.state is not JobState.PENDING or record.state_reason != "BeginTime":
                        held_since.pop(job_id, None)
                        continue
                    since = held_since.setdefault(job_id, time.monotonic())
                    if time.monotonic() - since >= 3.0 and not completing():
                        run_command(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], timeout=10, env=job_env)
                except SlurmCommandError:
                    continue  # the next look tries again

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    yield jobs
    stop.set()
    thread.join(timeout=5)


def test_a_job_at_its_time_limit_saves_its_state_requeues_and_finishes_with_every_sample_once(
    tmp_path: Path, slurm_cluster: ClusterHandle, start_when_requeued: list[int]
) -> None:
    executor = ElasticExecutor(folder=tmp_path / "jobs" / "%j", max_num_timeout=3)
    executor.update_parameters(min_workers=2, max_workers=2, gpus_per_worker=0, timeout_min=2, signal_delay_s=45)
    ledger = tmp_path / "ledger"
    job = executor.submit(train_in_runs, ledger)
    start_when_requeued.append(int(job.job_id))

    result = job.result()  # across the requeue: the same job id
    assert result["status"] == "finished" and result["samples"] == EPOCHS * DATASET, result
    events = job.history()["history"]
    names = [e["event"] for e in events]
    for expected in ("requeue_requested", "checkpoint_saved", "requeued", "resumed"):
        assert expected in names, names
    saved = next(e for e in events if e["event"] == "checkpoint_saved")
    assert saved["step"] > 0, f"the time limit fell before training started: {events}"
    assert names.index("checkpoint_saved") < names.index("requeued") < names.index("resumed")
    starts = assert_every_sample_once_over_the_runs(ledger, EPOCHS * DATASET // GLOBAL_BATCH, DATASET, EPOCHS)
    assert starts[:2] == [0, saved["step"]], "the second run resumes at the saved step"
    client = CliSlurmClient(dict(slurm_cluster.env))
    wait_until("the job to end", lambda: client.accounting_state(int(job.job_id)).is_final(), timeout=30)
    assert client.accounting_state(int(job.job_id)) is JobState.COMPLETED
