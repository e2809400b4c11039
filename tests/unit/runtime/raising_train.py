"""A toy worker whose training code raises ``ValueError`` at a given step on every rank (not a test module)."""

from __future__ import annotations

import argparse
import sys

import torch

from slurm_amoeba import runtime as amoeba
from tests.unit.runtime.toy_train import build_dataset, build_model


def main() -> int:
    """Train the toy model; raise at ``--raise-at``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--raise-at", type=int, required=True)
    args = parser.parse_args()
    amoeba.init()
    model = build_model(16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = build_dataset(100)
    sampler = amoeba.ElasticSampler(len(dataset), 12, seed=7, max_local_batch=4)
    loader = amoeba.ElasticDataLoader(dataset, sampler)
    state = amoeba.TorchState(model, optimizer, sampler)
    loss_fn = torch.nn.MSELoss()

    def train(state: amoeba.TorchState) -> None:
        while state.epoch < 3:
            for step in loader:
                if step.index == args.raise_at:
                    raise ValueError(f"bad batch at step {step.index}")
                for (x, y), weight in step:
                    (loss_fn(model(x), y) * weight).backward()
                state.step()

    amoeba.run(train, state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
