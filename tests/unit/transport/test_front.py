"""The front process: it checks credentials for its server and signs the server's replies, passes on who munge says
sent each request, is started again when it dies, cannot outlive its server, and says why it could not bind.
(What every request server does, refusals included, runs against it too: the ``server`` fixture's two kinds.)"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from slurm_amoeba.core.messages import Message, encode
from slurm_amoeba.daemon import Daemon, DaemonConfig
from slurm_amoeba.transport import front as front_module
from slurm_amoeba.transport.channel import destination, request
from slurm_amoeba.transport.front import FrontChannel, FrontError
from slurm_amoeba.transport.munge import seal
from tests.unit.daemon.fakes import FakeSlurm, job, node
from tests.waiting import wait_until


@pytest.fixture
def front(munged: None) -> Iterator[FrontChannel]:
    channel = FrontChannel("tcp://127.0.0.1:*")
    try:
        yield channel
    finally:
        channel.close()


def _answer(channel: FrontChannel, count: int, seen: list[tuple[int, int, str]]) -> threading.Thread:
    """Answer ``count`` requests on a thread, recording each sender's uid, gid and the message's kind."""

    def serve() -> None:
        for _ in range(count):
            req = channel.receive(10)
            if req is None:
                return
            seen.append((req.sender.uid, req.sender.gid, req.message.kind))
            channel.answer(req, req.message.reply(data={"n": len(seen)}))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_the_server_gets_each_request_with_the_uid_munge_vouches_for_and_the_reply_comes_back_signed(
    front: FrontChannel,
) -> None:
    seen: list[tuple[int, int, str]] = []
    thread = _answer(front, 2, seen)
    first = request(front.endpoint, Message("status", {}), timeout_s=5, expect_uid=os.getuid())
    second = request(front.endpoint, Message("jobs", {}), timeout_s=5, expect_uid=os.getuid())
    thread.join(10)
    assert first.body["ok"] and first.body["data"] == {"n": 1} and second.body["data"] == {"n": 2}
    assert seen == [(os.getuid(), os.getgid(), "status"), (os.getuid(), os.getgid(), "jobs")]
    assert front.alive() and front.starts == 1


def test_a_front_that_dies_is_started_again_on_the_same_endpoint(front: FrontChannel) -> None:
    endpoint, first = front.endpoint, front.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_until("the front to end", lambda: not front.alive(), timeout=5)
    seen: list[tuple[int, int, str]] = []
    thread = _answer(front, 1, seen)  # the next receive starts it again
    reply = request(endpoint, Message("status", {}), timeout_s=3, retries=3)
    thread.join(10)
    assert reply.body["ok"] and front.starts == 2 and front.pid not in (None, first)
    assert front.endpoint == endpoint


def test_a_front_started_by_a_thread_that_ended_goes_on_serving(munged: None) -> None:
    made: list[FrontChannel] = []
    starter = threading.Thread(target=lambda: made.append(FrontChannel("tcp://127.0.0.1:*")))
    starter.start()
    starter.join(30)
    channel = made[0]
    try:
        # a front tied to its starting thread (PR_SET_PDEATHSIG) got its signal when that thread ended
        seen: list[tuple[int, int, str]] = []
        thread = _answer(channel, 1, seen)
        assert request(channel.endpoint, Message("status", {}), timeout_s=5, retries=0).body["ok"]
        thread.join(10)
        assert channel.starts == 1
    finally:
        channel.close()


def test_the_private_socket_is_for_the_servers_user_only_and_goes_with_the_server(munged: None) -> None:
    channel = FrontChannel("tcp://127.0.0.1:*")
    where = Path(channel._dir)  # the directory of the private socket
    pid = channel.pid
    assert stat.S_IMODE(where.stat().st_mode) == 0o700 and (where / "back-1").exists()
    channel.close()
    assert not where.exists() and pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_front_does_not_outlive_a_server_that_dies_without_closing_it(munged: None, tmp_path: Path) -> None:
    script = (
        "import os, sys\n"
        "from slurm_amoeba.transport.front import FrontChannel\n"
        "channel = FrontChannel('tcp://127.0.0.1:*')\n"
        "print(channel.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    pid = int(done.stdout.split()[0])

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"  # ended, not yet reaped

    wait_until("the orphaned front to end", gone, timeout=10)


def test_a_front_that_cannot_bind_says_why(munged: None) -> None:
    taken: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    try:
        with pytest.raises(FrontError, match=f"could not bind tcp://127.0.0.1:{port}: Address already in use"):
            FrontChannel(f"tcp://127.0.0.1:{port}")
    finally:
        taken.close(linger=0)


def test_amoebad_with_front_process_answers_through_its_front(tmp_path: Path, munged: None) -> None:
    slurm = FakeSlurm(job_list=[job(100, gpus={"n1": 2})], node_list=[node("n1", used=2)])
    config = DaemonConfig(
        interval_s=0.2,
        listen="tcp://127.0.0.1:*",
        front_process=True,
        metrics_port=0,
        state_file=str(tmp_path / "state"),
    )
    daemon = Daemon(config, slurm)
    daemon.start()
    stop = threading.Event()
    thread = threading.Thread(target=daemon.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert isinstance(daemon.server, FrontChannel)
        started = time.monotonic()
        status = request(daemon.server.endpoint, Message("status", {}), timeout_s=5, expect_uid=os.getuid())
        assert status.body["ok"] and time.monotonic() - started < 5
        assert status.body["data"]["listen"] == daemon.server.endpoint
    finally:
        stop.set()
        thread.join(10)
        daemon.close()


def test_the_front_hands_the_server_a_window_of_requests_and_more_only_as_it_takes_them(munged: None) -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    back: zmq.Socket[bytes] = context.socket(zmq.PAIR)
    back.setsockopt(zmq.LINGER, 0)
    where = tempfile.mkdtemp(prefix="amoeba-front-test-")
    back.bind(f"ipc://{where}/back")
    front_side = front_module._Front("tcp://127.0.0.1:*", f"ipc://{where}/back")
    assert front_side.bind()
    kind, endpoint = back.recv_multipart()
    assert kind == b"ready"
    runner = threading.Thread(target=front_side.run, daemon=True)
    runner.start()
    client: zmq.Socket[bytes] = context.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.connect(endpoint.decode())
    to = destination(endpoint.decode())
    try:
        for _ in range(front_module.WINDOW + 36):  # one user's burst, more than the window
            payload = encode(Message("status", {}))
            client.send_multipart([b"", seal(payload, to=to), payload])
        handed: list[list[bytes]] = []

        def count(at_least: int) -> bool:
            while back.poll(0):
                handed.append(back.recv_multipart())
            return len(handed) >= at_least

        wait_until("a window of requests", lambda: count(front_module.WINDOW), timeout=10)
        back.send_multipart([b"took", b"16"])  # the server took 16 of them: the front may hand on 16 more
        wait_until("16 more", lambda: count(front_module.WINDOW + 16), timeout=10)
        back.send_multipart([b"stop"])  # read before the front looks at its clients again
        runner.join(10)
        count(0)
        assert not runner.is_alive() and len(handed) == front_module.WINDOW + 16
        assert all(frames[0] == b"request" and frames[1] == str(os.getuid()).encode() for frames in handed)
    finally:
        client.close(linger=0)
        front_side.close()
        back.close(linger=0)
        shutil.rmtree(where, ignore_errors=True)
