"""A small elastic training job: an MLP on a synthetic regression set, through slurm_amoeba's runtime.

Run it on Slurm with ``amoeba-sbatch --elastic 2:8 examples/job.sh`` (the script calls ``amoeba-run python
examples/elastic_mlp.py``), or locally with ``amoeba-local``. With ``--ledger DIR`` every worker writes which sample
indices it trained on at each step, so that a test can check that every sample of an epoch is seen exactly once
across resizes; rank 0 writes the final loss to ``DIR/result.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from slurm_amoeba import runtime as amoeba


def build_dataset(size: int) -> TensorDataset:
    """y = x . w + noise, the same on every worker (seeded)."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(size, 32, generator=generator)
    w = torch.randn(32, 1, generator=generator)
    return TensorDataset(x, x @ w + 0.05 * torch.randn(size, 1, generator=generator))


def train(
    epochs: int = 3,
    dataset_size: int = 2048,
    global_batch: int = 64,
    step_delay: float = 0.0,
    sample_delay: float = 0.0,
    ledger: Path | None = None,
) -> dict[str, object]:
    """Train through the elastic runtime (on every worker); return how it ended on this worker.

    This is also the function an :class:`~slurm_amoeba.launcher.ElasticExecutor` submits: ``job.result()`` is rank
    0's return value.
    """
    runtime = amoeba.init()  # joins the job; a new worker warms up below while the others keep training
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataset = build_dataset(dataset_size)
    sampler = amoeba.ElasticSampler(len(dataset), global_batch, seed=1)
    loader = amoeba.ElasticDataLoader(dataset, sampler)
    state = amoeba.TorchState(model, optimizer, sampler, extras={"loss": 0.0, "samples": 0})
    loss_fn = torch.nn.MSELoss()
    out = None
    if ledger is not None:
        ledger.mkdir(parents=True, exist_ok=True)
        out = open(ledger / f"ledger-{runtime.worker_id}.jsonl", "a")  # noqa: SIM115 - open for the whole run

    def loop(state: amoeba.TorchState) -> None:
        while state.epoch < epochs:
            for step in loader:
                total = 0.0
                local = 0
                for (x, y), weight in step:
                    local += len(x)
                    loss = loss_fn(model(x), y) * weight
                    loss.backward()
                    total += float(loss)
                if step_delay or sample_delay:
                    time.sleep(step_delay + sample_delay * local)
                state.step()
                state.extras["loss"] = total
                state.extras["samples"] += step.assignment.plan.step_samples
                if out is not None:
                    entry = {
                        "generation": runtime.generation,
                        "step": step.index,
                        "epoch": step.epoch,
                        "rank": runtime.rank,
                        "world_size": runtime.world_size,
                        "indices": step.indices,
                    }
                    out.write(json.dumps(entry) + "\n")
                    out.flush()
                if state.step_index % 10 == 0:
                    state.commit()

    result = amoeba.run(loop, state)
    print(f"worker {runtime.worker_id}: {result.status.value}, generations {list(result.generations)}", flush=True)
    return {
        "status": result.status.value,
        "rank": result.rank,  # None in a worker that left: it holds no rank any more
        "loss": float(state.extras["loss"]),
        "samples": int(state.extras["samples"]),
        "epochs": epochs,
        "generations": len(result.generations),
    }


def main(argv: list[str] | None = None) -> int:
    """The command line; rank 0 writes its result to ``LEDGER/result.json``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dataset-size", type=int, default=2048)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (a slower model)")
    parser.add_argument(
        "--sample-delay",
        type=float,
        default=0.0,
        help="extra seconds per local sample: emulates a GPU-bound model whose step time scales with the local batch",
    )
    parser.add_argument("--ledger", type=Path, default=None, help="directory for per-sample ledgers")
    args = parser.parse_args(argv)
    result = train(args.epochs, args.dataset_size, args.global_batch, args.step_delay, args.sample_delay, args.ledger)
    if result["status"] == amoeba.RunStatus.FINISHED.value and result["rank"] == 0 and args.ledger:
        (args.ledger / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
