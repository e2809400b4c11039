"""Bad input to amoeba-sbatch and ElasticExecutor: a clear error before anything is submitted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.launcher import ElasticExecutor
from slurm_amoeba.launcher.sbatch import prepare
from slurm_amoeba.slurm import CliSlurmClient
from tests.conftest import REPO, ClusterHandle
from tests.integration.test_satellite_terms import ACCOUNT, QOS, account  # noqa: F401 (account: the fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]


@pytest.fixture
def env(slurm_cluster: ClusterHandle, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    yield dict(os.environ)


def unique_name() -> str:
    """A job name no other test uses: a submission of this test is found by it, whatever else the cluster runs."""
    return f"launcher-input-{uuid.uuid4().hex[:12]}"


def amoeba_sbatch(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the amoeba-sbatch command (never through a shell) against the cluster."""
    return subprocess.run(
        ["amoeba-sbatch", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60, check=False
    )


def jobs_named(env: dict[str, str], name: str) -> int:
    """How many jobs Slurm remembers under ``name`` (squeue's JSON lists finished ones for MinJobAge too)."""
    return len(CliSlurmClient(env).jobs(name=name))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--elastic", "5:2", "examples/job.sh"], "max_workers=2 is below min_workers=5"),
        (["--elastic", "0", "examples/job.sh"], "min_workers=0"),
        (["--elastic", "abc", "examples/job.sh"], "'abc' is not MIN"),
        (["--elastic", "5:8", "--gpus-per-worker", "4", "examples/job.sh"], "needs 20 GPUs at least.*has 16"),
        (["--elastic", "2:4", "no/such/job.sh"], "'no/such/job.sh' does not exist"),
        (["--elastic", "2:4", "-N", "2", "examples/job.sh"], "sets -N 2 itself"),
        (["examples/job.sh"], "no worker range"),
    ],
)
def test_amoeba_sbatch_refuses_bad_input_before_submitting(env: dict[str, str], args: list[str], message: str) -> None:
    name = unique_name()  # on the command line, it beats the script's #SBATCH --job-name
    done = amoeba_sbatch(env, REPO, "-J", name, *args)
    assert done.returncode == 2, done.stderr
    assert "amoeba-sbatch: error:" in done.stderr
    assert re.search(message, done.stderr), done.stderr
    assert jobs_named(env, name) == 0


def test_amoeba_sbatch_reads_the_range_from_an_sbatch_elastic_line(env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --elastic=3:6\n#SBATCH -J x\namoeba-run python train.py\n")
    prepared = prepare([str(script), "--epochs", "2"], CliSlurmClient(env))
    spec = prepared.shape.spec
    assert (spec.min_workers, spec.max_workers) == (3, 6) and prepared.script_args == ["--epochs", "2"]


def test_amoeba_sbatch_test_only_shows_the_job_and_slurms_estimate_without_submitting(
    env: dict[str, str], tmp_path: Path
) -> None:
    name = unique_name()
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --elastic=2:4\n#SBATCH --ntasks=2 --gpus-per-task=1\namoeba-run true\n")
    done = amoeba_sbatch(env, tmp_path, "--test-only", "-J", name, "-t", "1:00:00", "--qos=normal", str(script))
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # no job id: nothing was submitted
    assert "AMOEBA_ELASTIC_MIN=2 AMOEBA_ELASTIC_MAX=4" in done.stderr
    command = next(line for line in done.stderr.splitlines() if line.strip().startswith("sbatch "))
    assert " : " not in command  # one component: no heterogeneous job (SLURM-FACTS.md)
    assert f"-J {name}" in command and "-t 1:00:00" in command and "--gpus-per-task=0" not in command
    assert "--qos=normal" in command and "--ntasks=2" in command and "--gpus-per-task=1" in command
    assert re.search(r"sbatch: Job \d+ to start at", done.stderr), done.stderr
    assert jobs_named(env, name) == 0


def test_amoeba_sbatch_test_only_reports_what_slurm_refuses(env: dict[str, str], tmp_path: Path) -> None:
    done = amoeba_sbatch(env, tmp_path, "--test-only", "--elastic", "1:2", "-C", "no-such-feature", "--wrap=true")
    assert done.returncode == 1 and "amoeba-sbatch: error:" in done.stderr, done.stderr
    assert "Invalid feature specification" in done.stderr, done.stderr


def test_executor_refuses_unknown_parameters_with_the_valid_ones(env: dict[str, str], tmp_path: Path) -> None:
    executor = ElasticExecutor(folder=tmp_path)
    with pytest.raises(SpecError, match=r"unknown key 'min_wrokers'; valid keys.*min_workers=1"):
        executor.update_parameters(min_wrokers=2)
    with pytest.raises(SpecError, match="max_workers=2 is below min_workers=5"):
        executor.update_parameters(min_workers=5, max_workers=2)


def test_executor_refuses_a_function_that_cannot_be_pickled(env: dict[str, str], tmp_path: Path) -> None:
    name = unique_name()
    executor = ElasticExecutor(folder=tmp_path)
    executor.update_parameters(min_workers=1, max_workers=2, job_name=name)
    lock = threading.Lock()
    with pytest.raises(SpecError, match="cannot be pickled"):
        executor.submit(lambda: lock.locked())
    assert jobs_named(env, name) == 0 and not list(tmp_path.glob("*.pkl"))


def test_executor_refuses_a_minimum_the_partition_can_never_hold(env: dict[str, str], tmp_path: Path) -> None:
    executor = ElasticExecutor(folder=tmp_path)
    name = unique_name()
    executor.update_parameters(min_workers=5, max_workers=8, gpus_per_worker=4, job_name=name)
    with pytest.raises(SpecError, match="needs 20 GPUs at least"):
        executor.submit(print, "never")
    assert jobs_named(env, name) == 0


@pytest.mark.usefixtures("account")  # the tests' account and QOS exist (made by sacctmgr)
def test_amoeba_sbatch_charges_the_job_and_gives_it_the_workers_gpus(env: dict[str, str], tmp_path: Path) -> None:
    name = unique_name()
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --elastic=2:4\n#SBATCH --ntasks=2 --gpus-per-task=1\namoeba-run true\n")
    done = amoeba_sbatch(env, tmp_path, "-H", "-J", name, "-A", ACCOUNT, "--qos", QOS, str(script))
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout.strip())
    try:
        records = CliSlurmClient(env).jobs(name=name)
        # One component (no heterogeneous job: SLURM-FACTS.md, hetjob start failure), charged as asked.
        assert [(r.het_job_offset, r.account, r.qos) for r in records] == [(0, ACCOUNT, QOS)]
        show = subprocess.run(
            ["scontrol", "-o", "show", "job", str(job_id)],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
            check=False,
        )
        assert "HetJobOffset" not in show.stdout and "gres/gpu=2" in show.stdout, show.stdout
    finally:
        CliSlurmClient(env).cancel(job_id)
