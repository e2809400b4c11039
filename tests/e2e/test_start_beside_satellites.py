"""An elastic job whose minimum workers can start only by preempting satellites starts once they have left, and Slurm
never drops it at its start (SLURM-FACTS.md, "hetjob start failure").

What used to happen: amoeba-sbatch submitted a heterogeneous job (component 0 the agent, CPUs only; component 1 the
workers). Slurm 22.05's backfill starts a heterogeneous job's components one after the other
(``_het_job_start_now``): the agent's component started at once, the workers' could not (their GPUs were held by
satellites in the preemptible partition, which Slurm preempted but which leave only after ``GraceTime``), and
backfill then deallocated the agent's component and kept the job from starting for the credential lifetime
(``_het_job_kill_now``: "Deallocate JobId=N+0(N) due to hetjob start failure", then ``BeginTime``). The test shows
both: that shape, submitted by hand, is dropped at its start; amoeba-sbatch's shape (one component) starts after the
satellites' grace time and nothing is dropped.

The satellites take every GPU that is free when the test starts (others' jobs on the shared cluster keep theirs),
as the test's own user.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from slurm_amoeba.launcher.sbatch import prepare, submission_env
from slurm_amoeba.slurm import CliSlurmClient, JobState, het_submit_args
from tests.conftest import ClusterHandle
from tests.e2e.test_admission import USER, runuser_sbatch
from tests.integration.daemon_helpers import wait_until
from tests.integration.test_daemon_two_users import ensure_user

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

FAILURE = "due to hetjob start failure"


def sbatch_as_user(cluster: ClusterHandle, args: list[str], env: dict[str, str] | None = None) -> int:
    return runuser_sbatch(cluster, args, env or cluster.env)


def fill_with_satellites(cluster: ClusterHandle, client: CliSlurmClient) -> list[int]:
    """One preemptible job per node with free GPUs, holding all of them; returns them once they all run."""
    jobs = []
    for node in client.nodes(partition=cluster.elastic_partition):
        if node.gpus_free > 0:
            args = ["-p", cluster.elastic_partition, "-w", node.name, "-n1", f"--gpus-per-node={node.gpus_free}"]
            args += ["-t", "5", "-o", "/dev/null", "--chdir=/tmp", "-J", "satellite-of-test", "--wrap", "sleep 300"]
            jobs.append(sbatch_as_user(cluster, args))
    wait_until(
        "the satellites to run",
        lambda: {r.job_id for r in client.jobs(job_ids=jobs) if r.state is JobState.RUNNING} == set(jobs),
        timeout=60,
    )
    return jobs


def log_lines(cluster: ClusterHandle, job_id: int) -> list[str]:
    text = (cluster.root / "log" / "slurmctld.log").read_text(errors="replace")
    return [line for line in text.splitlines() if f"JobId={job_id}+" in line or f"JobId={job_id} " in line]


def test_an_elastic_job_that_preempts_satellites_to_start_is_never_dropped_at_its_start(
    slurm_cluster: ClusterHandle,
) -> None:
    ensure_user(USER)
    client = slurm_cluster.client()
    workdir = Path(tempfile.mkdtemp(prefix="amoeba-start-"))
    workdir.chmod(0o755)
    script = workdir / "job.sh"
    script.write_text("#!/bin/bash\nsleep 5\n")
    script.chmod(0o755)
    mine: list[int] = []
    try:
        wait_until(
            "2 GPUs or more to be free",
            lambda: sum(n.gpus_free for n in client.nodes(partition=slurm_cluster.regular_partition)) >= 2,
            timeout=240,
        )
        # The heterogeneous shape amoeba-sbatch used to submit: the agent's component starts, the workers' cannot.
        mine += fill_with_satellites(slurm_cluster, client)
        old = ["-p", slurm_cluster.regular_partition, "-t", "2", "-o", "/dev/null", "--chdir=/tmp", "-n1", "-c1"]
        old += [":", "-p", slurm_cluster.regular_partition, "-t", "2", "-n2", "--gpus-per-task=1", str(script)]
        het = sbatch_as_user(slurm_cluster, old)
        mine.append(het)
        wait_until(
            "the heterogeneous job to be dropped", lambda: any(FAILURE in s for s in log_lines(slurm_cluster, het))
        )
        for job_id in mine:  # the heterogeneous job and every satellite (Slurm preempted only those it needed)
            client.cancel(job_id)
        gone = lambda: not any(r.state.is_active() for r in client.jobs(job_ids=mine))  # noqa: E731
        wait_until("the satellites to leave", gone, timeout=60)
        # amoeba-sbatch's shape: one component; it waits for the satellites' grace time, then starts.
        mine += fill_with_satellites(slurm_cluster, client)
        prepared = prepare(
            ["--elastic", "2:4", "--gpus-per-worker", "1", "-t", "2", "-o", "/dev/null", "--chdir=/tmp", str(script)],
            client,
        )
        args = het_submit_args(prepared.shape.components())
        assert ":" not in args
        job = sbatch_as_user(slurm_cluster, [*args, str(script)], submission_env(slurm_cluster.env, prepared.shape))
        mine.append(job)
        submitted = time.monotonic()
        wait_until(
            "the elastic job to start",
            lambda: any(r.state is not JobState.PENDING for r in client.jobs(job_ids=[job])),
            timeout=slurm_cluster.grace_time_s + 60,
            every=0.5,
        )
        waited = time.monotonic() - submitted
        lines = log_lines(slurm_cluster, job)
        assert not any(FAILURE in line or "Requeuing" in line for line in lines), lines
        assert any("Started JobId=" in line or "Allocate JobId=" in line for line in lines), lines
        print(
            f"test_start_beside_satellites: started {waited:.1f} s after submission (GraceTime "
            f"{slurm_cluster.grace_time_s} s)"
        )
    finally:
        for record in client.jobs(job_ids=mine):
            if record.state.is_active():
                client.cancel(record.job_id)
        shutil.rmtree(workdir, ignore_errors=True)
