"""ElasticExecutor without Slurm: the submission file it writes, the checks every submission path runs, and the
worker side (rank 0's result and output), with the agent tests' fake Slurm client passed in."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from submitit.core import utils

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.launcher import ElasticExecutor, ElasticJob
from slurm_amoeba.launcher.executor import ElasticInfoWatcher
from tests.conftest import REPO
from tests.unit.agent.fakes import FakeSlurm, node


def cluster(nodes: int) -> FakeSlurm:
    """Idle nodes of 4 GPUs and 8 CPUs each."""
    return FakeSlurm(node_list=[node(f"n{i}") for i in range(1, nodes + 1)])


def script_of(tmp_path: Path, **parameters: object) -> str:
    executor = ElasticExecutor(folder=tmp_path / "jobs" / "%j", slurm=cluster(4))
    executor.update_parameters(**parameters)
    return executor._make_submission_file_text("unused", "uid")


def components(script: str) -> list[list[str]]:
    """The #SBATCH lines of each heterogeneous component."""
    parts: list[list[str]] = [[]]
    for line in script.splitlines():
        if line.strip() == "#SBATCH hetjob":
            parts.append([])
        elif line.startswith("#SBATCH "):
            parts[-1].append(line.removeprefix("#SBATCH "))
    return parts


def test_account_qos_constraint_and_additional_parameters_reach_the_batch_script(tmp_path: Path) -> None:
    script = script_of(
        tmp_path,
        min_workers=2,
        max_workers=4,
        slurm_account="lab",
        slurm_qos="high",
        slurm_constraint="a100",
        slurm_additional_parameters={"mail_type": "END"},
        timeout_min=30,
        slurm_mem="2G",
    )
    (job,) = components(script)  # one component: no heterogeneous job (SLURM-FACTS.md, hetjob start failure)
    for line in ("--account=lab", "--qos=high", "--mail-type=END", "--constraint=a100"):
        assert line in job, job
    assert any("4096" in line and "mem" in line for line in job), job  # 2 workers x 2 GiB
    assert any(line.endswith("_agent_log.out") for line in job), job
    assert "--ntasks=2" in job and "--gpus-per-task=1" in job


def test_setup_lines_run_before_the_agent_with_unset_variables_allowed(tmp_path: Path) -> None:
    script = script_of(tmp_path, slurm_setup=["module load cuda/12", "export DATA=/scratch"])
    lines = script.splitlines()
    start = lines.index("set +u")
    assert lines[start + 1 : start + 4] == ["module load cuda/12", "export DATA=/scratch", "set -u"]
    agent_line = next(i for i, line in enumerate(lines) if "slurm_amoeba.launcher.run" in line)
    assert start > lines.index("set -euo pipefail") and agent_line > start + 3


def test_map_array_and_submit_array_refuse_an_unpicklable_function_before_submitting(tmp_path: Path) -> None:
    lock = threading.Lock()
    executor = ElasticExecutor(folder=tmp_path, slurm=cluster(4))
    with pytest.raises(SpecError, match="cannot be pickled"):
        executor.map_array(lambda x: lock.locked(), [1, 2])
    with pytest.raises(SpecError, match="cannot be pickled"):
        executor.submit_array([lambda: None, lambda: lock.locked()])
    with pytest.raises(SpecError, match="cannot be pickled"), executor.batch():
        executor.submit(lambda: lock.locked())
    assert not list(tmp_path.rglob("*.pkl"))


def test_map_array_refuses_a_minimum_the_cluster_can_never_hold(tmp_path: Path) -> None:
    executor = ElasticExecutor(folder=tmp_path, slurm=cluster(1))
    executor.update_parameters(min_workers=2, max_workers=4, gpus_per_worker=4)
    with pytest.raises(SpecError, match="needs 8 GPUs at least"):
        executor.map_array(print, ["a", "b"])
    assert not list(tmp_path.rglob("*.pkl"))


def run_worker(folder: Path, job_id: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "AMOEBA_WORKER_ID")}
    environ.update({"AMOEBA_JOB_FOLDER": str(folder), "AMOEBA_PARENT_JOB": job_id, **env})
    return subprocess.run(
        [sys.executable, "-m", "slurm_amoeba.launcher.fn_worker"],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def submitted(folder: Path, job_id: str, fn: Callable[..., object], *args: object) -> utils.JobPaths:
    paths = utils.JobPaths(folder, job_id=job_id, task_id=0)
    paths.folder.mkdir(parents=True, exist_ok=True)
    utils.DelayedSubmission(fn, *args).dump(paths.submitted_pickle)
    return paths


def test_rank_zero_writes_the_result_and_its_output_is_the_jobs_stdout(tmp_path: Path) -> None:
    from tests.unit.launcher.worker_fns import shout

    submitted(tmp_path, "77", shout, "hello")
    other = run_worker(tmp_path, "77", RANK="1", AMOEBA_WORKER_ID="g1-0")
    assert other.returncode == 0 and "stdout of hello" in other.stdout  # its own log keeps its output
    job: ElasticJob[str] = ElasticJob(folder=tmp_path, job_id="77", tasks=[0], watcher=ElasticInfoWatcher(FakeSlurm()))
    assert job.stdout() is None and not job.paths.result_pickle.exists()
    zero = run_worker(tmp_path, "77", RANK="0", AMOEBA_WORKER_ID="g0-1")
    assert zero.returncode == 0, zero.stderr
    assert job.result() == "HELLO"
    assert job.stdout() == "stdout of hello\n" and job.stderr() == "stderr of hello\n"


def test_before_the_first_generation_the_first_worker_of_the_main_group_speaks_for_rank_zero(
    tmp_path: Path,
) -> None:
    from tests.unit.launcher.worker_fns import shout

    submitted(tmp_path, "78", shout, "early")
    assert run_worker(tmp_path, "78", AMOEBA_WORKER_ID="g0-0").returncode == 0
    job: ElasticJob[str] = ElasticJob(folder=tmp_path, job_id="78", tasks=[0], watcher=ElasticInfoWatcher(FakeSlurm()))
    assert job.stdout() == "stdout of early\n"


def test_a_failure_on_rank_zero_is_raised_by_result_with_its_traceback_in_stderr(tmp_path: Path) -> None:
    from tests.unit.launcher.worker_fns import fail

    submitted(tmp_path, "79", fail, "it")
    assert run_worker(tmp_path, "79", RANK="0").returncode == 1
    job: ElasticJob[str] = ElasticJob(folder=tmp_path, job_id="79", tasks=[0], watcher=ElasticInfoWatcher(FakeSlurm()))
    with pytest.raises(utils.FailedJobError, match="it went wrong"):
        job.result()
    assert "RuntimeError: it went wrong" in (job.stderr() or "")


def test_a_job_that_opted_in_to_sharing_holds_shards_of_one_gpu_per_node_in_the_sharing_partition(
    tmp_path: Path,
) -> None:
    script = script_of(tmp_path, min_workers=2, max_workers=4, share="opportunistic")
    (job,) = components(script)  # one component: the agent runs in its batch step, on the sharing partition too
    assert "--partition=share" in job and "--gres=shard:2" in job and "--ntasks-per-node=1" in job
    assert not any(line.startswith("--gpus-per-task") for line in job)
    assert "export AMOEBA_SHARE=opportunistic" in script or "AMOEBA_SHARE" in script
