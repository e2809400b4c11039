"""A tiny seeded training job that the runtime tests launch as worker processes (not a test module).

It trains a float64 MLP on a synthetic regression set through the elastic runtime, and writes what the tests
check: a per-sample ledger (one JSON line per applied step: generation, step, epoch, this rank's indices) and the
final parameters. A test can hold the job at a step boundary: every rank waits before step ``s`` while the store
key ``test/release`` is ``<= s`` (rank 0 announces the step in ``test/held``), so resizes land at known steps; a
hold does not apply while the coordinator waits for the generation to end, since the switch needs steps.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from slurm_amoeba import runtime as amoeba
from slurm_amoeba.runtime.auth import JobAuth, JobKey

RELEASE_KEY = "test/release"
HELD_KEY = "test/held"


def build_model(hidden: int) -> torch.nn.Module:
    """The toy model; every worker builds it from the same seed."""
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(8, hidden, dtype=torch.float64),
        torch.nn.Tanh(),
        torch.nn.Linear(hidden, 1, dtype=torch.float64),
    )


def build_dataset(size: int) -> TensorDataset:
    """The toy regression set: y = x . w + noise, seeded."""
    generator = torch.Generator().manual_seed(99)
    x = torch.randn(size, 8, generator=generator, dtype=torch.float64)
    w = torch.randn(8, 1, generator=generator, dtype=torch.float64)
    y = x @ w + 0.1 * torch.randn(size, 1, generator=generator, dtype=torch.float64)
    return TensorDataset(x, y)


def main(argv: list[str] | None = None) -> int:
    """Run the toy job; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="directory for ledgers and parameters")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--dataset-size", type=int, default=100)
    parser.add_argument("--global-batch", type=int, default=12)
    parser.add_argument("--max-local-batch", type=int, default=4)
    parser.add_argument("--commit-every", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--loader-workers", type=int, default=0)
    parser.add_argument("--hold", action="store_true", help="obey test/release holds")
    parser.add_argument("--warm-up", action="store_true", help="give TorchState a warm_up (a joiner rehearses a step)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    runtime = amoeba.init()
    worker = runtime.worker_id
    device = runtime.device
    model = build_model(args.hidden).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    dataset = build_dataset(args.dataset_size)
    sampler = amoeba.ElasticSampler(len(dataset), args.global_batch, seed=7, max_local_batch=args.max_local_batch)
    loader_kwargs: dict[str, Any] = {}
    if args.loader_workers:
        loader_kwargs = {"num_workers": args.loader_workers, "persistent_workers": True}
    loader = amoeba.ElasticDataLoader(dataset, sampler, **loader_kwargs)
    loss_fn = torch.nn.MSELoss()

    def warm_up(net: torch.nn.Module) -> None:  # random data: the runtime puts the RNG and the model back after it
        x = torch.randn(args.max_local_batch, 8, dtype=torch.float64, device=device)
        loss_fn(net(x), torch.randn(args.max_local_batch, 1, dtype=torch.float64, device=device)).backward()

    state = amoeba.TorchState(
        model, optimizer, sampler, extras={"samples_seen": 0}, warm_up=warm_up if args.warm_up else None
    )
    ledger_path = args.out / f"ledger-{worker}.jsonl"

    wanted = JobAuth(JobKey.from_environ(os.environ), "hold").want  # the coordinator's sealed "want"

    def hold(step: int) -> None:
        deadline = time.monotonic() + 120
        store = runtime.store
        while int(store.get(RELEASE_KEY)) <= step:
            if wanted(store) == runtime.generation:
                return  # a membership change is pending: it needs steps to be agreed on
            if runtime.rank == 0:
                store.set(HELD_KEY, str(step))
            if time.monotonic() > deadline:
                raise TimeoutError(f"held at step {step} for 120 s")
            time.sleep(0.01)

    def train(state: amoeba.TorchState) -> None:
        with open(ledger_path, "a") as ledger:
            while state.epoch < args.epochs:
                for step in loader:
                    if args.hold:
                        hold(step.index)
                    for (x, y), weight in step:
                        (loss_fn(model(x.to(device)), y.to(device)) * weight).backward()
                    if args.step_delay:
                        time.sleep(args.step_delay)
                    state.step()
                    state.extras["samples_seen"] += step.assignment.plan.step_samples
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
                    if state.step_index % args.commit_every == 0:
                        state.commit()

    result = amoeba.run(train, state)
    if result.status is amoeba.RunStatus.FINISHED:
        params = {name: p.detach().cpu().clone() for name, p in model.state_dict().items()}
        torch.save(params, args.out / f"params-{worker}.pt")
        (args.out / f"extras-{worker}.json").write_text(json.dumps(dict(state.extras)))
    ending = {"status": result.status.value, "rank": result.rank, "RANK": os.environ.get("RANK"), "now": runtime.rank}
    (args.out / f"result-{worker}.json").write_text(json.dumps(ending))
    print(f"worker {worker} {result.status.value} generations {list(result.generations)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
