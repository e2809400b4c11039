"""The versioned JSON messages of the control flow: round trips and every kind of bad input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_amoeba.core.messages import MAX_MESSAGE_BYTES, Message, ProtocolError, decode, encode


def test_a_message_survives_a_round_trip() -> None:
    msg = Message("resize", {"job_id": "12", "target": 4, "reason": "idle GPUs"})
    back = decode(encode(msg))
    assert (back.kind, dict(back.body), back.id) == ("resize", dict(msg.body), msg.id)
    reply = back.reply(data={"size": 2})
    assert decode(encode(reply)).body == {"ok": True, "error": "", "data": {"size": 2}} and reply.id == msg.id


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"v": 2, "kind": "status", "id": "a", "sent_at": 1.0, "body": {}}, "version 2 is not supported"),
        ({"v": 1, "kind": "launch", "id": "a", "sent_at": 1.0, "body": {}}, "unknown message kind 'launch'"),
        ({"v": 1, "kind": "pin", "id": "a", "sent_at": 1.0, "body": {"job_id": "1"}}, "missing field"),
        ({"v": 1, "kind": "pin", "id": "a", "sent_at": 1.0, "body": {"job_id": "1", "pinned": 1}}, "'pinned' is 1"),
        (
            {
                "v": 1,
                "kind": "resize",
                "id": "a",
                "sent_at": 1.0,
                "body": {"job_id": "1", "target": True, "reason": ""},
            },
            "'target' is True",
        ),
        ({"v": 1, "kind": "status", "id": "a", "sent_at": 1.0, "body": {"x": 1}}, "unknown field"),
        ({"v": 1, "kind": "status", "id": "", "sent_at": 1.0, "body": {}}, "message id"),
        ([1, 2], "not an object"),
    ],
)
def test_malformed_messages_raise_protocol_errors_naming_the_problem(doc: object, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode(json.dumps(doc).encode())


def test_huge_messages_are_refused_both_ways() -> None:
    with pytest.raises(ProtocolError, match="over the"):
        decode(b" " * (MAX_MESSAGE_BYTES + 1))
    with pytest.raises(ProtocolError, match="over the"):
        encode(Message("reply", {"ok": True, "error": "x" * MAX_MESSAGE_BYTES, "data": {}}))


@given(st.binary(max_size=300))
def test_random_bytes_raise_only_protocol_errors(data: bytes) -> None:
    try:
        decode(data)
    except ProtocolError:
        pass
