"""e-tiresias live: a resize the ``e-tiresias`` policy decides in amoebad reaches a real elastic job (the example MLP
under the real agent, ``amoeba-sbatch --elastic 1:3``, a node's GPUs per worker) and the job reaches the ordered
size. The simulator's e-tiresias is the same policy object (DESIGN.md, "One policy module")."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_amoeba.slurm import CliSlurmClient
from tests.conftest import ClusterHandle
from tests.e2e.test_daemon_restart import env  # noqa: F401 (the fixture: the cluster, idle)
from tests.integration.daemon_helpers import DaemonProcess, end_job, submit_mlp_job, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


def test_a_grow_decided_by_e_tiresias_is_applied_to_a_real_job(
    slurm_cluster: ClusterHandle,
    env: dict[str, str],  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    daemon = DaemonProcess(slurm_cluster, tmp_path, host="10.77.0.1", policy="e-tiresias")
    daemon.start()
    client = CliSlurmClient(env)
    job_id = ""
    try:
        assert daemon.status()["policy"] == "e-tiresias"
        job_id = submit_mlp_job(slurm_cluster, env, tmp_path, daemon.endpoint)
        ordered = f"job {job_id}: grow 1 -> "
        wait_until("e-tiresias to order a grow", lambda: ordered in daemon.log_text(), timeout=90)
        line = next(text for text in daemon.log_text().splitlines() if ordered in text)
        target = int(line.split(ordered, 1)[1].split()[0].rstrip(",:;"))
        assert 1 < target <= 3, line
        wait_until(
            f"the job to train with {target} workers",
            lambda: [(j["size"], j["target"]) for j in daemon.status_jobs()] == [(target, target)],
            timeout=120,
        )
    finally:
        daemon.stop()
        if job_id:
            end_job(client, job_id)
