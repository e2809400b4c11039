"""A seeded job with an ordinary training loop that the loop tests launch as worker processes (not a test module).

The loop keeps its own optimizer step inside ``with state.sync():`` — ``GradScaler.unscale_``, ``clip_grad_norm_``,
``scaler.step``, ``scaler.update`` and a warm-up + cosine ``SequentialLR`` — and runs the forward pass under
``torch.autocast("cpu", dtype=torch.bfloat16)``. ``--fsdp`` shards the model with ``fully_shard`` through
:class:`~slurm_amoeba.runtime.fsdp.ShardedState`. It writes the same ledger as ``toy_train.py`` (plus the learning
rate and the loss scale of each step) and the final parameters, and obeys the same ``test/release`` holds.
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
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from slurm_amoeba import runtime as amoeba
from slurm_amoeba.runtime.auth import JobAuth, JobKey
from slurm_amoeba.runtime.fsdp import Built, ShardedState

DATASET = 100
RELEASE_KEY = "test/release"  # the holds of toy_train.py (this file runs as a script, outside the tests package)
HELD_KEY = "test/held"


def build(mesh: DeviceMesh | None, steps: int) -> Built:
    """The model (sharded over ``mesh`` if given), AdamW, and a 3-step warm-up then cosine schedule; seeded."""
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    if mesh is not None:
        fully_shard(model[0], mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02, weight_decay=0.01)
    warm = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=3)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps - 3)
    schedule = torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, cosine], milestones=[3])
    return Built(model, optimizer, [schedule])


def dataset() -> torch.utils.data.TensorDataset:
    """y = x . w + noise, seeded (float32)."""
    generator = torch.Generator().manual_seed(99)
    x = torch.randn(DATASET, 8, generator=generator)
    y = x @ torch.randn(8, 1, generator=generator) + 0.1 * torch.randn(DATASET, 1, generator=generator)
    return torch.utils.data.TensorDataset(x, y)


def main(argv: list[str] | None = None) -> int:
    """Run the job; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    runtime = amoeba.init()
    data = dataset()
    sampler = amoeba.ElasticSampler(len(data), 12, seed=7, max_local_batch=4)
    steps = args.epochs * -(-DATASET // 12)
    loader = amoeba.ElasticDataLoader(data, sampler)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=4)
    state: amoeba.TorchState
    if args.fsdp:
        state = ShardedState(lambda mesh: build(mesh, steps), sampler, scaler=scaler)
    else:
        built = build(None, steps)
        state = amoeba.TorchState(built.model, built.optimizer, sampler, schedulers=built.schedulers, scaler=scaler)
    ledger_path = args.out / f"ledger-{runtime.worker_id}.jsonl"

    wanted = JobAuth(JobKey.from_environ(os.environ), "hold").want  # the coordinator's sealed "want"

    def hold(step: int) -> None:
        store = runtime.store
        deadline = time.monotonic() + 120
        while int(store.get(RELEASE_KEY)) <= step and wanted(store) != runtime.generation:
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
                    model, optimizer = state.model, state.optimizer
                    for (x, y), weight in step:
                        with torch.autocast("cpu", dtype=torch.bfloat16):
                            loss = torch.nn.functional.mse_loss(model(x).float(), y) * weight
                        torch.autograd.backward(scaler.scale(loss))
                    with state.sync():
                        scaler.unscale_(optimizer)
                        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
                        scaler.step(optimizer)
                        scaler.update()
                        state.schedulers[0].step()
                    entry: dict[str, Any] = {
                        "generation": runtime.generation,
                        "step": step.index,
                        "epoch": step.epoch,
                        "rank": runtime.rank,
                        "world_size": runtime.world_size,
                        "torchrun": [str(runtime.rank), str(runtime.world_size)],
                        "step_samples": step.assignment.plan.step_samples,
                        "micro": [len(m) for m in step.assignment.micro_indices],
                        "indices": step.indices,
                        "lr": optimizer.param_groups[0]["lr"],
                        "scale": scaler.get_scale(),
                    }
                    ledger.write(json.dumps(entry) + "\n")
                    ledger.flush()
                    if state.step_index % 5 == 0:
                        state.commit()
            state.commit()  # the final parameters, gathered (a sharded model's) on every member

    result = amoeba.run(train, state)
    if result.status is amoeba.RunStatus.FINISHED:
        params = {name: t.detach().cpu().clone() for name, t in state.as_tree()["model"].items()}
        torch.save(params, args.out / f"params-{runtime.worker_id}.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
