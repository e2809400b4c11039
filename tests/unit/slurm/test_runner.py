"""The command runner: argv lists, timeouts, typed errors."""

from __future__ import annotations

import time

import pytest

from slurm_amoeba.slurm import SlurmCommandError, run_command


def test_returns_stdout_of_a_successful_command() -> None:
    assert run_command(["echo", "hello world"]).stdout == "hello world\n"


def test_never_runs_a_shell() -> None:
    out = run_command(["echo", "$HOME; rm -rf /"]).stdout
    assert out == "$HOME; rm -rf /\n"


def test_a_failing_command_raises_with_argv_exit_code_and_stderr() -> None:
    with pytest.raises(SlurmCommandError) as info:
        run_command(["ls", "/no/such/dir"])
    err = info.value
    assert err.argv == ["ls", "/no/such/dir"] and err.returncode == 2 and "No such file" in err.stderr
    assert "exit code 2" in str(err)


def test_a_missing_program_raises_and_says_how_to_install_it() -> None:
    with pytest.raises(SlurmCommandError, match="scripts/bootstrap") as info:
        run_command(["sbatch-that-does-not-exist"])
    assert info.value.returncode is None


def test_raises_timeout_if_the_command_runs_past_its_deadline() -> None:
    start = time.monotonic()
    with pytest.raises(SlurmCommandError, match="did not finish in time") as info:
        run_command(["sleep", "30"], timeout=0.3)
    assert info.value.timed_out and time.monotonic() - start < 5


def test_an_empty_argv_is_refused() -> None:
    with pytest.raises(SlurmCommandError, match="empty argv"):
        run_command([])
