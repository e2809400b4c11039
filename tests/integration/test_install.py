"""Install the built wheel as a site would: a clean virtual environment per extra, no checkout on the path.

The wheel and the sdist are built from this checkout (``python -m build --no-isolation``: the build tools of the
project's own environment, no download). Each environment installs the wheel by its URL, the form the README gives
(``pip install 'slurm-amoeba[daemon] @ file:///...whl'``); pip fetches the base and the ``daemon`` extra's small
dependencies from the configured index. The ``train`` extra's torch is not downloaded: that environment installs the
wheel ``--no-deps`` and reads the train dependencies from the project's environment through a ``.pth`` line, which
adds that directory to ``sys.path`` after the environment's own site-packages without running its ``.pth`` files, so
the checkout's editable install does not come with it (each test checks where ``slurm_amoeba`` is imported from).
Commands run from an empty directory with no ``PYTHONPATH``. Takes a minute or more: marked slow.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("slurm_amoeba-*.whl")
    return wheel


def _env(tmp: Path, requirement: Sequence[str]) -> tuple[Path, dict[str, str]]:
    prefix = tmp / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(prefix)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{prefix / 'bin'}:{env['PATH']}"
    done = subprocess.run(
        [str(prefix / "bin" / "python"), "-m", "pip", "install", "-q", *requirement],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return prefix, env


def _run(prefix: Path, env: dict[str, str], cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(prefix / "bin" / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=300, env=env, cwd=cwd
    )


def _imported_from(prefix: Path, env: dict[str, str], cwd: Path) -> Path:
    done = _run(prefix, env, cwd, "python", "-c", "import slurm_amoeba; print(slurm_amoeba.__file__)")
    return Path(done.stdout.strip())


def test_the_sdist_holds_the_shipped_configuration_and_the_data_licenses(dist: Path) -> None:
    import tarfile

    (sdist,) = dist.glob("slurm_amoeba-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    for needed in ("configs/amoebad.yaml", "configs/monitoring/amoebad-rules.yml", "gavel/LICENSE", "pollux/LICENSE"):
        assert any(name.endswith(needed) for name in names), needed


def test_the_base_install_runs_the_simulator_and_a_dry_run_and_names_the_daemon_extra(
    dist: Path, tmp_path: Path
) -> None:
    wheel = _wheel(dist)
    prefix, env = _env(tmp_path, [f"slurm-amoeba @ {wheel.as_uri()}"])
    work = tmp_path / "work"
    work.mkdir()
    assert _imported_from(prefix, env, work).is_relative_to(prefix)
    sim = _run(prefix, env, work, "amoeba-sim", "run", "--help")
    assert sim.returncode == 0, sim.stderr
    ran = _run(
        prefix,
        env,
        work,
        "amoeba-sim",
        "run",
        "--policy",
        "fifo",
        "--workload",
        "pollux/workloads/workload-1.csv",
        "--limit",
        "5",
        "--quiet",
    )
    assert ran.returncode == 0 and "fifo" in ran.stdout, ran.stderr[-2000:]
    (work / "job.sh").write_text("#!/bin/bash\nexec amoeba-run python train.py\n")
    env_no_slurm = {**env, "PATH": f"{prefix / 'bin'}:/nonexistent"}  # no sinfo/sbatch to run
    dry = _run(prefix, env_no_slurm, work, "amoeba-sbatch", "--dry-run", "--elastic", "1:2", "job.sh")
    assert dry.returncode == 0 and "would submit" in dry.stderr, dry.stderr
    daemon = _run(prefix, env, work, "amoebad", "--check")
    assert daemon.returncode == 1
    assert f"pip install 'slurm-amoeba[daemon] @ {wheel.as_uri()}'" in daemon.stderr, daemon.stderr


def test_the_daemon_extra_checks_the_shipped_configuration(dist: Path, tmp_path: Path) -> None:
    prefix, env = _env(tmp_path, [f"slurm-amoeba[daemon] @ {_wheel(dist).as_uri()}"])
    work = tmp_path / "work"
    work.mkdir()
    assert _imported_from(prefix, env, work).is_relative_to(prefix)
    shipped = prefix / "share" / "slurm-amoeba" / "amoebad.yaml"
    check = _run(prefix, env, work, "amoebad", "--check", "--config", str(shipped))
    assert check.returncode == 0 and f"configuration {shipped} is valid" in check.stdout, check.stderr
    unit = (prefix / "share" / "slurm-amoeba" / "systemd" / "amoebad.service").read_text()
    documentation = next(line for line in unit.splitlines() if line.startswith("Documentation="))
    installed = documentation.removeprefix("Documentation=file:///opt/slurm-amoeba/")
    assert (prefix / installed).is_file(), documentation


def test_the_train_extra_runs_its_commands_with_the_projects_torch(dist: Path, tmp_path: Path) -> None:
    prefix, env = _env(tmp_path, ["--no-deps", f"slurm-amoeba[train] @ {_wheel(dist).as_uri()}", "pyzmq"])
    site = Path(sysconfig.get_paths(vars={"base": str(prefix), "platbase": str(prefix)})["purelib"])
    shared = Path(sysconfig.get_paths()["purelib"])  # the project's environment: torch, submitit, cloudpickle
    (site / "zz-shared-train-deps.pth").write_text(f"{shared}\n")
    work = tmp_path / "work"
    work.mkdir()
    assert _imported_from(prefix, env, work).is_relative_to(prefix)
    for command in ("amoeba-run", "amoeba-local"):
        done = _run(prefix, env, work, command, "--help")
        assert done.returncode == 0, done.stderr[-2000:]
