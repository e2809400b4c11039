"""A job that loses every worker at once on the local Slurm cluster restarts from its disk checkpoint and finishes.

An executor job of two workers writes a disk checkpoint every 10 steps (the agent gives its workers a checkpoint
directory in the job's state folder). Once one is complete the test SIGKILLs the worker step (``scancel
--signal=KILL`` of that step): no worker holds the state any more. The agent, which still runs, restarts the job
from the newest complete checkpoint with a fresh coordinator and main group; the job finishes with the right
result, a history that says what happened, and every sample of every epoch trained on exactly once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from examples.elastic_mlp import train
from slurm_amoeba.agent.lifecycle import newest_step
from slurm_amoeba.launcher import ElasticExecutor
from slurm_amoeba.slurm import CliSlurmClient
from tests.conftest import ClusterHandle
from tests.e2e.test_elastic_jobs import job_env, wait_until  # noqa: F401 - job_env is a fixture
from tests.e2e.test_requeue_time_limit import assert_every_sample_once_over_the_runs

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

DATASET, GLOBAL_BATCH, EPOCHS = 1024, 64, 10  # 160 steps
STEP_S = 0.05


def train_per_coordinator(ledger: Path) -> dict[str, object]:
    """The example's training, each attempt's ledger in its own directory (the attempt's store port: a restart
    starts a fresh coordinator)."""
    return train(
        epochs=EPOCHS,
        dataset_size=DATASET,
        global_batch=GLOBAL_BATCH,
        step_delay=STEP_S,
        ledger=ledger / os.environ["AMOEBA_STORE_PORT"],
    )


def entries(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in directory.glob("ledger-*.jsonl") for line in path.read_text().splitlines()]


def test_a_job_whose_every_worker_is_killed_restarts_from_its_checkpoint_and_finishes_with_every_sample_once(
    tmp_path: Path,
    slurm_cluster: ClusterHandle,
    job_env: dict[str, str],  # noqa: F811 - the fixture
) -> None:
    client = CliSlurmClient(job_env)
    executor = ElasticExecutor(folder=tmp_path / "jobs" / "%j")
    executor.update_parameters(
        min_workers=2, max_workers=2, gpus_per_worker=0, timeout_min=5, setup=["export AMOEBA_CHECKPOINT_EVERY=10"]
    )
    ledger = tmp_path / "ledger"
    job = executor.submit(train_per_coordinator, ledger)
    checkpoints = job.state_dir / "checkpoints"
    wait_until("a checkpoint of step 20 or later", lambda: (newest_step(checkpoints) or 0) >= 20, timeout=180)
    # The worker step runs in the workers' component (squeue lists it under that component's id).
    steps = [s for c in client.het_components(int(job.job_id)) for s in client.steps(c.job_id)]
    (step,) = [s for s in steps if s.name == "amoeba-workers-g0"]
    assert step.number is not None, steps
    client.cancel(step.job_id, step=step.number, signal="KILL")  # every worker at once

    result = job.result()
    assert result["status"] == "finished" and result["samples"] == EPOCHS * DATASET, result
    events = job.history()["history"]
    restarts = [e for e in events if e["event"] == "restarting"]
    assert len(restarts) == 1 and restarts[0]["step"] >= 20, events
    resumed_at = restarts[0]["step"]

    starts = assert_every_sample_once_over_the_runs(ledger, EPOCHS * DATASET // GLOBAL_BATCH, DATASET, EPOCHS)
    assert starts[:2] == [0, resumed_at], "the restart resumes at the checkpoint's step"
