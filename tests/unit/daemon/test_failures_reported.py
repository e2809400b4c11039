"""Nodes an agent reports failing under its job (``node_failing`` events): kept by the daemon, shown by amoebactl."""

from __future__ import annotations

import json
import threading
import time

import pytest

from slurm_amoeba.cli import amoebactl
from slurm_amoeba.core.messages import Message
from slurm_amoeba.daemon import Daemon
from slurm_amoeba.transport.channel import request
from tests.unit.daemon.fakes import register_body, report_body

Running = tuple[Daemon, threading.Thread]


def report(daemon: Daemon, *events: dict[str, object]) -> None:
    assert daemon.server is not None
    body = report_body("100", 2)
    body["history"] = [{"t": time.time(), "event": "report"}, *events]
    assert request(daemon.server.endpoint, Message("report", body), timeout_s=15).body["ok"]


def test_a_node_the_agent_names_failing_is_kept_and_shown_by_amoebactl_jobs(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    daemon, _ = running
    assert daemon.server is not None
    body = register_body("100", endpoint="tcp://127.0.0.1:9", low=2, high=2)
    assert request(daemon.server.endpoint, Message("register", body), timeout_s=15).body["ok"]
    report(
        daemon,
        {"t": 1.0, "event": "node_failing", "node": "n4", "failures": 2},
        {"t": 2.0, "event": "node_failing", "node": "n4; rm -rf /", "failures": 2},  # not a node name
        {"t": 3.0, "event": "node_failing", "node": "n3", "failures": True},  # not a count
    )
    report(daemon, {"t": 4.0, "event": "node_failing", "node": "n4", "failures": 3})
    report(daemon)  # the events scrolled out of the agent's recent history: the daemon keeps what it learnt
    assert amoebactl.main(["--endpoint", daemon.server.endpoint, "--timeout", "15", "--json", "jobs"]) == 0
    assert json.loads(capsys.readouterr().out)["jobs"][0]["failing_nodes"] == {"n4": 3}
    assert amoebactl.main(["--endpoint", daemon.server.endpoint, "--timeout", "15", "jobs"]) == 0
    assert 'job 100: nodes failing under it: "n4" (3 times)' in capsys.readouterr().out
