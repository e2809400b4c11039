"""The front door of every command: ``--version``, light ``--help``, a one-line message for a missing pip extra."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_amoeba.cli.amoebactl import _parser as amoebactl_parser
from slurm_amoeba.cli.entry import EXTRA_MODULES
from slurm_amoeba.core.install import SOURCE_PLACEHOLDER, install_command

BIN = Path(sys.executable).parent
COMMANDS = ["amoeba-sim", "amoebad", "amoebactl", "amoeba-sbatch", "amoeba-run", "amoeba-local"]
HEAVY = ("torch", "submitit", "cloudpickle", "matplotlib", "numpy")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False, cwd=BIN
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_prints_the_installed_version(command: str) -> None:
    done = subprocess.run([str(BIN / command), "--version"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{command} (slurm-amoeba) {importlib.metadata.version('slurm-amoeba')}"


@pytest.mark.parametrize(("entry", "light"), [("amoeba_sbatch", HEAVY), ("amoebactl", HEAVY), ("amoeba_sim", HEAVY)])
def test_help_of_the_light_commands_imports_no_torch(entry: str, light: tuple[str, ...]) -> None:
    done = _python(
        "import contextlib, sys\n"
        f"from slurm_amoeba.cli import entry\n"
        f"with contextlib.redirect_stdout(None), contextlib.suppress(SystemExit):\n"
        f"    entry.{entry}(['--help'])\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(light)!r}))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"{entry} --help imported {done.stdout.strip()}"


@pytest.mark.parametrize(
    ("entry", "hidden", "extra"),
    [("amoebad", "prometheus_client", "daemon"), ("amoeba_run", "torch", "train"), ("amoeba_local", "torch", "train")],
)
def test_a_command_whose_extra_is_missing_names_the_pip_extra_in_one_line(entry: str, hidden: str, extra: str) -> None:
    assert hidden in EXTRA_MODULES[extra]
    done = _python(
        f"import sys\nsys.modules[{hidden!r}] = None  # as if not installed\n"
        f"from slurm_amoeba.cli import entry\nsys.exit(entry.{entry}(['--help']))\n"
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"needs {hidden}" in done.stderr and f"'{extra}' extra: {install_command(extra)}" in done.stderr


def test_the_executor_without_submitit_names_the_train_extra() -> None:
    done = _python("import sys\nsys.modules['submitit'] = None\nfrom slurm_amoeba.launcher import ElasticExecutor\n")
    assert f"ElasticExecutor needs submitit (the 'train' extra): {install_command('train')}" in done.stderr


def test_amoeba_sim_plot_without_matplotlib_fails_before_simulating() -> None:
    done = _python(
        "import sys\nsys.modules['matplotlib'] = None\nfrom slurm_amoeba.cli import entry\n"
        "sys.exit(entry.amoeba_sim(['compare', '--workloads', 'pollux/workloads', '--plot', 'x.png']))\n"
    )
    assert done.returncode == 2
    assert "--plot needs matplotlib" in done.stderr and install_command("sim") in done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "jobs"],
        ["jobs", "--json"],
        ["--timeout", "3", "jobs", "--json"],
        ["--json", "jobs", "--endpoint", "tcp://127.0.0.1:1"],
    ],
)
def test_amoebactl_takes_its_flags_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = amoebactl_parser().parse_args(argv)
    assert args.json is True and args.command == "jobs"
    assert args.timeout == (3.0 if "3" in argv else 15.0)
    assert args.endpoint.startswith("tcp://127.0.0.1:")


def test_amoebactl_without_json_prints_text() -> None:
    assert amoebactl_parser().parse_args(["jobs"]).json is False


@pytest.mark.parametrize(
    ("direct_url", "line"),
    [
        (
            '{"url": "file:///srv/wheels/slurm_amoeba-0.1.0-py3-none-any.whl", "archive_info": {}}',
            "pip install 'slurm-amoeba[daemon] @ file:///srv/wheels/slurm_amoeba-0.1.0-py3-none-any.whl'",
        ),
        (
            '{"url": "https://git.example.org/hpc/slurm_amoeba.git", "vcs_info": {"vcs": "git", "commit_id": "0abc"}}',
            "pip install 'slurm-amoeba[daemon] @ git+https://git.example.org/hpc/slurm_amoeba.git@0abc'",
        ),
        (
            '{"url": "file:///home/me/slurm_amoeba", "dir_info": {"editable": true}}',
            "pip install -e '/home/me/slurm_amoeba[daemon]'",
        ),
        (
            '{"url": "file:///home/me/slurm_amoeba", "dir_info": {}}',
            "pip install 'slurm-amoeba[daemon] @ file:///home/me/slurm_amoeba'",
        ),
        ("not json", f"pip install 'slurm-amoeba[daemon] @ {SOURCE_PLACEHOLDER}'"),
    ],
)
def test_the_install_line_adds_the_extra_from_where_the_package_came_from(direct_url: str, line: str) -> None:
    assert install_command("daemon", direct_url) == line


def test_no_message_or_manual_says_pip_install_slurm_amoeba_which_no_index_has() -> None:
    root = Path(__file__).resolve().parents[3]
    paths = [*root.glob("slurm_amoeba/**/*.py"), *root.glob("docs/*.md"), root / "README.md"]
    bad = re.compile(r"pip install '?slurm-amoeba(?:\[[a-z,]+\])?(?![\[\w-])'?(?! @)")
    found = [f"{path.relative_to(root)}: {m.group(0)}" for path in paths for m in bad.finditer(path.read_text())]
    assert found == []
