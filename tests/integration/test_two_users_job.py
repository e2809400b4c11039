"""User B against user A's elastic job while it trains (issue 11): the daemon, A's agent, the daemon's port and A's
job store. Every attempt is refused and logged, and A's job finishes with every sample applied exactly once.

User A is this test's own uid (root): A's job runs the project's Python from the repository's virtual environment,
which lives under /root, where no other Unix user may go. User B is ``amoeba-test-b``, a real Unix user whose
requests carry B's own munge credentials (``runuser -u amoeba-test-b -- munge``): that uid is all A's agent and the
daemon see of B. B's attempts on the store run in this process, with no job secret: the job's store knows no uids,
only its secret, so what B lacks there is the secret, which is what this test withholds. B would find the store's
port with ``ss -ltn`` on A's node (every user sees listening ports; nothing tells B which is A's); the test reads it
from A's agent log instead of scanning.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from slurm_amoeba.core.messages import Message, decode, encode
from slurm_amoeba.launcher.handle import AgentHandle
from slurm_amoeba.runtime.protocol import EVENTS_KEY, JOIN_KEY
from slurm_amoeba.slurm import CliSlurmClient, JobState
from slurm_amoeba.transport.channel import reply_destination
from slurm_amoeba.transport.munge import binding
from tests.conftest import REPO, ClusterHandle
from tests.e2e.test_elastic_jobs import applied_samples
from tests.integration.daemon_helpers import DaemonProcess, foreign_request, wait_until
from tests.integration.test_daemon_two_users import USER_B, ensure_user

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

EPOCHS = 3
DATASET = 640
SAMPLE_DELAY = 0.01  # ~19 s of training at one worker: long enough for every attempt, short enough for make test


class Squatter:
    """User B on the daemon's port while amoebad restarts: answers every request "ok", signed by B's munge."""

    def __init__(self, endpoint: str, user: str) -> None:
        self.user = user
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.answered: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.sock.poll(50):
                continue
            *route, _, payload = self.sock.recv_multipart()
            request = decode(payload)
            answer = encode(request.reply(data={"interval_s": 1.0}))
            made = subprocess.run(
                ["runuser", "-u", self.user, "--", "munge"],
                input=binding(answer, reply_destination(request.id), round(time.time() * 1000)),
                capture_output=True,
                timeout=30,
                check=True,
            )
            self.sock.send_multipart([*route, made.stdout.strip(), answer])
            self.answered.append(request.kind)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sock.close(linger=0)


@pytest.fixture
def job_env(slurm_cluster: ClusterHandle) -> dict[str, str]:
    environ = dict(os.environ)
    environ["SLURM_CONF"] = str(slurm_cluster.conf)
    environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environ['PATH']}"
    # The site's identity of the daemon, as the SPANK plugin's daemon_uid= exports it (the daemon runs as this uid).
    environ["AMOEBA_DAEMON_UID"] = str(os.getuid())
    return environ


@pytest.fixture
def daemon(slurm_cluster: ClusterHandle, tmp_path: Path) -> Iterator[DaemonProcess]:
    proc = DaemonProcess(slurm_cluster, tmp_path, interval_s=1.0, host="10.77.0.1")
    proc.start()
    yield proc
    proc.stop()


def submit_a(
    job_env: dict[str, str], daemon: DaemonProcess, tmp_path: Path, epochs: int = EPOCHS, dataset: int = DATASET
) -> str:
    """A's elastic job (1:2 workers of one GPU, ``examples/elastic_mlp.py`` with a ledger in ``tmp_path/ledger``)."""
    script = tmp_path / "job.sh"
    script.write_text(f'#!/bin/bash\nexec amoeba-run {sys.executable} {REPO / "examples/elastic_mlp.py"} "$@"\n')
    script.chmod(0o755)
    argv = ["amoeba-sbatch", "--elastic", "1:2", "--gpus-per-worker", "1", f"--output={tmp_path}/agent-%j.out"]
    args = ["--epochs", str(epochs), "--dataset-size", str(dataset), "--sample-delay", str(SAMPLE_DELAY)]
    submitted = subprocess.run(
        [*argv, str(script), *args, "--ledger", str(tmp_path / "ledger")],
        capture_output=True,
        text=True,
        env={**job_env, "AMOEBA_DAEMON_ENDPOINT": daemon.endpoint},
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().splitlines()[-1]


def logged(log: Path, line: str) -> bool:
    return line in log.read_text(errors="replace")


def b_against_the_daemon(daemon: DaemonProcess, job_id: str, uid_b: int) -> None:
    """(a) resize, pin, unpin, drain, jobs and status of A's job, as B: refused, or nothing of A's job shown."""
    changes = {
        "resize": ({"job_id": job_id, "target": 2, "reason": "b"}, f"uid {uid_b} may not resize job {job_id}"),
        "pin": ({"job_id": job_id, "pinned": True}, f"uid {uid_b} may not pin or unpin job {job_id}"),
        "unpin": ({"job_id": job_id, "pinned": False}, f"uid {uid_b} may not pin or unpin job {job_id}"),
        "drain": ({}, f"uid {uid_b} is not an operator"),
    }
    for what, (body, says) in changes.items():
        reply = foreign_request(daemon.endpoint, Message("pin" if what == "unpin" else what, body), user=USER_B)
        assert not reply.body["ok"] and says in reply.body["error"], (what, reply.body)
    for kind in ("jobs", "status"):
        read = foreign_request(daemon.endpoint, Message(kind, {}), user=USER_B).body
        assert read["ok"] and f'"{job_id}"' not in json.dumps(read), read
    log = daemon.log_text()
    for kind in ("resize", "pin", "drain"):
        assert f"refused {kind} from uid {uid_b}" in log, kind


def b_against_the_agent(endpoint: str, job_id: str, uid_b: int, agent_log: Path) -> None:
    """(b) status and a resize directive straight to A's agent, as B: refused and logged by the agent."""
    status = foreign_request(endpoint, Message("status", {}), user=USER_B).body
    directive = Message("resize", {"job_id": job_id, "target": 2, "reason": "b"})
    resize = foreign_request(endpoint, directive, user=USER_B).body
    for reply in (status, resize):
        assert not reply["ok"] and f"uid {uid_b}" in reply["error"], reply
        assert job_id not in json.dumps(reply["data"])
    for kind in ("status", "resize"):
        line = f"refused {kind} from uid {uid_b}"
        wait_until(f"A's agent to log B's {kind}", functools.partial(logged, agent_log, line))


def b_on_the_daemons_port(daemon: DaemonProcess, job_id: str, uid_b: int, agent_log: Path) -> None:
    """(c) B binds the daemon's port while amoebad restarts: A's agent refuses B's answers, and goes back to the
    real daemon when it is back (the site configured the daemon's uid, so the agent keeps trying)."""
    daemon.stop()
    squatter = Squatter(daemon.endpoint, USER_B)
    try:
        wait_until("A's agent to ask B's squatter", lambda: bool(squatter.answered), timeout=15)
        says = f"came from uid {uid_b}, expected {os.getuid()}"
        wait_until("A's agent to refuse B's answer", lambda: says in agent_log.read_text(), timeout=10)
    finally:
        squatter.close()
    daemon.start()

    def reports_again() -> bool:  # the daemon kept the job in its state file: A's agent just reports again
        jobs = daemon.status_jobs()
        return bool(jobs) and jobs[0]["job_id"] == job_id and (jobs[0]["last_report_age_s"] or 99) < 1.5

    wait_until("A's agent to report to the real daemon again", reports_again, timeout=20)


def b_on_the_store(agent_log: Path) -> None:
    """(d) B connects to A's job store and tries to join and to speak for a worker: refused and logged."""
    from torch._C._distributed_c10d import TCPStore

    address = r"(\[\S+/coordinator\]) store on \S+ port (\d+), workers reach it at (\S+)"
    found = re.search(address, agent_log.read_text())
    assert found, "A's agent logged no store address"
    prefix, port, host = found[1], int(found[2]), found[3]
    store = TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=10))
    store.queue_push(JOIN_KEY, json.dumps({"hint": "b", "nonce": "b-0"}))
    ready = {"kind": "ready", "worker": "g0-0", "time": time.time(), "allowed_sizes": [1]}
    store.queue_push(EVENTS_KEY, json.dumps(ready))
    for what in ("a join request", "an event"):
        line = f"{prefix} ignored {what}:"
        wait_until(f"A's coordinator to log B's {what}", functools.partial(logged, agent_log, line))


