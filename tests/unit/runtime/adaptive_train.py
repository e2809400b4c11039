"""A seeded job with an adaptive global batch, launched by ``test_adaptive_job.py`` as worker processes (not a test).

It trains a float64 MLP on a synthetic regression set with ``ElasticSampler(max_global_batch=...)`` and writes one
ledger line per applied step (generation, step, epoch, this rank's indices, the step's samples) and, on finishing,
the parameters. The batch is chosen either by the runtime (``--choose``) or by a fixed schedule of sizes that
changes at every ``--adapt-every`` steps (the same on every worker, so a run can be compared with a fixed-size run).
With ``--slow`` each step lasts at least the seconds the test writes in the store (a change lands at once, even in a
step that is sleeping); ``--step-seconds`` adds a fixed sleep to every step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch._C._distributed_c10d import TCPStore
from torch.utils.data import TensorDataset

from slurm_amoeba import runtime as amoeba
from slurm_amoeba.runtime.adaptive import AdaptiveBatch

DELAY_KEY = "test/step_delay"


def build_dataset(size: int) -> TensorDataset:
    """y = x . w + noise, seeded."""
    generator = torch.Generator().manual_seed(99)
    x = torch.randn(size, 8, generator=generator, dtype=torch.float64)
    w = torch.randn(8, 1, generator=generator, dtype=torch.float64)
    y = x @ w + 0.3 * torch.randn(size, 1, generator=generator, dtype=torch.float64)
    return TensorDataset(x, y)


def step_delay(store: TCPStore) -> None:
    """Sleep until the step has lasted the seconds in store key ``DELAY_KEY``, reading it again every 0.05 s: a delay
    the test lowers ends a step already sleeping at once, not at the end of the old delay."""
    began = time.monotonic()
    while (left := float(store.get(DELAY_KEY)) - (time.monotonic() - began)) > 0:
        time.sleep(min(left, 0.05))


def main(argv: list[str] | None = None) -> int:
    """Run the job; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--dataset-size", type=int, default=120)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--max-global-batch", type=int, default=32)
    parser.add_argument("--adapt-every", type=int, default=3)
    parser.add_argument("--schedule", default="8,16,12,24", help="batch sizes in turn at each decision point")
    parser.add_argument("--choose", action="store_true", help="the runtime picks the batch (no schedule)")
    parser.add_argument("--slow", action="store_true", help=f"sleep the seconds in store key {DELAY_KEY} per step")
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=0.0,
        help="sleep this long in every step: a fixed cost per step whatever its batch, as a GPU's kernel launches and "
        "all-reduce latency are (a larger batch then costs about no more time, and the goodput model sees it)",
    )
    parser.add_argument("--commit-every", type=int, default=4)
    args = parser.parse_args(argv)

    runtime = amoeba.init()
    worker = runtime.worker_id
    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16, dtype=torch.float64), torch.nn.Tanh(), torch.nn.Linear(16, 1, dtype=torch.float64)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = build_dataset(args.dataset_size)
    sampler = amoeba.ElasticSampler(
        len(dataset),
        args.global_batch,
        seed=7,
        max_local_batch=4,
        max_global_batch=args.max_global_batch,
        adapt_every=args.adapt_every,
    )
    loader = amoeba.ElasticDataLoader(dataset, sampler)
    # A fixed schedule uses a learning-rate rule that depends on the batch only (sqrt), so that the run can be
    # compared with a fixed-size run's parameters; the runtime's own choice uses SGD's default (AdaScale).
    adaptive = (
        AdaptiveBatch(overhead_prior=0.9, measure_every=1)
        if args.choose
        else AdaptiveBatch(lr_rule="sqrt", choose=False)
    )
    state = amoeba.TorchState(model, optimizer, sampler, adaptive=adaptive)
    schedule = [int(s) for s in args.schedule.split(",")]
    loss_fn = torch.nn.MSELoss()
    ledger_path = args.out / f"ledger-{worker}.jsonl"

    def train(state: amoeba.TorchState) -> None:
        with open(ledger_path, "a") as ledger:
            while state.epoch < args.epochs:
                for step in loader:
                    for (x, y), weight in step:
                        (loss_fn(model(x), y) * weight).backward()
                    if args.slow:  # the test slows the job down while it resizes it, then lets it finish
                        step_delay(runtime.store)
                    if args.step_seconds > 0:
                        time.sleep(args.step_seconds)
                    state.step()
                    entry = {
                        "generation": runtime.generation,
                        "step": step.index,
                        "epoch": step.epoch,
                        "rank": runtime.rank,
                        "world_size": runtime.world_size,
                        "torchrun": [os.environ["RANK"], os.environ["WORLD_SIZE"]],
                        "step_samples": step.assignment.plan.step_samples,
                        "micro": [len(m) for m in step.assignment.micro_indices],
                        "indices": step.indices,
                    }
                    ledger.write(json.dumps(entry) + "\n")
                    ledger.flush()
                    where = sampler.progress
                    if not args.choose and (where.step % args.adapt_every == 0 or where.cursor == 0):
                        adaptive.set_global_batch(schedule[(where.step // args.adapt_every) % len(schedule)])
                    if state.step_index % args.commit_every == 0:
                        state.commit()

    result = amoeba.run(train, state)
    if result.status is amoeba.RunStatus.FINISHED:
        params = {name: p.detach().cpu().clone() for name, p in model.state_dict().items()}
        torch.save(params, args.out / f"params-{worker}.pt")
    print(f"worker {worker} {result.status.value} generations {list(result.generations)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
