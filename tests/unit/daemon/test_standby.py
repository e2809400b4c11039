"""A daemon of a standby pair: the standby's answer, fenced directives, a daemon that loses its lease, ``ha:``."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from slurm_amoeba.cli import amoebactl
from slurm_amoeba.core.messages import Message, standby_redirect
from slurm_amoeba.daemon import Daemon, DaemonConfig
from slurm_amoeba.daemon.actuator import Directive
from slurm_amoeba.daemon.config import AgentSettings, ConfigError, load_config, parse_config
from slurm_amoeba.daemon.lease import Lease, LeaseRecord, LeaseStore, Role
from slurm_amoeba.daemon.observer import observe
from slurm_amoeba.daemon.standby import NOT_ACTING, FencedActuator, Standby, standby_answer
from slurm_amoeba.daemon.state import load_state
from slurm_amoeba.transport.channel import request
from tests.conftest import ClusterHandle
from tests.e2e.test_daemon_standby import standby_pair, takeover_bound_s
from tests.unit.daemon.fakes import ME, RecordingServer, register_body, report_body, req
from tests.unit.daemon.test_daemon import FakeAgent, cluster, wait_for
from tests.unit.daemon.test_lease import FakeClock


def holding(tmp_path: Path, clock: FakeClock, name: str = "a") -> Lease:
    lease = Lease(
        LeaseStore(tmp_path / "lease"),
        f"tcp://{name}:6820",
        renew_s=1.0,
        expiry_s=5.0,
        margin_s=1.0,
        clock=clock,
        owner=name,
    )
    lease.store.prepare()
    assert lease.watch() and lease.keep()
    return lease


def paired_daemon(tmp_path: Path, lease: Lease) -> Daemon:
    config = dataclasses.replace(
        DaemonConfig(),
        interval_s=1.0,
        listen="tcp://127.0.0.1:*",
        metrics_port=0,
        state_file=str(tmp_path / "state.json"),
        agents=AgentSettings(timeout_s=1.0, retries=1, parallel=2, stale_after_s=10.0, backoff_s=30.0),
    )
    slurm = cluster()
    daemon = Daemon(config, slurm, lease=lease)
    daemon.server = RecordingServer()
    daemon.round_loop.view = observe(slurm, daemon.clock())
    return daemon


def ask(daemon: Daemon, kind: str, body: dict[str, object]) -> Message:
    daemon.handle(req(kind, dict(body), uid=ME))
    assert isinstance(daemon.server, RecordingServer)
    return daemon.server.last()


def test_a_standby_answers_every_request_with_the_active_daemons_address(tmp_path: Path) -> None:
    active = holding(tmp_path, FakeClock(0.0))
    standby_lease = Lease(
        active.store, "tcp://b:6820", renew_s=1.0, expiry_s=5.0, margin_s=1.0, clock=FakeClock(0.0), owner="b"
    )
    assert not standby_lease.watch()
    standby = Standby(DaemonConfig(listen="tcp://127.0.0.1:*", metrics_port=0), standby_lease)
    standby.start()
    try:
        assert standby.server is not None
        answered = threading.Thread(target=standby.serve, args=(3.0,))
        answered.start()
        reply = request(standby.server.endpoint, Message("status", {}), timeout_s=3, retries=0)
        answered.join()
    finally:
        standby.close()
    assert not reply.body["ok"] and "the active one is tcp://a:6820 (lease generation 1)" in reply.body["error"]
    assert standby_redirect(reply) == "tcp://a:6820"
    assert standby_redirect(Message("x", {}).reply(ok=False, error="unknown job")) is None


def test_a_standby_that_knows_no_active_daemon_says_so(tmp_path: Path) -> None:
    lease = Lease(LeaseStore(tmp_path), "tcp://b:6820", renew_s=1.0, expiry_s=5.0, margin_s=1.0, clock=FakeClock(0))
    reply = standby_answer(req("status", {}), lease)
    assert "not known yet" in reply.body["error"] and standby_redirect(reply) == ""


def test_a_standby_run_returns_once_it_holds_the_lease(tmp_path: Path) -> None:
    lease = Lease(LeaseStore(tmp_path), "tcp://b:6820", renew_s=0.05, expiry_s=0.2, margin_s=0.05, clock=FakeClock(0.0))
    standby = Standby(DaemonConfig(listen="tcp://127.0.0.1:*", metrics_port=0), lease)
    try:
        assert standby.run(threading.Event())  # nobody holds the lease: it takes generation 1 at once
    finally:
        standby.close()
    assert lease.role is Role.ACTIVE and standby.metrics.lease_generation.value() == 1


def test_directives_carry_the_lease_generation_and_the_registration_reply_names_it(tmp_path: Path) -> None:
    lease = holding(tmp_path, FakeClock(0.0))
    daemon = paired_daemon(tmp_path, lease)
    agent = FakeAgent()
    try:
        registered = ask(daemon, "register", register_body("100", agent.endpoint))
        assert registered.body["ok"] and registered.body["data"]["fence"] == 1
        assert ask(daemon, "report", report_body("100", 2)).body["ok"]
        assert daemon.run_round().ordered == {"100": 4}
        wait_for("the agent to get the directive", lambda: len(agent.directives) == 1)
        assert agent.directives[0].body["fence"] == 1
        assert daemon.status()["ha"] == {
            "role": "active",
            "generation": 1,
            "active": "tcp://a:6820",
            "lease_dir": str(tmp_path / "lease"),
        }
    finally:
        agent.close()
        daemon.close()


def test_no_directive_leaves_once_the_lease_expired_by_this_hosts_clock(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    lease = holding(tmp_path, clock)
    agent = FakeAgent()
    actuator = FencedActuator(1, 1.0, 2, lease)
    try:
        clock.advance(5.0)  # the daemon stalled past its expiry: it may no longer act, even before it notices
        directive = Directive("100", agent.endpoint, ME, 3, "grow", 0.0)
        outcome = actuator.deliver(directive)
    finally:
        actuator.close()
        agent.close()
    assert not outcome.ok and outcome.error == NOT_ACTING and agent.directives == []


def test_a_daemon_that_loses_its_lease_leaves_its_loop_and_saves_nothing(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    lease = holding(tmp_path, clock)
    daemon = paired_daemon(tmp_path, lease)
    daemon.start()
    daemon.ledger.set_pinned("100", True)  # a change the deposed daemon must not write over the new holder's file
    assert lease.store.claim(2, "b")  # the standby took over while this one was paused
    clock.advance(1.0)
    stop = threading.Event()
    finished = threading.Thread(target=daemon.run, args=(stop,))
    finished.start()
    finished.join(10)
    stopped = not finished.is_alive()
    stop.set()
    assert stopped and daemon.deposed
    daemon.abandon()
    assert load_state(Path(str(daemon.state_path))).pinned == set()
    assert daemon.metrics.ha_role.value({"role": "standby"}) == 1


def test_a_daemon_without_a_pair_says_it_runs_alone(tmp_path: Path) -> None:
    daemon = Daemon(DaemonConfig(listen="tcp://127.0.0.1:*", metrics_port=0), cluster())
    try:
        assert daemon.status()["ha"] == {"role": "single"} and not daemon.deposed
        assert daemon.metrics.ha_role.value({"role": "single"}) == 1
    finally:
        daemon.close()


def test_the_ha_section_is_read_and_its_takeover_bound_stated() -> None:
    config = parse_config(
        {"listen": "tcp://ctl1:6820", "interval_s": 5, "ha": {"lease_dir": "/shared/amoebad", "expiry_s": 10}}
    )
    assert config.ha.enabled and config.ha.advertise == "tcp://ctl1:6820"
    assert config.ha.takeover_bound_s(config.interval_s) == 10 + 2 + 2 * 2 + 5
    assert not parse_config({}).ha.enabled


@pytest.mark.parametrize(
    ("ha", "listen", "named"),
    [
        ({"lease_dir": "/shared/amoebad"}, "tcp://0.0.0.0:6820", "ha.advertise"),
        ({"lease_dir": "shared"}, "tcp://ctl1:6820", "ha.lease_dir"),
        ({"lease_dir": "/shared", "renew_s": 4, "expiry_s": 5}, "tcp://ctl1:6820", "ha.expiry_s"),
        ({"expiry_s": 5}, "tcp://ctl1:6820", "ha.lease_dir"),
        ({"lease_dir": "/shared", "advertise": "ctl1"}, "tcp://0.0.0.0:6820", "ha.advertise"),
    ],
)
def test_an_ha_section_that_cannot_work_is_refused_naming_the_key(
    ha: dict[str, object], listen: str, named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        parse_config({"listen": listen, "ha": ha})


def test_amoebactl_given_the_standby_gets_its_answer_from_the_active_daemon(
    running: tuple[Daemon, threading.Thread], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    daemon, _ = running
    assert daemon.server is not None
    store = LeaseStore(tmp_path / "lease")
    store.prepare()
    store.write(LeaseRecord("a", daemon.server.endpoint, 1, 1, 5.0))
    lease = Lease(store, "tcp://b:6820", renew_s=1.0, expiry_s=5.0, margin_s=1.0, clock=FakeClock(0.0), owner="b")
    assert not lease.watch()
    standby = Standby(DaemonConfig(listen="tcp://127.0.0.1:*", metrics_port=0), lease)
    standby.start()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            standby.serve(0.05)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert standby.server is not None
        # Nothing listens on port 1: amoebactl waits out one --timeout there before it turns to the standby.
        status = amoebactl.main(
            ["--endpoint", f"tcp://127.0.0.1:1,{standby.server.endpoint}", "--timeout", "1", "status"]
        )
    finally:
        stop.set()
        thread.join(5)
        standby.close()
    assert status == 0 and f"listening on {daemon.server.endpoint}" in capsys.readouterr().out


def test_the_e2e_pair_shares_its_lease_and_state_and_states_a_bound_of_nine_seconds(tmp_path: Path) -> None:
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text("ClusterName=test\n")
    cluster = SimpleNamespace(regular_partition="batch", elastic_partition="elastic", conf=slurm_conf)
    first, second = standby_pair(cast(ClusterHandle, cluster), tmp_path)
    configs = [load_config(first.config), load_config(second.config)]
    assert configs[0].ha.lease_dir == configs[1].ha.lease_dir == str(tmp_path / "shared" / "lease")
    assert configs[0].state_file == configs[1].state_file == str(tmp_path / "shared" / "state.json")
    assert [c.ha.advertise for c in configs] == [first.endpoint, second.endpoint] and first.port != second.port
    assert first.log != second.log
    assert takeover_bound_s(second) == 4.0 + 1.0 + 2 * 1.0 + 2.0
