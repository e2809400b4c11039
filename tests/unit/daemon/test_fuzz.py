"""Whatever arrives on the daemon's socket, it keeps answering: random frames, wrong versions, huge messages.

The daemon runs its real loop on a real ZeroMQ socket in a thread; a DEALER socket throws frames at it; afterwards
an ordinary ``status`` request must still be answered and the loop thread must still be alive.
"""

from __future__ import annotations

import json
import random
import threading
import time

import pytest
import zmq

from slurm_amoeba.core.messages import MAX_MESSAGE_BYTES, Message, encode
from slurm_amoeba.daemon import Daemon
from slurm_amoeba.transport.channel import destination, request
from slurm_amoeba.transport.munge import seal
from tests.unit.daemon.test_daemon import wait_for


def envelope(payload: bytes, to: str) -> list[bytes]:
    return [b"", seal(payload, to=to), payload]


def signed_json(doc: object, to: str) -> list[bytes]:
    return envelope(json.dumps(doc).encode(), to)


def garbage(rng: random.Random, to: str) -> list[bytes]:
    """One hostile multipart message."""
    good = json.loads(
        encode(
            Message(
                "report",
                {
                    "job_id": "100",
                    "size": 2,
                    "generation": 1,
                    "target": 2,
                    "throughput": {},
                    "history": [],
                    "satellites": [],
                },
            )
        )
    )
    choice = rng.randrange(12)
    if choice == 0:
        return [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(1, 4))]
    if choice == 1:
        return [b"", rng.randbytes(rng.randrange(0, 300)), rng.randbytes(rng.randrange(0, 300))]
    if choice == 2:
        return signed_json({**good, "v": rng.choice([0, 2, "1", None, 1.5])}, to)
    if choice == 3:
        return signed_json({**good, "kind": rng.choice(["explode", "", 7, "reply"])}, to)
    if choice == 4:
        body = dict(good["body"])
        body[rng.choice(list(body))] = rng.choice([None, -1, 2**60, "x" * 50, [], {}, True, 1e308])
        return signed_json({**good, "body": body}, to)
    if choice == 5:
        body = {
            **good["body"],
            "throughput": {rng.choice(["-1", "0", "x", "1e9", "٣"]): rng.choice([1.0, -5.0, "fast"])},
        }
        return signed_json({**good, "body": body}, to)
    if choice == 6:
        return envelope(b"[" * 100_000 + b"]" * 100_000, to)  # deep nesting
    if choice == 7:
        return envelope(rng.randbytes(rng.randrange(1, 2000)), to)  # signed, not JSON
    if choice == 8:
        payload = json.dumps(good).encode()
        return [b"", seal(payload + b" ", to=to), payload]  # a credential for other bytes
    if choice == 9:
        payload = json.dumps(good).encode()
        cred = seal(payload, to=to)
        return [b"", cred, payload, b"extra"]
    if choice == 10:
        return [b"", b"x" * (2 << 20)]  # over the socket's size limit
    body = {**good["body"], "satellites": [rng.choice(["1; rm -rf /", -1, None, "123"])], "job_id": "100"}
    return signed_json({**good, "body": body}, to)


def oversized(frames: list[bytes]) -> bool:
    return sum(len(frame) for frame in frames) > MAX_MESSAGE_BYTES


def test_random_and_hostile_frames_never_stop_the_daemon(
    running: tuple[Daemon, threading.Thread], caplog: pytest.LogCaptureFixture
) -> None:
    daemon, thread = running
    assert daemon.server is not None
    endpoint = daemon.server.endpoint
    rng = random.Random(20261121)
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    expected = received = huge = 0
    for _ in range(300):
        frames = garbage(rng, destination(endpoint))
        if oversized(frames):
            # ZeroMQ drops a peer that sends a frame over the limit: send it on a connection of its own.
            throwaway = context.socket(zmq.DEALER)
            throwaway.setsockopt(zmq.LINGER, 0)
            throwaway.connect(endpoint)
            throwaway.send_multipart(frames)
            time.sleep(0.05)
            throwaway.close(linger=0)
            huge += 1
            continue
        sock.send_multipart(frames)
        expected += b"" in frames  # with a routing envelope, every message is answered (refused, here)
        while sock.poll(0):
            sock.recv_multipart()
            received += 1
    deadline = time.monotonic() + 10
    while received < expected and time.monotonic() < deadline:
        if sock.poll(100):
            sock.recv_multipart()
            received += 1
    sock.close(linger=0)
    assert huge > 0 and expected > 150
    assert received == expected, f"{expected - received} hostile messages went unanswered"
    reply = request(endpoint, Message("status", {}), timeout_s=10, retries=1)
    assert reply.body["ok"], reply.body
    assert thread.is_alive()
    assert daemon.last_round is not None and daemon.last_round.error == ""
    crashes = [r.getMessage() for r in caplog.records if r.exc_info is not None]
    assert crashes == [], "a hostile message reached an unexpected exception"


# ---------------------------------------------------------------------------------------------- issue 11's findings


