"""``amoeba-local``: its command language, and one short run driven by ``--at``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurm_amoeba.local.cli import Command, CommandError, build_parser, parse_at, parse_command
from tests.unit.runtime.jobs import TOY


def test_commands_parse_into_verb_worker_and_count() -> None:
    assert parse_command("add") == Command("add", count=1)
    assert parse_command("  add 3 ") == Command("add", count=3)
    assert parse_command("kill w2") == Command("kill", worker="w2")
    assert parse_at("12.5:term w1") == (12.5, Command("term", worker="w1"))
    assert parse_command("stop w1") == Command("stop", worker="w1")
    assert parse_command("cont w1") == Command("cont", worker="w1")


def test_coordinator_deadlines_are_flags_with_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMOEBA_LOCAL_REPORT_TIMEOUT", "4")
    args = build_parser().parse_args(["--heartbeat-timeout", "3", "--formation-attempts", "2", "--", "python"])
    assert (args.heartbeat_timeout, args.report_timeout, args.join_timeout) == (3.0, 4.0, 3600.0)
    assert args.formation_attempts == 2


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("grow 2", r"unknown command 'grow 2'; valid commands: add, remove"),
        ("add 0", r"'add 0': write 'add' or 'add K'"),
        ("kill", r"'kill': write 'kill ID', e.g. 'kill w1'"),
        ("status now", r"'status' takes no argument"),
    ],
)
def test_bad_commands_are_refused_with_the_valid_form(line: str, message: str) -> None:
    with pytest.raises(CommandError, match=message):
        parse_command(line)


def test_schedule_entry_without_seconds_is_refused() -> None:
    with pytest.raises(CommandError, match=r"--at 'soon:add' is not SECONDS:COMMAND"):
        parse_at("soon:add")


@pytest.mark.timeout(120)
def test_local_cli_runs_a_job_and_applies_a_scheduled_kill(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "slurm_amoeba.local.cli",
        "-n",
        "2",
        "--log-dir",
        str(tmp_path / "logs"),
        "--at",
        "0:kill w1",
        "--",
        sys.executable,
        str(TOY),
        "--out",
        str(tmp_path),
        "--epochs",
        "3",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sent SIGKILL to w1" in done.stdout
    assert "job finished" in done.stdout and "w0: done" in done.stdout
