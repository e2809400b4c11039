"""``scripts/bench-checkpoint``: what disk checkpoints cost a training step (docs/runtime.md, "Disk checkpoints").

On the model of ``scripts/bench-runtime`` (:mod:`benchmarks.runtime_worker`: an MLP of 1.06 M parameters, SGD with
momentum, so 8.5 MB of state; global batch 64, 2 workers, gloo on CPU) a local job commits every ``--block``
steps and writes a disk checkpoint at every second commit (``every_steps = 2 * block``). The blocks of steps that
follow a checkpoint (the background write runs during them) are compared with their neighbours, which follow a
commit without a checkpoint, in the same processes: the load of a shared machine then cancels out.

* ``extra_s_per_checkpoint``: median over checkpoints of (block after it) - (mean of the two neighbouring blocks):
  the training time one checkpoint costs (capture is the commit's, already paid without checkpoints; what is
  measured is the submit, the agreement's extra element and the writer thread's share of the cores).
* ``ratio_at_block``: median of (block after a checkpoint) / (its neighbours) - 1, i.e. the overhead when writing
  at every ``2 * block`` steps.
* ``ratio_at_default``: ``extra_s_per_checkpoint`` / the default interval (``DEFAULT_EVERY_S``): the steady-state
  overhead at the default setting (target <= 1 %).
* ``write_s``: from the commit to the checkpoint's ``COMPLETE`` marker (the background write's latency).

Run as ``scripts/bench-checkpoint [--quick] [--reps N] [--json FILE]``; the worker side is
``python -m benchmarks.checkpoint worker ...`` (started by the harness).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.record import Recording
from benchmarks.runtime_worker import GLOBAL_BATCH, build_dataset, build_model
from slurm_amoeba.local.job import LocalJob
from slurm_amoeba.runtime.checkpoint import COMPLETE, DEFAULT_EVERY_S, CheckpointPolicy, list_checkpoints

DEADLINE_S = 600.0


def run_worker(args: argparse.Namespace) -> None:
    """One training process: commit every ``--block`` steps, checkpoint every second commit, log step end times."""
    from slurm_amoeba import runtime as amoeba

    amoeba.init()
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sampler = amoeba.ElasticSampler(8192, GLOBAL_BATCH, seed=1)
    loader = amoeba.ElasticDataLoader(build_dataset(), sampler)
    state = amoeba.TorchState(model, optimizer, sampler)
    loss_fn = torch.nn.CrossEntropyLoss()
    policy = CheckpointPolicy(args.checkpoints, every_steps=2 * args.block, every_s=0, keep=10**6)
    ends: list[list[float]] = []

    def train(state: amoeba.TorchState) -> None:
        while state.step_index < args.steps:
            for step in loader:
                for (x, y), weight in step:
                    (loss_fn(model(x), y) * weight).backward()
                state.step()
                if state.step_index % args.block == 0:
                    state.commit()
                ends.append([float(state.step_index), time.perf_counter(), time.time()])
                if state.step_index >= args.steps:
                    return

    result = amoeba.run(train, state, checkpoint=policy)
    if result.is_rank0:
        (args.out / "steps.json").write_text(json.dumps(ends))


def block_times(ends: list[list[float]], block: int) -> dict[int, float]:
    """Seconds per block of ``block`` steps: block ``k`` holds steps ``k*block+1 .. (k+1)*block``.

    Args:
        ends: ``[step, perf_counter, wall]`` at the end of each step (after its commit, if any).
        block: steps per block.

    Returns:
        Block index to its duration (the first block, which has no start, is left out).
    """
    at = {int(step): t for step, t, _ in ends}
    return {k: at[(k + 1) * block] - at[k * block] for k in range(1, max(at) // block) if (k + 1) * block in at}


def checkpoint_cost(times: dict[int, float]) -> tuple[list[float], list[float]]:
    """Per checkpoint: its block's extra seconds over its neighbours, and its block's ratio to them.

    Blocks with an even index follow a checkpoint (written at steps that are multiples of ``2 * block``); each is
    compared with the mean of the blocks before and after it.
    """
    extras, ratios = [], []
    for k, spent in times.items():
        if k % 2 == 0 and k - 1 in times and k + 1 in times:
            neighbours = (times[k - 1] + times[k + 1]) / 2
            extras.append(spent - neighbours)
            ratios.append(spent / neighbours)
    return extras, ratios


def write_latencies(checkpoints: Path, ends: list[list[float]]) -> list[float]:
    """Seconds from each checkpoint's commit (wall clock) to its ``COMPLETE`` marker."""
    wall = {int(step): w for step, _, w in ends}
    return [
        (c.path / COMPLETE).stat().st_mtime - wall[c.step]
        for c in list_checkpoints(checkpoints)
        if c.complete and c.step in wall
    ]


