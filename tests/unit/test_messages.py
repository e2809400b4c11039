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


def _raw(body: object, kind: object = "status", **top: object) -> bytes:
    return json.dumps({"v": 1, "kind": kind, "id": "a", "sent_at": 1.0, "body": body, **top}).encode()


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b'{"v":1,"kind":"status","id":"a","sent_at":1' + b"0" * 5000 + b',"body":{}}', "5001 digits"),
        (_raw({}, sent_at=10**400), "digits"),
        (b'{"v":1,"kind":"status","id":"a","sent_at":NaN,"body":{}}', "NaN is not a number"),
        (_raw({}, kind="\u00e9" * 50_000), r"unknown message kind '\\xe9"),
        (b'{"v":1,"kind":"status","id":"a","sent_at":1,"body":{},"x":' + b"[" * 50 + b"]" * 50 + b"}", "nesting"),
        (b"[" * 100_000 + b"]" * 100_000, "nesting|not UTF-8 JSON"),
        (_raw({}, kind="s" * 70_000), "string of 70000 characters"),
    ],
)
def test_hostile_frames_are_refused_with_a_short_sentence(data: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match) as info:
        decode(data)
    assert len(str(info.value)) < 400  # never an echo of what was sent


def _report(history: list[object], throughput: dict[str, float] | None = None) -> Message:
    body = {"job_id": "1", "size": 2, "generation": 1, "target": 2, "history": history, "satellites": []}
    return Message("report", {**body, "throughput": throughput or {}})


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (_report([{"event": "x"}] * 65), "65 history events"),
        (_report([{"event": "x" * 3000}]), "history event of"),
        (_report([], {str(i): 1.0 for i in range(2000)}), "2000 throughput entries"),
    ],
)
def test_reports_are_bounded(message: Message, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        encode(message)
    raw = json.dumps(
        {"v": 1, "kind": "report", "id": "a", "sent_at": 1.0, "body": dict(message.body)}, separators=(",", ":")
    )
    with pytest.raises(ProtocolError, match=match):
        decode(raw.encode())


def test_a_report_may_state_the_device_memory_a_worker_peaked_at_and_nothing_out_of_range() -> None:
    body = {"job_id": "1", "size": 2, "generation": 1, "target": 2, "history": [], "satellites": [], "throughput": {}}
    assert decode(encode(Message("report", {**body, "memory_gib": 12.5}))).body["memory_gib"] == 12.5
    for bad in (-1.0, float("inf"), 1e9):
        with pytest.raises(ProtocolError, match="memory_gib"):
            encode(Message("report", {**body, "memory_gib": bad}))
    with pytest.raises(ProtocolError, match="memory_gib"):
        encode(Message("report", {**body, "memory_gib": "12"}))


def test_quote_is_ascii_and_short() -> None:
    from slurm_amoeba.core.messages import quote

    assert quote("a\nb\x1b[31m") == "'a\\nb\\x1b[31m'"
    assert quote("\u00e9" * 1000, 20) == "'\\xe9\\xe9\\xe9\\xe9..." and len(quote("x" * 1000, 20)) == 20


ADAPTIVE = {
    "global_batch": 64,
    "base_batch": 32,
    "max_batch": 512,
    "noise_scale": 250.0,
    "step_time_s": [[2, 32, 0.05, 10], [2, 64, 0.08, 30]],
}
REPORT = {"job_id": "7", "size": 2, "generation": 3, "target": 2, "throughput": {}, "history": [], "satellites": []}


def test_an_adaptive_report_and_a_batched_directive_survive_a_round_trip() -> None:
    full = {**ADAPTIVE, "efficiency": 0.9, "measured_steps": 4, "policy_batch": None, "batch_source": "runtime"}
    back = decode(encode(Message("report", {**REPORT, "adaptive": full})))
    assert back.body["adaptive"] == full
    assert decode(encode(Message("report", {**REPORT, "adaptive": {**ADAPTIVE, "noise_scale": None}}))).body
    resize = decode(encode(Message("resize", {"job_id": "7", "target": 4, "reason": "goodput", "batch": 96})))
    assert resize.body["batch"] == 96


def _report_bytes(adaptive: object, *, raw: tuple[bytes, bytes] | None = None) -> bytes:
    doc = {"v": 1, "kind": "report", "id": "r", "sent_at": 1.0, "body": {**REPORT, "adaptive": adaptive}}
    data = json.dumps(doc).encode()
    return data.replace(*raw) if raw else data


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (_report_bytes(ADAPTIVE, raw=(b'"noise_scale": 250.0', b'"noise_scale": NaN')), "not a number"),
        (_report_bytes(ADAPTIVE, raw=(b'"noise_scale": 250.0', b'"noise_scale": 1e400')), "not a finite"),
        (_report_bytes(ADAPTIVE, raw=(b'"noise_scale": 250.0', b'"noise_scale": -Infinity')), "not a number"),
        (_report_bytes(ADAPTIVE, raw=(b"[2, 64, 0.08, 30]", b"[2, 64, 1e999, 30]")), "is not \\[workers"),
        (_report_bytes(ADAPTIVE, raw=(b'"global_batch": 64', b'"global_batch": ' + b"9" * 19)), "19 digits"),
        (_report_bytes(ADAPTIVE, raw=(b'"global_batch": 64', b'"global_batch": 99999999999999999')), "out of|finite"),
        (_report_bytes({**ADAPTIVE, "global_batch": 64.0}), "'global_batch'"),
        (_report_bytes({**ADAPTIVE, "global_batch": True}), "'global_batch'"),
        (_report_bytes({**ADAPTIVE, "noise_scale": "250"}), "'noise_scale'"),
        (_report_bytes({**ADAPTIVE, "step_time_s": {"2": 0.1}}), "'step_time_s'"),
        (_report_bytes({**ADAPTIVE, "step_time_s": [[2, 32, 0.05]]}), "is not \\[workers"),
        (_report_bytes({**ADAPTIVE, "step_time_s": [[2, 32, "0.05", 1]]}), "is not \\[workers"),
        (_report_bytes({**ADAPTIVE, "step_time_s": [[2, 32, 0.05, 1]] * 33}), "33 entries"),
        (_report_bytes({**ADAPTIVE, "batch_source": "x" * 17}), "longer than 16"),
        (_report_bytes({**ADAPTIVE, "lr_rule": "sgd"}), "unknown field"),
        (_report_bytes({k: v for k, v in ADAPTIVE.items() if k != "max_batch"}), "missing 'max_batch'"),
        (_report_bytes([ADAPTIVE]), "'adaptive' is"),
        (_report_bytes({**ADAPTIVE, "step_time_s": [[[[[[[1]]]]]]]}), "nesting deeper"),
    ],
)
def test_hostile_adaptive_statistics_are_refused(data: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode(data)


@pytest.mark.parametrize("batch", [0, -3, 1 << 24, True, 8.0, "8", None])
def test_a_directives_batch_is_a_global_batch_of_three_bytes(batch: object) -> None:
    with pytest.raises(ProtocolError, match="batch"):
        encode(Message("resize", {"job_id": "7", "target": 4, "reason": "", "batch": batch}))


def test_a_directive_may_name_one_node_to_vacate() -> None:
    back = decode(encode(Message("resize", {"job_id": "7", "target": 4, "reason": "", "vacate": "gpu-n01.rack2"})))
    assert back.body["vacate"] == "gpu-n01.rack2"


@pytest.mark.parametrize("node", ["", "n[1-2]", "n1,n2", "-n1", "n 1", "x" * 65, 3, None])
def test_vacate_is_one_node_name(node: object) -> None:
    with pytest.raises(ProtocolError, match="vacate"):
        encode(Message("resize", {"job_id": "7", "target": 4, "reason": "", "vacate": node}))


PLACE = {
    "host": "77",
    "partition": "share",
    "nodes": {"s1": 2},
    "role": "opportunistic",
    "host_uid": 1001,
    "status_path": "/dev/shm/amoeba-share-77.json",
    "pace_bound": 0.05,
    "sub_batch": 8,
}


def test_a_directive_may_place_workers_beside_another_job_and_a_registration_name_its_sharing_mode() -> None:
    back = decode(encode(Message("resize", {"job_id": "7", "target": 4, "reason": "", "place_beside": PLACE})))
    assert back.body["place_beside"] == PLACE
    capped = {**PLACE, "memory_cap_bytes": 6 << 30}
    back = decode(encode(Message("resize", {"job_id": "7", "target": 4, "reason": "", "place_beside": capped})))
    assert back.body["place_beside"]["memory_cap_bytes"] == 6 << 30
    body = {"job_id": "7", "endpoint": "tcp://h:1", "min_workers": 1, "max_workers": 2, "gpus_per_worker": 1}
    body |= {"partition": "batch", "elastic_partition": "elastic", "share": "guaranteed", "share_partition": "share"}
    assert decode(encode(Message("register", body))).body["share"] == "guaranteed"
    with pytest.raises(ProtocolError, match="register: share 'always' is not one of guaranteed, opportunistic"):
        encode(Message("register", {**body, "share": "always"}))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"host": "x7"}, "host 'x7' is not a job id"),
        ({"partition": "a b"}, "partition 'a b' is not a partition name"),
        ({"role": "owner"}, "role 'owner' is not one of"),
        ({"nodes": {}}, "is not 1 to 64 nodes"),
        ({"nodes": {"n[1-2]": 1}}, "node 'n\\[1-2\\]' is not a node name"),
        ({"nodes": {"s1": 0}}, "nodes\\['s1'\\] = 0 is not 1 to 64 workers"),
        ({"nodes": {"s1": True}}, "nodes\\['s1'\\] = True is not 1 to 64 workers"),
        ({"extra": 1}, "place_beside has fields"),
        ({"host_uid": -1}, "host_uid -1 is not a uid"),
        ({"host_uid": "1001"}, "host_uid '1001' is not a uid"),
        ({"status_path": "shm/x.json"}, "status_path 'shm/x.json' is not an absolute file path"),
        ({"status_path": "/dev/shm/a b"}, "is not an absolute file path"),
        ({"pace_bound": 1.0}, "pace_bound 1.0 is not a fraction from 0 to under 1"),
        ({"pace_bound": True}, "pace_bound True is not a fraction"),
        ({"sub_batch": -1}, "sub_batch -1 is not a micro-batch of 0 or more"),
        ({"memory_cap_bytes": -1}, "memory_cap_bytes -1 is not a byte count of 0 or more"),
        ({"memory_cap_bytes": 2.5}, "memory_cap_bytes 2.5 is not a byte count"),
    ],
)
def test_a_place_beside_that_is_not_well_formed_is_refused_naming_the_field(
    change: dict[str, object], match: str
) -> None:
    place = {**PLACE, **change}
    with pytest.raises(ProtocolError, match=match):
        encode(Message("resize", {"job_id": "7", "target": 4, "reason": "", "place_beside": place}))
