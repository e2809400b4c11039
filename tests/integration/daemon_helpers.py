"""Helpers for the daemon's cluster tests: ``amoebad`` as a real process, and an agent that speaks the protocol.

:class:`FakeAgent` follows the agent contract (register, report every second, re-register on "unknown job", take
``resize`` only from the daemon's uid, grow with real satellite jobs in the elastic partition named and commented as
the real agent names them, shrink by cancelling them) without running any training, so that the daemon's GPU
accounting is tested against real Slurm jobs. A resize can be slowed down on purpose (``resize_delay_s``) to kill
the daemon while one is in flight.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
import zmq

from slurm_amoeba.core.messages import Message, decode, encode
from slurm_amoeba.slurm import CliSlurmClient, JobState, SubmitOptions
from slurm_amoeba.transport.channel import (
    ChannelError,
    ChannelServer,
    destination,
    reply_destination,
    request,
    request_from,
)
from slurm_amoeba.transport.munge import binding, unseal
from tests import waiting
from tests.conftest import REPO, ClusterHandle

T = TypeVar("T")


def wait_until(what: str, predicate: Callable[[], T | None], timeout: float = 30.0, every: float = 0.2) -> T:
    """:func:`tests.waiting.wait_until` at the pace of a cluster (every 0.2 s, 30 s by default)."""
    return waiting.wait_until(what, predicate, timeout, every)


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


class DaemonProcess:
    """``amoebad`` started with ``python -m slurm_amoeba.cli.amoebad`` and a configuration written for the test.

    With ``shared``, it is one of a standby pair: its state file and its lease (``ha.lease_dir``) are in that
    directory, which the other daemon of the pair is given too; ``name`` keeps the two daemons' files apart.
    """

    def __init__(
        self,
        cluster: ClusterHandle,
        workdir: Path,
        *,
        interval_s: float = 2.0,
        host: str = "127.0.0.1",
        policy: str = "elastic-backfill",
        name: str = "amoebad",
        shared: Path | None = None,
        ha: dict[str, float] | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.endpoint = f"tcp://{host}:{self.port}"
        self.config = workdir / f"{name}.yaml"
        self.log = workdir / f"{name}.log"
        self.state = (shared or workdir) / "state.json"
        self.interval_s = interval_s
        doc: dict[str, Any] = {
            "interval_s": interval_s,
            "listen": self.endpoint,
            "metrics": {"address": "127.0.0.1", "port": free_port()},
            "policy": {"name": policy},
            "partitions": {"regular": [cluster.regular_partition], "elastic": cluster.elastic_partition},
            "agents": {"timeout_s": 2, "retries": 0, "stale_after_s": 8, "backoff_s": 10},
            "resize_timeout_s": 90,
            "orphan_grace_s": 0,
            "slurm": {"conf": str(cluster.conf), "timeout_s": 20},
            "state_file": str(self.state),
            "log_level": "debug",
            # Admission (on by default) is tested by tests/e2e/test_admission*.py; the other tests' jobs start as
            # Slurm starts them.
            "admission": {"enabled": False},
        }
        if shared is not None:
            doc["ha"] = {"lease_dir": str(shared / "lease"), "advertise": self.endpoint, **(ha or {})}
        self.config.write_text(yaml.safe_dump(doc))
        self.metrics_port = int(doc["metrics"]["port"])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "slurm_amoeba.cli.amoebad", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until("amoebad to answer status", lambda: self.ask("status", timeout_s=1) is not None, timeout=20)

    def ask(self, kind: str, body: dict[str, Any] | None = None, timeout_s: float = 10) -> Message | None:
        """A request to the daemon as this (root) process; None when it does not answer."""
        try:
            return request(self.endpoint, Message(kind, body or {}), timeout_s=timeout_s, retries=0)
        except ChannelError:
            return None

    def status(self) -> dict[str, Any]:
        reply = self.ask("status")
        assert reply is not None and reply.body["ok"], reply
        data: dict[str, Any] = reply.body["data"]
        return data

    def wait_rounds(self, count: int, timeout: float | None = None) -> dict[str, Any]:
        """Wait until ``count`` rounds that began after this call have finished; the status after the last.

        A round that began after something the daemon could act on has had its chance to act: wait for one before
        asserting that the daemon did *not* do something. A round's ``at`` is the daemon's wall clock, which the
        test shares (one host); rounds the polling misses are not counted, so it may wait longer, never shorter.
        """
        since = time.time()
        began: set[float] = set()

        def finished() -> dict[str, Any] | None:
            status = self.status()
            last = status["last_round"]
            if last is not None and last["at"] > since:
                began.add(last["at"])
            return status if len(began) >= count else None

        bound = timeout if timeout is not None else self.interval_s * (count + 2) + 20
        return wait_until(f"{count} rounds of the daemon after {since:.3f}", finished, bound)

    def status_jobs(self) -> list[dict[str, Any]]:
        """``amoebactl jobs`` as data."""
        reply = self.ask("jobs")
        assert reply is not None and reply.body["ok"], reply
        jobs: list[dict[str, Any]] = reply.body["data"]["jobs"]
        return jobs

    def role(self) -> str:
        """``active``, ``standby`` (it answers as the standby), ``single``, or ``down`` (it does not answer)."""
        reply = self.ask("status", timeout_s=2)
        if reply is None:
            return "down"
        if not reply.body["ok"]:
            return str(reply.body["data"].get("role", "refused"))
        return str(reply.body["data"].get("ha", {}).get("role", "single"))

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill(signal.SIGTERM)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def foreign_request(endpoint: str, message: Message, user: str = "nobody", timeout_s: float = 10) -> Message:
    """Send ``message`` signed by another user's munge credential (``runuser -u USER -- munge``).

    The venv's python lives under /root, which other users cannot traverse, so only the credential is made as
    that user: ``munge`` reads the payload (what :func:`seal` binds: the message's bytes, its destination and its
    send time) from stdin.
    """
    payload = encode(message)
    made = subprocess.run(
        ["runuser", "-u", user, "--", "munge"],
        input=binding(payload, destination(endpoint), round(time.time() * 1000)),
        capture_output=True,
        timeout=30,
        check=True,
    )
    credential = made.stdout.strip()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart([credential, payload])
        if not sock.poll(int(timeout_s * 1000)):
            pytest.fail(f"the daemon did not answer a request signed by {user} within {timeout_s} s")
        cred, reply_payload = sock.recv_multipart()
        reply = decode(reply_payload)
        unseal(cred, reply_payload, to=reply_destination(message.id))  # the daemon's answer is authenticated too
        return reply
    finally:
        sock.close(linger=0)


class FakeAgent:
    """An elastic job's agent per the contract, with satellites that are real Slurm jobs (see the module docstring).

    Args:
        cluster: the test cluster.
        job_id: the parent job (already submitted, holding ``min_workers`` workers).
        daemon_endpoint: where to register and report.
        workdir: where satellites write their output.
        min_workers: the job's minimum (held by the parent job).
        max_workers: its maximum.
        gpus_per_worker: GPUs per worker (one satellite per extra worker).
        resize_delay_s: seconds between accepting a directive and acting on it.
        adaptive: the adaptive-batch statistics its reports carry (a report's ``adaptive`` object), or None.
    """

    def __init__(
        self,
        cluster: ClusterHandle,
        job_id: int,
        daemon_endpoint: str,
        workdir: Path,
        *,
        min_workers: int = 1,
        max_workers: int = 4,
        gpus_per_worker: int = 1,
        resize_delay_s: float = 0.0,
        adaptive: dict[str, Any] | None = None,
    ) -> None:
        self.cluster = cluster
        self.adaptive = adaptive
        self.client: CliSlurmClient = cluster.client()
        self.job_id = str(job_id)
        self.daemon_endpoint = daemon_endpoint
        self.workdir = workdir
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.gpus_per_worker = gpus_per_worker
        self.resize_delay_s = resize_delay_s
        self.server = ChannelServer("tcp://127.0.0.1:*")
        self.daemon_uid: int | None = None
        self.size = min_workers
        self.target = min_workers
        self.generation = 0
        self.satellites: list[int] = []
        self.directives: list[tuple[float, Message]] = []
        self.registrations = 0
        self.history: list[dict[str, Any]] = []
        self._counter = 0
        self._act_at = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._serve, daemon=True),
            threading.Thread(target=self._work, daemon=True),
        ]

    def start(self) -> None:
        """Register (again until the daemon takes it: a job its last view of Slurm does not show yet is told to
        retry, as a real agent's reports are) and start serving and reporting."""
        deadline = time.monotonic() + 20
        self.register()
        while not self.registrations and time.monotonic() < deadline:
            time.sleep(0.5)
            self.register()
        for thread in self._threads:
            thread.start()

    def register(self) -> None:
        message = Message(
            "register",
            {
                "job_id": self.job_id,
                "endpoint": self.server.endpoint,
                "min_workers": self.min_workers,
                "max_workers": self.max_workers,
                "gpus_per_worker": self.gpus_per_worker,
                "partition": self.cluster.regular_partition,
                "elastic_partition": self.cluster.elastic_partition,
            },
        )
        try:
            daemon, reply = request_from(self.daemon_endpoint, message, timeout_s=3, retries=0)
        except ChannelError:
            return
        if reply.body["ok"]:
            self.daemon_uid = daemon.uid
            self.registrations += 1

    def _serve(self) -> None:
        while not self._stop.is_set():
            req = self.server.receive(0.1)
            if req is None:
                continue
            if req.sender.uid != self.daemon_uid or req.message.kind != "resize":
                self.server.refuse(req, f"uid {req.sender.uid} may not direct job {self.job_id}")
                continue
            target = int(req.message.body["target"])
            with self._lock:
                self.directives.append((time.time(), req.message))
                if not self.min_workers <= target <= self.max_workers:
                    self.server.answer(req, req.message.reply(ok=False, error=f"{target} is outside the range"))
                    continue
                self.target = target
                self._act_at = time.monotonic() + self.resize_delay_s
                self.history.append({"t": time.time(), "event": "resize_requested", "target": target})
                self.server.answer(req, req.message.reply(data={"size": self.size, "target": target}))

    def _satellite_states(self) -> dict[int, JobState]:
        records = {r.job_id: r.state for r in self.client.jobs(job_ids=self.satellites)}
        return {sat: records.get(sat, JobState.UNKNOWN) for sat in self.satellites}

    def _work(self) -> None:
        next_report = 0.0
        while not self._stop.is_set():
            with self._lock:
                states = self._satellite_states()
                self.satellites = [s for s, state in states.items() if state.is_active()]
                if len(self.satellites) < len(states):
                    # Lost without a shrink (Slurm preempted them: they show as ended from the start of their
                    # GraceTime): as the real agent does, the target follows what the job still has, so that the
                    # job does not fight Slurm for the GPUs; the daemon may grow it again.
                    self.target = max(self.min_workers, min(self.target, self.min_workers + len(self.satellites)))
                running = sum(1 for s in self.satellites if states[s] is JobState.RUNNING)
                if self.min_workers + running != self.size:
                    self.size = self.min_workers + running
                    self.generation += 1
                if time.monotonic() >= self._act_at:
                    self._act()
            if time.monotonic() >= next_report:
                self._report()
                next_report = time.monotonic() + 1.0
            self._stop.wait(0.3)

    def _act(self) -> None:
        wanted = self.target - self.min_workers
        while len(self.satellites) < wanted:
            self._counter += 1
            name = f"amoeba-sat-{self.job_id}-g{self._counter}"
            sat = script(self.workdir / f"{name}.sh", "exec sleep 600\n")
            self.satellites.append(
                self.client.submit(
                    sat,
                    SubmitOptions(
                        name=name,
                        comment=f"amoeba-parent={self.job_id}",
                        partition=self.cluster.elastic_partition,
                        nodes=1,
                        ntasks=1,
                        gpus_per_node=self.gpus_per_worker,
                        output=str(self.workdir / f"{name}.out"),
                    ),
                )
            )
        while len(self.satellites) > wanted:
            self.client.cancel(self.satellites.pop())

    def _report(self) -> None:
        with self._lock:
            body = {
                "job_id": self.job_id,
                "size": self.size,
                "generation": self.generation,
                "target": self.target,
                "throughput": {str(n): 100.0 * n for n in range(self.min_workers, self.size + 1)},
                "history": self.history[-20:],
                "satellites": [str(s) for s in self.satellites],
                **({"adaptive": self.adaptive} if self.adaptive is not None else {}),
            }
        try:
            reply = request(self.daemon_endpoint, Message("report", body), timeout_s=1.5, retries=0)
        except ChannelError:
            return  # the daemon is down: keep going, as the real agent does
        if not reply.body["ok"] and "unknown job" in str(reply.body["error"]):
            self.register()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(10)
        self.server.close()
        for sat in self.satellites:
            with contextlib.suppress(Exception):
                self.client.cancel(sat)


def idle_cluster_env(cluster: ClusterHandle) -> dict[str, str]:
    """The cluster's environment with the venv's commands first, once the shared cluster is idle (the test is
    skipped when it stays busy with others' jobs for two minutes)."""
    environ = dict(os.environ)
    environ["SLURM_CONF"] = str(cluster.conf)
    environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environ['PATH']}"
    environ.pop("AMOEBA_DAEMON_ENDPOINT", None)
    client = CliSlurmClient(environ)
    deadline = time.monotonic() + 120
    while any(j.state.is_active() for j in client.jobs()) and time.monotonic() < deadline:
        time.sleep(1)
    if any(j.state.is_active() for j in client.jobs()):
        pytest.skip("the shared cluster stayed busy with others' jobs; this test needs it idle")
    return environ


def submit_mlp_job(
    cluster: ClusterHandle,
    env: dict[str, str],
    workdir: Path,
    daemon_endpoint: str,
    *,
    elastic: str = "1:3",
    gpus_per_worker: int | None = None,
    name: str = "job",
    options: tuple[str, ...] = (),
) -> str:
    """Submit ``examples/elastic_mlp.py`` with ``amoeba-sbatch --elastic ELASTIC`` (``gpus_per_worker``, by default a
    node's GPUs per worker; further amoeba-sbatch ``options``), its agent reporting to ``daemon_endpoint`` (one
    address or a pair's, comma-separated); returns the job id."""
    job_script = script(
        workdir / f"{name}.sh", f'exec amoeba-run {sys.executable} {REPO / "examples/elastic_mlp.py"} "$@"\n'
    )
    gpus = cluster.gpus_per_node if gpus_per_worker is None else gpus_per_worker
    args = ["--elastic", elastic, "--gpus-per-worker", str(gpus), *options]
    args += [f"--output={workdir}/{'agent' if name == 'job' else name}-%j.out", str(job_script)]
    return amoeba_sbatch_job(env, workdir, daemon_endpoint, [*args, "--epochs", "100000", "--sample-delay", "0.006"])


def amoeba_sbatch_job(env: dict[str, str], workdir: Path, daemon_endpoint: str, args: list[str]) -> str:
    """``amoeba-sbatch ARGS`` from ``workdir``, the job's agent reporting to ``daemon_endpoint``; returns the job id."""
    submitted = subprocess.run(
        ["amoeba-sbatch", *args],
        capture_output=True,
        text=True,
        env={**env, "AMOEBA_DAEMON_ENDPOINT": daemon_endpoint},
        cwd=workdir,
        timeout=60,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip().splitlines()[-1]


def job_ended(client: CliSlurmClient, job_id: str) -> bool:
    """Whether Slurm shows neither the job nor any of its satellites active."""
    return not any(
        j.state.is_active() and (job_id in (str(j.job_id), str(j.het_job_id)) or j.comment == f"amoeba-parent={job_id}")
        for j in client.jobs()
    )


def end_job(client: CliSlurmClient, job_id: str) -> None:
    """Cancel a job and wait until it and its satellites ended."""
    client.cancel(int(job_id))
    wait_until(
        "the job and its satellites to end",
        lambda: job_ended(client, job_id),
        timeout=60,
    )
