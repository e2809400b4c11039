"""GPU sharing end to end (docs/admin.md section 8e): two real elastic jobs that opted in, on the sharing partition.

The host (``amoeba-sbatch --share``) and the sharer (``--share=opportunistic``) each run their minimum worker on a
GPU of the sharing partition as 2 of its 3 shards. An operator's share (``amoebactl share``, applied by the
daemon's executor with the same rules as a policy's) places one more worker of the sharer beside the host: the
sharer's agent submits a satellite of one shard on the host's node, and Slurm gives it the host's GPU (the lowest
with a shard free). Then ``amoebactl resize`` of the host makes the daemon take the place back: the sharer goes back
to its own worker, its satellite beside the host is released and the directive cleared.

Needs the cluster started with the sharing partition (scripts/slurm-cluster's default, ``share`` on n5).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurm_amoeba.slurm import CliSlurmClient, JobRecord, JobState
from tests.conftest import REPO, ClusterHandle, require_slurm
from tests.integration.daemon_helpers import DaemonProcess, end_job, idle_cluster_env, submit_mlp_job, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

SHARE_PARTITION = "share"


@pytest.fixture
def env(slurm_cluster: ClusterHandle) -> dict[str, str]:
    """The idle cluster's environment, running this tree's code, once the cluster offers the sharing partition."""
    client = CliSlurmClient({**os.environ, "SLURM_CONF": str(slurm_cluster.conf)})
    if not client.nodes(partition=SHARE_PARTITION):
        message = (
            f"the cluster has no {SHARE_PARTITION!r} partition: restart it with this tree's scripts/slurm-cluster "
            "(down, then up) so that it offers gres/shard"
        )
        if require_slurm():
            pytest.fail(message)
        pytest.skip(message)
    environ = idle_cluster_env(slurm_cluster)
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))  # this tree's code
    return environ


def controller_address(cluster: ClusterHandle) -> str:
    """The address slurmctld listens on (the bridge's, where the nodes reach the daemon too)."""
    match = re.search(r"^SlurmctldHost=[^(\s]+\(([0-9.]+)\)", cluster.conf.read_text(), re.MULTILINE)
    assert match is not None, f"no SlurmctldHost=NAME(ADDRESS) in {cluster.conf}"
    return match.group(1)


def submit(cluster: ClusterHandle, env: dict[str, str], workdir: Path, endpoint: str, mode: str, name: str) -> str:
    """An elastic MLP job of 1..2 workers of one GPU that opted in to sharing with ``mode``; returns its id."""
    options = (f"--share={mode}", f"--share-partition={SHARE_PARTITION}", f"--job-name={name}")
    return submit_mlp_job(cluster, env, workdir, endpoint, elastic="1:2", gpus_per_worker=1, name=name, options=options)


def workers_record(client: CliSlurmClient, job_id: str) -> JobRecord | None:
    """The running workers' record of an elastic job: the job itself (offset 1 of one submitted as a heterogeneous
    job by an earlier version); None until Slurm runs it on a node (a pending job is active too, with no node)."""
    records = client.het_components(int(job_id))
    return records[-1] if records and records[-1].state is JobState.RUNNING and records[-1].nodes else None


def satellites(client: CliSlurmClient, job_id: str) -> list[JobRecord]:
    return [j for j in client.jobs() if j.state.is_active() and j.comment == f"amoeba-parent={job_id}"]


def share_events(daemon: DaemonProcess, job_id: str, kind: str) -> list[dict[str, Any]]:
    """The ``kind`` events in the history the job's agent reported (``share_directive``, ``share_cleared``)."""
    (job,) = [j for j in daemon.status_jobs() if j["job_id"] == job_id]
    return [e for e in job["history"] if e.get("event") == kind]


@dataclasses.dataclass
class Pair:
    """Two opted-in jobs on the sharing partition under a daemon with sharing on (:func:`opted_in_pair`).

    Attributes:
        daemon: the daemon.
        client: Slurm's commands.
        host: the ``guaranteed`` job; "" once the test ended it.
        sharer: the ``opportunistic`` job.
    """

    daemon: DaemonProcess
    client: CliSlurmClient
    host: str = ""
    sharer: str = ""


@contextlib.contextmanager
def opted_in_pair(cluster: ClusterHandle, env: dict[str, str], workdir: Path, policy: str) -> Iterator[Pair]:
    """``amoebad`` with ``policy`` and sharing on (up to 4 sharers per node in the sharing partition), the host
    submitted and running its worker, then the sharer submitted; both jobs ended and the daemon stopped after."""
    daemon = DaemonProcess(cluster, workdir, host=controller_address(cluster), policy=policy)
    doc = yaml.safe_load(daemon.config.read_text())
    # the prior of a site whose jobs leave most of their GPU idle: a worker beside a host keeps 97 % of its speed, so
    # the sharer (one worker of its own) trains faster with one beside the host and antman needs no pacing to pair
    doc["sharing"] = {"enabled": True, "partitions": {SHARE_PARTITION: 4}, "default_kept": 0.97}
    daemon.config.write_text(yaml.safe_dump(doc))
    daemon.start()
    pair = Pair(daemon, CliSlurmClient(env))
    try:
        pair.host = submit(cluster, env, workdir, daemon.endpoint, "guaranteed", "host")
        wait_until("the host's worker to run", lambda: workers_record(pair.client, pair.host) is not None, 90)
        pair.sharer = submit(cluster, env, workdir, daemon.endpoint, "opportunistic", "sharer")
        yield pair
    finally:
        daemon.stop()
        for job_id in (pair.sharer, pair.host):
            if job_id:
                end_job(pair.client, job_id)


def test_an_operators_share_puts_the_sharer_on_the_hosts_gpu_with_a_shard_and_the_hosts_resize_takes_it_back(
    slurm_cluster: ClusterHandle, env: dict[str, str], tmp_path: Path
) -> None:
    with opted_in_pair(slurm_cluster, env, tmp_path, "slurm") as pair:
        daemon, client, host, sharer = pair.daemon, pair.client, pair.host, pair.sharer
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
        told = wait_until(
            "the sharer's agent to hand its worker beside the host the opportunistic share directive",
            lambda: share_events(daemon, sharer, "share_directive"),
            60,
        )
        assert told[-1]["role"] == "opportunistic" and len(told[-1]["workers"]) == 1
        assert (told[-1]["host"], told[-1]["partner_uid"]) == (host, os.getuid()), "the host's owner, as registered"
        assert told[-1]["partner_status_path"] == f"/dev/shm/amoeba-share-{host}.json"

        back = daemon.ask("resize", {"job_id": host, "target": 2, "reason": "the owner needs its GPUs"}, 60)
        assert back is not None and back.body["ok"], back
        wait_until("the sharer's satellite beside the host to be released", lambda: not satellites(client, sharer), 120)
        wait_until(
            "the sharer to be back at its own worker",
            lambda: {j["job_id"]: (j["size"], j["target"]) for j in daemon.status_jobs()}.get(sharer) == (1, 1),
            90,
        )
        assert f"host job {host} needs its GPUs back" in daemon.log_text()
        cleared = wait_until(
            "the sharer's directive to be cleared", lambda: share_events(daemon, sharer, "share_cleared"), 60
        )
        assert cleared[-1]["workers"] == told[-1]["workers"] and cleared[-1]["partner_status_path"] == ""
        assert workers_record(client, host) is not None, "the host never failed"
