"""The who-may-do-what table: every request kind has one rule and one handler, and every request goes through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_amoeba.daemon import Daemon
from slurm_amoeba.daemon.config import Sharing
from slurm_amoeba.daemon.requests import (
    _HANDLERS,
    _JOB_HANDLERS,
    ACCESS,
    Access,
    JobOwner,
    OwnerFrom,
    Refused,
    Who,
    check_access,
)
from slurm_amoeba.transport.munge import Credential
from tests.unit.daemon.fakes import ME, OTHER_UID, job, register_body, report_body, req
from tests.unit.daemon.test_daemon import cluster, make_daemon, recorder

BODIES: dict[str, dict[str, object]] = {
    "register": register_body("100"),
    "report": report_body("100", 2),
    "resize": {"job_id": "100", "target": 3, "reason": ""},
    "pin": {"job_id": "100", "pinned": True},
    "share": {"job_id": "100", "host": "101", "nodes": {"n1": 1}},
    "drain": {},
    "resume": {},
    "status": {},
    "jobs": {},
    "policy_show": {},
    "admission": {"job_id": "100"},
}


def test_every_kind_has_one_rule_and_one_handler_and_the_rule_says_whether_it_names_a_job() -> None:
    assert set(ACCESS) == set(BODIES)
    assert set(_JOB_HANDLERS).isdisjoint(_HANDLERS)
    assert set(_JOB_HANDLERS) == {kind for kind, rule in ACCESS.items() if rule.owner_from is not OwnerFrom.NO_JOB}
    assert set(_HANDLERS) == {kind for kind, rule in ACCESS.items() if rule.owner_from is OwnerFrom.NO_JOB}
    for kind, rule in ACCESS.items():
        assert rule.reads and rule.changes and rule.verb, kind
        assert (rule.owner_from is OwnerFrom.NO_JOB) == (rule.unknown_job == ""), kind
        assert (rule.who is Who.ANYONE) == (rule.changes == "nothing"), kind


OWNER = JobOwner("100", 1000, "alice")
STRANGER = Credential(uid=2000, gid=2000)


@pytest.mark.parametrize(
    ("who", "sender", "owner", "operator", "refusal"),
    [
        (Who.ANYONE, STRANGER, None, False, None),
        (Who.OPERATOR, STRANGER, None, True, None),
        (Who.OPERATOR, STRANGER, None, False, "uid 2000 is not an operator; only operators may act"),
        (Who.JOB_OWNER, Credential(1000, 1000), OWNER, False, None),
        (Who.JOB_OWNER, STRANGER, OWNER, False, "uid 2000 may not act job 100: only its owner (alice) may"),
        (Who.JOB_OWNER, STRANGER, OWNER, True, "uid 2000 may not act job 100: only its owner (alice) may"),
        (Who.OWNER_OR_OPERATOR, Credential(1000, 1000), OWNER, False, None),
        (Who.OWNER_OR_OPERATOR, STRANGER, OWNER, True, None),
        (
            Who.OWNER_OR_OPERATOR,
            STRANGER,
            OWNER,
            False,
            "uid 2000 may not act job 100: only its owner (alice) or an operator may",
        ),
        (Who.OWNER_OR_OPERATOR, STRANGER, None, True, "uid 2000 may not act: only its owner or an operator may"),
    ],
)
def test_check_access_lets_through_exactly_whom_the_rule_names(
    who: Who, sender: Credential, owner: JobOwner | None, operator: bool, refusal: str | None
) -> None:
    rule = Access(who, OwnerFrom.NO_JOB if owner is None else OwnerFrom.SLURM, "x", "y", verb="act")
    if refusal is None:
        check_access(rule, sender, owner, operator)
        return
    with pytest.raises(Refused) as info:
        check_access(rule, sender, owner, operator)
    assert str(info.value) == refusal and info.value.reason == "unauthorized"


@pytest.mark.parametrize("kind", sorted(ACCESS))
def test_a_stranger_gets_exactly_what_the_table_allows_and_changes_nothing_else(tmp_path: Path, kind: str) -> None:
    d: Daemon = make_daemon(tmp_path, cluster())
    try:
        d.handle(req("register", register_body("100")))
        d.handle(req("report", report_body("100", 2)))
        d.handle(req(kind, dict(BODIES[kind]), uid=OTHER_UID))
        reply = recorder(d).last()
        rule = ACCESS[kind]
        if rule.who is Who.ANYONE:
            assert reply.body["ok"], reply.body
        else:
            assert not reply.body["ok"] and f"uid {OTHER_UID} " in reply.body["error"]
            assert d.metrics.refusals.value({"kind": kind, "reason": "unauthorized"}) == 1
        assert d.state.pinned == set() and not d.state.draining
        assert d.agents["100"].uid == ME and d.agents["100"].in_flight is None
    finally:
        d.close()


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("register", "unknown job 999"),
        ("report", "unknown job 999"),
        ("resize", "job 999 is not an elastic job registered"),
        ("pin", "shows no job 999"),
        ("share", "job 999 is not an elastic job registered"),
    ],
)
def test_a_request_about_an_unknown_job_is_refused_by_its_rules_message(tmp_path: Path, kind: str, error: str) -> None:
    d = make_daemon(tmp_path, cluster())
    try:
        d.handle(req(kind, {**BODIES[kind], "job_id": "999"}))
        reply = recorder(d).last()
        assert not reply.body["ok"] and error in reply.body["error"]
        assert d.metrics.refusals.value({"kind": kind, "reason": "unknown_job"}) == 1
    finally:
        d.close()


def test_an_operators_share_waits_for_the_next_round_and_is_refused_while_sharing_is_off(tmp_path: Path) -> None:
    off = make_daemon(tmp_path, cluster())
    try:
        off.handle(req("register", register_body("100")))
        off.handle(req("share", dict(BODIES["share"])))
        reply = recorder(off).last()
        assert not reply.body["ok"] and "GPU sharing is off at this site" in reply.body["error"]
    finally:
        off.close()
    slurm = cluster()
    slurm.job_list += [job(200, het_job_id=200, het_job_offset=0), job(201, het_job_id=200, het_job_offset=1)]
    on = make_daemon(tmp_path, slurm, sharing=Sharing(enabled=True, partitions={"share": 1}))
    try:
        on.handle(req("register", register_body("100")))
        on.handle(req("share", dict(BODIES["share"])))
        assert "host job 101 is not an elastic job registered" in recorder(on).last().body["error"]
        on.handle(req("register", register_body("200")))
        on.handle(req("report", report_body("100", 2)))
        on.handle(req("share", {**BODIES["share"], "host": "200"}))
        assert recorder(on).last().body["data"]["at"] == "next round"
        (share,) = on.ledger.take_requested_shares()
        assert (share.job_id, share.host, share.workers, dict(share.placement)) == ("100", "200", 3, {"n1": 1})
        assert on.ledger.take_requested_shares() == []
    finally:
        on.close()
