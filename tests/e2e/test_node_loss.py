"""A node dies under a running elastic job on the local Slurm cluster: the job goes on smaller, Slurm marks the node
down, the job regrows on another node (its next satellite excludes the dead one), nothing hangs, nothing is left.

The job (``amoeba-sbatch --elastic 1:2``, a whole node's GPUs per worker) runs its main group off the highest-numbered
node; the test's own placeholder jobs hold the other free nodes so that its satellite lands on the highest-numbered
node, which ``scripts/slurm-cluster kill-node`` then kills (its slurmd and every process in its network namespace).
The placeholders go at once, so the regrowth finds a node. Whatever happens, the node is started and resumed again
(``scripts/slurm-cluster restart-node``). It disturbs other tests on the shared cluster for about a minute.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_amoeba.launcher.handle import AgentHandle
from slurm_amoeba.slurm import CliSlurmClient, JobState, SlurmCommandError, SubmitOptions
from tests.conftest import REPO, ClusterHandle

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(480)]

CLUSTER = REPO / "scripts" / "slurm-cluster"


def wait_until(what: str, predicate: Callable[[], bool], timeout: float, detail: Callable[[], str] = str) -> float:
    """Poll ``predicate`` (a Slurm command failing counts as not yet: others restart munged or slurmctld on the
    shared cluster); return the seconds it took, or fail with ``what`` and ``detail()``."""
    start = time.monotonic()
    while True:
        with contextlib.suppress(SlurmCommandError):
            if predicate():
                return time.monotonic() - start
        if time.monotonic() - start > timeout:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}\n{detail()}")
        time.sleep(0.3)


def cancel(client: CliSlurmClient, job: int) -> None:
    """Cancel ``job``, retrying for a while when Slurm does not answer."""
    for attempt in range(10):
        try:
            client.cancel(job)
            return
        except SlurmCommandError:
            if attempt == 9:
                raise
            time.sleep(2)


def cluster_command(env: dict[str, str], *args: str) -> None:
    """Run ``scripts/slurm-cluster ARGS`` (kill-node, restart-node)."""
    done = subprocess.run([str(CLUSTER), *args], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"slurm-cluster {' '.join(args)} failed: {done.stderr}"


def node_state(env: dict[str, str], node: str) -> str:
    """sinfo's short state of ``node`` (``idle``, ``mix``, ``down*``, ...)."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-n", node, "-o", "%t"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


def processes_of(job_id: str) -> list[int]:
    """Processes anywhere on the machine (every node's namespace) that belong to elastic job ``job_id``."""
    mark = f"AMOEBA_PARENT_JOB={job_id}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if mark in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
    return found


def test_a_dead_node_shrinks_the_job_then_it_regrows_elsewhere_without_hang_or_orphan(
    tmp_path: Path, slurm_cluster: ClusterHandle
) -> None:
    env = {**slurm_cluster.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("AMOEBA_DAEMON_ENDPOINT", None)
    client = CliSlurmClient(env)
    node = max(slurm_cluster.nodes, key=lambda n: int(n.lstrip("n")))
    gpus = slurm_cluster.gpus_per_node
    wait_until(
        "an idle cluster (other tests' jobs; rerun later)",
        lambda: not any(j.state.is_active() for j in client.jobs()),
        timeout=180,
    )
    script = tmp_path / "job.sh"
    script.write_text(f'#!/bin/bash\nexec amoeba-run {sys.executable} {REPO / "examples/elastic_mlp.py"} "$@"\n')
    script.chmod(0o755)
    job_id, placeholders = "", []
    try:
        submitted = subprocess.run(
            ["amoeba-sbatch", "--elastic", "1:2", "--gpus-per-worker", str(gpus), f"--exclude={node}",
             f"--output={tmp_path}/job-%j.out", str(script), "--epochs", "100000", "--sample-delay", "0.006"],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60, check=False,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip().splitlines()[-1]
        state_dir = tmp_path / f"amoeba-{job_id}"
        agent = AgentHandle(job_id, state_dir)

        def detail() -> str:
            out = (tmp_path / f"job-{job_id}.out").read_text(errors="replace").splitlines()[-25:]
            return "\n".join(out) + f"\nhistory: {agent.status().get('history', [])[-8:]}"

        def satellites() -> dict[int, tuple[str, ...]]:
            return {
                j.job_id: j.nodes
                for j in client.jobs()
                if j.state.is_active() and j.comment == f"amoeba-parent={job_id}"
            }

        wait_until("1 worker training", lambda: agent.workers() == 1, 150, detail)
        components = client.het_components(int(job_id))
        assert not any(node in c.nodes for c in components), components
        # Hold the GPUs of every other node but the main workers' with a placeholder, so that the satellite lands on
        # `node` (the agent's component holds no GPU).
        for other in sorted(set(slurm_cluster.nodes) - set(components[-1].nodes) - {node}):
            (tmp_path / "hold.sh").write_text("#!/bin/bash\nsleep 600\n")
            placeholders.append(
                client.submit(
                    tmp_path / "hold.sh",
                    SubmitOptions(
                        partition=slurm_cluster.elastic_partition,
                        nodelist=other,
                        gpus_per_node=gpus,
                        name="amoeba-test-hold",
                        output=str(tmp_path / "hold-%j.out"),
                    ),
                )
            )
        wait_until(
            "the placeholders to run",
            lambda: all((r := client.job(p)) is not None and r.state is JobState.RUNNING for p in placeholders),
            60,
        )
        assert agent.resize(2) == 2
        wait_until("2 workers training", lambda: agent.workers() == 2, 120, detail)
        (first,) = satellites().values()
        assert first == (node,), f"the satellite runs on {first}, not on {node}"

        cluster_command(env, "kill-node", node)
        killed_at = time.monotonic()
        for placeholder in placeholders:
            cancel(client, placeholder)
        wait_until("the job to go on with 1 worker", lambda: agent.workers() == 1, 60, detail)
        events = agent.status()["history"]
        released = [e for e in events if e["event"] == "satellite_released"]
        assert released and released[-1]["failure"] == "infrastructure", released
        wait_until("the job to regrow to 2 workers", lambda: agent.workers() == 2, 120, detail)
        regrown = [nodes for nodes in satellites().values() if nodes != (node,)]
        assert regrown and all(node not in nodes for nodes in regrown), satellites()
        assert f"#SBATCH --exclude={node}" in (state_dir / "satellite-g2.sh").read_text()
        wait_until(f"Slurm to mark {node} down", lambda: "down" in node_state(env, node), 90)
        assert time.monotonic() - killed_at < 150
        step = agent.status()["series"][-1]["step"]
        wait_until("training to go on", lambda: (agent.status()["series"][-1]["step"] or 0) > (step or 0), 30, detail)

        cancel(client, int(job_id))
        wait_until(
            "the job and its satellites to end",
            lambda: client.accounting_state(int(job_id)).is_final() and not satellites(),
            90,
            detail,
        )
        wait_until(
            "no process of the job left", lambda: not processes_of(job_id), 30, lambda: str(processes_of(job_id))
        )
    finally:
        cluster_command(env, "restart-node", node)
        for placeholder in placeholders:
            cancel(client, placeholder)
        if job_id:
            cancel(client, int(job_id))
