"""``amoebactl`` against a running daemon: every command, its table and its JSON, and its exit statuses."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from slurm_amoeba.cli import amoebactl
from slurm_amoeba.core.layout import AGENT_STATUS_FILE
from slurm_amoeba.core.messages import Message
from slurm_amoeba.daemon import Daemon, requests
from slurm_amoeba.transport.channel import ChannelServer, request
from tests.conftest import installed_tool
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


def test_watch_shows_each_job_s_size_target_throughput_and_last_event() -> None:
    data = {
        "jobs": [
            {
                "job_id": "100", "user": "alice", "size": 2, "target": 4, "min_workers": 1, "max_workers": 4,
                "throughput": {"2": 180.0, "4": 340.0}, "history": [{"event": "started"}, {"event": "grow\x1b[2J"}],
            }
        ]
    }  # fmt: skip
    screen = amoebactl.watch_screen(data, "tcp://h:1", 2).splitlines()
    assert screen[0] == "amoebactl watch: tcp://h:1, every 2 s; q quits"
    assert screen[2].split() == ["JOB", "USER", "SIZE", "TARGET", "RANGE", "SAMPLES/S", "LAST", "EVENT"]
    assert screen[3].split() == ["100", "alice", "2", "4", "1..4", "180.0", "grow\\u001b[2J"]  # escaped, not obeyed


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=10, check=True).stdout


def test_watch_redraws_the_jobs_under_tmux_and_quits_on_q(running: Running, tmp_path: Path) -> None:
    installed_tool("tmux", "Debian's tmux package")
    daemon, _ = running
    assert daemon.server is not None
    registered(daemon)
    session = f"amoeba-watch-{os.getpid()}"
    done = tmp_path / "exit-status"
    command = (
        f"PYTHONPATH={shlex.quote(str(Path.cwd()))} {shlex.quote(sys.executable)} -m slurm_amoeba.cli.amoebactl "
        f"watch --endpoint {daemon.server.endpoint} --interval 0.3; echo $? > {done}; sleep 30"
    )
    _tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "20", command)
    try:
        deadline = time.monotonic() + 20
        screen = ""
        while "alice" not in screen and time.monotonic() < deadline:
            time.sleep(0.2)
            screen = _tmux("capture-pane", "-p", "-t", session)
        rows = [line.split() for line in screen.splitlines() if line.strip()]
        assert rows[0][:2] == ["amoebactl", "watch:"] and rows[1][:4] == ["JOB", "USER", "SIZE", "TARGET"], screen
        assert rows[2][:5] == ["100", "alice", "2", "2", "2..2"], screen
        assert rows[2][-1] == "report", screen  # the last event the agent reported
        _tmux("send-keys", "-t", session, "q")
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert done.read_text().strip() == "0"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=10, check=False)


def test_resize_local_reaches_the_jobs_agent_without_a_daemon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shell user resizes their own job: the directive goes to the agent's socket named in its status file."""
    server = ChannelServer("tcp://127.0.0.1:*")
    seen: list[tuple[int, dict[str, object]]] = []

    def agent() -> None:  # answers as handle_directive does: the owner may resize within 1..4
        for _ in range(2):
            req = server.receive(10)
            assert req is not None
            seen.append((req.sender.uid, dict(req.message.body)))
            target = int(req.message.body["target"])
            ok = 1 <= target <= 4
            error = "" if ok else f"resize to {target} workers is outside this job's range 1..4"
            server.answer(req, req.message.reply(ok=ok, error=error, data={"size": 2, "target": target} if ok else {}))

    thread = threading.Thread(target=agent, daemon=True)
    thread.start()
    state = tmp_path / "amoeba-100"
    state.mkdir()
    (state / AGENT_STATUS_FILE).write_text(json.dumps({"endpoint": server.endpoint, "size": 2}))
    try:
        assert amoebactl.main(["resize", "--local", "--state-dir", str(state), "100", "3", "--timeout", "5"]) == 0
        assert "job 100: its agent accepted: target 3" in capsys.readouterr().out
        assert amoebactl.main(["resize", "--local", "--state-dir", str(state), "100", "9", "--timeout", "5"]) == 1
        assert "outside this job's range 1..4" in capsys.readouterr().err
    finally:
        thread.join(10)
        server.close()
    assert [(uid, body["job_id"], body["target"]) for uid, body in seen] == [
        (os.getuid(), "100", 3),
        (os.getuid(), "100", 9),
    ]


def test_resize_local_without_an_agent_says_where_it_looked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["resize", "--local", "--state-dir", str(tmp_path / "nowhere"), "100", "3", "--timeout", "0.3"]
    assert amoebactl.main(argv) == 3
    assert f"its agent has not started (no {tmp_path / 'nowhere' / AGENT_STATUS_FILE})" in capsys.readouterr().err
