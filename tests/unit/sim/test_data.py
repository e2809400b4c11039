"""The simulator's reference data ships inside the package, with its licenses and sources, and needs no checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_amoeba.sim.data import DATA_DIR_ENV, SimError, data_dir, packaged_data_dir, resolve

BIN = Path(sys.executable).parent


def amoeba_sim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the installed ``amoeba-sim`` in ``cwd`` with ``AMOEBA_DATA_DIR`` unset."""
    env = {k: v for k, v in os.environ.items() if k != DATA_DIR_ENV}
    return subprocess.run(
        [str(BIN / "amoeba-sim"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_amoeba_sim_runs_a_shipped_workload_from_any_directory_without_amoeba_data_dir(tmp_path: Path) -> None:
    done = amoeba_sim("run", "--policy", "fifo", "--workload", "pollux/workloads/workload-6.csv", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split()[:2] == ["policy", "avg"]
    assert done.stdout.splitlines()[2].startswith("fifo")


def test_amoeba_sim_data_names_the_packaged_folder_and_its_sources(tmp_path: Path) -> None:
    done = amoeba_sim("data", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == str(packaged_data_dir())
    assert "pollux/workloads/  (8 workloads)" in done.stdout and "SOURCES.md" in done.stdout


def test_every_shipped_data_folder_carries_its_license_and_is_named_in_sources() -> None:
    folder = packaged_data_dir()
    sources = (folder / "SOURCES.md").read_text()
    licenses = {"pollux": "Apache License", "gavel": "MIT License"}
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == sorted(licenses)
    for name, license_title in licenses.items():
        assert license_title in (folder / name / "LICENSE").read_text()
        assert f"`{name}/`" in sources
    for needed in (
        "pollux/traces/philly.csv",
        "pollux/traces/bert/placements.csv",
        "gavel/simulation_throughputs.json",
    ):
        assert (folder / needed).is_file(), needed


def test_amoeba_data_dir_overrides_the_packaged_data_and_a_wrong_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert data_dir() == tmp_path
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(SimError, match=r"AMOEBA_DATA_DIR=.*missing.* is not a folder"):
        data_dir()


def test_a_relative_path_is_found_here_first_then_in_the_data_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    shipped = Path("pollux/workloads/workload-1.csv")
    assert resolve(shipped) == packaged_data_dir() / shipped
    (tmp_path / "pollux" / "workloads").mkdir(parents=True)
    (tmp_path / shipped).write_text("name,time,application,num_replicas,batch_size\n")
    assert resolve(shipped) == shipped
    assert resolve(Path("no/such.csv")) == Path("no/such.csv")
