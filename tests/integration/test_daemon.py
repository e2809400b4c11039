"""``amoebad`` against the real local Slurm cluster, with an agent that speaks the protocol and real satellite jobs.

- kill -9 of the daemon in the middle of a resize, then a restart: the job is not lost, the resize is not ordered a
  second time, and after one interval no satellite is orphaned or unaccounted for;
- another user's resize, signed with that user's own munge credential, is refused with the reason;
- a pending regular job runs within GraceTime (the daemon shrinks the elastic job, or Slurm preempts its
  satellites first), and the job settles at the GPUs left;
- with the ``goodput`` policy, an adaptive job's reported statistics reach the daemon and its grow carries the
  policy's global batch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_amoeba.core.messages import Message
from slurm_amoeba.daemon.state import load_state
from slurm_amoeba.policy.goodput import model_from_report
from slurm_amoeba.slurm import CliSlurmClient, JobState, SubmitOptions
from tests.conftest import ClusterHandle
from tests.integration.daemon_helpers import DaemonProcess, FakeAgent, foreign_request, script, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]

#: The test cluster's ``KillWait`` (configs/slurm/slurm.conf.in): seconds from a preempted job's SIGTERM at the end
#: of its GraceTime to its SIGKILL.
KILL_WAIT_S = 5


@pytest.fixture
def submitted() -> list[int]:
    """Ids of the jobs the test submits itself (its satellites are found through their parents)."""
    return []


@pytest.fixture
def client(slurm_cluster: ClusterHandle, submitted: list[int]) -> Iterator[CliSlurmClient]:
    """A client on an idle cluster; the test's own jobs (parents, satellites, regular jobs) are cancelled afterwards.

    The cluster is shared with other tests and developers: only jobs this test submitted are touched, found by the
    ``submitted`` list or by being a satellite of such a job.
    """
    cli = slurm_cluster.client()
    before = {j.job_id for j in cli.jobs() if j.state.is_active()}
    if before:
        deadline = time.monotonic() + 120
        while any(j.state.is_active() for j in cli.jobs()) and time.monotonic() < deadline:
            time.sleep(1)
        if any(j.state.is_active() for j in cli.jobs()):
            pytest.skip(f"the shared cluster stayed busy with others' jobs {sorted(before)}; these tests need it idle")
    yield cli
    mine = set(submitted)
    parents = {str(job_id) for job_id in mine}
    for job in cli.jobs():
        parent = job.comment.removeprefix("amoeba-parent=") if job.comment.startswith("amoeba-parent=") else ""
        if job.state.is_active() and (job.job_id in mine or parent in parents):
            cli.cancel(job.job_id)
    wait_until(
        "the test's jobs to leave the nodes",
        lambda: (
            not any(
                j.state.is_active() and (j.job_id in mine or j.comment.removeprefix("amoeba-parent=") in parents)
                for j in cli.jobs()
            )
        ),
        60,
    )


@pytest.fixture
def daemon(slurm_cluster: ClusterHandle, tmp_path: Path) -> Iterator[DaemonProcess]:
    proc = DaemonProcess(slurm_cluster, tmp_path)
    proc.start()
    yield proc
    proc.stop()


def parent_job(client: CliSlurmClient, tmp_path: Path, submitted: list[int], gpus: int = 1) -> int:
    """A stand-in for an elastic job's own allocation (its minimum workers), running until cancelled."""
    body = script(tmp_path / "parent.sh", "exec sleep 600\n")
    job_id = client.submit(
        body, SubmitOptions(name="fake-elastic", nodes=1, ntasks=1, gpus_per_node=gpus, output=str(tmp_path / "p.out"))
    )
    submitted.append(job_id)
    wait_until("the parent job to run", lambda: (j := client.job(job_id)) is not None and j.state is JobState.RUNNING)
    return job_id


