"""amoebad orders Slurm's queue by attained service (2D-LAS) on the real cluster; without it Slurm keeps its own order.

The scenario, run twice (without the daemon: the control; with it), with 16-GPU jobs (the whole cluster) of a user
of this test's own, so that they run one at a time and the start order is Slurm's order:

1. ``A`` runs a few seconds (16 GPUs: ~50 GPU-seconds of attained service), then is requeued, as a preempted or
   failed-node job is: it keeps its place (``priority/basic`` keeps its priority, the highest of the queue), and its
   ``StartTime`` is set to now so that it need not wait ``cred_expire`` (120 s);
2. meanwhile ``X`` (a blocker), ``B`` and ``C`` were submitted; X runs while A, B, C wait.

Slurm's own order after X: A, B, C. With the daemon (threshold 20 GPU-seconds, so that A is in the second LAS
queue): B, C, A. The daemon reorders only that user's jobs (``queue_order.users``), so other engineers' jobs on the
shared cluster are never touched; if they hold GPUs the jobs wait longer, but the order stays.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml

from slurm_amoeba.slurm import CliSlurmClient, JobState
from tests.conftest import ClusterHandle
from tests.integration.daemon_helpers import DaemonProcess, wait_until
from tests.integration.test_daemon_two_users import ensure_user

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]

USER = "amoeba-las"
THRESHOLD_GPU_S = 20.0
#: A exits at once when Slurm runs it again after the requeue.
A_SCRIPT = 'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then sleep 1; else sleep 120; fi'


def sbatch(cluster: ClusterHandle, name: str, wrap: str) -> int:
    """A whole-cluster job of the test's user (16 GPUs on 4 nodes, one minute's limit)."""
    gpus = cluster.gpus_per_node
    argv = ["sbatch", "--parsable", "-J", name, "-p", cluster.regular_partition, f"-N{len(cluster.nodes)}"]
    argv += [f"--gres=gpu:{gpus}", "--time=1", "--chdir=/tmp", "-o", "/dev/null", "--wrap", wrap]
    out = subprocess.run(
        ["runuser", "-u", USER, "--", *argv], env=cluster.env, capture_output=True, text=True, timeout=30, check=True
    )
    return int(out.stdout.strip().split(";")[0])


def scontrol(cluster: ClusterHandle, *args: str) -> None:
    subprocess.run(["scontrol", *args], env=cluster.env, capture_output=True, text=True, timeout=30, check=True)


def start_order(client: CliSlurmClient, jobs: dict[str, int]) -> list[str]:
    """The jobs' names by the start time of their last run (A's second run)."""
    records = {r.job_id: r for r in client.jobs(job_ids=list(jobs.values()))}
    return sorted(jobs, key=lambda name: (records[jobs[name]].start_time, jobs[name]))


def run_scenario(cluster: ClusterHandle, workdir: Path, *, with_daemon: bool) -> tuple[list[str], str]:
    """The scenario of the module docstring; returns the start order of A, B, C and the daemon's log."""
    client = cluster.client()
    daemon: DaemonProcess | None = None
    jobs: dict[str, int] = {}
    try:
        if with_daemon:
            daemon = DaemonProcess(cluster, workdir, interval_s=1.0)
            doc = yaml.safe_load(daemon.config.read_text())
            doc["queue_order"] = {
                "enabled": True,
                "thresholds_gpu_s": [THRESHOLD_GPU_S],
                "users": [USER],
                "max_updates_per_round": 10,
            }
            daemon.config.write_text(yaml.safe_dump(doc))
            daemon.start()
        jobs["A"] = sbatch(cluster, "las-A", A_SCRIPT)
        wait_until("A to run", lambda: _state(client, jobs["A"]) is JobState.RUNNING, timeout=60)
        time.sleep(3.0)  # A attains ~3 s x 16 GPUs
        jobs["X"] = sbatch(cluster, "las-X", "sleep 5")
        jobs["B"] = sbatch(cluster, "las-B", "sleep 1")
        jobs["C"] = sbatch(cluster, "las-C", "sleep 1")
        scontrol(cluster, "requeue", str(jobs["A"]))
        wait_until("A to be pending again", lambda: _state(client, jobs["A"]) is JobState.PENDING, timeout=30)
        scontrol(cluster, "update", f"JobId={jobs['A']}", "StartTime=now")
        ordered = {name: jobs[name] for name in ("A", "B", "C")}
        wait_until(
            "A, B and C to finish",
            lambda: all(_state(client, job) is JobState.COMPLETED for job in ordered.values()),
            timeout=90,
            every=0.5,
        )
        order = start_order(client, ordered)
    finally:
        if daemon is not None:
            daemon.stop()
        for job in jobs.values():
            if _state(client, job).is_active():
                client.cancel(job)
    return order, daemon.log_text() if daemon is not None else ""


def _state(client: CliSlurmClient, job_id: int) -> JobState:
    record = client.job(job_id)
    return record.state if record is not None else JobState.UNKNOWN


def test_the_daemon_makes_slurm_start_jobs_in_las_order_and_slurm_alone_does_not(
    slurm_cluster: ClusterHandle, tmp_path: Path
) -> None:
    ensure_user(USER)
    control, _ = run_scenario(slurm_cluster, tmp_path / "without", with_daemon=False)
    assert control == ["A", "B", "C"], f"Slurm's own order (the control) changed: {control}"
    (tmp_path / "with").mkdir()
    ordered, log = run_scenario(slurm_cluster, tmp_path / "with", with_daemon=True)
    assert ordered == ["B", "C", "A"], f"the daemon did not put the requeued job A last: {ordered}\n{log[-3000:]}"
    assert "[daemon/queue] ordering Slurm's queue by attained service" in log
    assert "GPU-s)" in log and "priority" in log
    assert "reordered pending jobs their own priority back" in log  # revert_on_stop ran when it stopped
