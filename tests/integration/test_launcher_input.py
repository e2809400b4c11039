"""Bad input to amoeba-sbatch and ElasticExecutor: a clear error before anything is submitted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.launcher import ElasticExecutor
from slurm_amoeba.launcher.sbatch import prepare
from slurm_amoeba.slurm import CliSlurmClient
from tests.conftest import REPO, ClusterHandle

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]


@pytest.fixture
def env(slurm_cluster: ClusterHandle, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    yield dict(os.environ)


def job_count(env: dict[str, str]) -> int:
    return len(CliSlurmClient(env).jobs())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--elastic", "5:2", "examples/job.sh"], "max_workers=2 is below min_workers=5"),
        (["--elastic", "0", "examples/job.sh"], "min_workers=0"),
        (["--elastic", "abc", "examples/job.sh"], "'abc' is not MIN"),
        (["--elastic", "5:8", "--gpus-per-worker", "4", "examples/job.sh"], "needs 20 GPUs at least.*has 16"),
        (["--elastic", "2:4", "no/such/job.sh"], "'no/such/job.sh' does not exist"),
        (["--elastic", "2:4", "-N", "2", "examples/job.sh"], "sets -N itself"),
        (["examples/job.sh"], "no worker range"),
    ],
)
def test_amoeba_sbatch_refuses_bad_input_before_submitting(env: dict[str, str], args: list[str], message: str) -> None:
    before = job_count(env)
    done = subprocess.run(
        ["amoeba-sbatch", *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=60, check=False
    )
    assert done.returncode == 2, done.stderr
    assert "amoeba-sbatch: error:" in done.stderr
    assert re.search(message, done.stderr), done.stderr
    assert job_count(env) == before


def test_amoeba_sbatch_reads_the_range_from_an_sbatch_elastic_line(env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --elastic=3:6\n#SBATCH -J x\namoeba-run python train.py\n")
    shape, _, args = prepare([str(script), "--epochs", "2"], CliSlurmClient(env))
    assert (shape.spec.min_workers, shape.spec.max_workers) == (3, 6) and args == ["--epochs", "2"]


def test_executor_refuses_unknown_parameters_with_the_valid_ones(env: dict[str, str], tmp_path: Path) -> None:
    executor = ElasticExecutor(folder=tmp_path)
    with pytest.raises(SpecError, match=r"unknown key 'min_wrokers'; valid keys.*min_workers=1"):
        executor.update_parameters(min_wrokers=2)
    with pytest.raises(SpecError, match="max_workers=2 is below min_workers=5"):
        executor.update_parameters(min_workers=5, max_workers=2)


def test_executor_refuses_a_function_that_cannot_be_pickled(env: dict[str, str], tmp_path: Path) -> None:
    executor = ElasticExecutor(folder=tmp_path)
    executor.update_parameters(min_workers=1, max_workers=2)
    lock = threading.Lock()
    before = job_count(env)
    with pytest.raises(SpecError, match="cannot be pickled"):
        executor.submit(lambda: lock.locked())
    assert job_count(env) == before and not list(tmp_path.glob("*.pkl"))


def test_executor_refuses_a_minimum_the_partition_can_never_hold(env: dict[str, str], tmp_path: Path) -> None:
    executor = ElasticExecutor(folder=tmp_path)
    executor.update_parameters(min_workers=5, max_workers=8, gpus_per_worker=4)
    before = job_count(env)
    with pytest.raises(SpecError, match="needs 20 GPUs at least"):
        executor.submit(print, "never")
    assert job_count(env) == before
