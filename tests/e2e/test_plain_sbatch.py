"""The README's batch script submitted with plain ``sbatch``: the SPANK plugin's ``--elastic`` makes an elastic job.

The script is taken from README.md as it is written there, so the README cannot drift from what works. The job
trains ``examples/elastic_mlp.py`` with its minimum of 2 workers in its own (one-component) allocation, grows to 3
with a satellite and shrinks back on request, ends COMPLETED, and every sample of every epoch is applied once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_amoeba.launcher.handle import AgentHandle
from slurm_amoeba.slurm import CliSlurmClient, JobState, SlurmCommandError
from tests.conftest import REPO, ClusterHandle
from tests.e2e.test_elastic_jobs import applied_samples, satellites_of, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

DATASET = 512  # 8 steps an epoch, 80 in all: ~31 s at 2 workers; the resizes are over ~9 s after the job starts
SAMPLE_DELAY = 0.012  # seconds per local sample: long enough steps to grow and shrink while it trains
EPOCHS_IN_README = 10


@pytest.fixture
def plain_env(slurm_cluster: ClusterHandle) -> Iterator[dict[str, str]]:
    """The environment sbatch runs in (and the job inherits): the cluster's, the venv's commands first, no daemon."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "AMOEBA_"))}
    env["SLURM_CONF"] = str(slurm_cluster.conf)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    yield env


def assert_each_sample_once(ledger: Path, generations: list[dict[str, Any]], epochs: int, dataset: int) -> None:
    counts = applied_samples(ledger, generations)
    assert sorted(counts) == list(range(epochs))
    for epoch, counter in counts.items():
        assert set(counter) == set(range(dataset)) and set(counter.values()) == {1}, f"epoch {epoch}"


def readme_plain_sbatch_script() -> str:
    """The README's batch script: the bash block with ``#SBATCH --elastic=`` (a block inside a list item is indented
    there; the script is the block without that indentation)."""
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.DOTALL)
    blocks = [textwrap.dedent(block) for block in blocks]
    scripts = [b for b in blocks if "#SBATCH --elastic=" in b and "amoeba-run" in b]
    assert len(scripts) == 1, f"README.md should hold one batch script with #SBATCH --elastic=, found {len(scripts)}"
    return str(scripts[0])


def test_readme_script_with_plain_sbatch_trains_grows_shrinks_and_completes(
    tmp_path: Path, plain_env: dict[str, str]
) -> None:
    script = tmp_path / "train.sh"
    script.write_text(readme_plain_sbatch_script())
    assert f"--epochs {EPOCHS_IN_README}" in script.read_text()
    ledger = tmp_path / "ledger"
    client = CliSlurmClient(plain_env)
    training = ["--dataset-size", str(DATASET), "--sample-delay", str(SAMPLE_DELAY), "--ledger", str(ledger)]
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--output={tmp_path}/agent-%j.out", str(script), *training],
        capture_output=True,
        text=True,
        env=plain_env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    agent = AgentHandle(job_id, REPO / f"amoeba-{job_id}")
    try:
        (record,) = client.jobs(job_ids={int(job_id)})
        assert not record.is_het_component, "plain sbatch must make an ordinary job, not a heterogeneous one"
        wait_until("2 workers training", lambda: agent.workers() == 2, timeout=90)
        assert agent.resize(3) == 3
        wait_until("3 workers training", lambda: agent.workers() == 3, timeout=60)
        assert len(satellites_of(client, job_id)) == 1
        assert agent.resize(2) == 2
        wait_until("back to 2 workers", lambda: agent.workers() == 2, timeout=30)
        wait_until("the job to end", lambda: client.accounting_state(int(job_id)).is_final(), timeout=240)
        state = client.accounting_state(int(job_id))
        log = (tmp_path / f"agent-{job_id}.out").read_text()
        assert state is JobState.COMPLETED, f"job {job_id} ended {state.value}; the agent's log ends:\n{log[-3000:]}"
        result = json.loads((ledger / "result.json").read_text())
        assert result["samples"] == EPOCHS_IN_README * DATASET
        generations = agent.history()["generations"]
        sizes = [g["size"] for g in generations]
        assert sizes[0] == 2 and max(sizes) == 3 and sizes[-1] == 2, sizes
        assert_each_sample_once(ledger, generations, EPOCHS_IN_README, DATASET)
        assert not satellites_of(client, job_id)
    finally:
        with contextlib.suppress(SlurmCommandError):
            client.cancel(int(job_id))
        shutil.rmtree(REPO / f"amoeba-{job_id}", ignore_errors=True)
