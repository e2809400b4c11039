"""slurmctld restarted under a running elastic job and its daemon on the local Slurm cluster: both go on.

While slurmctld is away, the agent's and the daemon's Slurm polls fail (logged, retried); the workers train on, since
nothing on their path speaks to slurmctld. Afterwards the job is still running in Slurm, its training has gone on,
its agent still reports to the daemon, and a resize still works (a satellite is an ``sbatch`` to the new
slurmctld). It disturbs other tests on the shared cluster for a few seconds (``scripts/slurm-cluster restart-ctld``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_amoeba.launcher.handle import AgentHandle
from slurm_amoeba.slurm import CliSlurmClient, JobState
from tests.conftest import REPO, ClusterHandle
from tests.e2e.test_node_loss import cancel, cluster_command, wait_until
from tests.integration.daemon_helpers import DaemonProcess, job_ended

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(360)]


def test_slurmctld_restarted_under_an_elastic_job_and_its_daemon_both_go_on(
    tmp_path: Path, slurm_cluster: ClusterHandle
) -> None:
    env = {**slurm_cluster.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("AMOEBA_DAEMON_ENDPOINT", None)
    client = CliSlurmClient(env)
    daemon = DaemonProcess(slurm_cluster, tmp_path, host="10.77.0.1")
    daemon.start()
    script = tmp_path / "job.sh"
    script.write_text(f'#!/bin/bash\nexec amoeba-run {sys.executable} {REPO / "examples/elastic_mlp.py"} "$@"\n')
    script.chmod(0o755)
    job_id = ""
    try:
        submitted = subprocess.run(
            ["amoeba-sbatch", "--elastic", "1:2", "--gpus-per-worker", "1", f"--output={tmp_path}/job-%j.out",
             str(script), "--epochs", "100000", "--sample-delay", "0.006"],
            capture_output=True, text=True, env={**env, "AMOEBA_DAEMON_ENDPOINT": daemon.endpoint}, cwd=tmp_path,
            timeout=60, check=False,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip().splitlines()[-1]
        agent = AgentHandle(job_id, tmp_path / f"amoeba-{job_id}")

        def detail() -> str:
            out = (tmp_path / f"job-{job_id}.out").read_text(errors="replace").splitlines()[-20:]
            return "\n".join(out) + "\n--- daemon\n" + "\n".join(daemon.log_text().splitlines()[-20:])

        def step() -> int:
            series = agent.status().get("series") or [{}]
            return int(series[-1].get("step") or 0)

        def satellites() -> list[int]:
            return [j.job_id for j in client.jobs() if j.state.is_active() and j.comment == f"amoeba-parent={job_id}"]

        def reported() -> bool:
            jobs = [j for j in daemon.status_jobs() if j["job_id"] == job_id]
            return bool(jobs) and (jobs[0]["last_report_age_s"] or 99) < 5

        wait_until("the job training", lambda: agent.workers() >= 1 and step() > 0, 150, detail)
        wait_until("the agent to report to the daemon", reported, 30, detail)
        # Pinned, the policy leaves the job's size to the test (a grow it ordered before the pin is undone).
        pinned = daemon.ask("pin", {"job_id": job_id, "pinned": True})
        assert pinned is not None and pinned.body["ok"], pinned
        assert agent.resize(1) == 1
        wait_until("1 worker and no satellite", lambda: agent.workers() == 1 and not satellites(), 60, detail)
        before = step()

        cluster_command(env, "restart-ctld")
        wait_until("slurmctld back", lambda: client.accounting_state(int(job_id)) is JobState.RUNNING, 60, detail)
        record = client.job(int(job_id))
        assert record is not None and record.state is JobState.RUNNING, record
        wait_until("training to go on", lambda: step() > before + 5, 60, detail)
        assert daemon.proc is not None and daemon.proc.poll() is None, detail()
        wait_until("the agent to report to the daemon again", reported, 30, detail)
        status = daemon.status()
        assert status["orphans"] == [] and status["unclaimed"] == [], status
        # Slurm still takes the job's requests: a grow submits a satellite to the new slurmctld, and it joins.
        assert agent.resize(2) == 2
        wait_until("a satellite in Slurm", lambda: bool(satellites()), 30, detail)
        wait_until("2 workers training", lambda: agent.workers() == 2, 90, detail)
        assert "Traceback" not in daemon.log_text(), detail()
    finally:
        daemon.stop()
        if job_id:
            cancel(client, int(job_id))
            wait_until(
                "the job and its satellites to end",
                lambda: job_ended(client, job_id),
                60,
            )