def amoebactl(endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurm_amoeba.cli.amoebactl", "--endpoint", endpoint, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_kill_9_mid_resize_then_restart_loses_no_job_and_orders_nothing_twice(
    slurm_cluster: ClusterHandle,
    client: CliSlurmClient,
    daemon: DaemonProcess,
    tmp_path: Path,
    submitted: list[int],
) -> None:
    job_id = parent_job(client, tmp_path, submitted)
    agent = FakeAgent(slurm_cluster, job_id, daemon.endpoint, tmp_path, max_workers=4, resize_delay_s=6.0)
    agent.start()
    try:
        assert agent.daemon_uid == 0  # the daemon runs as root in the tests
        wait_until("the daemon to order the job to grow", lambda: len(agent.directives) == 1, timeout=20)
        assert agent.directives[0][1].body["target"] == 4
        wait_until(
            "the daemon to save the acknowledged resize",
            lambda: str(job_id) in load_state(daemon.state).in_flight,
            timeout=20,
            every=0.05,
        )
        daemon.kill()
        assert load_state(daemon.state).in_flight[str(job_id)].target == 4
        assert agent.size == 1 and agent.target == 4  # the resize is in flight: the agent has not acted yet
        daemon.start()
        wait_until("the agent to register again", lambda: agent.registrations == 2, timeout=20)
        wait_until("the job to reach 4 workers", lambda: agent.size == 4, timeout=60)
        wait_until(
            "the daemon to see the job at 4 workers with no resize in flight",
            lambda: (s := daemon.status())["in_flight"] == {} and s["workers"] == 4,
        )
        status = daemon.wait_rounds(1)  # a round that knew the resize had arrived: its chance to order it again
        assert status["last_round"]["ordered"] == {}, status["last_round"]
        assert status["orphans"] == [] and status["unclaimed"] == []
        assert status["in_flight"] == {}
        assert status["jobs"]["elastic"] == 1 and status["workers"] == 4
        assert len(agent.directives) == 1, f"the resize was ordered again: {agent.directives}"
        assert (j := client.job(job_id)) is not None and j.state is JobState.RUNNING  # no job lost
        active = [j for j in client.jobs() if j.state.is_active() and j.name.startswith("amoeba-sat-")]
        assert sorted(j.job_id for j in active) == sorted(agent.satellites) and len(active) == 3
        assert all(j.comment == f"amoeba-parent={job_id}" for j in active)
        jobs = amoebactl(daemon.endpoint, "--json", "jobs")
        assert jobs.returncode == 0, jobs.stderr
        listed = json.loads(jobs.stdout)["jobs"]
        assert [(j["job_id"], j["size"], j["target"]) for j in listed] == [(str(job_id), 4, 4)]
        log = daemon.log_text()
        assert f"job {job_id} reached 4 workers" in log
        assert "[daemon/recovery]" in log
    finally:
        agent.stop()


def test_another_users_resize_is_refused_with_the_reason(
    slurm_cluster: ClusterHandle,
    client: CliSlurmClient,
    daemon: DaemonProcess,
    tmp_path: Path,
    submitted: list[int],
) -> None:
    job_id = parent_job(client, tmp_path, submitted)
    agent = FakeAgent(slurm_cluster, job_id, daemon.endpoint, tmp_path, max_workers=2)
    agent.start()
    try:
        wait_until("the agent to grow to 2", lambda: agent.size == 2, timeout=40)
        before = len(agent.directives)
        resize = Message("resize", {"job_id": str(job_id), "target": 1, "reason": "mine now"})
        reply = foreign_request(daemon.endpoint, resize, user="nobody")
        assert reply.kind == "reply" and reply.id == resize.id
        assert not reply.body["ok"]
        assert "uid 65534 may not resize job" in reply.body["error"]
        assert "only its owner (root) or an operator" in reply.body["error"]
        pin = Message("pin", {"job_id": str(job_id), "pinned": True})
        assert "may not pin" in foreign_request(daemon.endpoint, pin).body["error"]
        drain = Message("drain", {})
        assert "not an operator" in foreign_request(daemon.endpoint, drain).body["error"]
        status = foreign_request(daemon.endpoint, Message("status", {}))
        assert status.body["ok"]  # reading is open to anyone munge vouches for
        assert len(agent.directives) == before
        assert "refused resize from uid 65534" in daemon.log_text()
        wait_until("the daemon to see the grow arrive", lambda: daemon.status()["in_flight"] == {}, timeout=20)
        owner = amoebactl(daemon.endpoint, "resize", str(job_id), "1")
        assert owner.returncode == 0, owner.stderr
        wait_until("the owner's resize to arrive", lambda: agent.size == 1, timeout=30)
    finally:
        agent.stop()


