"""The global-batch planner and the exactly-once sampler, as plain objects (no processes)."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_amoeba.runtime import BatchPlanError, ElasticDataLoader, ElasticSampler, GlobalBatchPlanner
from slurm_amoeba.runtime.planner import split_evenly
from slurm_amoeba.runtime.sampler import Progress


class FixedTopology:
    """A rank in a world of a given size that never switches."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size

    def check_boundary(self) -> None:
        return None


def test_split_gives_contiguous_sizes_that_differ_by_at_most_one() -> None:
    assert split_evenly(10, 4) == [3, 3, 2, 2]
    assert split_evenly(3, 5) == [1, 1, 1, 0, 0]


def test_memory_cap_moves_the_rest_of_a_share_to_accumulation() -> None:
    planner = GlobalBatchPlanner(global_batch=12, max_local_batch=4)
    one = planner.plan(12, 1)
    assert one.micro_batches == ((4, 4, 4),) and one.accumulation == 3
    four = planner.plan(12, 4)
    assert four.micro_batches == ((3,), (3,), (3,), (3,)) and four.accumulation == 1
    uneven = planner.plan(12, 5)
    assert [sum(m) for m in uneven.micro_batches] == [3, 3, 2, 2, 2]


def test_short_last_step_may_leave_a_rank_without_samples() -> None:
    plan = GlobalBatchPlanner(global_batch=12).plan(3, 4)
    assert plan.micro_batches == ((1,), (1,), (1,), ())


def test_global_batch_smaller_than_the_worker_count_is_refused_naming_both() -> None:
    with pytest.raises(BatchPlanError, match=r"global batch 3 is smaller than the worker count 4"):
        GlobalBatchPlanner(global_batch=3).check_world_size(4)


def test_even_split_of_an_indivisible_global_batch_is_refused_with_the_nearest_multiples() -> None:
    with pytest.raises(BatchPlanError, match=r"global batch 10 cannot be split evenly over 4 workers.*8 or 12"):
        GlobalBatchPlanner(global_batch=10, even=True).plan(10, 4)
    assert GlobalBatchPlanner(global_batch=12, even=True).allowed_world_sizes(8) == [1, 2, 3, 4, 6]


def test_plan_needing_more_accumulation_than_allowed_is_refused() -> None:
    with pytest.raises(BatchPlanError, match=r"needs 16 accumulation steps, more than max_accumulation=8"):
        GlobalBatchPlanner(global_batch=64, max_local_batch=2, max_accumulation=8).check_world_size(2)


def test_dataset_smaller_than_one_global_batch_is_refused_naming_both() -> None:
    with pytest.raises(BatchPlanError, match=r"dataset of 10 samples is smaller than one global batch of 32"):
        ElasticSampler(10, 32)


def test_refused_world_size_leaves_the_sampler_position_untouched() -> None:
    sampler = ElasticSampler(100, 12, seed=1)
    sampler.progress = Progress(epoch=2, cursor=36, step=21)
    with pytest.raises(BatchPlanError, match="13"):
        sampler.remaining_assignments(0, 13)
    assert sampler.progress == Progress(epoch=2, cursor=36, step=21)


def test_permutation_depends_only_on_seed_and_epoch() -> None:
    a, b = ElasticSampler(50, 5, seed=3), ElasticSampler(50, 5, seed=3)
    assert a.permutation(4) == b.permutation(4)
    assert a.permutation(4) != a.permutation(5)
    assert sorted(a.permutation(4)) == list(range(50))
    assert ElasticSampler(50, 5, seed=4).permutation(4) != a.permutation(4)


def test_rest_of_the_epoch_is_resplit_over_the_new_workers_without_loss_or_repeat() -> None:
    sampler = ElasticSampler(30, 8, seed=0)
    sampler.advance()  # one step applied with some earlier world size
    before = [i for r in range(2) for a in sampler.remaining_assignments(r, 2) for i in a.indices]
    after = [i for r in range(3) for a in sampler.remaining_assignments(r, 3) for i in a.indices]
    assert sorted(before) == sorted(after) == sorted(sampler.permutation(0)[8:])


