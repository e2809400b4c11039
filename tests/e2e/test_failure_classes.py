"""A bug in the training code on the local Slurm cluster: the job ends at once instead of shrinking to its minimum.

The job (``amoeba-sbatch --elastic 2:3``, one fake GPU per worker) asks for a third worker (a satellite), then its
training code raises ``ValueError`` at step 20 on every rank (every member: the satellite's worker may have joined or
still be warming up, on a loaded machine). The coordinator sees the same user error on every member
(:mod:`slurm_amoeba.runtime.failures`) and ends the job; its agent prints the traceback in the job's output, records
the class in the history (``job.history()``), stops the workers and releases its satellite.

Run as a script, this module is that job's training program (``python test_failure_classes.py --raise-at 20``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from slurm_amoeba import runtime as amoeba
from slurm_amoeba.launcher.handle import AgentHandle
from slurm_amoeba.slurm import CliSlurmClient, JobState

if TYPE_CHECKING:  # not at run time: as the job's script this module imports nothing of the test suite
    from tests.conftest import ClusterHandle

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]

RAISE_AT = 20
STEP_DELAY_S = 1.0  # step 20 comes ~20 s after training starts: time for the satellite to start


def train_with_a_bug(raise_at: int, step_delay: float) -> int:
    """A small regression whose training code raises ``ValueError`` at global step ``raise_at`` on every rank."""
    amoeba.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    inputs, targets = torch.randn(240, 8), torch.randn(240, 1)
    sampler = amoeba.ElasticSampler(240, 12, seed=3)
    loader = amoeba.ElasticDataLoader(torch.utils.data.TensorDataset(inputs, targets), sampler)
    state = amoeba.TorchState(model, optimizer, sampler)

    def train(state: amoeba.TorchState) -> None:
        while state.epoch < 100:
            for step in loader:
                if state.step_index == raise_at:
                    raise ValueError(f"label out of range in batch of step {state.step_index}")
                for (x, y), weight in step:
                    torch.autograd.backward(torch.nn.functional.mse_loss(model(x), y) * weight)
                time.sleep(step_delay)
                state.step()

    amoeba.run(train, state)
    return 0


def wait_until(what: str, predicate: Callable[[], bool], timeout: float, state_dir: Path | None = None) -> float:
    """Poll ``predicate``; return the seconds it took, or fail with ``what`` (and the ends of the job's logs)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}{log_tails(state_dir)}")
        time.sleep(0.2)
    return time.monotonic() - start


def log_tails(state_dir: Path | None, lines: int = 15) -> str:
    """The last lines of the job's output, its workers' logs and its agent's recent events, for a failure message."""
    if state_dir is None:
        return ""
    parts = []
    for path in sorted([*state_dir.parent.glob("job-*.out"), *state_dir.glob("*.log")]):
        text = path.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {path.name}\n" + "\n".join(text))
    try:
        status = json.loads((state_dir / "agent-status.json").read_text())
        parts.append(f"--- agent: phase {status['phase']}, workers {status['workers']}, {status['history'][-6:]}")
    except (OSError, ValueError, KeyError):
        pass
    return "\n" + "\n".join(parts)


def test_a_user_bug_on_every_rank_ends_the_job_within_seconds_with_its_traceback_and_no_satellite_left(
    tmp_path: Path, slurm_cluster: ClusterHandle
) -> None:
    env = {**os.environ, "SLURM_CONF": str(slurm_cluster.conf)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env.pop("AMOEBA_DAEMON_ENDPOINT", None)
    client = CliSlurmClient(env)
    script = tmp_path / "job.sh"
    script.write_text(
        f"#!/bin/bash\nexec amoeba-run {sys.executable} {Path(__file__).resolve()} --raise-at {RAISE_AT} "
        f"--step-delay {STEP_DELAY_S}\n"
    )
    script.chmod(0o755)
    submitted = subprocess.run(
        ["amoeba-sbatch", "--elastic", "2:3", "--gpus-per-worker", "1", f"--output={tmp_path}/job-%j.out", str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    state_dir = tmp_path / f"amoeba-{job_id}"
    agent = AgentHandle(job_id, state_dir)

    def satellites() -> list[int]:
        return [j.job_id for j in client.jobs() if j.state.is_active() and j.comment == f"amoeba-parent={job_id}"]

    try:
        wait_until("2 workers training", lambda: agent.workers() == 2, 120, state_dir)
        assert agent.resize(3) == 3
        wait_until("the satellite", lambda: bool(satellites()), 10, state_dir)
        wait_until("the job to end", lambda: client.accounting_state(int(job_id)).is_final(), 90, state_dir)
        ended = time.time()
        history = agent.history()
        events = {e["event"]: e for e in history["history"]}
        failed = events["job_failed"]
        assert (failed["failure"], failed["error"], failed["step"]) == ("user", "ValueError", RAISE_AT), failed
        assert failed["reason"] == f"user error: every member raised ValueError at step {RAISE_AT}"
        last = history["generations"][-1]
        assert last["size"] in (2, 3) and last["end_reason"] == "lost"
        assert any(e["event"] == "satellite_submitted" for e in history["history"])
        # Within seconds: from the raise (the generation's end) to the verdict, and to the job's end in Slurm.
        assert failed["t"] - last["ended_at"] < 3, (failed, last)
        assert ended - failed["t"] < 30, "the job outlived its verdict"
        assert client.accounting_state(int(job_id)) is not JobState.COMPLETED
        output = (tmp_path / f"job-{job_id}.out").read_text(errors="replace")
        assert "the job failed (user error, not retried)" in output
        assert "Traceback (most recent call last)" in output and "ValueError: label out of range" in output
        assert "in train" in output  # the raising frame of the training code
        wait_until("no satellite left", lambda: not satellites(), 20, state_dir)
        assert json.loads((tmp_path / f"amoeba-{job_id}" / "agent-status.json").read_text())["phase"] == "lost"
    finally:
        client.cancel(int(job_id))


def main() -> int:
    """The job's training program (see the module docstring)."""
    parser = argparse.ArgumentParser(description="train; raise ValueError at --raise-at on every rank")
    parser.add_argument("--raise-at", type=int, required=True)
    parser.add_argument("--step-delay", type=float, default=0.0)
    args = parser.parse_args()
    return train_with_a_bug(args.raise_at, args.step_delay)


if __name__ == "__main__":
    sys.exit(main())