def test_a_regular_job_that_needs_the_elastic_jobs_gpus_runs_within_grace_time_and_the_job_shrinks(
    slurm_cluster: ClusterHandle,
    client: CliSlurmClient,
    daemon: DaemonProcess,
    tmp_path: Path,
    submitted: list[int],
) -> None:
    job_id = parent_job(client, tmp_path, submitted, gpus=2)
    total = len(slurm_cluster.nodes) * slurm_cluster.gpus_per_node
    agent = FakeAgent(slurm_cluster, job_id, daemon.endpoint, tmp_path, max_workers=total // 2, gpus_per_worker=2)
    agent.start()
    try:
        # Every idle GPU (all of them on a quiet cluster; the cluster is shared, so someone may hold a few).
        wait_until(
            "the elastic job to take every idle GPU",
            lambda: (
                agent.size > 1
                and agent.size == agent.target
                and sum(c.free for c in client.gpus_per_node(partition=slurm_cluster.elastic_partition)) == 0
                and daemon.status()["in_flight"] == {}
            ),
            timeout=60,
        )
        grown = agent.size
        regular = script(tmp_path / "regular.sh", "exec sleep 600\n")
        asked_at = time.monotonic()
        regular_id = client.submit(
            regular, SubmitOptions(name="regular", nodes=1, ntasks=1, gpus_per_node=4, output=str(tmp_path / "r.out"))
        )
        submitted.append(regular_id)
        # Slurm's preemption and the daemon's shrink race for the same GPUs. The daemon's shrink frees them within
        # a round or two; Slurm's backfill may decide to preempt first (within a second of the submission), and
        # then the regular job waits out the satellites' GraceTime and KillWait. Either way it runs within that.
        bound = slurm_cluster.grace_time_s + KILL_WAIT_S + daemon.interval_s + 5
        wait_until(
            "the regular job to run",
            lambda: (j := client.job(regular_id)) is not None and j.state is JobState.RUNNING,
            timeout=bound + 15,
        )
        assert time.monotonic() - asked_at <= bound
        # Either way the job ends up using everything the regular job left, and nothing more.
        wait_until(
            "the elastic job to settle at the GPUs left",
            lambda: (
                agent.size == agent.target == grown - 2
                and sum(c.free for c in client.gpus_per_node(partition=slurm_cluster.elastic_partition)) == 0
            ),
            timeout=40,
        )
        # The daemon's view follows Slurm's at its next rounds (a satellite Slurm preempted may be regrown then).
        status = wait_until(
            f"the daemon to see the regular job run and the elastic job at {grown - 2} workers",
            lambda: (s := daemon.status())["jobs"]["regular_running"] == 1 and s["workers"] == grown - 2 and s,
            timeout=30,
        )
        assert status["orphans"] == []
    finally:
        agent.stop()


def test_a_satellite_whose_parent_is_gone_is_reported_and_left_to_its_owner(
    slurm_cluster: ClusterHandle,
    client: CliSlurmClient,
    daemon: DaemonProcess,
    tmp_path: Path,
    submitted: list[int],
) -> None:
    gone_parent = parent_job(client, tmp_path, submitted)
    client.cancel(gone_parent)
    wait_until("the parent to end", lambda: (j := client.job(gone_parent)) is None or not j.state.is_active())
    body = script(tmp_path / "orphan.sh", "exec sleep 600\n")
    orphan = client.submit(
        body,
        SubmitOptions(
            name=f"amoeba-sat-{gone_parent}-g1",
            comment=f"amoeba-parent={gone_parent}",
            partition=slurm_cluster.elastic_partition,
            nodes=1,
            ntasks=1,
            gpus_per_node=1,
            output=str(tmp_path / "orphan.out"),
        ),
    )
    submitted.append(orphan)
    wait_until(
        "the daemon to report the orphan",
        lambda: [o["job_id"] for o in daemon.status()["orphans"]] == [str(orphan)],
        timeout=20,
    )
    listed = amoebactl(daemon.endpoint, "status")
    assert f"satellite {orphan} of gone job {gone_parent} (user root): scancel it" in listed.stdout
    wait_until("the warning in the log", lambda: f"satellite {orphan} (user root" in daemon.log_text(), timeout=10)
    assert (j := client.job(orphan)) is not None and j.state is JobState.RUNNING  # the daemon cancels nobody's job


def test_with_goodput_an_adaptive_jobs_statistics_reach_the_daemon_and_its_grow_carries_the_policys_batch(
    slurm_cluster: ClusterHandle, client: CliSlurmClient, tmp_path: Path, submitted: list[int]
) -> None:
    adaptive = {
        "global_batch": 64,
        "base_batch": 32,
        "max_batch": 1024,
        "noise_scale": 2000.0,
        "step_time_s": [[1, 32, 0.05, 10], [1, 64, 0.08, 30]],
        "batch_source": "runtime",
    }
    model = model_from_report(adaptive)
    assert model is not None
    daemon = DaemonProcess(slurm_cluster, tmp_path, policy="goodput")
    daemon.start()
    job_id = parent_job(client, tmp_path, submitted)
    agent = FakeAgent(slurm_cluster, job_id, daemon.endpoint, tmp_path, max_workers=3, adaptive=adaptive)
    agent.start()
    try:
        wait_until("the daemon to order the job to grow", lambda: len(agent.directives) >= 1, timeout=20)
        order = agent.directives[0][1].body
        assert order["target"] == 3 and order["batch"] == model.best(3)[0], order
        wait_until("the job to reach 3 workers", lambda: agent.size == 3, timeout=60)
        jobs = amoebactl(daemon.endpoint, "jobs")
        assert jobs.returncode == 0, jobs.stderr
        assert f'job {job_id}: global batch 64 (range 32..1024, chosen by "runtime"), noise scale 2000' in jobs.stdout
        assert f"global batch {model.best(3)[0]}" in daemon.log_text()
    finally:
        agent.stop()
        daemon.stop()
