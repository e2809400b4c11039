"""The channel keeps serving whatever arrives, never echoes what it refuses, and turns every failure of a request
into a :class:`ChannelError` (a munged hiccup included), so that no caller's loop dies of a peer's bytes."""

from __future__ import annotations

import json
import threading

import pytest

from slurm_amoeba.core.messages import MAX_MESSAGE_BYTES, Message, decode
from slurm_amoeba.transport import channel
from slurm_amoeba.transport.channel import ChannelError, RequestServer, request
from slurm_amoeba.transport.munge import MungeError, seal
from tests.unit.transport.conftest import send_raw


def _signed(payload: bytes, to: str) -> list[bytes]:
    return [seal(payload, to=to), payload]


HOSTILE = [
    json.dumps({"v": 1, "kind": "\u00e9" * 100_000, "id": "a", "sent_at": 1.0, "body": {}}).encode(),
    b'{"v":1,"kind":"status","id":"a","sent_at":' + b"9" * 5000 + b',"body":{}}',
    b'{"v":1,"kind":"status","id":"a","sent_at":1,"body":' + b"[" * 500 + b"]" * 500 + b"}",
    b"\xff\xfe not utf-8",
]


@pytest.mark.parametrize("payload", HOSTILE, ids=["wide-kind", "huge-int", "deep", "not-utf8"])
def test_a_hostile_request_gets_a_short_refusal_and_the_server_goes_on(server: RequestServer, payload: bytes) -> None:
    answers: list[Message] = []
    thread = threading.Thread(target=lambda: _serve_one(server, answers))
    thread.start()
    reply = send_raw(server.endpoint, _signed(payload, server.destination))
    refusal = decode(reply[1])
    assert refusal.body["ok"] is False and len(reply[1]) < 1000
    assert server.refusals == 1
    ok = request(server.endpoint, Message("status", {}), timeout_s=5)
    thread.join(10)
    assert ok.body["ok"] is True and [m.kind for m in answers] == ["status"]


def _serve_one(server: RequestServer, seen: list[Message]) -> None:
    while True:
        req = server.receive(timeout_s=10)
        if req is None:
            return
        seen.append(req.message)
        server.answer(req, req.message.reply(data={}))
        return


def test_a_reply_too_large_becomes_a_refusal_that_fits(server: RequestServer) -> None:
    def serve() -> None:
        req = server.receive(timeout_s=10)
        assert req is not None
        server.answer(req, req.message.reply(data={"blob": "x" * 60_000, "more": ["y" * 60_000] * 20}))

    thread = threading.Thread(target=serve)
    thread.start()
    reply = request(server.endpoint, Message("status", {}), timeout_s=5, retries=0)
    thread.join(10)
    assert reply.body["ok"] is False and "could not be sent" in reply.body["error"]
    assert str(MAX_MESSAGE_BYTES) in reply.body["error"]


def test_a_munge_failure_while_signing_is_a_channel_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(payload: bytes, **_: object) -> bytes:
        raise MungeError("munged is not answering")

    monkeypatch.setattr(channel, "seal", broken)
    with pytest.raises(ChannelError, match="not sent: munged is not answering"):
        request("tcp://127.0.0.1:9", Message("status", {}), timeout_s=0.1, retries=0)


def test_an_endpoint_zeromq_cannot_use_is_a_channel_error(munged: None) -> None:
    with pytest.raises(ChannelError, match="not sent"):
        request("nonsense://here", Message("status", {}), timeout_s=0.1, retries=0)
