"""Two real Unix users against a real ``amoebad`` on the local cluster (issue 11, the daemon's side).

User A submits a job (as A, with ``runuser``) and registers and reports for it with A's own munge credential; user
B, another Unix user with credentials of their own, tries every request against A's job: resize, pin, unpin, drain,
resume, jobs and status. Every change is refused with the reason and logged with B's uid; B's reads show nothing of
A's job but a count; A still sees the job in full. The cluster's nodes share the host's ``/etc/passwd`` (each node
is a network, UTS and mount namespace of the same root file system), so users created here exist on every node;
the fixture creates them once and leaves them for later runs (they own nothing, and may log in nowhere).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.system_users import SystemUserError, system_user
from slurm_amoeba.core.messages import Message
from slurm_amoeba.slurm import CliSlurmClient, JobState
from slurm_amoeba.transport.channel import ChannelServer
from tests.conftest import ClusterHandle
from tests.integration.daemon_helpers import DaemonProcess, foreign_request, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]

USER_A = "amoeba-test-a"
USER_B = "amoeba-test-b"


def ensure_user(name: str) -> int:
    """The uid of ``name``, created as a system user if it does not exist; skips the test when it cannot be."""
    try:
        return system_user(name)
    except SystemUserError as exc:
        pytest.skip(str(exc))


@pytest.fixture
def users() -> tuple[int, int]:
    """The uids of users A and B (see the module docstring)."""
    return ensure_user(USER_A), ensure_user(USER_B)


@pytest.fixture
def daemon(slurm_cluster: ClusterHandle, tmp_path: Path) -> Iterator[DaemonProcess]:
    proc = DaemonProcess(slurm_cluster, tmp_path, interval_s=1.0)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def a_job(slurm_cluster: ClusterHandle, users: tuple[int, int]) -> Iterator[int]:
    """A running job of user A holding one GPU, submitted as A; cancelled afterwards."""
    client: CliSlurmClient = slurm_cluster.client()
    sbatch = [
        "sbatch",
        "--parsable",
        "--job-name=a-elastic",
        f"--partition={slurm_cluster.regular_partition}",
        "--nodes=1",
        "--ntasks=1",
        "--gpus-per-node=1",
        "--chdir=/tmp",
        "--output=/dev/null",
        "--wrap=exec sleep 600",
    ]
    submitted = subprocess.run(
        ["runuser", "-u", USER_A, "--", *sbatch],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=slurm_cluster.env,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = int(submitted.stdout.strip().split(";")[0])
    try:
        wait_until(
            "A's job to run",
            lambda: (j := client.job(job_id)) is not None and j.state is JobState.RUNNING,
            timeout=90,
        )
        record = client.job(job_id)
        assert record is not None and record.uid == users[0]
        yield job_id
    finally:
        client.cancel(job_id)


def test_user_b_can_neither_change_nor_read_user_as_job(
    daemon: DaemonProcess, a_job: int, users: tuple[int, int], slurm_cluster: ClusterHandle
) -> None:
    uid_a, uid_b = users
    job_id = str(a_job)
    agent = ChannelServer("tcp://127.0.0.1:*")  # A's directive endpoint (a fixed range: nothing is ordered)
    try:
        register = {
            "job_id": job_id,
            "endpoint": agent.endpoint,
            "min_workers": 1,
            "max_workers": 1,
            "gpus_per_worker": 1,
            "partition": slurm_cluster.regular_partition,
            "elastic_partition": slurm_cluster.elastic_partition,
        }

        def registered() -> bool:  # the daemon may not have seen the job yet: it says so, and A retries
            return bool(foreign_request(daemon.endpoint, Message("register", register), user=USER_A).body["ok"])

        wait_until("A's registration to be taken", registered, timeout=30, every=1.0)
        report = {
            "job_id": job_id,
            "size": 1,
            "generation": 1,
            "target": 1,
            "throughput": {"1": 123.0},
            "history": [{"t": 1.0, "event": "secret-of-a"}],
            "satellites": [],
        }
        assert foreign_request(daemon.endpoint, Message("report", report), user=USER_A).body["ok"]

        attempts = {
            "resize": ({"job_id": job_id, "target": 1, "reason": "mine now"}, f"uid {uid_b} may not resize job"),
            "pin": ({"job_id": job_id, "pinned": True}, f"uid {uid_b} may not pin or unpin job"),
            "unpin": ({"job_id": job_id, "pinned": False}, f"uid {uid_b} may not pin or unpin job"),
            "drain": ({}, f"uid {uid_b} is not an operator"),
            "resume": ({}, f"uid {uid_b} is not an operator"),
        }
        for what, (body, says) in attempts.items():
            kind = "pin" if what == "unpin" else what
            reply = foreign_request(daemon.endpoint, Message(kind, body), user=USER_B)
            assert not reply.body["ok"] and says in reply.body["error"], (what, reply.body)

        jobs = foreign_request(daemon.endpoint, Message("jobs", {}), user=USER_B).body
        assert jobs["ok"] and jobs["data"]["jobs"] == [] and jobs["data"]["others"] == 1, jobs
        status = foreign_request(daemon.endpoint, Message("status", {}), user=USER_B).body
        assert status["ok"] and status["data"]["limited_to_own_jobs"] is True
        for read in (jobs, status):
            text = json.dumps(read)
            assert f'"{job_id}"' not in text and "secret-of-a" not in text and agent.endpoint not in text

        own = foreign_request(daemon.endpoint, Message("jobs", {}), user=USER_A).body["data"]["jobs"]
        assert [(j["job_id"], j["uid"], j["history"]) for j in own] == [
            (job_id, uid_a, [{"t": 1.0, "event": "secret-of-a"}])
        ]
        state = daemon.status()  # the daemon's own uid: an operator
        assert state["draining"] is False and state["pinned"] == []
        log = daemon.log_text()
        for kind in ("resize", "pin", "drain", "resume"):
            assert f"refused {kind} from uid {uid_b}" in log, kind
        assert agent.receive(0.5) is None  # no directive reached A's agent
    finally:
        agent.close()
