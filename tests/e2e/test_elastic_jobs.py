"""Elastic jobs end to end on the local Slurm cluster: grow with satellites, shrink, preemption, no orphans.

The job is ``examples/elastic_mlp.py`` (a small real model on CPU). Each worker takes a whole node's 4 fake GPUs, so
the minimum (2 workers) holds 2 nodes and growing to 4 fills the cluster (one satellite per node): a regular job
that needs a node must then preempt one satellite, and the job goes on with 3 workers. Every worker writes a
per-sample ledger; the test rebuilds the final timeline from the agent's generations and checks that every sample
of every epoch was applied exactly once.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from examples.elastic_mlp import train
from slurm_amoeba.launcher import ElasticExecutor
from slurm_amoeba.launcher.handle import AgentHandle
from slurm_amoeba.slurm import CliSlurmClient, JobState, SubmitOptions
from slurm_amoeba.slurm.satellite import parse_satellite_name
from tests.conftest import REPO, ClusterHandle

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(420)]

DATASET = 2048
GLOBAL_BATCH = 64
SAMPLE_DELAY = 0.012  # seconds per local sample: a 2-worker step takes ~0.4 s, a 4-worker one ~0.2 s
# Epochs of each job (32 steps each, ~12 s at 2 workers, ~6 s at 4): its resizes are over within ~10 s of its start
# (seen: 7 s for the shell job, 11 s for the executor's). The executor's job must then outlast Slurm's preemption of a
# satellite (its decision, GraceTime and KillWait: seen up to 20 s at 4 workers) to reach its 3-worker generation.
EXECUTOR_EPOCHS = 7
SHELL_EPOCHS = 3


def wait_until(what: str, predicate: Callable[[], bool], timeout: float = 60.0) -> float:
    """Poll ``predicate``; return the seconds it took, or fail with ``what``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - start


