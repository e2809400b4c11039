"""GPU sharing end to end (docs/admin.md section 8e): two real elastic jobs that opted in, on the sharing partition.

The host (``amoeba-sbatch --share``) and the sharer (``--share=opportunistic``) each run their minimum worker on a
GPU of the sharing partition as 2 of its 3 shards. An operator's share (``amoebactl share``, applied by the
daemon's executor with the same rules as a policy's) places one more worker of the sharer beside the host: the
sharer's agent submits a satellite of one shard on the host's node, and Slurm gives it the host's GPU (the lowest
with a shard free). Then ``amoebactl resize`` of the host makes the daemon take the place back: the sharer goes back
to its own worker and its satellite beside the host is released.

Needs the cluster started with the sharing partition (scripts/slurm-cluster's default, ``share`` on n5).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from slurm_amoeba.slurm import CliSlurmClient, JobRecord
from tests.conftest import REPO, ClusterHandle
from tests.integration.daemon_helpers import DaemonProcess, end_job, script, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

SHARE_PARTITION = "share"


@pytest.fixture
def env(slurm_cluster: ClusterHandle) -> dict[str, str]:
    """The cluster's environment with the venv's commands first, once the shared cluster is idle and offers the
    sharing partition."""
    environ = dict(os.environ)
    environ["SLURM_CONF"] = str(slurm_cluster.conf)
    environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environ['PATH']}"
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))  # this tree's code
    environ.pop("AMOEBA_DAEMON_ENDPOINT", None)
    client = CliSlurmClient(environ)
    if not client.nodes(partition=SHARE_PARTITION):
        message = (
            f"the cluster has no {SHARE_PARTITION!r} partition: restart it with this tree's scripts/slurm-cluster "
            "(down, then up) so that it offers gres/shard"
        )
        if os.environ.get("AMOEBA_REQUIRE_SLURM"):
            pytest.fail(message)
        pytest.skip(message)
    deadline = time.monotonic() + 120
    while any(j.state.is_active() for j in client.jobs()) and time.monotonic() < deadline:
        time.sleep(1)
    if any(j.state.is_active() for j in client.jobs()):
        pytest.skip("the shared cluster stayed busy with others' jobs; this test needs it idle")
    return environ


def controller_address(cluster: ClusterHandle) -> str:
    """The address slurmctld listens on (the bridge's, where the nodes reach the daemon too)."""
    match = re.search(r"^SlurmctldHost=[^(\s]+\(([0-9.]+)\)", cluster.conf.read_text(), re.MULTILINE)
    assert match is not None, f"no SlurmctldHost=NAME(ADDRESS) in {cluster.conf}"
    return match.group(1)


def submit(env: dict[str, str], workdir: Path, endpoint: str, mode: str, name: str) -> str:
    """An elastic MLP job of 1..2 workers that opted in to sharing with ``mode``; returns its id."""
    job_script = script(
        workdir / f"{name}.sh",
        f'exec amoeba-run {sys.executable} {REPO / "examples/elastic_mlp.py"} "$@"\n',
    )
    submitted = subprocess.run(
        [
            "amoeba-sbatch",
            "--elastic",
            "1:2",
            "--gpus-per-worker",
            "1",
            f"--share={mode}",
            f"--share-partition={SHARE_PARTITION}",
            f"--job-name={name}",
            f"--output={workdir}/{name}-%j.out",
            str(job_script),
            "--epochs",
            "100000",
            "--sample-delay",
            "0.006",
        ],
        capture_output=True,
        text=True,
        env={**env, "AMOEBA_DAEMON_ENDPOINT": endpoint},
        cwd=workdir,
        timeout=60,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().splitlines()[-1]


def workers_record(client: CliSlurmClient, job_id: str) -> JobRecord | None:
    """The running workers' component (offset 1) of an elastic job."""
    records = [r for r in client.het_components(int(job_id)) if r.het_job_offset == 1]
    return records[0] if records and records[0].state.is_active() else None


def satellites(client: CliSlurmClient, job_id: str) -> list[JobRecord]:
    return [j for j in client.jobs() if j.state.is_active() and j.comment == f"amoeba-parent={job_id}"]


def test_an_operators_share_puts_the_sharer_on_the_hosts_gpu_with_a_shard_and_the_hosts_resize_takes_it_back(
    slurm_cluster: ClusterHandle, env: dict[str, str], tmp_path: Path
) -> None:
    daemon = DaemonProcess(slurm_cluster, tmp_path, host=controller_address(slurm_cluster), policy="slurm")
    doc = yaml.safe_load(daemon.config.read_text())
    doc["sharing"] = {"enabled": True, "partitions": {SHARE_PARTITION: 4}}
    daemon.config.write_text(yaml.safe_dump(doc))
    daemon.start()
    client = CliSlurmClient(env)
    host = sharer = ""
    try:
        host = submit(env, tmp_path, daemon.endpoint, "guaranteed", "host")
        wait_until("the host's worker to run", lambda: workers_record(client, host) is not None, 90)
        sharer = submit(env, tmp_path, daemon.endpoint, "opportunistic", "sharer")
        wait_until("the sharer's worker to run", lambda: workers_record(client, sharer) is not None, 90)
        wait_until(
            "both jobs to report their first generation of 1 worker",
            lambda: (
                {j["job_id"]: (j["size"], j["target"]) for j in daemon.status_jobs()} == {host: (1, 1), sharer: (1, 1)}
            ),
            90,
        )
        time.sleep(daemon.interval_s * 1.5)  # a round has seen them steady
        host_workers = workers_record(client, host)
        assert host_workers is not None and host_workers.partition == SHARE_PARTITION
        (node,) = host_workers.nodes
        (host_gpus,) = host_workers.gpu_indices  # the GPU its shards are on
        own = workers_record(client, sharer)
        assert own is not None and own.gpu_indices != host_workers.gpu_indices, "Slurm paired two hosts by itself"

        reply = daemon.ask("share", {"job_id": sharer, "host": host, "nodes": {node: 1}})
        assert reply is not None and reply.body["ok"], reply
        wait_until(
            "the sharer to reach 2 workers beside the host",
            lambda: {j["job_id"]: (j["size"], j["target"]) for j in daemon.status_jobs()}.get(sharer) == (2, 2),
            120,
        )
        (beside,) = satellites(client, sharer)
        assert beside.partition == SHARE_PARTITION and beside.nodes == (node,)
        assert beside.gpu_indices == (host_gpus,), "the sharer's worker runs on the host's GPU"
        assert f"job {sharer}: share 1 -> 2 workers, beside job {host}" in daemon.log_text()

        back = daemon.ask("resize", {"job_id": host, "target": 2, "reason": "the owner needs its GPUs"}, 60)
        assert back is not None and back.body["ok"], back
        wait_until("the sharer's satellite beside the host to be released", lambda: not satellites(client, sharer), 120)
        wait_until(
            "the sharer to be back at its own worker",
            lambda: {j["job_id"]: (j["size"], j["target"]) for j in daemon.status_jobs()}.get(sharer) == (1, 1),
            90,
        )
        assert f"host job {host} needs its GPUs back" in daemon.log_text()
        assert workers_record(client, host) is not None, "the host never failed"
    finally:
        daemon.stop()
        for job_id in (sharer, host):
            if job_id:
                end_job(client, job_id)