@settings(max_examples=60, deadline=None)
@given(
    dataset=st.integers(1, 200),
    batch=st.integers(1, 64),
    world=st.integers(1, 16),
    cap=st.integers(0, 9),
)
def test_every_split_covers_the_step_once_and_weights_sum_to_one(
    dataset: int, batch: int, world: int, cap: int
) -> None:
    if batch > dataset or world > batch:
        return
    sampler = ElasticSampler(dataset, batch, seed=dataset, max_local_batch=cap)
    assignments = [sampler.assignment(r, world) for r in range(world)]
    seen = [i for a in assignments for i in a.indices]
    assert seen == sampler.permutation(0)[: min(batch, dataset)]
    weights = sum(a.weight(m) for a in assignments for m in range(len(a.micro_indices)))
    assert weights == pytest.approx(1.0)
    sizes = [len(a.indices) for a in assignments]
    assert max(sizes) - min(sizes) <= 1
    if cap:
        assert all(len(m) <= cap for a in assignments for m in a.micro_indices)


def test_loader_feeds_a_dataloader_with_worker_processes_and_regroups_steps() -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(20))
    sampler = ElasticSampler(20, 6, seed=2, max_local_batch=2)
    loader = ElasticDataLoader(dataset, sampler, topology=FixedTopology(1, 2), num_workers=1)
    seen: list[int] = []
    for step in loader:
        micro = [(batch[0].tolist(), weight) for batch, weight in step]
        assert [m[0] for m in micro] == [list(m) for m in step.assignment.micro_indices]
        seen.extend(i for m in micro for i in m[0])
        sampler.advance()
    counts = collections.Counter(seen)
    expected = [i for a in ElasticSampler(20, 6, seed=2).remaining_assignments(1, 2) for i in a.indices]
    assert sorted(counts) == sorted(expected) and set(counts.values()) == {1}
    assert sampler.progress == Progress(epoch=1, cursor=0, step=4)


def test_persistent_loader_processes_start_during_warm_up_and_survive_a_resize() -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(24))
    sampler = ElasticSampler(24, 6, seed=4)
    topology = FixedTopology(0, 2)
    loader = ElasticDataLoader(dataset, sampler, topology=topology, num_workers=1, persistent_workers=True)
    started = loader._loader._iterator
    assert started is not None, "the loader processes start in the constructor"
    seen: list[int] = []
    for step in loader:  # one step at 2 workers, then the job shrinks to 1
        seen.extend(int(i) for batch, _ in step for i in batch[0])
        sampler.advance()
        break
    topology.world_size = 1
    for step in loader:
        seen.extend(int(i) for batch, _ in step for i in batch[0])
        sampler.advance()
    assert loader._loader._iterator is started
    first = ElasticSampler(24, 6, seed=4).permutation(0)
    assert seen == first[0:3] + first[6:24]


def test_loader_refuses_arguments_that_choose_samples() -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(20))
    with pytest.raises(Exception, match=r"remove batch_size, shuffle"):
        ElasticDataLoader(dataset, ElasticSampler(20, 4), batch_size=4, shuffle=True)


def test_loader_notices_a_step_left_without_state_step() -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(20))
    loader = ElasticDataLoader(dataset, ElasticSampler(20, 4), topology=FixedTopology(0, 1))
    steps = iter(loader)
    for _ in next(steps):
        pass
    with pytest.raises(Exception, match=r"step 0 ended without state.step\(\)"):
        next(steps)


def test_memory_cap_comes_from_the_launcher_and_only_changes_micro_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMOEBA_MAX_LOCAL_BATCH", "2")
    capped = ElasticSampler(40, 12, seed=3)
    monkeypatch.delenv("AMOEBA_MAX_LOCAL_BATCH")
    uncapped = ElasticSampler(40, 12, seed=3)
    for rank in range(2):
        a, b = capped.assignment(rank, 2), uncapped.assignment(rank, 2)
        assert a.indices == b.indices
        assert [len(m) for m in a.micro_indices] == [2, 2, 2] and len(b.micro_indices) == 1
    monkeypatch.setenv("AMOEBA_MAX_LOCAL_BATCH", "lots")
    with pytest.raises(BatchPlanError, match=r"AMOEBA_MAX_LOCAL_BATCH='lots' is not a whole number"):
        ElasticSampler(40, 12)


