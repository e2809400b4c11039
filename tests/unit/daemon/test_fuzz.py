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
from slurm_amoeba.transport.channel import request
from slurm_amoeba.transport.munge import seal


def envelope(payload: bytes) -> list[bytes]:
    return [b"", seal(payload), payload]


def signed_json(doc: object) -> list[bytes]:
    return envelope(json.dumps(doc).encode())


def garbage(rng: random.Random) -> list[bytes]:
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
        return signed_json({**good, "v": rng.choice([0, 2, "1", None, 1.5])})
    if choice == 3:
        return signed_json({**good, "kind": rng.choice(["explode", "", 7, "reply"])})
    if choice == 4:
        body = dict(good["body"])
        body[rng.choice(list(body))] = rng.choice([None, -1, 2**60, "x" * 50, [], {}, True, 1e308])
        return signed_json({**good, "body": body})
    if choice == 5:
        body = {
            **good["body"],
            "throughput": {rng.choice(["-1", "0", "x", "1e9", "٣"]): rng.choice([1.0, -5.0, "fast"])},
        }
        return signed_json({**good, "body": body})
    if choice == 6:
        return envelope(b"[" * 100_000 + b"]" * 100_000)  # deep nesting
    if choice == 7:
        return envelope(rng.randbytes(rng.randrange(1, 2000)))  # signed, not JSON
    if choice == 8:
        payload = json.dumps(good).encode()
        return [b"", seal(payload + b" "), payload]  # a credential for other bytes
    if choice == 9:
        payload = json.dumps(good).encode()
        cred = seal(payload)
        return [b"", cred, payload, b"extra"]
    if choice == 10:
        return [b"", b"x" * (2 << 20)]  # over the socket's size limit
    body = {**good["body"], "satellites": [rng.choice(["1; rm -rf /", -1, None, "123"])], "job_id": "100"}
    return signed_json({**good, "body": body})


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
        frames = garbage(rng)
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
