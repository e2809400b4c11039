"""The daemon's loop, API and authorization, against a Slurm in memory and fake agents on real sockets.

Requests from other uids are built by hand (``fakes.req``): the channel's munge check is tested in the channel's
own tests and, with a real second uid, in ``tests/integration/test_daemon.py``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurm_amoeba.core.messages import MAX_MESSAGE_BYTES, Message, encode
from slurm_amoeba.daemon import Daemon, DaemonConfig
from slurm_amoeba.daemon.config import AgentSettings, Limits
from slurm_amoeba.daemon.metrics import MetricsServer
from slurm_amoeba.daemon.observer import observe
from slurm_amoeba.daemon.state import load_state
from slurm_amoeba.slurm import JobState as SlurmState
from slurm_amoeba.transport.channel import ChannelServer
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
    satellite,
)
from tests.waiting import wait_until


class FakeAgent:
    """An agent's directive endpoint: records every resize and accepts it (or refuses, when told)."""

    def __init__(self, accept: bool = True) -> None:
        self.server = ChannelServer("tcp://127.0.0.1:*")
        self.accept = accept
        self.directives: list[Message] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def _serve(self) -> None:
        while not self._stop.is_set():
            request = self.server.receive(0.05)
            if request is None:
                continue
            self.directives.append(request.message)
            target = int(request.message.body["target"])
            if self.accept:
                self.server.answer(request, request.message.reply(data={"size": 2, "target": target}))
            else:
                self.server.answer(request, request.message.reply(ok=False, error="the job is finishing"))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.server.close()


