"""kill -9 of amoebad while a real elastic job grows, then a restart: the real agent registers again, the job reaches
the ordered size, the resize is not ordered twice, and no satellite is orphaned or unaccounted for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurm_amoeba.slurm import CliSlurmClient
from tests.conftest import ClusterHandle
from tests.integration.daemon_helpers import DaemonProcess, end_job, idle_cluster_env, submit_mlp_job, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


@pytest.fixture
def env(slurm_cluster: ClusterHandle) -> dict[str, str]:
    """The cluster's environment with the venv's commands first, once the shared cluster is idle."""
    return idle_cluster_env(slurm_cluster)


def agent_history(state_dir: Path) -> list[dict[str, Any]]:
    path = state_dir / "agent-status.json"
    if not path.exists():
        return []
    try:
        history: list[dict[str, Any]] = json.loads(path.read_text())["history"]
    except (json.JSONDecodeError, KeyError):
        return []  # caught mid-write
    return history


def test_kill_9_while_a_real_job_grows_then_restart_orders_nothing_twice(
    slurm_cluster: ClusterHandle, env: dict[str, str], tmp_path: Path
) -> None:
    daemon = DaemonProcess(slurm_cluster, tmp_path, host="10.77.0.1")
    daemon.start()
    client = CliSlurmClient(env)
    job_id = ""
    try:
        job_id = submit_mlp_job(slurm_cluster, env, tmp_path, daemon.endpoint)
        state_dir = tmp_path / f"amoeba-{job_id}"
        wait_until("the daemon to order the grow", lambda: f"job {job_id}: grow 1 -> 3" in daemon.log_text(), 60)
        daemon.kill()  # kill -9 in the middle of the resize
        daemon.start()
        wait_until(
            "the agent to register again", lambda: daemon.log_text().count(f"job {job_id} (user root) registered") == 2
        )
        wait_until(
            "the job to reach 3 workers",
            lambda: [(j["size"], j["target"]) for j in daemon.status_jobs()] == [(3, 3)],
            timeout=90,
        )
        wait_until("the daemon to see no resize in flight", lambda: daemon.status()["in_flight"] == {})
        status = daemon.wait_rounds(1)  # a round that knew the resize had arrived: its chance to order it again
        assert status["last_round"]["ordered"] == {}, status["last_round"]
        assert status["orphans"] == [] and status["unclaimed"] == [] and status["in_flight"] == {}
        requested = [e for e in agent_history(state_dir) if e.get("event") == "resize_requested"]
        assert [e["target"] for e in requested] == [3], f"ordered more than once: {requested}"
        satellites = [j for j in client.jobs() if j.state.is_active() and j.comment == f"amoeba-parent={job_id}"]
        assert satellites and all(j.partition == slurm_cluster.elastic_partition for j in satellites)
        assert sorted(str(j.job_id) for j in satellites) == sorted(daemon.status_jobs()[0]["satellites"])
    finally:
        daemon.stop()
        if job_id:
            end_job(client, job_id)
