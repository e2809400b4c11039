"""The agent's link to the daemon, against a stand-in daemon on loopback: registration, reports, who may direct.

The stand-in is a real channel server in a thread (munge credentials included); it forgets the job once, as a
restarted daemon does, and the link registers again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from slurm_amoeba.agent import link as link_module
from slurm_amoeba.agent.link import DaemonLink
from slurm_amoeba.core.messages import RETRY_SOON, STANDBY, Message
from slurm_amoeba.transport.channel import ChannelServer
from tests.unit.agent.fakes import ChannelStandIn

REGISTRATION = {
    "job_id": "42",
    "endpoint": "tcp://127.0.0.1:1",
    "min_workers": 1,
    "max_workers": 4,
    "gpus_per_worker": 1,
    "partition": "batch",
    "elastic_partition": "elastic",
}
REPORT = {"job_id": "42", "size": 1, "generation": 1, "target": 1, "throughput": {}, "history": [], "satellites": []}


class StandInDaemon(ChannelStandIn):
    """Answers registrations; answers the first report with "unknown job" (it restarted), later ones with ok."""

    def __init__(self, not_read_yet: int = 0) -> None:
        self.not_read_yet = not_read_yet  # registrations refused as "reading Slurm's record" before one is taken
        self._forgot = False
        super().__init__()

    def answer(self, message: Message) -> Message:
        if message.kind == "register" and self.not_read_yet > 0:
            self.not_read_yet -= 1
            return message.reply(
                ok=False, error=f"job 42: the daemon is reading Slurm's record of its submission; {RETRY_SOON}"
            )
        if message.kind == "report" and not self._forgot:
            self._forgot = True
            return message.reply(ok=False, error="unknown job 42; register first")
        return message.reply()


@pytest.fixture
def daemon(munged: None) -> Iterator[StandInDaemon]:
    stand_in = StandInDaemon()
    yield stand_in
    stand_in.close()


def test_a_registered_agent_takes_directives_from_its_owner_and_the_daemon_only(daemon: StandInDaemon) -> None:
    link = DaemonLink(daemon.server.endpoint, owner_uid=1234, prefix="[42/agent]", daemon_uid=os.getuid())
    link.register(REGISTRATION)
    assert daemon.kinds == ["register"] and link.registered and link.daemon_uid == os.getuid()
    assert link.may_direct(1234) and link.may_direct(os.getuid()) and not link.may_direct(4321)


def test_without_a_configured_identity_a_daemon_of_another_uid_is_not_trusted(daemon: StandInDaemon) -> None:
    link = DaemonLink(daemon.server.endpoint, owner_uid=1234, prefix="[42/agent]")
    link.register(REGISTRATION)
    link.report(REPORT)
    assert daemon.kinds == ["register"], "one answer of uid 0 and the job runs without a daemon"
    assert not link.registered and link.endpoint is None and link.daemon_uid == 1234
    assert not link.may_direct(os.getuid()), "the answerer's uid is not the daemon's"


def test_a_report_the_daemon_does_not_know_registers_again(daemon: StandInDaemon) -> None:
    link = DaemonLink(daemon.server.endpoint, owner_uid=os.getuid(), prefix="[42/agent]")
    link.register(REGISTRATION)
    link.report(REPORT)
    link.report(REPORT)
    assert daemon.kinds == ["register", "report", "register", "report"]


def test_without_a_daemon_nothing_is_sent_and_only_the_owner_directs() -> None:
    link = DaemonLink(None, owner_uid=1234, prefix="[42/agent]")
    link.register(REGISTRATION)
    link.report(REPORT)
    assert not link.registered and link.may_direct(1234) and not link.may_direct(0) and not link.may_read(4321)


def test_a_registration_the_daemon_cannot_vet_yet_is_sent_again_within_seconds(
    munged: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(link_module, "REGISTER_RETRY_S", 0.01)
    stand_in = StandInDaemon(not_read_yet=2)
    try:
        link = DaemonLink(stand_in.server.endpoint, owner_uid=1234, prefix="[42/agent]", daemon_uid=os.getuid())
        link.register(REGISTRATION)
        assert stand_in.kinds == ["register"] * 3 and link.registered, "not at the next report, seconds later"
    finally:
        stand_in.close()


class StandInStandby(ChannelStandIn):
    """A standby daemon: answers everything with "standby, the active one is X"."""

    def __init__(self, active: str) -> None:
        self.active = active
        super().__init__()

    def answer(self, message: Message) -> Message:
        data = {"role": STANDBY, "active": self.active, "generation": 3}
        return message.reply(ok=False, error="this amoebad is the standby", data=data)


def test_an_agent_told_by_the_standby_where_the_active_daemon_is_registers_there(daemon: StandInDaemon) -> None:
    standby = StandInStandby(daemon.server.endpoint)
    try:
        both = f"{standby.server.endpoint}, {daemon.server.endpoint}"
        link = DaemonLink(both, owner_uid=1234, prefix="[42/agent]", daemon_uid=os.getuid())
        link.register(REGISTRATION)
        assert standby.kinds == ["register"] and daemon.kinds == ["register"]
        assert link.registered and link.endpoint == daemon.server.endpoint
    finally:
        standby.close()


def test_an_agent_whose_daemon_stops_answering_turns_to_the_next_address(
    daemon: StandInDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(link_module, "REGISTER_TIMEOUT_S", 1.0)  # the dead address costs 2 s, not 6 s
    dead = ChannelServer("tcp://127.0.0.1:*")  # bound, never answers: a daemon killed with SIGKILL
    try:
        link = DaemonLink(f"{dead.endpoint},{daemon.server.endpoint}", 1234, "[42/agent]", daemon_uid=os.getuid())
        link.register(REGISTRATION)
        assert not link.registered and link.endpoint == daemon.server.endpoint
        link.report(REPORT)  # the new active daemon forgot the job ("unknown job"): the agent registers there
        assert daemon.kinds == ["report", "register"] and link.registered
    finally:
        dead.close()


def test_a_directive_of_an_older_lease_generation_is_refused() -> None:
    link = DaemonLink("tcp://a:1,tcp://b:1", owner_uid=1234, prefix="[42/agent]", daemon_uid=990)
    assert link.admit({"job_id": "42", "target": 2, "reason": "", "fence": 4}) == ""
    refusal = link.admit({"job_id": "42", "target": 3, "reason": "", "fence": 3})
    assert "lease generation 3 refused" in refusal and "seen generation 4" in refusal
    assert link.admit({"job_id": "42", "target": 3, "reason": "", "fence": 5}) == "" and link.fence == 5
    assert link.admit({"job_id": "42", "target": 3, "reason": "the owner's"}) == ""  # no fence: the owner's


def test_the_registration_reply_teaches_the_agent_the_active_daemons_generation(munged: None) -> None:
    class Fencing(ChannelStandIn):
        def answer(self, message: Message) -> Message:
            return message.reply(data={"fence": 7})

    stand_in = Fencing()
    try:
        link = DaemonLink(stand_in.server.endpoint, owner_uid=1234, prefix="[42/agent]", daemon_uid=os.getuid())
        link.register(REGISTRATION)
    finally:
        stand_in.close()
    assert link.fence == 7 and link.admit({"job_id": "42", "target": 2, "reason": "", "fence": 6}) != ""