def wait_for_gpus(client: CliSlurmClient, job_id: str) -> float:
    """Wait until the job runs (others' jobs on the shared cluster may hold the GPUs a while); the time it starts."""
    wait_until(
        f"job {job_id} to start (others' jobs may hold the cluster's GPUs)",
        lambda: client.accounting_state(int(job_id)) is not JobState.PENDING,
        timeout=240,
        every=1.0,
    )
    return time.monotonic()


def assert_finished_exactly_once(ledger: Path, handle: AgentHandle, epochs: int, dataset: int) -> None:
    """Rank 0's result says finished with every sample, and the ledgers show each sample applied once an epoch."""
    result = json.loads((ledger / "result.json").read_text())
    assert result["status"] == "finished" and result["samples"] == epochs * dataset
    counts = applied_samples(ledger, handle.history()["generations"])
    assert sorted(counts) == list(range(epochs))
    for epoch, counter in counts.items():
        assert set(counter) == set(range(dataset)) and set(counter.values()) == {1}, f"epoch {epoch}"


def test_user_b_cannot_touch_user_as_training_job(
    slurm_cluster: ClusterHandle, job_env: dict[str, str], daemon: DaemonProcess, tmp_path: Path
) -> None:
    uid_b = ensure_user(USER_B)
    client = CliSlurmClient(job_env)
    started = time.monotonic()
    job_id = submit_a(job_env, daemon, tmp_path)
    agent_log = tmp_path / f"agent-{job_id}.out"
    handle = AgentHandle(job_id, tmp_path / f"amoeba-{job_id}")
    try:
        started = wait_for_gpus(client, job_id)
        wait_until("A's job to train", lambda: handle.workers() >= 1, timeout=60)
        wait_until("A's agent to register", lambda: f"job {job_id} (user root) registered" in daemon.log_text())
        endpoint = daemon.status_jobs()[0]["endpoint"]  # an operator's view (this process is the daemon's uid)

        pinned = daemon.ask("pin", {"job_id": job_id, "pinned": True})  # A keeps the job at one worker: a known length
        assert pinned is not None and pinned.body["ok"], pinned

        attacks = time.monotonic()
        b_on_the_store(agent_log)
        b_against_the_daemon(daemon, job_id, uid_b)
        b_against_the_agent(endpoint, job_id, uid_b, agent_log)
        b_on_the_daemons_port(daemon, job_id, uid_b, agent_log)
        print(f"B's attempts took {time.monotonic() - attacks:.1f} s, from {attacks - started:.1f} s on")
        assert client.accounting_state(int(job_id)) is JobState.RUNNING, "A's job ended before B was done"

        wait_until("A's job to end", lambda: client.accounting_state(int(job_id)).is_final(), timeout=90)
        assert client.accounting_state(int(job_id)) is JobState.COMPLETED, agent_log.read_text()[-3000:]
        assert_finished_exactly_once(tmp_path / "ledger", handle, EPOCHS, DATASET)
    finally:
        if not client.accounting_state(int(job_id)).is_final():
            client.cancel(int(job_id))
        print(f"two-user job test took {time.monotonic() - started:.0f} s from the job's start")