def wait_for(what: str, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    wait_until(what, predicate, timeout)


def cluster() -> FakeSlurm:
    """Two nodes of 4 GPUs; elastic job 100 (agent + 2 workers on n1)."""
    slurm = FakeSlurm(
        job_list=[
            job(100, het_job_id=100, het_job_offset=0),
            job(101, het_job_id=100, het_job_offset=1, gpus={"n1": 2}),
        ],
        node_list=[node("n1"), node("n2")],
    )
    slurm.set_used()
    return slurm


@pytest.fixture
def agent() -> Iterator[FakeAgent]:
    fake = FakeAgent()
    yield fake
    fake.close()


def make_daemon(
    tmp_path: Path, slurm: FakeSlurm, clock: Callable[[], float] = time.time, **overrides: object
) -> Daemon:
    settings = {
        "interval_s": 1.0,
        "listen": "tcp://127.0.0.1:*",
        "metrics_port": 0,
        "state_file": str(tmp_path / "state.json"),
        "agents": AgentSettings(timeout_s=1.0, retries=0, parallel=2, stale_after_s=10.0, backoff_s=30.0),
    }
    settings.update(overrides)
    daemon = Daemon(dataclasses.replace(DaemonConfig(), **settings), slurm, clock=clock)  # type: ignore[arg-type]
    daemon.server = RecordingServer()
    daemon.round_loop.view = observe(slurm, clock())  # requests are answered from the last view of Slurm
    return daemon


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = make_daemon(tmp_path, cluster())
    yield d
    d.close()


def recorder(d: Daemon) -> RecordingServer:
    assert isinstance(d.server, RecordingServer)
    return d.server


def ask(d: Daemon, kind: str, body: dict[str, object], uid: int = ME) -> Message:
    before = len(recorder(d).answers)
    d.handle(req(kind, dict(body), uid=uid))
    assert len(recorder(d).answers) == before + 1, f"{kind} was not answered at once"
    return recorder(d).last()


def settle(d: Daemon, job_id: str) -> None:
    """Wait until the directive of ``job_id`` came back and was applied."""

    def done() -> bool:
        d.apply_outcomes()
        flight = d.agents[job_id].in_flight
        return flight is None or flight.acknowledged

    wait_for(f"the directive to job {job_id} to come back", done)


def register_and_report(d: Daemon, endpoint: str, size: int = 2, target: int | None = None) -> None:
    assert ask(d, "register", register_body("100", endpoint)).body["ok"]
    assert ask(d, "report", report_body("100", size, target)).body["ok"]


def test_a_registered_job_grows_into_idle_gpus_and_is_not_ordered_again_while_it_moves(
    daemon: Daemon, agent: FakeAgent
) -> None:
    register_and_report(daemon, agent.endpoint)
    assert daemon.run_round().ordered == {"100": 4}
    wait_for("the agent to get the directive", lambda: len(agent.directives) == 1)
    settle(daemon, "100")
    assert agent.directives[0].body == {"job_id": "100", "target": 4, "reason": agent.directives[0].body["reason"]}
    assert daemon.run_round().ordered == {}  # acknowledged, not reached: not re-ordered
    assert ask(daemon, "report", report_body("100", 2, 4)).body["ok"]
    assert daemon.run_round().ordered == {}  # the agent says it is moving
    assert ask(daemon, "report", report_body("100", 4)).body["ok"]
    assert daemon.agents["100"].in_flight is None
    assert daemon.metrics.resize_latency.count == 1
    assert len(agent.directives) == 1


def test_a_report_for_an_unknown_job_asks_the_agent_to_register_again(daemon: Daemon) -> None:
    reply = ask(daemon, "report", report_body("100", 2))
    assert not reply.body["ok"] and "unknown job 100" in reply.body["error"]


def test_only_the_jobs_owner_may_register_or_report_for_it(daemon: Daemon, agent: FakeAgent) -> None:
    reply = ask(daemon, "register", register_body("100", agent.endpoint), uid=OTHER_UID)
    assert not reply.body["ok"] and f"uid {OTHER_UID} may not register" in reply.body["error"]
    register_and_report(daemon, agent.endpoint)
    reply = ask(daemon, "report", report_body("100", 4), uid=OTHER_UID)
    assert not reply.body["ok"] and "may not report" in reply.body["error"]
    assert daemon.agents["100"].report is not None and daemon.agents["100"].report.size == 2
    assert daemon.metrics.refusals.value({"kind": "report", "reason": "unauthorized"}) == 1


def test_registering_a_job_slurm_does_not_run_is_refused(daemon: Daemon) -> None:
    reply = ask(daemon, "register", register_body("999"))
    assert not reply.body["ok"] and "unknown job 999" in reply.body["error"]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"max_workers": 0}, "worker range"),
        ({"endpoint": "ipc:///tmp/x"}, "endpoint"),
        ({"job_id": "12; rm"}, "not a Slurm job id"),
        ({"gpus_per_worker": 0}, "gpus_per_worker"),
        ({"elastic_partition": "batch"}, "would grow in partition 'batch'"),
        ({"elastic_partition": ""}, "elastic_partition=''"),
    ],
)
def test_a_registration_with_bad_values_is_refused_with_the_value(
    daemon: Daemon, change: dict[str, object], error: str
) -> None:
    reply = ask(daemon, "register", {**register_body("100"), **change})
    assert not reply.body["ok"] and error in reply.body["error"]


def test_a_report_with_a_bad_throughput_table_is_refused(daemon: Daemon, agent: FakeAgent) -> None:
    register_and_report(daemon, agent.endpoint)
    reply = ask(daemon, "report", {**report_body("100", 2), "throughput": {"two": 3.0}})
    assert not reply.body["ok"] and "throughput key 'two'" in reply.body["error"]


def test_another_users_resize_is_refused_and_the_owners_goes_to_the_agent(daemon: Daemon, agent: FakeAgent) -> None:
    register_and_report(daemon, agent.endpoint)
    body = {"job_id": "100", "target": 3, "reason": ""}
    reply = ask(daemon, "resize", body, uid=OTHER_UID)
    assert not reply.body["ok"] and f"uid {OTHER_UID} may not resize job 100" in reply.body["error"]
    assert agent.directives == []
    daemon.handle(req("resize", body))
    settle(daemon, "100")
    assert len(recorder(daemon).answers) == 4  # the deferred answer came once the agent had answered
    assert recorder(daemon).last().body["ok"] and recorder(daemon).last().body["data"]["target"] == 3
    assert [m.body["target"] for m in agent.directives] == [3]
    reply = ask(daemon, "resize", {"job_id": "100", "target": 2, "reason": ""})
    assert not reply.body["ok"] and "still resizing to 3" in reply.body["error"]
    reply = ask(daemon, "resize", {"job_id": "100", "target": 9, "reason": ""})
    assert not reply.body["ok"] and "outside" in reply.body["error"]


