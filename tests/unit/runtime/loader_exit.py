"""A process with persistent loader processes (not a test module): prints their pids, then raises or waits.

``raise``: an exception escapes the script (it must still exit); ``wait``: it sleeps until signalled.
"""

from __future__ import annotations

import multiprocessing
import sys
import time

import torch
from torch.utils.data import TensorDataset

from slurm_amoeba.runtime import ElasticDataLoader, ElasticSampler


class OneWorker:
    """The topology of a single worker."""

    rank = 0
    world_size = 1

    def check_boundary(self) -> None:
        """Never a switch."""


def main(mode: str) -> None:
    """Start two loader processes, take one micro-batch, then raise or wait."""
    dataset = TensorDataset(torch.arange(40.0))
    loader = ElasticDataLoader(
        dataset, ElasticSampler(40, 4), topology=OneWorker(), num_workers=2, persistent_workers=True
    )
    for step in loader:
        for _batch, _weight in step:
            break
        break
    pids = [p.pid for p in multiprocessing.active_children()]
    print(" ".join(str(p) for p in pids), flush=True)
    if mode == "raise":
        raise RuntimeError("an error that escapes the training script")
    time.sleep(120)


if __name__ == "__main__":
    main(sys.argv[1])
