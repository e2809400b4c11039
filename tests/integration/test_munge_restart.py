"""munged restarts while an elastic job trains (issue 11): the job survives it.

The cluster's munged (the one ``scripts/slurm-cluster`` started, its pid file under the cluster's state directory) is
stopped with SIGTERM, left down for a few of the agent's report intervals, and started again exactly as it ran (its
own command line, as its own user). Meanwhile the agent cannot sign its reports: it says so once, keeps its job,
and retries with every report; once munged is back its reports reach the daemon again, and the job finishes with
every sample applied exactly once. Slurm itself needs munge too: its commands fail for those seconds, and the agent
and the daemon go on. Other engineers' jobs share this munged: the outage is kept to a few seconds, and munged is
started again whatever happens in the test.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurm_amoeba.launcher.handle import AgentHandle
from slurm_amoeba.slurm import CliSlurmClient, JobState
from tests.conftest import ClusterHandle
from tests.integration.daemon_helpers import DaemonProcess, wait_until
from tests.integration.test_two_users_job import (
    assert_finished_exactly_once,
    daemon,
    job_env,
    submit_a,
    wait_for_gpus,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(400)]

__all__ = ["daemon", "job_env"]  # fixtures shared with the two-user test

EPOCHS = 2
DATASET = 640  # ~13 s of training at one worker (0.01 s a sample)
DOWN_S = 3.0  # three of the agent's report intervals (the daemon tells it 1 s)


def munge_answers() -> bool:
    return subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=False).returncode == 0


def _process_of(pid_file: Path) -> tuple[int, list[str], str]:
    """munged's pid, command line and user, from its pid file and /proc."""
    pid = int(pid_file.read_text().strip())
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    status = Path(f"/proc/{pid}/status").read_text()
    uid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:")))
    return pid, [a.decode() for a in argv], pwd.getpwuid(uid).pw_name


@pytest.fixture
def munged_restart(slurm_cluster: ClusterHandle) -> Iterator[Callable[[], float]]:
    """A callable that restarts the cluster's munged (down for :data:`DOWN_S`); munged is running again afterwards
    whatever happened."""
    pid_file = slurm_cluster.root / "munge" / "munged.pid"
    assert pid_file.exists(), f"no {pid_file}: this test restarts the munged scripts/slurm-cluster started"
    pid, argv, user = _process_of(pid_file)
    assert Path(argv[0]).name == "munged", argv

    def start() -> None:
        subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, timeout=30, check=True)
        wait_until("munged to answer again", munge_answers, timeout=15)

    def restart() -> float:
        os.kill(pid, signal.SIGTERM)
        wait_until("munged to stop", lambda: not Path(f"/proc/{pid}").exists(), timeout=10)
        time.sleep(DOWN_S)
        began = time.monotonic()
        start()
        return time.monotonic() - began

    try:
        yield restart
    finally:
        if not munge_answers():
            start()


def test_an_elastic_job_survives_a_munged_restart(
    slurm_cluster: ClusterHandle,
    job_env: dict[str, str],
    daemon: DaemonProcess,
    munged_restart: Callable[[], float],
    tmp_path: Path,
) -> None:
    client = CliSlurmClient(job_env)
    job_id = submit_a(job_env, daemon, tmp_path, epochs=EPOCHS, dataset=DATASET)
    agent_log = tmp_path / f"agent-{job_id}.out"
    handle = AgentHandle(job_id, tmp_path / f"amoeba-{job_id}")
    try:
        wait_for_gpus(client, job_id)
        wait_until("the job to train", lambda: handle.workers() >= 1, timeout=60)
        wait_until("its agent to register", lambda: f"job {job_id} (user root) registered" in daemon.log_text())
        pinned = daemon.ask("pin", {"job_id": job_id, "pinned": True})  # one worker: a known length
        assert pinned is not None and pinned.body["ok"], pinned

        munged_restart()
        assert client.accounting_state(int(job_id)) is JobState.RUNNING, "the job ended before munged came back"

        def reports_again() -> bool:
            jobs = daemon.status_jobs()
            return bool(jobs) and (jobs[0]["last_report_age_s"] or 99) < 1.5

        wait_until("the agent's reports to reach the daemon again", reports_again, timeout=15)
        log = agent_log.read_text()
        assert log.count("munged does not sign the agent's messages") == 1, log[-3000:]
        assert "munged signs again" in log, log[-3000:]

        wait_until("the job to end", lambda: client.accounting_state(int(job_id)).is_final(), timeout=60)
        assert client.accounting_state(int(job_id)) is JobState.COMPLETED, agent_log.read_text()[-3000:]
        assert_finished_exactly_once(tmp_path / "ledger", handle, EPOCHS, DATASET)
    finally:
        if not client.accounting_state(int(job_id)).is_final():
            client.cancel(int(job_id))