def test_a_configured_operator_may_resize_any_job(tmp_path: Path, agent: FakeAgent) -> None:
    d = make_daemon(tmp_path, cluster(), operator_uids=frozenset({OTHER_UID}))
    try:
        register_and_report(d, agent.endpoint)
        d.handle(req("resize", {"job_id": "100", "target": 3, "reason": "maintenance"}, uid=OTHER_UID))
        wait_for("the agent to get it", lambda: len(agent.directives) == 1)
        assert "maintenance" in agent.directives[0].body["reason"]
    finally:
        d.close()


def test_a_pinned_job_is_left_alone_and_only_its_owner_may_pin_it(daemon: Daemon, agent: FakeAgent) -> None:
    register_and_report(daemon, agent.endpoint)
    reply = ask(daemon, "pin", {"job_id": "100", "pinned": True}, uid=OTHER_UID)
    assert not reply.body["ok"] and "may not pin" in reply.body["error"]
    assert ask(daemon, "pin", {"job_id": "100", "pinned": True}).body["ok"]
    assert daemon.run_round().ordered == {}
    assert load_state(daemon.state_path).pinned == {"100"}
    assert ask(daemon, "pin", {"job_id": "100", "pinned": False}).body["ok"]
    assert daemon.run_round().ordered == {"100": 4}


def test_a_drain_holds_every_job_at_its_minimum_until_resumed(daemon: Daemon, agent: FakeAgent) -> None:
    register_and_report(daemon, agent.endpoint, size=3)
    reply = ask(daemon, "drain", {}, uid=OTHER_UID)
    assert not reply.body["ok"] and "not an operator" in reply.body["error"]
    assert ask(daemon, "drain", {}).body["ok"]  # the daemon's own uid is an operator
    assert daemon.run_round().ordered == {"100": 1}
    settle(daemon, "100")
    assert ask(daemon, "report", report_body("100", 1)).body["ok"]
    assert daemon.run_round().ordered == {}
    reply = ask(daemon, "resize", {"job_id": "100", "target": 3, "reason": ""})
    assert not reply.body["ok"] and "until an operator runs `amoebactl resume`" in reply.body["error"]
    assert ask(daemon, "resume", {}).body["ok"]
    assert daemon.run_round().ordered == {"100": 4}


def test_a_drain_outranks_a_pin_and_the_pin_holds_again_after_resume(daemon: Daemon, agent: FakeAgent) -> None:
    register_and_report(daemon, agent.endpoint, size=3)
    assert ask(daemon, "pin", {"job_id": "100", "pinned": True}).body["ok"]
    assert ask(daemon, "drain", {}).body["ok"]
    assert daemon.run_round().ordered == {"100": 1}
    settle(daemon, "100")
    assert ask(daemon, "report", report_body("100", 1)).body["ok"]
    assert ask(daemon, "resume", {}).body["ok"]
    assert daemon.run_round().ordered == {}  # pinned: the policy does not grow it back
    assert daemon.metrics.decisions.value({"kind": "shrink", "source": "drain"}) == 1


def test_an_agent_that_refuses_is_left_alone_for_the_backoff(daemon: Daemon) -> None:
    refusing = FakeAgent(accept=False)
    try:
        register_and_report(daemon, refusing.endpoint)
        assert daemon.run_round().ordered == {"100": 4}
        settle(daemon, "100")
        assert daemon.agents["100"].in_flight is None
        assert daemon.run_round().ordered == {}
        assert daemon.metrics.directive_failures.value({"reason": "refused"}) == 1
    finally:
        refusing.close()