@pytest.fixture
def job_env(slurm_cluster: ClusterHandle, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """This process's environment pointed at the cluster, with the venv's commands first on PATH.

    Afterwards, jobs that appeared during the test and are still active (the test's job, its satellites) are
    cancelled; jobs that were there before are left alone.
    """
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("AMOEBA_DAEMON_ENDPOINT", raising=False)
    client = CliSlurmClient(dict(os.environ))
    before = {job.job_id for job in client.jobs()}
    yield dict(os.environ)
    for job in client.jobs():
        if job.state.is_active() and job.job_id not in before and job.job_id > max(before, default=0):
            client.cancel(job.job_id)


def satellites_of(client: CliSlurmClient, job_id: str) -> list[int]:
    """Active satellites of ``job_id`` as squeue shows them (by name and comment)."""
    return [
        j.job_id
        for j in client.jobs()
        if j.state.is_active()
        and (parse_satellite_name(j.name) or ("", ""))[0] == job_id
        and j.comment == f"amoeba-parent={job_id}"
    ]


def applied_samples(ledger_dir: Path, generations: list[dict[str, Any]]) -> dict[int, collections.Counter[int]]:
    """Per epoch, how often each sample was applied in the final timeline (a rollback undoes later steps)."""
    by_generation: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for path in ledger_dir.glob("ledger-*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            by_generation[entry["generation"]].append(entry)
    kept: list[dict[str, Any]] = []
    for record in generations:
        start = record.get("start_step") or 0
        kept = [e for e in kept if e["step"] < start]
        kept.extend(by_generation.get(record["generation"], []))
    counts: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for entry in kept:
        counts[entry["epoch"]].update(entry["indices"])
    return counts


def assert_exactly_once(ledger_dir: Path, generations: list[dict[str, Any]], epochs: int) -> None:
    counts = applied_samples(ledger_dir, generations)
    assert sorted(counts) == list(range(epochs))
    for epoch, counter in counts.items():
        repeated = {i: n for i, n in counter.items() if n != 1}
        missing = set(range(DATASET)) - set(counter)
        assert not repeated and not missing, f"epoch {epoch}: repeated {repeated}, missing {sorted(missing)[:10]}"


def preempt_one_satellite(client: CliSlurmClient, slurm_cluster: ClusterHandle, tmp_path: Path) -> int:
    """Submit a regular job that needs a whole node's GPUs while the elastic job fills the cluster."""
    script = tmp_path / "regular.sh"
    script.write_text("#!/bin/bash\nsleep 5\n")
    return client.submit(
        script,
        SubmitOptions(
            partition=slurm_cluster.regular_partition,
            nodes=1,
            gpus_per_node=slurm_cluster.gpus_per_node,
            name="regular",
            output=str(tmp_path / "regular.out"),
        ),
    )


def test_an_executor_job_grows_shrinks_and_survives_preemption_with_every_sample_once(
    tmp_path: Path, slurm_cluster: ClusterHandle, job_env: dict[str, str]
) -> None:
    client = CliSlurmClient(job_env)
    executor = ElasticExecutor(folder=tmp_path / "jobs" / "%j")
    executor.update_parameters(min_workers=2, max_workers=4, gpus_per_worker=slurm_cluster.gpus_per_node)
    ledger = tmp_path / "ledger"
    job = executor.submit(
        train,
        epochs=EXECUTOR_EPOCHS,
        dataset_size=DATASET,
        global_batch=GLOBAL_BATCH,
        sample_delay=SAMPLE_DELAY,
        ledger=ledger,
    )
    wait_until("2 workers training", lambda: job.workers() == 2, timeout=90)

    # Grow: satellites in the elastic partition (one per node's worth of workers) bring 2 workers that warm up and
    # join.
    assert job.resize(4) == 4
    wait_until("the satellites to run", lambda: len(satellites_of(client, job.job_id)) == 2, timeout=30)
    joined_s = wait_until("4 workers training", lambda: job.workers() == 4, timeout=60)
    assert joined_s < 30, f"the satellite's workers took {joined_s:.1f} s to join"
    for sat_id in satellites_of(client, job.job_id):
        sat = client.job(sat_id)
        assert sat is not None and sat.partition == slurm_cluster.elastic_partition and len(sat.nodes) == 1

    # Shrink: its workers leave at a step boundary, then the satellite is released.
    assert job.resize(2) == 2
    wait_until("2 workers training", lambda: job.workers() == 2, timeout=30)
    wait_until("the satellite to leave squeue", lambda: not satellites_of(client, job.job_id), timeout=30)

    # Preemption: grow again into the whole cluster; a regular job takes a node back within GraceTime.
    job.resize(4)
    wait_until("4 workers training again", lambda: job.workers() == 4, timeout=90)
    regular = preempt_one_satellite(client, slurm_cluster, tmp_path)
    wait_until(
        "the regular job to start",
        lambda: client.accounting_state(regular) in (JobState.RUNNING, JobState.COMPLETED),
        timeout=slurm_cluster.grace_time_s + 30,
    )
    # Only the preempted node's satellite goes: the job goes on with 3 workers.
    wait_until("the elastic job to go on with 3 workers", lambda: job.workers() == 3, timeout=30)

    result = job.result()
    assert result["status"] == "finished" and result["samples"] == EXECUTOR_EPOCHS * DATASET
    history = job.history()
    events = [e["event"] for e in history["history"]]
    assert events.count("satellite_submitted") == 4 and "satellite_released" in events, history["history"]
    sizes = [g["size"] for g in history["generations"]]
    assert max(sizes) == 4 and sizes[-1] == 3
    assert set(history["throughput"]) >= {"2", "4"}
    assert_exactly_once(ledger, history["generations"], EXECUTOR_EPOCHS)
    wait_until("no satellite left", lambda: not satellites_of(client, job.job_id), timeout=20)


def test_amoeba_sbatch_and_amoeba_run_grow_and_shrink_a_shell_job(
    tmp_path: Path, slurm_cluster: ClusterHandle, job_env: dict[str, str]
) -> None:
    client = CliSlurmClient(job_env)
    ledger = tmp_path / "ledger"
    submitted = subprocess.run(
        [
            "amoeba-sbatch",
            "--elastic",
            "2:3",
            "--gpus-per-worker",
            "2",
            f"--output={tmp_path}/agent-%j.out",
            "examples/job.sh",
            "--epochs",
            str(SHELL_EPOCHS),
            "--dataset-size",
            str(DATASET),
            "--sample-delay",
            str(SAMPLE_DELAY),
            "--ledger",
            str(ledger),
        ],
        capture_output=True,
        text=True,
        env=job_env,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    comps = client.het_components(int(job_id))
    assert [c.het_job_offset for c in comps] == [0]  # one component: no heterogeneous job (SLURM-FACTS.md)
    agent = AgentHandle(job_id, REPO / f"amoeba-{job_id}")
    try:
        wait_until("2 workers training", lambda: agent.workers() == 2, timeout=90)
        assert agent.resize(3) == 3
        wait_until("3 workers training", lambda: agent.workers() == 3, timeout=60)
        assert agent.resize(2) == 2
        wait_until("back to 2 workers", lambda: agent.workers() == 2, timeout=30)
        wait_until("the job to end", lambda: client.accounting_state(int(job_id)).is_final(), timeout=180)
        assert client.accounting_state(int(job_id)) is JobState.COMPLETED
        result = json.loads((ledger / "result.json").read_text())
        assert result["samples"] == SHELL_EPOCHS * DATASET
        generations = agent.history()["generations"]
        assert [g["size"] for g in generations][:1] == [2] and max(g["size"] for g in generations) == 3
        assert_exactly_once(ledger, generations, SHELL_EPOCHS)
        assert not satellites_of(client, job_id)
    finally:
        shutil.rmtree(REPO / f"amoeba-{job_id}", ignore_errors=True)


def test_a_satellite_whose_parent_is_gone_exits_by_itself(
    tmp_path: Path, slurm_cluster: ClusterHandle, job_env: dict[str, str]
) -> None:
    client = CliSlurmClient(job_env)
    executor = ElasticExecutor(folder=tmp_path / "jobs" / "%j")
    executor.update_parameters(min_workers=1, max_workers=2, gpus_per_worker=slurm_cluster.gpus_per_node)
    job = executor.submit(
        train, epochs=1000, dataset_size=DATASET, global_batch=GLOBAL_BATCH, sample_delay=SAMPLE_DELAY
    )
    wait_until("1 worker training", lambda: job.workers() == 1, timeout=90)
    job.resize(2)
    wait_until("2 workers training", lambda: job.workers() == 2, timeout=90)
    (satellite,) = satellites_of(client, job.job_id)
    # SIGKILL to the agent and every step: the agent cannot clean up, so the satellite must notice on its own.
    client.cancel(int(job.job_id), signal="KILL", full=True)
    wait_until("the parent to end", lambda: client.accounting_state(int(job.job_id)).is_final(), timeout=30)
    gone_s = wait_until("the orphan satellite to exit", lambda: not satellites_of(client, job.job_id), timeout=30)
    assert gone_s < 15, f"the orphan satellite took {gone_s:.1f} s to exit"
    assert client.accounting_state(satellite).is_final()
