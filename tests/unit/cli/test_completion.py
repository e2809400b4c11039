"""Shell completion: the shipped bash and zsh files are what the parsers say, and bash completes every word."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_amoeba.cli.completion import PARSERS, generate, load_parser, words
from tests.conftest import installed_tool

SHIPPED = Path(__file__).resolve().parents[3] / "configs" / "completion"


def test_the_shipped_files_are_what_the_parsers_generate() -> None:
    for name, text in generate().items():
        assert (SHIPPED / name).read_text() == text, f"regenerate: python -m slurm_amoeba.cli.completion {SHIPPED}"


def _complete(line: str) -> list[str]:
    """What bash offers after ``line`` (the last word, possibly empty, being completed)."""
    bash = installed_tool("bash", "Debian's bash package")
    typed = line.split(" ")
    script = (
        f"source {shlex.quote(str(SHIPPED / 'slurm-amoeba.bash'))}\n"
        f"COMP_WORDS=({' '.join(shlex.quote(w) for w in typed)}); COMP_CWORD={len(typed) - 1}\n"
        "_slurm_amoeba_complete\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    done = subprocess.run([bash, "--norc", "-c", script], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.split()


@pytest.mark.parametrize("command", list(PARSERS))
def test_bash_completes_every_subcommand_and_option_of_every_command(command: str) -> None:
    for path, expected in words(load_parser(command)).items():
        line = " ".join([command, *path.split(), ""])
        assert sorted(_complete(line)) == sorted(expected), line


def test_completion_knows_amoebactl_s_subcommands_and_their_own_options() -> None:
    assert {"status", "jobs", "resize", "watch", "--endpoint"} <= set(_complete("amoebactl "))
    assert "--reason" in _complete("amoebactl resize --")
    assert "--check" in _complete("amoebad --") and "--dry-run" in _complete("amoeba-sbatch --d")


def test_the_zsh_file_declares_every_command_and_runs_under_zsh_when_there_is_one() -> None:
    text = (SHIPPED / "_slurm-amoeba").read_text()
    assert text.splitlines()[0] == "#compdef " + " ".join(PARSERS)
    zsh = shutil.which("zsh")
    if zsh is not None:
        done = subprocess.run(
            [zsh, "-f", "-c", f"autoload -U compinit && compinit -u && source {SHIPPED / '_slurm-amoeba'}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