def one_run(work: Path, steps: int, block: int) -> dict[str, Any]:
    """One local job of 2 workers; the figures of one repetition."""
    checkpoints = work / "checkpoints"
    command = [sys.executable, "-m", "benchmarks.checkpoint", "worker", "--out", str(work)]
    command += ["--checkpoints", str(checkpoints), "--steps", str(steps), "--block", str(block)]
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
    with LocalJob(command, initial_workers=2, job_id="bench-ckpt", env=env, log_dir=work / "logs") as job:
        result = job.wait(DEADLINE_S)
    if result.phase.value != "finished":
        raise RuntimeError(f"bench-checkpoint: the job ended {result.phase.value}; logs in {work / 'logs'}")
    ends = json.loads((work / "steps.json").read_text())
    times = block_times(ends, block)
    extras, ratios = checkpoint_cost(times)
    plain = [t for k, t in times.items() if k % 2 == 1]
    return {
        "step_s": statistics.median(plain) / block,
        "extra_s_per_checkpoint": statistics.median(extras),
        "ratio_at_block": statistics.median(ratios) - 1,
        "write_s": statistics.median(write_latencies(checkpoints, ends)),
        "checkpoints": len(extras),
        "extras_quartiles": statistics.quantiles(extras, n=4) if len(extras) > 1 else extras,
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode")
    worker = sub.add_parser("worker", help="one training process (started by the harness)")
    worker.add_argument("--out", type=Path, required=True)
    worker.add_argument("--checkpoints", type=Path, required=True)
    worker.add_argument("--steps", type=int, required=True)
    worker.add_argument("--block", type=int, required=True)
    parser.add_argument("--quick", action="store_true", help="fewer steps, one repetition")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--block", type=int, default=30, help="steps per block (default 30)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    recording = Recording("checkpoint", vars(args))
    if args.mode == "worker":
        logging.basicConfig(level=logging.WARNING)
        run_worker(args)
        return 0
    pairs = 6 if args.quick else 20
    reps = 1 if args.quick else args.reps
    runs = []
    for rep in range(reps):
        work = Path(tempfile.mkdtemp(prefix="amoeba-bench-ckpt-"))
        try:
            runs.append(one_run(work, steps=(2 * pairs + 2) * args.block, block=args.block))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"repetition {rep + 1}/{reps}: {json.dumps(runs[-1])}", file=sys.stderr, flush=True)
    figures = _summary(runs, args.block)
    _print_table(figures)
    if args.json is not None:
        recording.write(args.json, figures)
    return 0


def _summary(runs: list[dict[str, Any]], block: int) -> dict[str, Any]:
    def median(key: str) -> float:
        return statistics.median(float(run[key]) for run in runs)

    extra = median("extra_s_per_checkpoint")
    return {
        "model_parameters": sum(p.numel() for p in build_model().parameters()),
        "workers": 2,
        "block_steps": block,
        "checkpoint_every_steps": 2 * block,
        "default_every_s": DEFAULT_EVERY_S,
        "step_s": median("step_s"),
        "extra_s_per_checkpoint": extra,
        "ratio_at_block": median("ratio_at_block"),
        "ratio_at_default": extra / DEFAULT_EVERY_S,
        "write_s": median("write_s"),
        "repetitions": runs,
        "torch": torch.__version__,
        "host": platform.node(),
        "load_average": list(os.getloadavg()),
    }


def _print_table(figures: dict[str, Any]) -> None:
    runs = figures["repetitions"]
    rows = [
        ("step_s", "steady step time, blocks without a checkpoint (s)"),
        ("extra_s_per_checkpoint", "training time one checkpoint costs (s)"),
        ("ratio_at_block", f"overhead writing every {figures['checkpoint_every_steps']} steps"),
        ("ratio_at_default", f"overhead at the default interval ({figures['default_every_s']:.0f} s)"),
        ("write_s", "commit to COMPLETE, in the background (s)"),
    ]
    print(f"{'JSON key':<24} {'median':>12}  {'per repetition':<36} what")
    for key, what in rows:
        each = ", ".join(f"{run[key]:.4g}" for run in runs) if key in runs[0] else "-"
        print(f"{key:<24} {figures[key]:>12.4g}  {each:<36} {what}")


if __name__ == "__main__":
    sys.exit(main())
