"""What a user of a shared cluster cannot do to the daemon: stall its answers, flood it, read or outgrow the site.

Issue 11, the daemon's side: Slurm calls never block answers (a slurmctld that hangs delays rounds only), requests
and agents per uid are limited, another user's job shows only as a count, ``jobs`` comes in pages, and the site's
worker caps hold whatever path a job came in by.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_amoeba.core.messages import Message
from slurm_amoeba.daemon import Daemon, DaemonConfig, metrics
from slurm_amoeba.daemon.agents import HISTORY_BYTES, InFlight, bounded_history
from slurm_amoeba.daemon.config import Limits
from slurm_amoeba.daemon.limits import RateLimiter
from slurm_amoeba.transport.channel import request
from tests.unit.daemon.fakes import (
    ME,
    OTHER_UID,
    FakeSlurm,
    RecordingServer,
    job,
    node,
    register_body,
    report_body,
    req,
)
from tests.waiting import wait_until


@pytest.fixture
def hanging(tmp_path: Path) -> Iterator[tuple[Daemon, FakeSlurm]]:
    """A running daemon whose Slurm hangs after the first round (job 100 known, job 200 not yet)."""
    slurm = FakeSlurm(job_list=[job(100, gpus={"n1": 2})], node_list=[node("n1", used=2)])
    config = DaemonConfig(interval_s=0.2, listen="tcp://127.0.0.1:*", metrics_port=0, state_file=str(tmp_path / "s"))
    daemon = Daemon(config, slurm)
    daemon.start()
    stop = threading.Event()
    thread = threading.Thread(target=daemon.run, args=(stop,), daemon=True)
    thread.start()
    wait_until("the first round", lambda: daemon.last_round is not None)
    slurm.hung = True
    yield daemon, slurm
    slurm.release.set()
    stop.set()
    thread.join(10)
    daemon.close()


def timed(endpoint: str, kind: str, body: dict[str, object]) -> tuple[Message, float]:
    tick = time.monotonic()
    reply = request(endpoint, Message(kind, body), timeout_s=5, retries=0)
    return reply, time.monotonic() - tick


def test_a_hung_slurmctld_delays_rounds_never_answers(hanging: tuple[Daemon, FakeSlurm]) -> None:
    daemon, slurm = hanging
    assert daemon.server is not None
    endpoint = daemon.server.endpoint
    wait_until("a round to begin and hang in squeue", lambda: daemon.round_loop.observing)
    rounds = len(daemon.rounds)
    # A job in the last view registers at once; one Slurm has not shown yet is told to retry, at once.
    known, known_s = timed(endpoint, "register", register_body("100"))
    unknown, unknown_s = timed(endpoint, "register", register_body("200"))
    status, status_s = timed(endpoint, "status", {})
    assert known.body["ok"], known.body
    assert not unknown.body["ok"] and "retry" in unknown.body["error"], unknown.body
    assert status.body["ok"]
    assert max(known_s, unknown_s, status_s) < 1.0, (known_s, unknown_s, status_s)
    assert len(daemon.rounds) == rounds, "a round finished while Slurm hung"
    # Slurm answers again and now shows job 200: the round finishes, and the retry succeeds.
    slurm.job_list.append(job(200, gpus={"n1": 1}))
    slurm.hung = False
    slurm.release.set()
    wait_until("the hung round and the next one to finish", lambda: len(daemon.rounds) > rounds + 1)
    again, _ = timed(endpoint, "register", register_body("200"))
    assert again.body["ok"], again.body


# ---------------------------------------------------------------------------------------------- limits per uid


def make(tmp_path: Path, slurm: FakeSlurm, **limits: Any) -> Daemon:
    config = DaemonConfig(
        listen="tcp://127.0.0.1:*",
        metrics_port=0,
        state_file=str(tmp_path / "state.json"),
        limits=Limits(**limits),
    )
    daemon = Daemon(config, slurm)
    daemon.server = RecordingServer()
    daemon.run_round()
    return daemon


def ask(d: Daemon, kind: str, body: dict[str, Any], uid: int = ME, gid: int = 0) -> Message:
    assert isinstance(d.server, RecordingServer)
    before = len(d.server.answers)
    d.handle(req(kind, dict(body), uid=uid, gid=gid))
    assert len(d.server.answers) == before + 1, f"{kind} was not answered at once"
    return d.server.last()


def two_users() -> FakeSlurm:
    """Job 100 of alice (ME, the daemon's uid) and job 300 of bob (OTHER_UID), each holding 2 GPUs."""
    slurm = FakeSlurm(
        job_list=[
            job(100, gpus={"n1": 2}),
            job(300, uid=OTHER_UID, user="nobody", gpus={"n2": 2}),
            job(301, uid=OTHER_UID, user="nobody", gpus={"n2": 1}),
        ],
        node_list=[node("n1"), node("n2")],
    )
    slurm.set_used()
    return slurm


def test_a_uid_over_its_request_rate_is_refused_and_counted_and_the_daemons_uid_never(tmp_path: Path) -> None:
    d = make(tmp_path, two_users(), requests_per_s=1e-6, burst=5)  # no token comes back while the test runs
    try:
        answers = [ask(d, "status", {}, uid=OTHER_UID).body for _ in range(20)]
        assert [a["ok"] for a in answers] == [True] * 5 + [False] * 15  # the burst passes, then every one is refused
        assert "limits.requests_per_s" in answers[-1]["error"]
        assert d.metrics.refusals.value({"kind": "status", "reason": "rate_limited"}) == 15
        assert all(ask(d, "status", {}).body["ok"] for _ in range(50))  # the daemon's own uid (amoebactl as root)
    finally:
        d.close()


def test_a_uids_bucket_gets_its_tokens_back_at_the_rate_and_a_refusal_takes_none() -> None:
    limiter = RateLimiter(rate=4.0, burst=3)
    assert [limiter.allow(OTHER_UID, 10.0) for _ in range(4)] == [True, True, True, False]
    assert not limiter.allow(OTHER_UID, 10.125)  # half a token
    assert limiter.allow(OTHER_UID, 10.25)  # a whole one: the refusal at 10.125 took nothing
    assert not limiter.allow(OTHER_UID, 10.25)
    assert limiter.allow(ME, 10.25), "each uid has its own bucket"
    assert [limiter.allow(OTHER_UID, 100.0) for _ in range(4)] == [True, True, True, False], "full at the burst"


def test_a_uid_may_register_only_so_many_agents(tmp_path: Path) -> None:
    d = make(tmp_path, two_users(), agents_per_uid=1)
    try:
        assert ask(d, "register", register_body("300", high=2), uid=OTHER_UID).body["ok"]
        assert ask(d, "register", register_body("300", high=2), uid=OTHER_UID).body["ok"]  # again: the same job
        second = ask(d, "register", register_body("301", high=2), uid=OTHER_UID).body
        assert not second["ok"] and "limits.agents_per_uid = 1" in second["error"]
        assert d.metrics.refusals.value({"kind": "register", "reason": "limit"}) == 1
        assert sorted(d.agents) == ["300"]
    finally:
        d.close()


# ---------------------------------------------------------------------------------------------- the site's caps


@pytest.mark.parametrize(
    ("limits", "claimed", "taken", "clamped"),
    [
        ({}, (1, 4), (1, 4), []),
        ({"max_workers": 3}, (1, 8), (1, 3), ["max_workers clamped from 8 to 3 (limits.max_workers"]),
        ({"user_max_workers": {OTHER_UID: 2}}, (1, 8), (1, 2), ["max_workers_per_user (uid 65534)"]),
        ({"account_max_workers": {"physics": 3}}, (2, 8), (2, 3), ["max_workers_per_account (physics)"]),
        ({}, (5, 8), (2, 8), ["min_workers clamped from 5 to 2: Slurm's allocation of job 300 holds 2"]),
    ],
)
def test_a_claimed_range_is_clamped_to_the_site_and_to_slurm_and_the_reply_and_log_say_so(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    limits: dict[str, Any],
    claimed: tuple[int, int],
    taken: tuple[int, int],
    clamped: list[str],
) -> None:
    slurm = two_users()
    slurm.job_list[1] = dataclasses.replace(slurm.job_list[1], account="physics")
    d = make(tmp_path, slurm, **limits)
    try:
        reply = ask(d, "register", register_body("300", low=claimed[0], high=claimed[1]), uid=OTHER_UID).body
        assert reply["ok"], reply
        reg = d.agents["300"].registration
        data = reply["data"]
        assert (reg.min_workers, reg.max_workers) == taken == (data["min_workers"], data["max_workers"])
        assert len(reply["data"]["clamped"]) == len(clamped)
        for note, expected in zip(reply["data"]["clamped"], clamped, strict=True):
            assert expected in note
            assert any(note in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
        # The daemon never orders past the cap, and refuses a user's resize past it.
        over = ask(d, "resize", {"job_id": "300", "target": taken[1] + 1, "reason": ""}, uid=OTHER_UID).body
        assert not over["ok"] and "outside" in over["error"]
    finally:
        d.close()


def test_a_job_whose_own_allocation_is_over_the_cap_is_refused(tmp_path: Path) -> None:
    d = make(tmp_path, two_users(), user_max_workers={OTHER_UID: 1})
    try:
        reply = ask(d, "register", register_body("300", low=2, high=4), uid=OTHER_UID).body
        assert not reply["ok"] and "over this site's cap of 1" in reply["error"]
        assert "300" not in d.agents
        assert d.metrics.refusals.value({"kind": "register", "reason": "limit"}) == 1
    finally:
        d.close()


# ---------------------------------------------------------------------------------------------- private reads


def test_status_and_jobs_show_another_users_job_only_to_operators(tmp_path: Path) -> None:
    d = make(tmp_path, two_users())
    try:
        assert ask(d, "register", register_body("100")).body["ok"]
        assert ask(d, "report", report_body("100", 2)).body["ok"]
        assert ask(d, "register", register_body("300", high=2), uid=OTHER_UID).body["ok"]
        assert ask(d, "report", report_body("300", 2), uid=OTHER_UID).body["ok"]
        assert ask(d, "pin", {"job_id": "100", "pinned": True}).body["ok"]
        d.ledger.agents["100"].in_flight = InFlight(target=3, ordered_at=time.time(), source="policy", reason="x")
        # bob sees his own job in full, alice's as a count; no endpoint, history or throughput of hers.
        bob = ask(d, "jobs", {}, uid=OTHER_UID).body["data"]
        assert [j["job_id"] for j in bob["jobs"]] == ["300"] and bob["others"] == 1
        assert '"100"' not in json.dumps(bob)  # nothing of alice's job: no id, endpoint, history or throughput
        status = ask(d, "status", {}, uid=OTHER_UID).body["data"]
        assert status["in_flight"] == {} and status["pinned"] == [] and status["pinned_count"] == 1
        assert status["limited_to_own_jobs"] is True
        # An operator (by group, here) sees every job.
        op = make(tmp_path / "op", two_users())
        try:
            op.config = dataclasses.replace(op.config, operator_gids=frozenset({4242}))
            op.requests.config = op.config
            assert ask(op, "register", register_body("100")).body["ok"]
            assert ask(op, "register", register_body("300", high=2), uid=OTHER_UID).body["ok"]
            seen = ask(op, "jobs", {}, uid=12345, gid=4242).body["data"]
            assert [j["job_id"] for j in seen["jobs"]] == ["100", "300"] and seen["others"] == 0
            assert ask(op, "status", {}, uid=12345, gid=4242).body["data"]["limited_to_own_jobs"] is False
        finally:
            op.close()
    finally:
        d.close()


def test_history_is_kept_bounded_in_count_bytes_and_nesting() -> None:
    deep: Any = "x"
    for _ in range(3):
        deep = {"d": deep}
    events = [{"event": "e", "n": i, "pad": "p" * 1000} for i in range(60)] + [deep]
    kept = bounded_history(events)
    assert len(json.dumps(kept)) <= HISTORY_BYTES + 100
    assert kept[-1] == {"event": "unreadable", "text": "{'d': {'d': {'d': 'x'}}}"}
    assert kept[-2]["n"] == 59 and len(kept) < 20


def test_a_reply_that_cannot_be_encoded_is_logged_and_counted_not_raised(tmp_path: Path) -> None:
    d = make(tmp_path, two_users())
    try:
        # A request from a peer on the socket (not a hand-made one, whose answers are only recorded).
        message = dataclasses.replace(req("status", {}), route=(b"peer", b""))
        d.requests.answer(message, message.message.reply(data={"x": object()}))  # not JSON: encode raises TypeError
        assert d.metrics.loop_errors.value() == 1
        assert ask(d, "status", {}).body["ok"]
    finally:
        d.close()


def test_a_read_of_slurm_that_fails_on_its_thread_ends_the_round_with_the_reason(
    hanging: tuple[Daemon, FakeSlurm],
) -> None:
    daemon, slurm = hanging
    wait_until("a round to begin and hang in squeue", lambda: daemon.round_loop.observing)
    rounds = len(daemon.rounds)
    slurm.down = True
    slurm.release.set()
    failed = wait_until("a round to fail", lambda: [r for r in list(daemon.rounds)[rounds:] if r.error])
    assert "Slurm did not answer" in failed[0].error
    assert daemon.metrics.observe_failures.value() >= 1
    assert daemon.metrics.loop_errors.value() == 0


def test_an_idle_metrics_connection_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "CONNECTION_TIMEOUT_S", 0.5)
    server = metrics.MetricsServer("127.0.0.1", 0, lambda: "")
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as idle:
            tick = time.monotonic()
            assert idle.recv(1) == b""  # closed by the server, sending nothing
            assert time.monotonic() - tick < 3
    finally:
        server.stop()
