"""An unmodified torchrun DDP script (``examples/torchrun_ddp.py``) as an elastic Slurm job: ``amoeba-sbatch
--restart`` of a script with a plain ``amoeba-run`` line; it grows with a satellite and shrinks back, restarted each
time through its checkpoint hook, and ends COMPLETED with the parameters of the fixed-size run."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_amoeba.launcher.handle import AgentHandle
from slurm_amoeba.slurm import CliSlurmClient, JobState, SlurmCommandError
from tests.conftest import REPO, ClusterHandle
from tests.e2e.test_elastic_jobs import satellites_of, wait_until
from tests.unit.launcher.test_restart import BATCH, EPOCHS, SIZE, reference_parameters, saved_at

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


@pytest.fixture
def job_env(slurm_cluster: ClusterHandle) -> dict[str, str]:
    """The cluster's environment, the venv's commands first, no daemon; the test cancels only its own job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "AMOEBA_"))}
    env["SLURM_CONF"] = str(slurm_cluster.conf)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return env


def script_started(log: Path) -> int | None:
    """The pid of the script once it has started (its first line), else None."""
    text = log.read_text(errors="replace") if log.exists() else ""
    pids = re.findall(r"script pid (\d+)", text)
    return int(pids[-1]) if pids and "from step" in text else None


def test_an_unmodified_torchrun_script_grows_and_shrinks_through_slurm_satellites(
    tmp_path: Path,
    job_env: dict[str, str],
) -> None:
    client = CliSlurmClient(job_env)
    out, checkpoint = tmp_path / "out.json", tmp_path / "ck.pt"
    training = f"--checkpoint {checkpoint} --out {out} --epochs {EPOCHS} --save-every 5 --step-sleep 0.05"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\nexport AMOEBA_RESTART_GRACE_S=20\n"
        f"amoeba-run {sys.executable} {REPO / 'examples' / 'torchrun_ddp.py'} {training}\n"
    )
    submitted = subprocess.run(
        [
            "amoeba-sbatch",
            "--restart",  # the script's plain amoeba-run gets AMOEBA_RESTART=1
            "--elastic",
            "1:2",
            "--gpus-per-worker",
            "1",
            f"--output={tmp_path}/agent-%j.out",
            str(script),
        ],
        capture_output=True,
        text=True,
        env=job_env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    state_dir = REPO / f"amoeba-{job_id}"
    agent = AgentHandle(job_id, state_dir)
    try:
        wait_until("1 worker training", lambda: agent.workers() == 1, timeout=150)
        wait_until("the script to start", lambda: script_started(state_dir / "worker-g0-0.log") is not None)
        pid = script_started(state_dir / "worker-g0-0.log")
        assert pid is not None
        # Held while the satellite's worker starts (a loaded machine may take longer than the whole training).
        os.kill(pid, signal.SIGSTOP)
        try:
            assert agent.resize(2) == 2
            wait_until(
                "the satellite's worker to be ready",
                lambda: any("ready: the script" in p.read_text() for p in state_dir.glob("worker-g[1-9]*.log")),
                timeout=90,
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_until("2 workers training", lambda: agent.workers() == 2, timeout=60)
        assert len(satellites_of(client, job_id)) == 1
        wait_until(
            "the script to restart",
            lambda: len(re.findall("from step", (state_dir / "worker-g0-0.log").read_text())) == 2,
        )
        before = saved_at(checkpoint)
        wait_until("steps at 2 workers (a periodic save)", lambda: saved_at(checkpoint) != before)
        assert agent.resize(1) == 1
        wait_until("back to 1 worker", lambda: agent.workers() == 1, timeout=60)
        wait_until("the job to end", lambda: client.accounting_state(int(job_id)).is_final(), timeout=120)
        state = client.accounting_state(int(job_id))
        log = (tmp_path / f"agent-{job_id}.out").read_text()
        assert state is JobState.COMPLETED, f"job {job_id} ended {state.value}; the agent's log ends:\n{log[-3000:]}"
        data = json.loads(out.read_text())
        assert [h[1] for h in data["history"]] == [1, 2, 1], data["history"]
        assert data["step"] == EPOCHS * SIZE // BATCH
        assert max(abs(a - b) for a, b in zip(data["params"], reference_parameters(), strict=True)) < 1e-9
        wait_until("no satellite left", lambda: not satellites_of(client, job_id), timeout=30)
    finally:
        with contextlib.suppress(SlurmCommandError):
            client.cancel(int(job_id))
        shutil.rmtree(state_dir, ignore_errors=True)