def test_an_unreachable_agent_costs_one_deadline_and_a_backoff(daemon: Daemon) -> None:
    silent = ChannelServer("tcp://127.0.0.1:*")  # binds, never answers
    try:
        register_and_report(daemon, silent.endpoint)
        daemon.run_round()
        settle(daemon, "100")
        assert daemon.metrics.directive_failures.value({"reason": "unreachable"}) == 1
        assert daemon.agents["100"].backoff_until > time.time()
    finally:
        silent.close()


def test_a_restarted_daemon_does_not_order_a_resize_its_predecessor_ordered(tmp_path: Path, agent: FakeAgent) -> None:
    slurm = cluster()
    first = make_daemon(tmp_path, slurm)
    register_and_report(first, agent.endpoint)
    assert first.run_round().ordered == {"100": 4}
    settle(first, "100")
    first.actuator.close()  # no close(): as if killed after the agent's acknowledgement
    assert load_state(Path(tmp_path / "state.json")).in_flight["100"].target == 4
    second = make_daemon(tmp_path, slurm)
    try:
        assert ask(second, "report", report_body("100", 2)).body["error"].startswith("unknown job")
        register_and_report(second, agent.endpoint, size=2)  # the agent has not moved yet
        assert second.run_round().ordered == {}
        assert ask(second, "report", report_body("100", 4)).body["ok"]
        assert second.agents["100"].in_flight is None
        second.save_state()  # the loop writes it after each batch of requests
        assert "100" not in load_state(Path(tmp_path / "state.json")).in_flight
        assert len(agent.directives) == 1
    finally:
        second.close()


def test_a_job_that_ends_is_forgotten_with_its_pin(daemon: Daemon, agent: FakeAgent) -> None:
    register_and_report(daemon, agent.endpoint)
    assert ask(daemon, "pin", {"job_id": "100", "pinned": True}).body["ok"]
    assert isinstance(daemon.slurm, FakeSlurm)
    daemon.slurm.job_list = [dataclasses.replace(j, state=SlurmState.COMPLETED) for j in daemon.slurm.job_list]
    daemon.run_round()
    assert daemon.agents == {} and daemon.state.pinned == set()


def test_a_dead_slurmctld_skips_the_round_without_deciding(daemon: Daemon, agent: FakeAgent) -> None:
    register_and_report(daemon, agent.endpoint)
    assert isinstance(daemon.slurm, FakeSlurm)
    daemon.slurm.down = True
    summary = daemon.run_round()
    assert summary.ordered == {} and "Slurm did not answer" in summary.error
    assert daemon.metrics.observe_failures.value() == 1
    daemon.slurm.down = False
    assert daemon.run_round().ordered == {"100": 4}


def test_anyone_authenticated_may_read_status_jobs_and_the_policy_but_sees_only_counts_of_others_jobs(
    daemon: Daemon, agent: FakeAgent
) -> None:
    register_and_report(daemon, agent.endpoint)
    daemon.run_round()
    status = ask(daemon, "status", {}, uid=OTHER_UID)
    assert status.body["ok"]
    data = status.body["data"]
    assert (
        data["jobs"]["elastic"] == 1
        and data["gpus"] == {"total": 8, "free": 6}
        and data["policy"] == "elastic-backfill"
    )
    assert data["limited_to_own_jobs"] is True
    others = ask(daemon, "jobs", {}, uid=OTHER_UID).body["data"]
    assert others == {"jobs": [], "total": 0, "others": 1, "next": None}
    jobs = ask(daemon, "jobs", {}).body["data"]["jobs"]  # the owner (here also the daemon's uid) sees it in full
    assert [(j["job_id"], j["size"], j["user"]) for j in jobs] == [("100", 2, "alice")]
    policy = ask(daemon, "policy_show", {}, uid=OTHER_UID).body["data"]
    assert policy["name"] == "elastic-backfill" and policy["knobs"]["start_pending"] is False


def test_a_message_kind_the_daemon_does_not_take_is_refused(daemon: Daemon) -> None:
    reply = ask(daemon, "reply", {"ok": True, "error": "", "data": {}})
    assert not reply.body["ok"] and "does not take 'reply'" in reply.body["error"]