SEQUENCES = st.lists(
    st.one_of(
        st.tuples(st.just("train"), st.integers(1, 12)),
        st.tuples(st.just("resize"), st.integers(1, 9)),
        st.tuples(st.just("kill"), st.integers(0, 0)),
        st.tuples(st.just("commit"), st.integers(0, 0)),
    ),
    max_size=30,
)


@settings(max_examples=80, deadline=None)
@given(
    dataset=st.integers(10, 90),
    batch=st.integers(9, 10),
    cap=st.integers(0, 4),
    ops=SEQUENCES,
)
def test_random_resizes_and_rollbacks_apply_every_sample_once_per_epoch_with_the_global_batch(
    dataset: int, batch: int, cap: int, ops: list[tuple[str, int]]
) -> None:
    """The sampler alone, driven like the runtime drives it: resizes re-split, kills roll back to the commit."""
    sampler = ElasticSampler(dataset, batch, seed=11, max_local_batch=cap)
    world = 2
    committed = dataclasses.replace(sampler.progress)
    applied: dict[int, list[int]] = {}  # global step -> samples applied by all ranks (the final timeline)

    def step() -> None:
        assignments = [sampler.assignment(rank, world) for rank in range(world)]
        assert sum(len(a.indices) for a in assignments) == sampler.step_samples(sampler.progress.cursor)
        assert all(len(m) <= cap for a in assignments for m in a.micro_indices if cap)
        applied[sampler.progress.step] = [i for a in assignments for i in a.indices]
        sampler.advance()

    for op, value in [*ops, ("train", 3 * -(-dataset // batch))]:
        if op == "train":
            for _ in range(value):
                step()
        elif op == "resize":
            world = value
        elif op == "commit":
            committed = dataclasses.replace(sampler.progress)
        else:  # a worker dies mid-step: the survivors roll back and redo the steps since the commit
            world = max(1, world - 1)
            sampler.progress = dataclasses.replace(committed)
            for later in [s for s in applied if s >= committed.step]:
                del applied[later]
    per_epoch: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    steps_per_epoch = sampler.steps_per_epoch
    for index, samples in applied.items():
        per_epoch[index // steps_per_epoch].update(samples)
        expected = batch if (index + 1) % steps_per_epoch else dataset - (steps_per_epoch - 1) * batch
        assert len(samples) == expected, "the global batch changed"
    complete = sampler.progress.step // steps_per_epoch
    for epoch in range(complete):
        assert sorted(per_epoch[epoch]) == list(range(dataset)) and set(per_epoch[epoch].values()) == {1}


def test_idle_ranks_take_no_samples_and_the_others_split_the_step_as_a_world_of_their_size() -> None:
    planner = GlobalBatchPlanner(global_batch=12, max_local_batch=4)
    plan = planner.plan(12, 4, idle=frozenset({1, 3}))
    assert plan.micro_batches == ((3, 3), (), (3, 3), ())
    assert [plan.local_offset(r) for r in range(4)] == [0, 6, 6, 12]
    assert plan.micro_batches[0] == planner.plan(12, 2).micro_batches[0]
    with pytest.raises(BatchPlanError, match="not all ranks"):
        planner.plan(12, 2, idle=frozenset({2}))
    with pytest.raises(BatchPlanError, match="evenly"):
        GlobalBatchPlanner(global_batch=12, even=True).plan(12, 6, idle=frozenset({0}))  # 5 workers left


def test_a_step_with_idle_ranks_still_covers_every_sample_once() -> None:
    sampler = ElasticSampler(30, 7, seed=4)
    idle = frozenset({0, 2})
    seen = [i for rank in range(4) for i in sampler.assignment(rank, 4, idle=idle).indices]
    assert sorted(seen) == sorted(sampler.permutation(0)[:7])
    assert sampler.assignment(0, 4, idle=idle).indices == [] and sampler.assignment(2, 4, idle=idle).indices == []
