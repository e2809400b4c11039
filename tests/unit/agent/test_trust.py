"""Attacks on a job's agent: hostile frames at its directive server, a squatter on the daemon's port, another user.

The agent's directive server is a real :class:`~slurm_amoeba.transport.channel.ChannelServer` on loopback served
by :meth:`Agent.serve_one` (the call its loop makes); its Slurm and coordinator are the unit fakes. Requests of
another user are signed by ``runuser -u nobody -- munge`` (the venv lives under /root, which ``nobody`` cannot
reach, so only the credential is made as that user), as the daemon's integration tests do.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from slurm_amoeba.agent.agent import Agent
from slurm_amoeba.agent.config import AgentConfig, configured_daemon_uid, read_site_file
from slurm_amoeba.agent.link import DaemonLink
from slurm_amoeba.agent.status import Journal, fit_status
from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.core.messages import MAX_EVENT_BYTES, MAX_MESSAGE_BYTES, Message, decode, encode
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.transport import channel as channel_module
from slurm_amoeba.transport.channel import ChannelServer, reply_destination, request
from slurm_amoeba.transport.munge import EMUNGE_SOCKET, MungeError, binding, seal, unseal
from tests.unit.agent.fakes import (
    PARENT,
    ChannelStandIn,
    FakeClock,
    FakeCoordinator,
    FakeSlurm,
    FakeSteps,
    ServingStandIn,
)

NOBODY = 65534
REGISTRATION = {
    "job_id": "42",
    "endpoint": "tcp://127.0.0.1:1",
    "min_workers": 1,
    "max_workers": 4,
    "gpus_per_worker": 1,
    "partition": "batch",
    "elastic_partition": "elastic",
}


def seal_as(user: str, payload: bytes, to: str) -> bytes:
    """A munge credential for ``payload`` and destination ``to``, made by ``user``."""
    made = subprocess.run(
        ["runuser", "-u", user, "--", "munge"],
        input=binding(payload, to, round(time.time() * 1000)),
        capture_output=True,
        timeout=30,
        check=True,
    )
    return made.stdout.strip()


class Client:
    """Raw frames to the agent's directive server; each answer is read after the agent served one request."""

    def __init__(self, agent: Agent, channel: ChannelServer) -> None:
        self.agent, self.channel = agent, channel
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.REQ)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(channel.endpoint)

    def exchange(self, frames: list[bytes]) -> Message:
        self.sock.send_multipart(frames)
        for _ in range(50):  # a refusal is sent inside serve_one; a request returns from it
            self.agent.serve_one(self.channel, 0.1)
            if self.sock.poll(0):
                break
        assert self.sock.poll(1000), "the agent did not answer"
        credential, payload = self.sock.recv_multipart()
        reply = decode(payload)
        unseal(credential, payload, to=reply_destination(reply.id))
        assert len(payload) < 4096 or reply.body["ok"], "a refusal never echoes what was sent"
        return reply

    def close(self) -> None:
        self.sock.close(linger=0)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, munged: None) -> Iterator[tuple[Agent, Client]]:
    """A 2:8 agent whose main group runs, serving directives on loopback."""
    monkeypatch.setenv("SLURM_JOB_ID", str(PARENT))
    monkeypatch.setenv("AMOEBA_SITE_FILE", str(tmp_path / "absent.conf"))
    config = AgentConfig(
        job_id=str(PARENT),
        spec=ElasticSpec(2, 8, gpus_per_worker=1),
        command=("python", "train.py"),
        state_dir=tmp_path / "state",
        advertise_addr="127.0.0.1",
    )
    coordinator = FakeCoordinator()
    agent = Agent(config, FakeSlurm(), coordinator=coordinator, step_starter=FakeSteps(), clock=FakeClock())
    agent.start_main_group()
    coordinator.members("g0-0", "g0-1")
    channel = ChannelServer("tcp://127.0.0.1:*")
    DESTINATION["to"] = channel.destination
    client = Client(agent, channel)
    yield agent, client
    client.close()
    channel.close()
    agent.shutdown()