def test_metrics_are_served_in_the_prometheus_text_format(tmp_path: Path, agent: FakeAgent) -> None:
    d = make_daemon(tmp_path, cluster())
    d.metrics_server = MetricsServer("127.0.0.1", 0, d.metrics.registry.render)  # what start() does, on a free port
    d.metrics_server.start()
    try:
        register_and_report(d, agent.endpoint)
        d.run_round()
        with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_server.port}/metrics", timeout=5) as page:
            text = page.read().decode()
        assert 'amoeba_jobs{kind="elastic"} 1' in text
        assert 'amoeba_workers{job="100"} 2' in text
        assert 'amoeba_decisions_total{kind="grow",source="policy"} 1' in text
        assert "amoeba_policy_seconds_count 1" in text
        assert 'amoeba_resize_latency_seconds_bucket{le="+Inf"} 0' in text
        # the capacity is a gauge of its own; the states are its parts and add up to it
        assert "amoeba_gpus_capacity 8.0" in text
        assert 'amoeba_gpus{state="free"} 6.0' in text and 'amoeba_gpus{state="allocated"} 2.0' in text
        assert 'state="total"' not in text
    finally:
        d.close()


def test_a_job_whose_agent_settles_elsewhere_is_decided_for_again_after_a_short_pause(
    tmp_path: Path, agent: FakeAgent
) -> None:
    now = [1_000_000.0]
    d = make_daemon(tmp_path, cluster(), clock=lambda: now[0])
    try:
        register_and_report(d, agent.endpoint)
        assert d.run_round().ordered == {"100": 4}
        settle(d, "100")
        assert ask(d, "report", report_body("100", 2)).body["ok"]  # an old report, sent before the agent acted
        assert d.agents["100"].in_flight is not None
        now[0] += 5
        assert ask(d, "report", report_body("100", 3)).body["ok"]  # the agent settled at 3 (a satellite failed)
        assert d.agents["100"].in_flight is None
        assert d.metrics.directive_failures.value({"reason": "abandoned"}) == 1
        assert d.run_round().ordered == {}  # a short pause ...
        now[0] += 2 * d.config.interval_s + 1
        assert ask(d, "report", report_body("100", 3)).body["ok"]
        assert d.run_round().ordered == {"100": 4}  # ... then the policy decides again
    finally:
        d.close()


def test_with_e_tiresias_only_the_managed_elastic_jobs_are_ordered(tmp_path: Path, agent: FakeAgent) -> None:
    slurm = cluster()
    slurm.job_list.append(job(300, state=SlurmState.PENDING, gpus_per_node=2, reason="Priority"))
    slurm.job_list.append(job(301, gpus={"n2": 1}, user="bob"))
    slurm.set_used()
    d = make_daemon(tmp_path, slurm, policy="e-tiresias")
    try:
        register_and_report(d, agent.endpoint)
        summary = d.run_round()
        assert summary.error == ""
        assert set(summary.ordered) <= {"100"}  # never a start for 300 nor anything for bob's job: Slurm's business
        assert d.last_observation is not None and d.last_observation.regular_pending == 1
    finally:
        d.close()


def test_the_jobs_reply_comes_in_pages_each_under_the_message_limit_with_a_thousand_fat_jobs(tmp_path: Path) -> None:
    slurm = FakeSlurm(node_list=[node(f"n{i}", total=8) for i in range(250)])
    slurm.job_list = [job(1000 + i, gpus={f"n{i // 4}": 2}) for i in range(1000)]
    slurm.set_used()
    d = make_daemon(tmp_path, slurm, limits=Limits(agents_per_uid=1000))
    try:
        d.run_round()
        fat = [{"t": 1.0, "event": "generation", "reason": "x" * 1500}] * 50
        for i in range(1000):
            job_id = str(1000 + i)
            assert ask(d, "register", register_body(job_id)).body["ok"]
            assert ask(d, "report", {**report_body(job_id, 2), "history": fat}).body["ok"]
        seen: list[str] = []
        offset: int | None = 0
        pages = 0
        while offset is not None:
            reply = ask(d, "jobs", {"offset": offset, "limit": 200})
            assert len(encode(reply)) < MAX_MESSAGE_BYTES
            data = reply.body["data"]
            seen += [j["job_id"] for j in data["jobs"]]
            offset, pages = data["next"], pages + 1
        assert seen == [str(1000 + i) for i in range(1000)]
        assert pages > 5  # 16 KiB of history each: about 30 jobs a page
        assert not ask(d, "jobs", {"offset": -1}).body["ok"]
        assert not ask(d, "jobs", {"limit": 10_000}).body["ok"]
    finally:
        d.close()


