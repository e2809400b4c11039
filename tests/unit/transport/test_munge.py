"""Credentials name their destination and their send time, and are taken once (a real munged: the ``munged``
fixture reuses the cluster's or starts one)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from slurm_amoeba.core.messages import Message, decode, encode
from slurm_amoeba.transport.channel import ChannelError, RequestServer, destination, reply_destination, request
from slurm_amoeba.transport.munge import (
    CLOCK_SKEW_S,
    EMUNGE_CRED_REPLAYED,
    MAX_AGE_S,
    MungeError,
    ReplayCache,
    seal,
    unseal,
)
from tests.unit.transport.conftest import send_raw
from tests.waiting import wait_until

PAYLOAD = b'{"v": 1}'


def test_a_credential_says_who_sent_it_and_when(munged: None) -> None:
    before = time.time()
    who = unseal(seal(PAYLOAD, to="tcp port 6820"), PAYLOAD, to="tcp port 6820")
    assert who.uid == os.getuid() and who.gid == os.getgid()
    assert before - 0.01 <= who.sent_at <= time.time() + 0.01


def test_a_credential_for_another_destination_is_refused_naming_both(munged: None) -> None:
    credential = seal(PAYLOAD, to="tcp port 41234")
    with pytest.raises(MungeError, match="made for 'tcp port 41234', not for 'tcp port 6820'"):
        unseal(credential, PAYLOAD, to="tcp port 6820")


def test_a_credential_for_other_bytes_is_refused(munged: None) -> None:
    with pytest.raises(MungeError, match="another message"):
        unseal(seal(PAYLOAD, to="x"), PAYLOAD + b" ", to="x")


@pytest.mark.parametrize(
    ("shift", "says"),
    [(-(MAX_AGE_S + CLOCK_SKEW_S + 5), "ago, more than"), (CLOCK_SKEW_S + 5, "in this host's future")],
    ids=["too old", "from the future"],
)
def test_a_credential_outside_the_age_bound_is_refused(munged: None, shift: float, says: str) -> None:
    credential = seal(PAYLOAD, to="x", sent_at=time.time() + shift)
    with pytest.raises(MungeError, match=says):
        unseal(credential, PAYLOAD, to="x")


def test_clocks_within_the_skew_allowance_are_taken(munged: None) -> None:
    ahead = seal(PAYLOAD, to="x", sent_at=time.time() + CLOCK_SKEW_S - 2)
    late = seal(PAYLOAD, to="x", sent_at=time.time() - MAX_AGE_S - CLOCK_SKEW_S + 2)
    assert unseal(ahead, PAYLOAD, to="x").uid == os.getuid()
    assert unseal(late, PAYLOAD, to="x").uid == os.getuid()


def test_munged_refuses_a_replay_and_says_so(munged: None) -> None:
    credential = seal(PAYLOAD, to="x")
    unseal(credential, PAYLOAD, to="x")
    with pytest.raises(MungeError, match=r"Replayed credential \(17\)") as caught:
        unseal(credential, PAYLOAD, to="x")
    assert caught.value.replayed and caught.value.code == EMUNGE_CRED_REPLAYED and not caught.value.unreachable


def test_the_replay_cache_refuses_a_second_use_and_forgets_old_ones() -> None:
    cache = ReplayCache(keep_s=10, size=3)
    cache.check(b"a", now=0)
    with pytest.raises(MungeError, match="replayed") as caught:
        cache.check(b"a", now=1)
    assert caught.value.replayed
    cache.check(b"b", now=20)  # "a" is older than keep_s: forgotten (munge's age bound refuses it by then)
    cache.check(b"a", now=21)
    for name in (b"c", b"d", b"e"):  # over size: the oldest goes
        cache.check(name, now=22)
    cache.check(b"b", now=23)


@contextlib.contextmanager
def _serving(server: RequestServer) -> Iterator[None]:
    """Answer ``server``'s valid requests on a thread until the block ends.

    A refused request is answered inside ``receive``, which then waits on for a valid one: the loop stops when the
    test has its replies instead of waiting out a receive timeout.
    """
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            req = server.receive(timeout_s=0.05)
            if req is not None:
                server.answer(req, req.message.reply())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def test_the_server_refuses_a_request_made_for_another_port_and_says_why(server: RequestServer) -> None:
    assert server.destination == destination(server.endpoint) and server.destination.startswith("tcp port ")
    message = Message("status", {})
    payload = encode(message)
    with _serving(server):
        credential, answer = send_raw(server.endpoint, [seal(payload, to="tcp port 6820"), payload])
    reply = decode(answer)
    unseal(credential, answer, to=reply_destination(message.id))  # the refusal answers that request
    assert reply.id == message.id and not reply.body["ok"]
    assert "made for 'tcp port 6820'" in reply.body["error"]
    # a front process counts its refusal on the server's side as the serving thread reads on
    wait_until("the refusal counted", lambda: server.refusals == 1, timeout=5)
    assert server.refusals == 1


def test_the_server_takes_a_credential_once(server: RequestServer) -> None:
    payload = encode(Message("status", {}))
    frames = [seal(payload, to=server.destination), payload]
    with _serving(server):
        first = decode(send_raw(server.endpoint, frames)[1])
        again = decode(send_raw(server.endpoint, frames)[1])
    assert first.body["ok"] and not again.body["ok"] and "eplayed" in again.body["error"]


def test_a_reply_made_for_another_request_is_not_trusted(munged: None) -> None:
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    stale = encode(Message("reply", {"ok": True, "error": "", "data": {}}, id="an-old-request"))
    replay = [seal(stale, to=reply_destination("an-old-request")), stale]

    def answer_with_an_old_reply() -> None:
        if sock.poll(5000):
            *route, _, _, _ = sock.recv_multipart()
            sock.send_multipart([*route, b"", *replay])  # a genuine reply, signed for another request

    thread = threading.Thread(target=answer_with_an_old_reply, daemon=True)
    thread.start()
    try:
        with pytest.raises(ChannelError, match="could not be trusted: .*made for 'reply an-old-request'"):
            request(f"tcp://127.0.0.1:{port}", Message("status", {}), timeout_s=5, retries=0)
    finally:
        thread.join(10)
        sock.close(linger=0)
