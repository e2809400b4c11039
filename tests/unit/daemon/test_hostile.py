"""What a user of a shared cluster cannot do to the daemon: stall its answers, flood it, read or outgrow the site.

Issue 11, the daemon's side: Slurm calls never block answers (a slurmctld that hangs delays rounds only), requests
and agents per uid are limited, another user's job shows only as a count, ``jobs`` comes in pages, and the site's
worker caps hold whatever path a job came in by.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_amoeba.core.messages import Message
from slurm_amoeba.daemon import Daemon, DaemonConfig
from slurm_amoeba.transport.channel import request
from tests.unit.daemon.fakes import FakeSlurm, job, node, register_body


@pytest.fixture
def hanging(tmp_path: Path) -> Iterator[tuple[Daemon, FakeSlurm]]:
    """A running daemon whose Slurm hangs after the first round (job 100 known, job 200 not yet)."""
    slurm = FakeSlurm(job_list=[job(100, gpus={"n1": 2})], node_list=[node("n1", used=2)])
    config = DaemonConfig(interval_s=0.2, listen="tcp://127.0.0.1:*", metrics_port=0, state_file=str(tmp_path / "s"))
    daemon = Daemon(config, slurm)
    daemon.start()
    stop = threading.Event()
    thread = threading.Thread(target=daemon.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while daemon.last_round is None and time.monotonic() < deadline:
        time.sleep(0.02)
    slurm.hung = True
    yield daemon, slurm
    slurm.release.set()
    stop.set()
    thread.join(10)
    daemon.close()


def timed(endpoint: str, kind: str, body: dict[str, object]) -> tuple[Message, float]:
    tick = time.monotonic()
    reply = request(endpoint, Message(kind, body), timeout_s=5, retries=0)
    return reply, time.monotonic() - tick


def test_a_hung_slurmctld_delays_rounds_never_answers(hanging: tuple[Daemon, FakeSlurm]) -> None:
    daemon, slurm = hanging
    assert daemon.server is not None
    endpoint = daemon.server.endpoint
    time.sleep(0.5)  # a round has begun and hangs in squeue
    assert daemon.round_loop.observing
    rounds = len(daemon.rounds)
    # A job in the last view registers at once; one Slurm has not shown yet is told to retry, at once.
    known, known_s = timed(endpoint, "register", register_body("100"))
    unknown, unknown_s = timed(endpoint, "register", register_body("200"))
    status, status_s = timed(endpoint, "status", {})
    assert known.body["ok"], known.body
    assert not unknown.body["ok"] and "retry" in unknown.body["error"], unknown.body
    assert status.body["ok"]
    assert max(known_s, unknown_s, status_s) < 1.0, (known_s, unknown_s, status_s)
    assert len(daemon.rounds) == rounds, "a round finished while Slurm hung"
    # Slurm answers again and now shows job 200: the round finishes, and the retry succeeds.
    slurm.job_list.append(job(200, gpus={"n1": 1}))
    slurm.hung = False
    slurm.release.set()
    deadline = time.monotonic() + 10
    while len(daemon.rounds) <= rounds + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    again, _ = timed(endpoint, "register", register_body("200"))
    assert again.body["ok"], again.body
