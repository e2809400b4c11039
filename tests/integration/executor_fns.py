"""A function the executor's integration test submits (importable by the job's workers from the repository)."""

from __future__ import annotations

import os

from examples.elastic_mlp import train


def train_and_tell(epochs: int) -> dict[str, object]:
    """Print what the setup lines exported, train through the elastic runtime, print the end, return the result."""
    print(f"setup says {os.environ.get('AMOEBA_TEST_SETUP', 'nothing')}", flush=True)
    result = train(epochs=epochs, dataset_size=256, global_batch=32)
    print(f"trained {epochs} epoch(s) as rank {os.environ.get('RANK')}", flush=True)
    return result
