"""ElasticExecutor on the local cluster with submitit's spellings: setup lines, account and QOS, rank 0's output."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_amoeba.launcher import ElasticExecutor
from slurm_amoeba.slurm import CliSlurmClient
from tests.conftest import ClusterHandle
from tests.integration.executor_fns import train_and_tell

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]


@pytest.fixture
def env(slurm_cluster: ClusterHandle, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("AMOEBA_DAEMON_ENDPOINT", raising=False)
    yield dict(os.environ)


def test_a_job_submitted_with_submitits_parameters_runs_setup_and_shows_rank_zeros_output(
    env: dict[str, str], tmp_path: Path
) -> None:
    executor = ElasticExecutor(folder=tmp_path / "%j")
    executor.update_parameters(
        min_workers=1,
        max_workers=1,
        gpus_per_worker=0,
        timeout_min=10,
        name="submitit-spellings",
        slurm_qos="normal",
        slurm_setup=["export AMOEBA_TEST_SETUP=exported-by-setup"],
        slurm_additional_parameters={"mail_type": "NONE"},
        mem="256M",
    )
    job = executor.submit(train_and_tell, 1)
    try:
        result = job.result()
    finally:
        if not job.done():
            job.cancel(check=False)
    assert result["status"] == "finished", result
    stdout = job.stdout() or ""
    assert "setup says exported-by-setup" in stdout, (stdout, job.agent_log())
    assert "trained 1 epoch(s) as rank 0" in stdout, stdout
    assert "amoeba" in (job.agent_log() or "").lower()
    record = next(iter(CliSlurmClient(env).jobs(job_ids={int(job.job_id)})), None)
    assert record is None or record.qos == "normal"


def test_map_array_submits_one_checked_elastic_job_per_item(env: dict[str, str], tmp_path: Path) -> None:
    executor = ElasticExecutor(folder=tmp_path / "%j")
    executor.update_parameters(min_workers=1, max_workers=1, gpus_per_worker=0, timeout_min=10)
    jobs = executor.map_array(train_and_tell, [1, 1])
    try:
        assert len({job.job_id for job in jobs}) == 2
        results = [job.result() for job in jobs]
    finally:
        for job in jobs:
            if not job.done():
                job.cancel(check=False)
    assert [r["status"] for r in results] == ["finished", "finished"]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(job.stdout() for job in jobs):
        time.sleep(0.2)
    assert all("as rank 0" in (job.stdout() or "") for job in jobs)
