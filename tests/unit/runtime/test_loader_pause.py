"""What re-iterating the loader after a switch costs a worker: one step's plan, not the rest of the epoch's.

Every member iterates the :class:`ElasticDataLoader` afresh at each switch (new rank and world size). It plans
this rank's steps one at a time as the ``DataLoader`` and the training loop reach them; these tests count the
sampler's per-step plans and check that the lazily planned steps are exactly the eagerly planned ones, across a
resize, with loader processes reading ahead, and with an adaptive batch's planning boundary.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from slurm_amoeba.runtime import ElasticDataLoader, ElasticSampler
from slurm_amoeba.runtime.sampler import Progress, StepAssignment
from tests.unit.runtime.test_planner_sampler import FixedTopology as Topology  # its size is changed between iterations


def _counting(sampler: ElasticSampler, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the sampler's per-step plans (its ``assignment`` calls)."""
    calls: list[int] = []
    original = sampler.assignment

    def counted(
        rank: int, world_size: int, progress: Progress | None = None, idle: frozenset[int] = frozenset()
    ) -> StepAssignment:
        calls.append(1)
        return original(rank, world_size, progress, idle)

    monkeypatch.setattr(sampler, "assignment", counted)
    return calls


def _consume(step: Any) -> list[int]:
    return [int(i) for batch, _ in step for i in batch[0]]


def test_a_switch_plans_the_steps_it_reaches_not_the_rest_of_the_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    size = 100_000
    dataset = torch.utils.data.TensorDataset(torch.arange(size))
    sampler = ElasticSampler(size, 64, seed=1)
    topology = Topology(0, 2)
    loader = ElasticDataLoader(dataset, sampler, topology=topology)
    calls = _counting(sampler, monkeypatch)
    steps = iter(loader)
    _consume(next(steps))
    sampler.advance()
    assert len(calls) <= 3, f"{len(calls)} steps planned for one step (the epoch has {sampler.steps_per_epoch})"
    topology.world_size = 1  # the switch: the loader is iterated afresh
    calls.clear()
    _consume(next(iter(loader)))
    assert len(calls) <= 3


def test_lazy_steps_are_the_eager_plan_across_a_resize_with_loader_processes() -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(50))
    sampler = ElasticSampler(50, 8, seed=3, max_local_batch=3)
    reference = ElasticSampler(50, 8, seed=3, max_local_batch=3)
    topology = Topology(1, 2)
    loader = ElasticDataLoader(dataset, sampler, topology=topology, num_workers=1, prefetch_factor=4)
    seen: list[int] = []
    for index, step in enumerate(loader):
        expected = reference.assignment(1, 2, Progress(epoch=0, cursor=8 * index, step=index))
        assert step.assignment == expected
        seen.extend(_consume(step))
        sampler.advance()
        if index == 2:
            break
    topology.rank, topology.world_size = 0, 1
    for step in loader:
        assert step.assignment == reference.assignment(0, 1, dataclasses_progress(sampler))
        seen.extend(_consume(step))
        sampler.advance()
    first = reference.permutation(0)
    at_two = [i for s in range(3) for i in reference.assignment(1, 2, Progress(epoch=0, cursor=8 * s, step=s)).indices]
    assert seen == at_two + first[24:50]


def dataclasses_progress(sampler: ElasticSampler) -> Progress:
    """A copy of the sampler's position."""
    progress = sampler.progress
    return Progress(epoch=progress.epoch, cursor=progress.cursor, step=progress.step)


def test_an_adaptive_batch_plan_stops_where_the_batch_may_change() -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(200))
    sampler = ElasticSampler(200, 8, seed=2, max_global_batch=32, adapt_every=5)
    loader = ElasticDataLoader(dataset, sampler, topology=Topology(0, 1))
    steps = 0
    for step in loader:
        _consume(step)
        sampler.advance()
        steps += 1
    assert steps == 5
