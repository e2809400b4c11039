"""Goodput mode end to end: a real adaptive-batch job (``tests/unit/runtime/adaptive_train.py --choose`` under the
real agent, ``amoeba-sbatch --elastic 1:2``) reports its statistics to amoebad running the ``goodput`` policy; the
policy's directive carries a global batch; the agent hands it to the coordinator once, and the workers train with
exactly that batch from a decision point on, every sample of each epoch once (docs/runtime.md, "What reaches the
daemon, and how the policy's batch comes back")."""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from slurm_amoeba.slurm import CliSlurmClient
from tests.conftest import REPO, ClusterHandle
from tests.e2e.test_daemon_restart import (
    agent_history,
    env,  # noqa: F401 (the fixture: the cluster, idle)
)
from tests.integration.daemon_helpers import DaemonProcess, amoeba_sbatch_job, end_job, script, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(400)]

DATASET = 240
STEP_SECONDS = 0.02
BASE_BATCH = 8
ORDER = re.compile(r"job (\d+): (grow|shrink|batch) (\d+) -> (\d+) workers, global batch (\d+)")


def first_new_batch(log: str) -> re.Match[str] | None:
    """The daemon's first order of a global batch other than the job's own first one, or None."""
    return next((order for order in ORDER.finditer(log) if int(order.group(5)) != BASE_BATCH), None)


def ledger_lines(out: Path) -> list[dict[str, Any]]:
    lines = []
    for path in sorted(out.glob("ledger-*.jsonl")):
        for text in path.read_text().splitlines():
            if text.strip():
                lines.append(json.loads(text))
    return lines


def test_the_goodput_policys_batch_is_applied_by_the_workers_exactly_once(
    slurm_cluster: ClusterHandle,
    env: dict[str, str],  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    daemon = DaemonProcess(slurm_cluster, tmp_path, host="10.77.0.1", policy="goodput", interval_s=1.0)
    daemon.start()
    client = CliSlurmClient(env)
    out = tmp_path / "out"
    out.mkdir()
    train = REPO / "tests" / "unit" / "runtime" / "adaptive_train.py"
    job_script = script(tmp_path / "job.sh", f'exec amoeba-run {sys.executable} {train} "$@"\n')
    job_id = ""
    try:
        args = ["--elastic", "1:2", "--gpus-per-worker", "1", f"--output={tmp_path}/agent-%j.out", str(job_script)]
        args += ["--out", str(out), "--choose", "--epochs", "400", "--dataset-size", str(DATASET)]
        # A fixed cost per step (as on a GPU, where a small batch costs about as long as a larger one): the goodput
        # model then finds a larger batch better whatever the CPU's speed, so the policy orders one.
        args += ["--step-seconds", str(STEP_SECONDS)]
        job_id = amoeba_sbatch_job(
            env,
            tmp_path,
            daemon.endpoint,
            [*args, "--global-batch", str(BASE_BATCH), "--max-global-batch", "64", "--adapt-every", "3"],
        )
        state_dir = tmp_path / f"amoeba-{job_id}"
        order = wait_until(
            f"the policy to order a global batch other than the job's {BASE_BATCH}",
            lambda: first_new_batch(daemon.log_text()),
            timeout=150,
        )
        kind, size, target, batch = order.group(2, 3, 4, 5)
        workers, policy_batch = int(target), int(batch)

        def applied() -> bool:
            return any(e["world_size"] == workers and e["step_samples"] == policy_batch for e in ledger_lines(out))

        wait_until(f"the workers to train with the batch {policy_batch}", applied, timeout=120)

        def handed() -> list[dict[str, Any]]:
            """The agent's record of handing the policy's batch to the workers (its status file is written a
            moment after the workers have it)."""
            chosen = [e for e in agent_history(state_dir) if e.get("event") == "batch_chosen"]
            return [e for e in chosen if e["batch"] == policy_batch and e["workers"] == workers]

        ordered = wait_until(f"the agent's history to show the batch {policy_batch} handed over", handed, timeout=30)
        assert len(ordered) == 1, ordered  # handed to the workers once
        # Exactly once: within each finished epoch of a generation, no sample index is applied twice.
        seen: dict[tuple[int, int], Counter[int]] = {}
        for entry in ledger_lines(out):
            seen.setdefault((entry["generation"], entry["epoch"]), Counter()).update(entry["indices"])
        twice = {key: [i for i, n in counter.items() if n > 1] for key, counter in seen.items()}
        assert not any(twice.values()), {k: v for k, v in twice.items() if v}
        print(f"test_goodput_live: {kind} {size} -> {workers} workers with the policy's global batch {policy_batch}")
    finally:
        daemon.stop()
        if job_id:
            end_job(client, job_id)
