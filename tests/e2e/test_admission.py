"""amoebad admits elastic jobs at their requested size on the real cluster: it holds a pending elastic job while its
requested size is not free, releases it when it is, and releases one held too long anyway (the starvation bound).

The scenario, with jobs of a user of this test's own (the daemon admits only that user's jobs,
``admission.users``, so other engineers' jobs on the shared cluster are never touched):

1. ``X``, a regular job that leaves 4 GPUs free (12 of the 16 on an idle cluster), runs a few seconds;
2. meanwhile two elastic jobs, submitted with amoeba-sbatch's own shape and mark (``amoeba-elastic=MIN:MAX`` in the
   comment, ``--begin=now+3`` from ``AMOEBA_ADMISSION_DELAY_S``): ``E`` asks ``2:8`` (requested 8 GPUs), ``W`` asks
   ``2:16`` (the whole cluster). Slurm alone would start both at their minimum of 2 GPUs at once (4 are free).
3. With the daemon (``max_hold_s`` 12): both are held while X runs (the status says "held by amoebad: waiting for 8
   GPUs"); when X ends, 16 GPUs are free: E is released and starts; W still does not fit beside E's 8 and stays held
   until the bound releases it, 12 s after its hold, and it starts at its minimum.

Other engineers' jobs on the shared cluster make the test wait for 8 free GPUs first and size X to what is free; the
CI run has the cluster to itself.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from slurm_amoeba.launcher.sbatch import prepare, submission_env
from slurm_amoeba.slurm import CliSlurmClient, JobRecord, JobState, het_submit_args
from slurm_amoeba.slurm.marks import parse_elastic_comment, parse_hold_mark
from tests.conftest import ClusterHandle
from tests.integration.daemon_helpers import DaemonProcess, wait_until
from tests.integration.test_daemon_two_users import ensure_user

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

USER = "amoeba-admit"
MAX_HOLD_S = 12.0


def runuser_sbatch(cluster: ClusterHandle, args: list[str], env: dict[str, str]) -> int:
    out = subprocess.run(
        ["runuser", "-u", USER, "--", "sbatch", "--parsable", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == 0, f"sbatch {args} as {USER}: {out.stderr}"
    return int(out.stdout.strip().split(";")[0])


def submit_elastic(cluster: ClusterHandle, workdir: Path, elastic: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """An elastic job of the test's user, shaped and marked by amoeba-sbatch's own code (its script only sleeps;
    ``workdir`` must be readable by the user)."""
    script = workdir / f"elastic-{elastic.replace(':', '-')}.sh"
    script.write_text("#!/bin/bash\nsleep 30\n")
    script.chmod(0o755)
    monkeypatch.setenv("AMOEBA_ADMISSION_DELAY_S", "3")
    prepared = prepare(
        ["--elastic", elastic, "--gpus-per-worker", "1", "-t", "2", "-o", "/dev/null", "--chdir=/tmp", str(script)],
        cluster.client(),
    )
    args = het_submit_args(prepared.shape.components())
    assert any(a.startswith("--comment=amoeba-elastic=") for a in args) and "--begin=now+3" in args
    return runuser_sbatch(cluster, [*args, str(script)], submission_env(cluster.env, prepared.shape))


def free_gpus(client: CliSlurmClient) -> int:
    return sum(node.gpus_free for node in client.nodes(partition="batch"))  # not the sharing partition's


def leader(client: CliSlurmClient, job_id: int) -> JobRecord | None:
    return next((r for r in client.jobs(job_ids=[job_id]) if r.het_job_offset == 0), None)


def state(client: CliSlurmClient, job_id: int) -> JobState:
    record = leader(client, job_id)
    return record.state if record is not None else JobState.UNKNOWN


def held_by_daemon(client: CliSlurmClient, job_id: int) -> bool:
    record = leader(client, job_id)
    return record is not None and record.priority == 0 and parse_hold_mark(record.admin_comment) is not None


def test_an_elastic_job_waits_for_its_requested_size_and_the_bound_releases_one_that_never_fits(
    slurm_cluster: ClusterHandle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ensure_user(USER)
    started = time.monotonic()
    client = slurm_cluster.client()
    daemon = DaemonProcess(slurm_cluster, tmp_path, interval_s=1.0)
    doc = yaml.safe_load(daemon.config.read_text())
    doc["admission"] = {"enabled": True, "holds_by": "daemon", "max_hold_s": MAX_HOLD_S, "users": [USER]}
    daemon.config.write_text(yaml.safe_dump(doc))
    jobs: dict[str, int] = {}
    scripts = Path(tempfile.mkdtemp(prefix="amoeba-admit-"))
    scripts.chmod(0o755)  # the test's user reads its scripts there (pytest's tmp_path is root's alone)
    try:
        daemon.start()
        # X leaves 4 GPUs free: on an idle cluster it takes 12 (other engineers' jobs may hold some meanwhile).
        wait_until("8 GPUs or more to be free", lambda: free_gpus(client) >= 8, timeout=240, every=1.0)
        blocker = ["-J", "admit-X", "-p", slurm_cluster.regular_partition, f"--gpus={free_gpus(client) - 4}"]
        blocker += ["--time=1", "--chdir=/tmp", "-o", "/dev/null", "--wrap", "sleep 6"]
        jobs["X"] = runuser_sbatch(slurm_cluster, blocker, slurm_cluster.env)
        wait_until("X to run", lambda: state(client, jobs["X"]) is JobState.RUNNING, timeout=120)
        jobs["E"] = submit_elastic(slurm_cluster, scripts, "2:8", monkeypatch)
        jobs["W"] = submit_elastic(slurm_cluster, scripts, "2:16", monkeypatch)
        w_submitted = time.monotonic()
        record = leader(client, jobs["E"])
        assert record is not None and parse_elastic_comment(record.comment) == (2, 8)
        wait_until("E and W to be held", lambda: all(held_by_daemon(client, jobs[n]) for n in "EW"), timeout=30)
        held = {h["job_id"]: h for h in daemon.status()["admission"]["held"]}
        if state(client, jobs["X"]) is JobState.RUNNING:  # X still holds its 12 GPUs
            assert held[str(jobs["E"])]["wanted"] == 8 and held[str(jobs["W"])]["wanted"] == 16
        wait_until("E to run", lambda: state(client, jobs["E"]) is JobState.RUNNING, timeout=120, every=0.5)
        # W stays held until its bound: on a loaded machine E may start only after W's MAX_HOLD_S ran out (counted
        # from Slurm's submit time, in whole seconds, up to a second before sbatch returned; its log line is checked
        # below)
        w_held = held_by_daemon(client, jobs["W"])
        assert w_held or time.monotonic() - w_submitted >= MAX_HOLD_S - 1.5, "W was released with E, before its bound"
        wait_until("W to run", lambda: state(client, jobs["W"]) is JobState.RUNNING, timeout=60, every=0.5)
        log = daemon.log_text()
        e_line = next(line for line in log.splitlines() if f"job {jobs['E']} (user {USER}) released" in line)
        w_line = next(line for line in log.splitlines() if f"job {jobs['W']} (user {USER}) released" in line)
        assert "its requested 8 GPUs are free or lendable" in e_line, e_line
        assert "admission.max_hold_s 12 s" in w_line and "starts at its minimum (2 GPUs)" in w_line, w_line
        running = {r.job_id: r.gpus_held for r in client.jobs(job_ids=[jobs["W"]]) if r.state is JobState.RUNNING}
        assert list(running.values()) == [2], f"W did not start at its minimum: {running}"
        w_mark = leader(client, jobs["W"])
        assert w_mark is not None and w_mark.admin_comment == "" and w_mark.priority > 0
    finally:
        daemon.stop()
        for job in jobs.values():
            if state(client, job).is_active():
                client.cancel(job)
        shutil.rmtree(scripts, ignore_errors=True)
    log = daemon.log_text()
    assert "[daemon/admission] admitting elastic jobs at their requested size" in log
    print(f"test_admission: {time.monotonic() - started:.1f} s")