def test_a_satellite_the_agent_does_not_list_is_reported_once_in_status_and_log(
    tmp_path: Path, agent: FakeAgent, caplog: pytest.LogCaptureFixture
) -> None:
    slurm = cluster()
    slurm.job_list.append(satellite(200, 100, gpus={"n2": 1}, submit_time=int(time.time()) - 600))
    slurm.set_used()
    d = make_daemon(tmp_path, slurm)
    try:
        register_and_report(d, agent.endpoint)  # its report lists no satellite
        d.run_round()
        d.run_round()
        assert [s["job_id"] for s in d.status()["unclaimed"]] == ["200"]
        warnings = [r for r in caplog.records if "is not among the satellites its agent reports" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        d.close()


def test_an_agent_outside_any_partition_may_still_register(daemon: Daemon, agent: FakeAgent) -> None:
    assert ask(daemon, "register", {**register_body("100", agent.endpoint), "partition": ""}).body["ok"]


def moving_cluster() -> FakeSlurm:
    """4 nodes of 4 GPUs: elastic job 100 (1:4) at 4 workers, 1 on n4 and a satellite of 3 on n1; rigid jobs on n2,
    n3 and n4; rigid job 400 (4 GPUs, one node) pending: no node has 4 free, n1 would with its satellite gone."""
    slurm = FakeSlurm(
        job_list=[
            job(100, het_job_id=100, het_job_offset=0),
            job(101, het_job_id=100, het_job_offset=1, gpus={"n4": 1}),
            satellite(200, 100, gpus={"n1": 3}),
            job(300, gpus={"n2": 2}),
            job(301, gpus={"n3": 1}),
            job(302, gpus={"n4": 3}),
            job(400, state=SlurmState.PENDING, gpus_per_node=4, reason="Resources", submit_time=int(time.time()) - 60),
        ],
        node_list=[node("n1"), node("n2"), node("n3"), node("n4")],
    )
    slurm.set_used()
    return slurm


def test_a_rigid_job_that_finds_no_whole_node_makes_a_satellite_move_and_the_job_keeps_its_size(
    tmp_path: Path, agent: FakeAgent
) -> None:
    d = make_daemon(tmp_path, moving_cluster(), whole_node_starts=True)
    try:
        assert ask(d, "register", register_body("100", agent.endpoint)).body["ok"]
        assert ask(d, "report", report_body("100", 4, satellites=["200"])).body["ok"]
        assert d.run_round().ordered == {"100": 4}  # a move at its size: the policy leaves the job at 4
        assert set(d.ledger.moves) == {"100", "400"}, "the moved job and the one moved for are held off"
        wait_for("the agent to get the move", lambda: len(agent.directives) == 1)
        body = agent.directives[0].body
        assert (body["target"], body["vacate"]) == (4, "n1") and "job 400 starts on one node" in body["reason"]
        assert d.metrics.decisions.value({"kind": "move", "source": "policy"}) == 1
        settle(d, "100")
        assert d.run_round().ordered == {}, "not ordered again while the node is being vacated"
        assert len(agent.directives) == 1
    finally:
        d.close()
    off = make_daemon(tmp_path / "off", moving_cluster())  # the default: off
    try:
        assert ask(off, "register", register_body("100", agent.endpoint)).body["ok"]
        assert ask(off, "report", report_body("100", 4, satellites=["200"])).body["ok"]
        # The round's summary lists every directive it handed to the actuator: none is proof that none is coming.
        assert off.run_round().ordered == {}, "whole_node_starts off (the default) orders no move"
        assert len(agent.directives) == 1
    finally:
        off.close()
