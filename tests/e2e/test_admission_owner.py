"""Admission held by the jobs' owners, live (``admission.holds_by: owner``, the shipped default): an elastic job's
admission guard holds its own job at the daemon's word while its requested size is not free, releases it when it
is, and lets go of another job's hold when the daemon stops answering (docs/admin.md, section 8c).

The scenario: ``X``, a regular job, leaves 4 GPUs free for 8 s; ``E`` asks ``2:8`` and ``W`` ``2:16`` (amoeba-sbatch's
shape and mark, eligible 3 s after submission), each with a guard (``python -m slurm_amoeba.launcher.guard``,
polling every second) as amoeba-sbatch starts it. Slurm alone would start both at once at their minimum. With the
daemon: both are held by their guards; when X ends E is released and starts; W still waits (16 GPUs are never free
beside E) until the daemon stops: its guard then releases it after its silence bound (4 s), and it starts at its
minimum. Here every job, guard and daemon runs as the test's user (the cluster's jobs cannot run this Python as
another user); that an owner may hold and release their own job as a plain user is in docs/SLURM-FACTS.md.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from slurm_amoeba.launcher.guard import guard_argv
from slurm_amoeba.launcher.sbatch import prepare, submission_env
from slurm_amoeba.slurm import CliSlurmClient, JobRecord, JobState, het_submit_args
from tests.conftest import ClusterHandle
from tests.integration.daemon_helpers import DaemonProcess, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


def record(client: CliSlurmClient, job_id: int) -> JobRecord | None:
    return next(iter(client.jobs(job_ids=[job_id])), None)


def state(client: CliSlurmClient, job_id: int) -> JobState:
    found = record(client, job_id)
    return found.state if found is not None else JobState.UNKNOWN


def held(client: CliSlurmClient, job_id: int) -> bool:
    found = record(client, job_id)
    return found is not None and found.state is JobState.PENDING and found.is_held


def submit(cluster: ClusterHandle, client: CliSlurmClient, script: Path, elastic: str) -> int:
    prepared = prepare(
        ["--elastic", elastic, "--gpus-per-worker", "1", "-t", "2", "-o", "/dev/null", str(script)], client
    )
    args = het_submit_args(prepared.shape.components())
    assert "--begin=now+3" in args and ":" not in args
    out = subprocess.run(
        ["sbatch", "--parsable", *args, str(script)],
        env=submission_env(cluster.env, prepared.shape),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(out.stdout.strip().split(";")[0])


def test_guards_hold_their_own_jobs_at_the_daemons_word_and_let_go_when_it_stops(
    slurm_cluster: ClusterHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = slurm_cluster.client()
    daemon = DaemonProcess(slurm_cluster, tmp_path, interval_s=1.0)
    doc = yaml.safe_load(daemon.config.read_text())
    doc["admission"] = {"enabled": True, "holds_by": "owner", "max_hold_s": 600}
    daemon.config.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("AMOEBA_ADMISSION_DELAY_S", "3")
    workdir = Path(tempfile.mkdtemp(prefix="amoeba-owner-"))
    script = workdir / "job.sh"
    script.write_text("#!/bin/bash\nsleep 20\n")
    script.chmod(0o755)
    env = {**slurm_cluster.env, "PYTHONPATH": str(REPO), "AMOEBA_DAEMON_UID": str(os.getuid())}
    jobs: dict[str, int] = {}
    guards: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: workdir / f"guard-{name}.log" for name in "EW"}
    try:
        daemon.start()
        wait_until(
            "8 GPUs or more to be free",
            lambda: sum(n.gpus_free for n in client.nodes(partition=slurm_cluster.regular_partition)) >= 8,
            timeout=240,
        )
        free = sum(n.gpus_free for n in client.nodes(partition=slurm_cluster.regular_partition))
        blocker = ["sbatch", "--parsable", "-J", "owner-X", "-p", slurm_cluster.regular_partition, f"--gpus={free - 4}"]
        blocker += ["--time=1", "--chdir=/tmp", "-o", "/dev/null", "--wrap", "sleep 8"]
        out = subprocess.run(blocker, env=slurm_cluster.env, capture_output=True, text=True, timeout=30, check=True)
        jobs["X"] = int(out.stdout.strip())
        wait_until("X to run", lambda: state(client, jobs["X"]) is JobState.RUNNING, timeout=120)
        for name, elastic in (("E", "2:8"), ("W", "2:16")):
            jobs[name] = submit(slurm_cluster, client, script, elastic)
            argv = [*guard_argv(jobs[name], daemon.endpoint, sys.executable), "--poll", "1", "--silence", "4"]
            with logs[name].open("wb") as out_file:
                guards[name] = subprocess.Popen(argv, env=env, stdout=out_file, stderr=out_file)
        wait_until("E and W to be held by their guards", lambda: held(client, jobs["E"]) and held(client, jobs["W"]))
        shown = {h["job_id"] for h in daemon.status()["admission"]["held"]}
        assert {str(jobs["E"]), str(jobs["W"])} <= shown, shown
        wait_until("E to run", lambda: state(client, jobs["E"]) is JobState.RUNNING, timeout=120, every=0.5)
        assert held(client, jobs["W"]), "W was released with E although 16 GPUs were never free beside E"
        wait_until("E's guard to end", lambda: guards["E"].poll() is not None, timeout=10)
        daemon.stop()
        stopped = time.monotonic()
        wait_until("W to run", lambda: state(client, jobs["W"]) is JobState.RUNNING, timeout=60, every=0.5)
        print(f"test_admission_owner: W started {time.monotonic() - stopped:.1f} s after the daemon stopped")
        e_log, w_log = (logs[name].read_text(errors="replace") for name in "EW")
        assert "held at the daemon's word" in e_log and "released: the daemon's verdict is" in e_log, e_log
        assert "released: the daemon has not answered for 4 s" in w_log, w_log
        text = daemon.log_text()
        assert "holds by the jobs' owners, through their admission guards" in text, text[-2000:]
    finally:
        daemon.stop()
        for guard in guards.values():
            if guard.poll() is None:
                guard.terminate()
        for job in jobs.values():
            if state(client, job).is_active():
                client.cancel(job)
        shutil.rmtree(workdir, ignore_errors=True)
