"""Gradient buckets: layout, overlap with backward, and misuse, on a one-process gloo group; the reduce of a
step without the idle joiners on three processes."""

from __future__ import annotations

import datetime
import multiprocessing
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import FileStore, HashStore

from slurm_amoeba.runtime import RuntimeConfigError
from slurm_amoeba.runtime.gradients import GradientBuckets


@pytest.fixture
def single_process_group() -> Iterator[None]:
    store = HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=10))
    try:
        yield
    finally:
        dist.destroy_process_group()


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 600))


def test_buckets_follow_backward_order_and_the_control_word_ends_the_last_one() -> None:
    model = mlp()
    buckets = GradientBuckets(model, first_bucket_bytes=1 << 20, bucket_bytes=1 << 20)
    params = list(model.parameters())
    assert buckets.buckets[0].params[0] is params[-1], "the last layer's gradients come first in backward"
    assert [len(b.params) for b in buckets.buckets] == [2, 2]
    assert buckets.buckets[-1].tensor.data_ptr() + 4 * (buckets.buckets[-1].tensor.numel() - 1) == (
        buckets.control.data_ptr()
    )
    assert all(p.grad is not None and p.grad.data_ptr() == buckets.views[id(p)].data_ptr() for p in params)


def test_overlapped_reduction_leaves_the_same_gradients_as_a_plain_backward(single_process_group: None) -> None:
    reference = mlp()
    x = torch.randn(8, 64)
    reference(x).pow(2).mean().backward()
    model = mlp()
    buckets = GradientBuckets(model, first_bucket_bytes=1 << 16, bucket_bytes=1 << 16)
    (model(x[:4]).pow(2).mean() * 0.5).backward()
    buckets.arm(1.0)
    (model(x[4:]).pow(2).mean() * 0.5).backward()
    assert all(b.work is not None for b in buckets.buckets), "every bucket was sent during backward"
    assert buckets.finish(0.0) == 1.0
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad)


def test_gradients_replaced_by_zero_grad_are_taken_back_into_the_buffer(single_process_group: None) -> None:
    model = mlp()
    buckets = GradientBuckets(model)
    model(torch.randn(2, 64)).sum().backward()
    model.zero_grad(set_to_none=True)
    model(torch.ones(2, 64)).sum().backward()
    expected = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    buckets.finish(0.0)
    for p, grad in zip(model.parameters(), expected, strict=True):
        assert p.grad is not None and p.grad.data_ptr() == buckets.views[id(p)].data_ptr()
        torch.testing.assert_close(p.grad, grad)


def test_second_backward_in_the_armed_micro_batch_is_refused(single_process_group: None) -> None:
    model = mlp()
    buckets = GradientBuckets(model)
    buckets.arm(0.0)
    x = torch.randn(2, 64)
    model(x).sum().backward()
    with pytest.raises(RuntimeConfigError, match=r"call backward\(\) once per micro-batch"):
        model(x).sum().backward()
    buckets.finish(0.0)


def _reduce_without_idle(
    path: str, rank: int, results: multiprocessing.Queue[tuple[int, float, list[float], int]]
) -> None:
    """One rank of :func:`test_a_step_without_the_idle_ranks_sums_the_members_gradients_for_everyone`."""
    store = FileStore(path, 3)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=3, timeout=datetime.timedelta(seconds=20))
    try:
        model = mlp()
        buckets = GradientBuckets(model, first_bucket_bytes=1 << 16)
        for index, p in enumerate(model.parameters()):
            p.grad = torch.full_like(p, float(10 * rank + index))
        control = 1.0 if rank in (0, 1) else 0.0  # the idle rank's word is not counted
        word, sends = buckets.reduce_without(rank, 2, [0, 2], [1], control)
        for work, _buffer in sends:
            work.wait()
        means = [float(buckets.views[id(p)].mean()) for p in model.parameters()]
        results.put((rank, word, means, len(sends)))
    finally:
        dist.destroy_process_group()


def test_a_step_without_the_idle_ranks_sums_the_members_gradients_for_everyone(tmp_path: Path) -> None:
    """Members 0 and 2 (the root) sum point to point; idle rank 1 receives the sum, its own gradients ignored."""
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[tuple[int, float, list[float], int]] = context.Queue()
    procs = [
        context.Process(target=_reduce_without_idle, args=(str(tmp_path / "store"), rank, results)) for rank in range(3)
    ]
    for proc in procs:
        proc.start()
    got = {}
    for _ in procs:
        rank, word, means, sends = results.get(timeout=60)
        got[rank] = (word, means, sends)
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    expected = [float(index + 20 + index) for index in range(4)]  # rank 0's 0 + i, rank 2's 20 + i
    for rank in range(3):
        word, means, _sends = got[rank]
        assert word == 1.0, f"rank {rank}: the members' control words sum to 1"
        assert means == expected, f"rank {rank}: {means}"
    assert [got[rank][2] for rank in range(3)] == [0, 0, len(GradientBuckets(mlp()).flats)], "only the root sends"