def exchange(endpoint: str, frames: list[bytes], timeout_s: float = 10.0) -> list[bytes]:
    """Send raw ``frames`` on a connection of their own; return the reply's frames (the test fails without one)."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart(frames)
        assert sock.poll(int(timeout_s * 1000)), "the daemon did not answer"
        return sock.recv_multipart()
    finally:
        sock.close(linger=0)


def refusal(reply: list[bytes]) -> dict[str, object]:
    """The body of a refusal, checked to be small and ASCII-clean (nothing of the input echoed)."""
    assert len(reply) == 3 and reply[0] == b""
    assert len(reply[2]) < 2048, f"a refusal of {len(reply[2])} bytes"
    body = json.loads(reply[2])["body"]
    assert body["ok"] is False and str(body["error"]).isascii()
    return dict(body)


def still_answers(daemon: Daemon, thread: threading.Thread) -> None:
    assert daemon.server is not None
    reply = request(daemon.server.endpoint, Message("status", {}), timeout_s=10, retries=1)
    assert reply.body["ok"], reply.body
    assert thread.is_alive()


def raw(kind: str = '"status"', body: str = "{}", sent_at: str = "1.0", msg_id: str = '"abc"') -> bytes:
    return f'{{"v":1,"kind":{kind},"id":{msg_id},"sent_at":{sent_at},"body":{body}}}'.encode()


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        (raw(kind=json.dumps("é" * 300_000, ensure_ascii=False)), "65536 limit"),  # 0.6 MB of UTF-8
        (raw(kind=json.dumps("é" * 60_000, ensure_ascii=False)), "unknown message kind"),
        (raw(kind='"report"', body='{"size":' + "9" * 5000 + "}"), "5000 digits"),
        (raw(sent_at="1" + "0" * 400), "401 digits"),
        (raw(sent_at="1e400"), "sent_at is inf"),
        (raw(msg_id='"' + "x" * 100 + '"'), "message id"),
        (b'{"v":1,"kind":"status","id":"a","sent_at":1,"body":{}}\xff\xfe', "not UTF-8 JSON"),
        (b'{"v":1,"kind":"st\xc3atus"}', "not UTF-8 JSON"),
        (b"[" * 50 + b"]" * 50, "nesting deeper"),
    ],
    ids=[
        "huge-non-ascii-kind",
        "long-non-ascii-kind",
        "5000-digit-int",
        "sent_at-10**400",
        "sent_at-1e400",
        "long-id",
        "non-utf8",
        "bad-utf8",
        "deep",
    ],
)
def test_issue_11s_frames_are_refused_briefly_and_the_daemon_goes_on(
    running: tuple[Daemon, threading.Thread], payload: bytes, says: str
) -> None:
    daemon, thread = running
    assert daemon.server is not None
    body = refusal(exchange(daemon.server.endpoint, envelope(payload, daemon.server.destination)))
    assert says in str(body["error"]), body
    still_answers(daemon, thread)
    # The serve loop counts a batch's refusals after the batch, which may end after it answered still_answers.
    wait_for("the refusal to be counted", lambda: daemon.metrics.unreadable.value() >= 1, timeout=5)


def test_a_replayed_frame_is_refused(running: tuple[Daemon, threading.Thread]) -> None:
    daemon, thread = running
    assert daemon.server is not None
    frames = envelope(encode(Message("status", {})), daemon.server.destination)
    first = exchange(daemon.server.endpoint, frames)
    assert json.loads(first[2])["body"]["ok"] is True
    again = refusal(exchange(daemon.server.endpoint, frames))
    assert "refused" in str(again["error"]), again
    still_answers(daemon, thread)


def test_a_report_of_50_deep_huge_events_then_jobs_still_answers(running: tuple[Daemon, threading.Thread]) -> None:
    """The issue's report: 50 history events of the largest size and nesting a report may carry, then ``jobs``."""
    daemon, thread = running
    assert daemon.server is not None
    endpoint = daemon.server.endpoint
    registration = {
        "job_id": "100",
        "endpoint": "tcp://127.0.0.1:9",
        "min_workers": 1,
        "max_workers": 2,
        "gpus_per_worker": 1,
        "partition": "batch",
        "elastic_partition": "elastic",
    }
    deadline = time.monotonic() + 10
    while daemon.last_round is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert request(endpoint, Message("register", registration), timeout_s=10).body["ok"]
    event = {"a": {"b": {"c": ["\x1b[31m" + "z" * 1900]}}}  # nesting 4 (the most a report takes), ~2 KB
    history = [{**event, "n": i} for i in range(50)]
    report = {
        "job_id": "100",
        "size": 2,
        "generation": 1,
        "target": 2,
        "throughput": {"2": 1.0},
        "history": history,
        "satellites": [],
    }
    assert request(endpoint, Message("report", report), timeout_s=10).body["ok"]
    reply = request(endpoint, Message("jobs", {}), timeout_s=10)
    assert reply.body["ok"], reply.body
    (shown,) = reply.body["data"]["jobs"]
    assert shown["history"] and all(e["event"] == "unreadable" for e in shown["history"])
    assert len(encode(reply)) < 64 * 1024
    still_answers(daemon, thread)
