"""The training process of ``scripts/bench-plans``: ``examples/tiny_lm.py``'s model under ``PlannedState``.

The loop is the example's (bf16 autocast, clipping, AdamW, warm-up + cosine); around it this worker writes what
the harness (:mod:`benchmarks.plans`) checks: a ledger line per applied step (epoch, step, this rank's sample
indices), each generation's plan with its predicted and measured peak and step time, and rank 0's final
parameters. ``--pin N=PLAN`` pins a size's plan (``replicated``, ``sharded``, ``+ckpt``, ``/mbK``), e.g. to make a
test walk every layout.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from examples.tiny_lm import LMConfig, blocks_of, build_placed, lm_loss, markov_text
from slurm_amoeba import runtime as amoeba
from slurm_amoeba.runtime.planned import PlannedState
from slurm_amoeba.runtime.plans import Layout, Plan


def parse_pin(text: str) -> tuple[int, Plan]:
    """``"2=sharded+ckpt/mb4"`` -> ``(2, Plan(SHARDED, True, 4))``."""
    size, _, name = text.partition("=")
    layout_part, _, micro = name.partition("/mb")
    layout = Layout(layout_part.split("+")[0])
    return int(size), Plan(layout, "+ckpt" in layout_part, int(micro))


def main(argv: list[str] | None = None) -> int:
    """Train; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--sequences", type=int, default=256)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--memory-budget", type=int, default=None)
    parser.add_argument("--max-workers", type=int, default=4)
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to wait per step (the harness's pace)")
    parser.add_argument("--pin", action="append", default=[], type=parse_pin)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    runtime = amoeba.init()
    config = LMConfig(context=args.context, width=args.width, layers=args.layers)
    rows = markov_text(config, args.sequences)
    data = torch.utils.data.TensorDataset(rows[:, :-1], rows[:, 1:])
    sampler = amoeba.ElasticSampler(len(rows), args.global_batch, seed=1)
    total_steps = args.epochs * sampler.steps_per_epoch
    device = runtime.device
    state = PlannedState(
        lambda placement: build_placed(placement, config, total_steps, 3e-3),
        sampler,
        blocks=blocks_of,
        probe_loss=lambda model, n: lm_loss(model, rows[:n, :-1], rows[:n, 1:], device),
        memory_budget=args.memory_budget,
        max_workers=args.max_workers,
        pinned=dict(args.pin),
        device=device,
    )
    loader = amoeba.ElasticDataLoader(data, sampler)
    ledger_path = args.out / f"ledger-{runtime.worker_id}.jsonl"

    def train(state: amoeba.TorchState) -> None:
        with open(ledger_path, "a") as ledger:
            while state.epoch < args.epochs:
                for step in loader:
                    model = state.model
                    for (inputs, targets), weight in step:
                        torch.autograd.backward(lm_loss(model, inputs, targets, device) * weight)
                    with state.sync():
                        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                        state.optimizer.step()
                        state.schedulers[0].step()
                    time.sleep(args.step_delay)
                    entry = {"step": step.index, "epoch": step.epoch, "world_size": runtime.world_size}
                    ledger.write(json.dumps({**entry, "indices": step.indices}) + "\n")
                    ledger.flush()
        state.commit()  # gathers the full parameters on every member (a collective)

    result = amoeba.run(train, state)
    worker = runtime.worker_id
    report: dict[str, Any] = {"worker": worker, "generations": [g.to_json() for g in state.generations]}
    report["profile"] = state.space.profile.to_json()
    report["min_workers"] = state.min_workers
    (args.out / f"plans-{worker}.json").write_text(json.dumps(report, indent=1))
    if result.is_rank0:
        torch.save({k: v.detach().cpu() for k, v in state.as_tree()["model"].items()}, args.out / "params.pt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