def resize(target: int, job_id: str = str(PARENT)) -> Message:
    return Message("resize", {"job_id": job_id, "target": target, "reason": "test"})


DESTINATION = {"to": ""}  # the served channel's destination, set by the fixture (its port is a free one)


def signed(message: Message | bytes) -> list[bytes]:
    payload = message if isinstance(message, bytes) else encode(message)
    return [seal(payload, to=DESTINATION["to"]), payload]


def raw(doc: object) -> bytes:
    return json.dumps(doc).encode()


def envelope(kind: str, body: object, **fields: object) -> dict[str, object]:
    return {"v": 1, "kind": kind, "id": "x1", "sent_at": 1.0, "body": body, **fields}


# Built when a test runs, not at import: munged may not be up yet, and a credential expires (munge TTL).
HOSTILE: dict[str, Callable[[], list[bytes]]] = {
    "one frame": lambda: [b"hello"],
    "three frames": lambda: [b"a", b"b", b"c"],
    "no credential": lambda: [b"", raw(envelope("status", {}))],
    "garbage credential": lambda: [b"MUNGE:garbage:", raw(envelope("status", {}))],
    "not JSON": lambda: signed(b"{not json"),
    "not UTF-8": lambda: signed(b'{"v": 1, "kind": "\xff\xfe"}'),
    "deep": lambda: signed(b"[" * 5000 + b"]" * 5000),
    "huge integer": lambda: signed(
        raw(envelope("resize", {"job_id": "42", "target": 0, "reason": ""})).replace(
            b'"target": 0', b'"target": ' + b"9" * 5000
        )
    ),
    "overflowing time": lambda: signed(raw(envelope("status", {})).replace(b'"sent_at": 1.0', b'"sent_at": 1e400')),
    "NaN": lambda: signed(raw(envelope("status", {})).replace(b'"sent_at": 1.0', b'"sent_at": NaN')),
    "unknown kind, long non-ASCII": lambda: signed(raw(envelope("\u00e9" * 100_000, {}))),
    "wrong body types": lambda: signed(raw(envelope("resize", {"job_id": 42, "target": "3", "reason": None}))),
    "extra fields": lambda: signed(raw(envelope("resize", {"job_id": "42", "target": 3, "reason": "", "x": [[[[]]]]}))),
    "wrong version": lambda: signed(raw(envelope("status", {}, v=2))),
    "a reply as a request": lambda: signed(Message("reply", {"ok": True, "error": "", "data": {}})),
    "a message for the daemon": lambda: signed(Message("drain", {})),
    "batch zero": lambda: signed(raw(envelope("resize", {"job_id": "42", "target": 3, "reason": "", "batch": 0}))),
    "batch over three bytes": lambda: signed(
        raw(envelope("resize", {"job_id": "42", "target": 3, "reason": "", "batch": 1 << 24}))
    ),
    "batch a bool": lambda: signed(raw(envelope("resize", {"job_id": "42", "target": 3, "reason": "", "batch": True}))),
    "batch a float": lambda: signed(raw(envelope("resize", {"job_id": "42", "target": 3, "reason": "", "batch": 8.0}))),
    "batch NaN": lambda: signed(
        raw(envelope("resize", {"job_id": "42", "target": 3, "reason": "", "batch": 1})).replace(
            b'"batch": 1', b'"batch": NaN'
        )
    ),
    "batch huge": lambda: signed(
        raw(envelope("resize", {"job_id": "42", "target": 3, "reason": "", "batch": 1})).replace(
            b'"batch": 1', b'"batch": ' + b"9" * 40
        )
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_frame_is_refused_and_the_agent_answers_the_next_request(
    served: tuple[Agent, Client], name: str
) -> None:
    agent, client = served
    frames = HOSTILE[name]()
    if len(frames) == 2:
        reply = client.exchange(frames)
        assert not reply.body["ok"] and len(reply.body["error"]) <= 400, reply.body["error"]
    else:  # not two frames: refused too (ZeroMQ's REQ socket takes any count)
        reply = client.exchange(frames)
        assert not reply.body["ok"]
    after = client.exchange(signed(resize(3)))
    assert after.body["ok"] and after.body["data"]["target"] == 3 and agent.target == 3


def test_an_oversized_frame_is_dropped_and_the_agent_still_answers(served: tuple[Agent, Client]) -> None:
    agent, client = served
    client.sock.send_multipart([b"x", b"y" * (MAX_MESSAGE_BYTES + 65536)])  # over the socket's MAXMSGSIZE
    agent.serve_one(client.channel, 0.5)
    client.sock.close(linger=0)  # the dropped request gets no answer: a fresh REQ socket for the next one
    fresh = Client(agent, client.channel)
    try:
        assert fresh.exchange(signed(Message("status", {}))).body["ok"]
    finally:
        fresh.close()


def test_a_directives_batch_reaches_the_coordinator_for_the_target_size(served: tuple[Agent, Client]) -> None:
    agent, client = served
    coordinator = agent.coordinator
    assert isinstance(coordinator, FakeCoordinator)
    batched = Message("resize", {"job_id": str(PARENT), "target": 4, "reason": "goodput", "batch": 96})
    reply = client.exchange(signed(batched))
    assert reply.body["ok"] and agent.target == 4
    assert [(c.batch, c.world_size) for c in coordinator.batches] == [(96, 4)]
    assert any(e["event"] == "batch_chosen" and e["batch"] == 96 for e in agent.journal.history)
    assert client.exchange(signed(resize(3))).body["ok"] and len(coordinator.batches) == 1, "no batch: none sent"
    outside = Message("resize", {"job_id": str(PARENT), "target": 9, "reason": "", "batch": 96})
    refused = client.exchange(signed(outside))
    assert not refused.body["ok"] and agent.target == 3 and len(coordinator.batches) == 1


def test_a_directive_of_a_deposed_daemon_is_refused_once_a_newer_one_directed_the_job(
    served: tuple[Agent, Client],
) -> None:
    agent, client = served

    def fenced(target: int, fence: int) -> Message:
        return Message("resize", {"job_id": str(PARENT), "target": target, "reason": "policy", "fence": fence})

    assert client.exchange(signed(fenced(4, 2))).body["ok"] and agent.target == 4  # the new active daemon
    late = client.exchange(signed(fenced(6, 1)))  # the old one, paused, wakes and sends what it had decided
    assert not late.body["ok"] and "lease generation 1 refused" in late.body["error"] and agent.target == 4
    assert client.exchange(signed(resize(3))).body["ok"] and agent.target == 3  # the owner's carry no fence


def test_a_replayed_directive_is_refused(served: tuple[Agent, Client]) -> None:
    agent, client = served
    frames = signed(resize(4))
    assert client.exchange(frames).body["ok"] and agent.target == 4
    agent.resize(2)
    replayed = client.exchange(frames)
    assert not replayed.body["ok"] and "replay" in replayed.body["error"].lower() and agent.target == 2


def test_a_handler_that_fails_costs_one_refusal_not_the_agent(
    served: tuple[Agent, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, client = served

    def broken(target: int, reason: str = "", batch: int | None = None) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(agent, "resize", broken)
    reply = client.exchange(signed(resize(3)))
    assert not reply.body["ok"] and "RuntimeError" in reply.body["error"] and "a bug" not in reply.body["error"]
    monkeypatch.undo()
    assert client.exchange(signed(resize(3))).body["ok"]


def test_another_user_can_neither_resize_nor_read_the_job(served: tuple[Agent, Client]) -> None:
    agent, client = served
    for message in (resize(8), Message("status", {})):
        payload = encode(message)
        reply = client.exchange([seal_as("nobody", payload, client.channel.destination), payload])
        assert not reply.body["ok"] and f"uid {NOBODY} may not" in reply.body["error"]
        assert not reply.body["data"], "nothing of the job in a refusal"
    assert agent.target == 2
    mine = client.exchange(signed(Message("status", {})))
    assert mine.body["ok"] and mine.body["data"]["target"] == 2


def test_a_status_with_a_huge_history_still_fits_one_message(served: tuple[Agent, Client]) -> None:
    agent, client = served
    for i in range(1000):
        agent.journal.event("grow_failed", error="\u00e9" * 10_000, i=i, nested=[[["x" * 3000]]])
    assert all(len(json.dumps(e)) <= MAX_EVENT_BYTES for e in agent.journal.history)
    reply = client.exchange(signed(Message("status", {})))
    assert reply.body["ok"] and reply.body["data"]["history"], "the newest events stay"


def test_fit_status_cuts_the_oldest_entries_until_the_document_fits() -> None:
    doc = {
        "job_id": "42",
        "series": [{"t": i, "pad": "x" * 100} for i in range(20000)],
        "history": [{"t": i} for i in range(10)],
    }
    fitted = fit_status(doc, budget=100_000)
    assert fitted["truncated"] and len(json.dumps(fitted)) <= 100_000
    assert fitted["series"][-1]["t"] == 19999 and fitted["history"] == doc["history"]
    assert fit_status({"job_id": "42"}) == {"job_id": "42"}


def test_journal_events_are_bounded_in_bytes() -> None:
    journal = Journal(lambda: 1.0)
    journal.event("grow_failed", error="e" * 10_000)
    journal.event("odd", **{f"k{i}": i for i in range(1000)})
    first, second = journal.history
    assert len(first["error"]) <= 256 and first["event"] == "grow_failed"
    assert second == {"t": 1.0, "event": "odd", "truncated": True}


# ------------------------------------------------------------------------------------------- the daemon's identity


def test_the_daemon_uid_comes_from_the_job_environment_else_the_site_file(tmp_path: Path) -> None:
    site = tmp_path / "daemon.conf"
    assert configured_daemon_uid({"AMOEBA_SITE_FILE": str(site)}) is None, "no file: not configured"
    site.write_text("# amoebad's identity\ndaemon_user = nobody  # the daemon's account\n")
    assert configured_daemon_uid({"AMOEBA_SITE_FILE": str(site)}) == NOBODY
    assert configured_daemon_uid({"AMOEBA_SITE_FILE": str(site), "AMOEBA_DAEMON_UID": "990"}) == 990
    site.write_text("daemon_uid = 991\n")
    assert read_site_file(site) == 991


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("daemon_uid = -1\n", "not a uid"),
        ("daemon_uid = 99999999999\n", "not a uid"),
        ("daemon_user = no-such-user-here\n", "no user on this node"),
        ("daemon_uid\n", "not key = value"),
    ],
)
def test_a_malformed_site_file_is_an_error_naming_the_line(tmp_path: Path, text: str, match: str) -> None:
    site = tmp_path / "daemon.conf"
    site.write_text(text)
    with pytest.raises(SpecError, match=match) as error:
        read_site_file(site)
    assert f"{site}:1" in str(error.value)


def test_a_malformed_daemon_uid_variable_is_an_error() -> None:
    with pytest.raises(SpecError, match="AMOEBA_DAEMON_UID"):
        configured_daemon_uid({"AMOEBA_DAEMON_UID": "root"})


class Squatter(ServingStandIn):
    """Binds the daemon's port as ``nobody`` would: answers every request "ok", signed by nobody's munge."""

    def __init__(self) -> None:
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port: int = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        super().__init__()

    def serve_once(self) -> None:
        if not self.sock.poll(50):
            return
        *route, _, payload = self.sock.recv_multipart()
        message = decode(payload)
        self.kinds.append(message.kind)
        answer = encode(message.reply())
        credential = seal_as("nobody", answer, reply_destination(message.id))
        self.sock.send_multipart([*route, credential, answer])

    def release(self) -> None:
        self.sock.close(linger=0)


@pytest.fixture
def squatter(munged: None) -> Iterator[Squatter]:
    fake = Squatter()
    yield fake
    fake.close()


def test_a_squatter_on_the_daemons_port_is_neither_registered_with_nor_obeyed(
    squatter: Squatter, served: tuple[Agent, Client], caplog: pytest.LogCaptureFixture
) -> None:
    agent, client = served
    link = DaemonLink(squatter.endpoint, owner_uid=os.getuid(), prefix="[42/agent]", daemon_uid=990)
    with caplog.at_level(logging.WARNING):
        link.register(REGISTRATION)
        link.register(REGISTRATION)
    assert squatter.kinds == ["register", "register"] and not link.registered
    assert sum("is not trusted" in r.getMessage() for r in caplog.records) == 1, "logged once"
    assert not link.may_direct(NOBODY)
    agent.link = link
    payload = encode(resize(8))
    reply = client.exchange([seal_as("nobody", payload, client.channel.destination), payload])
    assert not reply.body["ok"] and agent.target == 2, "the squatter's resize is refused"


@pytest.fixture
def daemon_here(munged: None) -> Iterator[ChannelServer]:
    """A daemon of this process's uid on loopback that answers every request "ok"."""
    stand_in = ChannelStandIn()
    try:
        yield stand_in.server
    finally:
        stand_in.close()


def test_the_pinned_daemon_is_trusted(daemon_here: ChannelServer) -> None:
    link = DaemonLink(daemon_here.endpoint, owner_uid=1234, prefix="[42/agent]", daemon_uid=os.getuid())
    link.register(REGISTRATION)
    assert link.registered and link.may_direct(os.getuid())
    assert request(daemon_here.endpoint, Message("status", {}), expect_uid=os.getuid()).body["ok"]


def test_a_munged_hiccup_costs_a_report_and_an_answer_never_the_agent(
    served: tuple[Agent, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, client = served
    frames = signed(Message("status", {}))  # signed while munged still answers

    def munged_down(payload: bytes, **_: object) -> bytes:
        raise MungeError("Failed to connect to munged: Connection refused")

    monkeypatch.setattr(channel_module, "seal", munged_down)
    link = DaemonLink("tcp://127.0.0.1:9", owner_uid=os.getuid(), prefix="[42/agent]", daemon_uid=os.getuid())
    link.register(REGISTRATION)  # signing fails: ChannelError inside, logged
    link.report({"job_id": "42"})
    assert not link.registered
    client.sock.send_multipart(frames)
    agent.serve_one(client.channel, 0.5)  # the answer cannot be signed: logged, not raised
    assert not client.sock.poll(200)
    monkeypatch.undo()
    client.close()
    fresh = Client(agent, client.channel)
    try:
        assert fresh.exchange(signed(Message("status", {}))).body["ok"]
    finally:
        fresh.close()


def test_a_munged_restart_is_logged_once_and_its_end_too(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, daemon_here: ChannelServer
) -> None:
    def munged_down(payload: bytes, **_: object) -> bytes:
        raise MungeError("Failed to connect to munged: Connection refused", EMUNGE_SOCKET)

    link = DaemonLink(daemon_here.endpoint, owner_uid=1234, prefix="[42/agent]", daemon_uid=os.getuid())
    with caplog.at_level(logging.WARNING):
        monkeypatch.setattr(channel_module, "seal", munged_down)
        link.register(REGISTRATION)
        for _ in range(3):
            link.report({"job_id": "42"})
        monkeypatch.undo()
        link.register(REGISTRATION)
        link.report({"job_id": "42"})
    lines = [r.getMessage() for r in caplog.records]
    assert sum("munged does not sign" in line for line in lines) == 1, lines
    assert sum("munged signs again: the register reached the daemon" in line for line in lines) == 1, lines
    assert link.registered and link.endpoint == daemon_here.endpoint, "the link kept its daemon"


def test_a_directives_vacate_reaches_the_agents_next_round(served: tuple[Agent, Client]) -> None:
    agent, client = served
    moved = Message("resize", {"job_id": str(PARENT), "target": 2, "reason": "move", "vacate": "n3"})
    assert client.exchange(signed(moved)).body["ok"]
    assert agent.observe().vacate == "n3" and agent.observe().vacate == ""  # one round's order
    assert any(e["event"] == "move_requested" and e["node"] == "n3" for e in agent.journal.history)
