"""``amoebactl`` against a running daemon: every command, its table and its JSON, and its exit statuses."""

from __future__ import annotations

import json
import threading
import time

import pytest

from slurm_amoeba.cli import amoebactl
from slurm_amoeba.core.messages import Message
from slurm_amoeba.daemon import Daemon, requests
from slurm_amoeba.transport.channel import request
from tests.unit.daemon.fakes import FakeSlurm, job, register_body, report_body

Running = tuple[Daemon, threading.Thread]


def ctl(daemon: Daemon, *args: str) -> int:
    assert daemon.server is not None
    return amoebactl.main(["--endpoint", daemon.server.endpoint, "--timeout", "5", *args])


def registered(daemon: Daemon) -> None:
    """Register job 100 and report 2 workers (as its agent would), with no agent behind the endpoint."""
    assert daemon.server is not None
    body = register_body("100", endpoint="tcp://127.0.0.1:9", low=2, high=2)  # a fixed range: nothing to order
    assert request(daemon.server.endpoint, Message("register", body), timeout_s=5).body["ok"]
    assert request(daemon.server.endpoint, Message("report", report_body("100", 2)), timeout_s=5).body["ok"]


def test_status_prints_the_cluster_and_the_daemon(running: Running, capsys: pytest.CaptureFixture[str]) -> None:
    daemon, _ = running
    deadline = time.monotonic() + 5
    while daemon.last_round is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ctl(daemon, "status") == 0
    out = capsys.readouterr().out
    assert "policy      elastic-backfill every 0.2 s" in out
    assert "gpus        2 free of 4" in out
    assert "orphans     0" in out


def test_jobs_lists_sizes_throughput_and_history(running: Running, capsys: pytest.CaptureFixture[str]) -> None:
    daemon, _ = running
    assert ctl(daemon, "jobs") == 0
    assert "no elastic job is registered" in capsys.readouterr().out
    registered(daemon)
    assert ctl(daemon, "jobs") == 0
    out = capsys.readouterr().out
    header, row = out.splitlines()[:2]
    assert header.split() == [
        "JOB", "USER", "SIZE", "TARGET", "RANGE", "GPU/W", "SATELLITES", "PINNED", "REPORT", "THROUGHPUT"
    ]  # fmt: skip
    assert row.split()[:8] == ["100", "alice", "2", "2", "2..2", "1", "-", "no"]
    assert "job 100 history" in out and '"event": "report"' in out
    assert ctl(daemon, "--json", "jobs") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["jobs"][0]["throughput"]["4"] == 340.0


def test_pin_unpin_drain_resume_and_policy_show(running: Running, capsys: pytest.CaptureFixture[str]) -> None:
    daemon, _ = running
    registered(daemon)
    assert ctl(daemon, "pin", "100") == 0
    assert "job 100 is pinned" in capsys.readouterr().out
    assert daemon.state.pinned == {"100"}
    assert ctl(daemon, "unpin", "100") == 0
    assert daemon.state.pinned == set()
    assert ctl(daemon, "drain") == 0
    assert "draining" in capsys.readouterr().out and daemon.state.draining
    assert ctl(daemon, "resume") == 0
    assert "resumed" in capsys.readouterr().out and not daemon.state.draining
    assert ctl(daemon, "policy", "show") == 0
    out = capsys.readouterr().out
    assert out.startswith("elastic-backfill (") and "start_pending=False, min_gain=0.1" in out and "e-tiresias" in out


def test_a_refusal_exits_1_with_the_reason(running: Running, capsys: pytest.CaptureFixture[str]) -> None:
    daemon, _ = running
    assert ctl(daemon, "resize", "100", "3") == 1
    assert "refused: job 100 is not an elastic job registered with amoebad" in capsys.readouterr().err
    registered(daemon)
    assert ctl(daemon, "resize", "100", "3") == 1
    assert "2..2 workers; 3 is outside that" in capsys.readouterr().err


def test_no_daemon_exits_3_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert amoebactl.main(["--endpoint", "tcp://127.0.0.1:9", "--timeout", "0.3", "status"]) == 3
    assert "is it running?" in capsys.readouterr().err


def test_a_bad_timeout_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert amoebactl.main(["--timeout", "0", "status"]) == 2
    assert "--timeout 0.0 must be more than 0 seconds" in capsys.readouterr().err


def test_jobs_follows_every_page(
    running: Running, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, _ = running
    assert isinstance(daemon.slurm, FakeSlurm) and daemon.server is not None
    daemon.slurm.job_list += [job(101, gpus={"n1": 1}), job(102, gpus={"n1": 1})]
    rounds = len(daemon.rounds)
    deadline = time.monotonic() + 5
    while len(daemon.rounds) < rounds + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    for job_id in ("100", "101", "102"):
        body = register_body(job_id, endpoint="tcp://127.0.0.1:9", low=1, high=1)
        assert request(daemon.server.endpoint, Message("register", body), timeout_s=5).body["ok"]
    monkeypatch.setattr(requests, "JOBS_PAGE", 1)  # one job a page
    assert ctl(daemon, "--json", "jobs") == 0
    data = json.loads(capsys.readouterr().out)
    assert [j["job_id"] for j in data["jobs"]] == ["100", "101", "102"] and data["next"] is None
    assert daemon.metrics.requests.value({"kind": "jobs"}) == 3


def test_jobs_shows_an_adaptive_jobs_batch_and_noise_scale(
    running: Running, capsys: pytest.CaptureFixture[str]
) -> None:
    daemon, _ = running
    assert daemon.server is not None
    body = register_body("100", endpoint="tcp://127.0.0.1:9", low=2, high=2)
    assert request(daemon.server.endpoint, Message("register", body), timeout_s=5).body["ok"]
    adaptive = {
        "global_batch": 96,
        "base_batch": 32,
        "max_batch": 512,
        "noise_scale": 1234.5,
        "step_time_s": [[2, 96, 0.1, 5]],
        "efficiency": 0.95,
        "batch_source": "policy",
        "policy_batch": 96,
    }
    report = {**report_body("100", 2), "adaptive": adaptive}
    assert request(daemon.server.endpoint, Message("report", report), timeout_s=5).body["ok"]
    assert ctl(daemon, "jobs") == 0
    out = capsys.readouterr().out
    assert (
        'job 100: global batch 96 (range 32..512, chosen by "policy"), noise scale 1234, efficiency 0.950, '
        "policy's batch 96" in out
    )
    assert ctl(daemon, "--json", "jobs") == 0
    assert json.loads(capsys.readouterr().out)["jobs"][0]["adaptive"]["noise_scale"] == 1234.5
