"""Leaving a generation's group at a switch without waiting for its connections to close (runtime/group.py).

``release_group`` unregisters the default group at once and shuts it down in a background thread; these tests check
that the next group then forms and works in the same processes, that the training thread is not held for the
shutdown, that torch's bookkeeping still looks as the function expects (so a torch upgrade that changes it fails
here instead of silently leaving groups behind), and that draining waits for the shutdown.
"""

from __future__ import annotations

import datetime
import multiprocessing
import sys
import time

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore
from torch.distributed import distributed_c10d

from slurm_amoeba.runtime import group

GENERATIONS = 4


def _generations(port: int, rank: int, results: multiprocessing.Queue[tuple[int, float, float]]) -> None:
    """Child process: form, use and release ``GENERATIONS`` groups of 2 in a row; report each release's time."""
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    for generation in range(1, GENERATIONS + 1):
        dist.init_process_group(
            "gloo",
            store=PrefixStore(f"gen{generation}", store),
            rank=rank,
            world_size=2,
            timeout=datetime.timedelta(seconds=20),
        )
        total = torch.full((1000,), float(generation))
        dist.all_reduce(total)
        if not bool((total == 2 * generation).all()):
            sys.exit(3)
        started = time.perf_counter()
        group.release_group("gloo")
        released = time.perf_counter() - started
        if dist.is_initialized() or distributed_c10d._world.group_count != 0:
            sys.exit(4)
        results.put((rank, generation, released))
    started = time.perf_counter()
    group.drain_released_groups()
    results.put((rank, 0, time.perf_counter() - started))
    sys.exit(0)


@pytest.mark.timeout(90)
def test_a_released_group_makes_room_for_the_next_one_at_once() -> None:
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[tuple[int, float, float]] = context.Queue()
    children = [context.Process(target=_generations, args=(master.port, rank, results)) for rank in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=80)
    assert [child.exitcode for child in children] == [0, 0]
    rows = [results.get(timeout=5) for _ in range(2 * (GENERATIONS + 1))]
    releases = [seconds for _, generation, seconds in rows if generation]
    assert len(releases) == 2 * GENERATIONS
    # destroy_process_group takes ~20 ms per gloo group (its threads stop on a timeout); releasing must not.
    assert sorted(releases)[len(releases) // 2] < 0.005, releases


def test_torch_bookkeeping_is_what_release_group_expects() -> None:
    # If this fails after a torch upgrade, release_group falls back to destroy_process_group (slower, still right):
    # look at torch's destroy_process_group and update group._BOOKKEEPING.
    assert group._bookkeeping_known(distributed_c10d._world)


def test_without_a_group_release_only_resets_the_counter() -> None:
    assert not dist.is_initialized()
    distributed_c10d._world.group_count = 3
    group.release_group("gloo")
    assert distributed_c10d._world.group_count == 0
    group.drain_released_groups()
