"""Disk checkpoints: the pure parts by tables, a sharded write read back, and a whole job killed and resumed.

The must-show: a toy job checkpointing every 5 steps is held at step 23, every worker is SIGKILLed, and a new job
started on the same checkpoint directory resumes at step 20 and ends with the parameters of an uninterrupted run,
every sample applied exactly once per epoch over the two runs.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest
import torch

from slurm_amoeba.runtime.checkpoint import (
    COMPLETE,
    Checkpointer,
    CheckpointJob,
    CheckpointPolicy,
    list_checkpoints,
    newest_complete,
    parse_every,
    prune,
    read_checkpoint,
    shard_assignment,
    write_checkpoint,
)
from slurm_amoeba.runtime.errors import RuntimeConfigError, StateError
from slurm_amoeba.runtime.state import clone_tree
from tests.unit.runtime.conftest import ReferenceRun
from tests.unit.runtime.jobs import (
    DEADLINE_S,
    NEVER,
    ToyJob,
    applied_ledger,
    epoch_counts,
    final_params,
    read_ledgers,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", (0, 300.0)), ("500", (500, 0.0)), ("90s", (0, 90.0)), ("15m", (0, 900.0)), ("1h", (0, 3600.0))],
)
def test_parse_every_reads_steps_or_a_time(text: str, expected: tuple[int, float]) -> None:
    assert parse_every(text) == expected


@pytest.mark.parametrize("text", ["0", "-5", "1.5", "10 steps", "5d", "s"])
def test_parse_every_refuses_what_is_neither_steps_nor_a_time_naming_the_value(text: str) -> None:
    with pytest.raises(RuntimeConfigError, match="AMOEBA_CHECKPOINT_EVERY"):
        parse_every(text)


def test_policy_from_environ_is_none_without_a_directory_and_refuses_a_bad_keep(tmp_path: Path) -> None:
    assert CheckpointPolicy.from_environ({}) is None
    policy = CheckpointPolicy.from_environ({"AMOEBA_CHECKPOINT_DIR": str(tmp_path), "AMOEBA_CHECKPOINT_EVERY": "20"})
    assert policy == CheckpointPolicy(tmp_path, every_steps=20, every_s=0.0, keep=2)
    with pytest.raises(RuntimeConfigError, match="AMOEBA_CHECKPOINT_KEEP='two'"):
        CheckpointPolicy.from_environ({"AMOEBA_CHECKPOINT_DIR": str(tmp_path), "AMOEBA_CHECKPOINT_KEEP": "two"})
    with pytest.raises(RuntimeConfigError, match="keep=0"):
        CheckpointPolicy(tmp_path, keep=0)


@pytest.mark.parametrize(
    ("every_steps", "every_s", "step", "since_s", "due"),
    [
        (5, 0, 10, 0.0, True),
        (5, 0, 11, 1e9, False),
        (5, 0, 0, 0.0, False),
        (0, 60, 7, 59.9, False),
        (0, 60, 7, 60.0, True),
        (5, 60, 7, 61.0, True),
    ],
)
def test_a_commit_is_due_by_steps_or_by_time(
    every_steps: int, every_s: float, step: int, since_s: float, due: bool
) -> None:
    policy = CheckpointPolicy(Path("/unused"), every_steps=every_steps, every_s=every_s)
    assert policy.due(step, since_s) is due


@pytest.mark.parametrize(
    ("sizes", "world_size", "expected"),
    [
        ([], 2, [[], []]),
        ([100, 10, 10, 80], 2, [[0], [1, 2, 3]]),
        ([5, 5, 5], 1, [[0, 1, 2]]),
        ([1, 2, 3], 4, [[2], [1], [0], []]),
    ],
)
def test_shard_assignment_gives_each_tensor_to_one_member_balancing_bytes(
    sizes: list[int], world_size: int, expected: list[list[int]]
) -> None:
    assert shard_assignment(sizes, world_size) == expected


def test_shard_assignment_covers_every_tensor_once_and_loads_differ_by_at_most_the_largest() -> None:
    sizes = [(i * 7919) % 1000 + 1 for i in range(57)]
    for world_size in (1, 2, 3, 8):
        shards = shard_assignment(sizes, world_size)
        assert sorted(i for shard in shards for i in shard) == list(range(len(sizes)))
        loads = [sum(sizes[i] for i in shard) for shard in shards]
        assert max(loads) - min(loads) <= max(sizes)


def _tree(seed: int) -> dict[str, object]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(4, 3, generator=generator), "b": torch.arange(5, dtype=torch.int64)},
        "optimizer": {"state": {0: {"momentum": torch.randn(4, 3, generator=generator)}}, "param_groups": []},
        "progress": {"epoch": 1, "cursor": 24, "step": seed},
        "extras": {"best": float("inf"), "names": ("a", "b")},
    }


def _write(policy: CheckpointPolicy, step: int, ranks: range, world_size: int = 3) -> Path | None:
    tree = _tree(step)
    path = None
    for rank in reversed(ranks):  # rank 0 last: it waits for the others' shards
        path = write_checkpoint(policy, "r1", CheckpointJob(clone_tree(tree), step, 1, rank, world_size))
    return path


def test_a_sharded_checkpoint_reads_back_the_same_tree_and_is_complete_only_with_every_shard(tmp_path: Path) -> None:
    policy = CheckpointPolicy(tmp_path, every_steps=5, shard_timeout_s=0.2)
    path = _write(policy, 10, range(3))
    assert path is not None and (path / COMPLETE).is_file()
    assert sorted(p.name for p in path.glob("shard-*.done")) == ["shard-0.done", "shard-1.done", "shard-2.done"]
    back = read_checkpoint(path)
    expected = _tree(10)
    torch.testing.assert_close(back["model"], expected["model"], rtol=0, atol=0)
    torch.testing.assert_close(back["optimizer"], expected["optimizer"], rtol=0, atol=0)
    assert back["progress"] == expected["progress"] and back["extras"] == expected["extras"]

    assert _write(policy, 15, range(0, 3, 2)) is None  # rank 1 never wrote: abandoned after the shard timeout
    assert [c.step for c in list_checkpoints(tmp_path)] == [10, 15]
    newest = newest_complete(tmp_path)
    assert newest is not None and newest.step == 10
    with pytest.raises(StateError, match="no COMPLETE marker"):
        read_checkpoint(tmp_path / "step-000000015-r1-g1")


def test_prune_keeps_the_newest_complete_ones_and_drops_older_incomplete_ones(tmp_path: Path) -> None:
    policy = CheckpointPolicy(tmp_path, every_steps=5, keep=2, shard_timeout_s=0.1)
    _write(policy, 5, range(1), world_size=1)
    _write(policy, 8, range(0, 1), world_size=2)  # incomplete, older than what is kept: dropped
    _write(policy, 10, range(1), world_size=1)
    _write(policy, 15, range(1), world_size=1)  # keep=2: the checkpoint of step 5 goes
    _write(policy, 20, range(0, 1), world_size=2)  # incomplete and newest: may still be under way, kept
    assert [(c.step, c.complete) for c in list_checkpoints(tmp_path)] == [(10, True), (15, True), (20, False)]
    assert prune(tmp_path, 1) == [tmp_path / "step-000000010-r1-g1"]


def test_the_checkpointer_writes_in_the_background_and_submit_returns_at_once(tmp_path: Path) -> None:
    writer = Checkpointer(CheckpointPolicy(tmp_path, every_steps=1), "r2", "[test]")
    try:
        started = time.perf_counter()
        writer.submit(CheckpointJob(_tree(3), 3, 1, 0, 1))
        assert time.perf_counter() - started < 0.05
        assert writer.flush(30)
        assert [p.name for p in writer.written] == ["step-000000003-r2-g1"]
    finally:
        writer.close()


EPOCHS, DATASET, GLOBAL_BATCH = 5, 100, 12
STEPS = EPOCHS * -(-DATASET // GLOBAL_BATCH)


@pytest.mark.timeout(200)
def test_a_job_killed_whole_resumes_from_its_checkpoint_with_the_uninterrupted_trajectory(
    tmp_path: Path, fixed_run: ReferenceRun
) -> None:
    checkpoints = tmp_path / "checkpoints"
    env = {"AMOEBA_CHECKPOINT_DIR": str(checkpoints), "AMOEBA_CHECKPOINT_EVERY": "5", "AMOEBA_CHECKPOINT_KEEP": "2"}
    first, second = tmp_path / "first", tmp_path / "second"
    with ToyJob(first, workers=2, hold=True, env=env) as toy:
        toy.release(23)
        view = toy.wait_members(2)
        toy.wait_held(23)
        deadline = time.monotonic() + 60
        while (newest := newest_complete(checkpoints)) is None or newest.step < 20:
            assert time.monotonic() < deadline, f"no complete checkpoint of step 20: {list_checkpoints(checkpoints)}"
            time.sleep(0.05)
        assert view.plan is not None
        for worker in view.plan.members:
            toy.job.kill(worker)
        first_history = toy.job.view().history
    complete = [c.step for c in list_checkpoints(checkpoints) if c.complete]
    # The kill may land before the writer pruned the oldest one, and a write that fell behind is replaced by the next:
    # what holds is that 20 is the newest complete checkpoint and at most keep + 1 are left.
    assert complete[-1] == 20 and len(complete) <= 3 and set(complete) <= {5, 10, 15, 20}, complete

    with ToyJob(second, workers=2, hold=False, env=env) as toy:
        result = toy.finish()
    assert result.phase.value == "finished", result
    assert result.view.history[0].plan.start_step in (None, 20)

    before = [e for e in applied_ledger(read_ledgers(first), first_history) if e.step < 20]
    after = applied_ledger(read_ledgers(second), result.view.history)
    assert min(e.step for e in after) == 20, "the second run resumes at the checkpoint's step"
    counts = epoch_counts(before + after)
    assert sorted(counts) == list(range(EPOCHS))
    for epoch, counter in counts.items():
        assert sorted(counter) == list(range(DATASET)) and set(counter.values()) == {1}, f"epoch {epoch}"
    per_step = collections.Counter(e.step for e in before + after)
    assert sorted(per_step) == list(range(STEPS))
    params = final_params(second)
    assert len(params) == 2
    for worker, tensors in params.items():
        for name, tensor in fixed_run.params.items():
            torch.testing.assert_close(tensors[name], tensor, rtol=1e-9, atol=1e-11, msg=f"{worker} {name}")


@pytest.mark.timeout(200)
def test_checkpoints_by_time_are_agreed_by_every_member_so_each_one_completes(
    tmp_path: Path, fixed_run: ReferenceRun
) -> None:
    checkpoints = tmp_path / "checkpoints"
    env = {"AMOEBA_CHECKPOINT_DIR": str(checkpoints), "AMOEBA_CHECKPOINT_EVERY": "1s", "AMOEBA_CHECKPOINT_KEEP": "100"}
    with ToyJob(tmp_path / "out", workers=2, hold=False, env=env, extra_args=["--step-delay", "0.05"]) as toy:
        result = toy.finish()
    assert result.phase.value == "finished", result
    found = list_checkpoints(checkpoints)
    # 45 steps of >= 50 ms, a commit every 5 steps: a checkpoint every 1 s is due every 4th commit or so.
    assert len(found) >= 2, found
    assert all(c.complete for c in found), f"members disagreed on a time-based checkpoint: {found}"
    assert all(c.step % 5 == 0 for c in found)
    newest = read_checkpoint(found[-1].path)
    assert newest["progress"]["step"] == found[-1].step


@pytest.mark.timeout(200)
def test_a_job_whose_every_member_leaves_writes_a_final_checkpoint_and_resumes_there_exactly(
    tmp_path: Path, fixed_run: ReferenceRun
) -> None:
    checkpoints = tmp_path / "checkpoints"
    # No checkpoint falls due by steps: the only one is the final one, written when every member leaves.
    env = {"AMOEBA_CHECKPOINT_DIR": str(checkpoints), "AMOEBA_CHECKPOINT_EVERY": "100000"}
    first, second = tmp_path / "first", tmp_path / "second"
    with ToyJob(first, workers=2, hold=True, env=env) as toy:
        toy.release(23)
        view = toy.wait_members(2)
        toy.wait_held(23)
        assert view.plan is not None
        for worker in view.plan.members:
            toy.job.terminate(worker)  # SIGTERM: what a stop, a time limit or a preemption sends every worker
        toy.release(NEVER)
        ended = toy.job.wait(DEADLINE_S)
        first_history = toy.job.view().history
    assert ended.phase.value == "lost", ended
    assert all(v.status.value == "left" for v in ended.view.workers.values()), ended.view.workers
    (final,) = list_checkpoints(checkpoints)
    assert final.complete and final.step >= 23, final

    with ToyJob(second, workers=2, hold=False, env=env) as toy:
        result = toy.finish()
    assert result.phase.value == "finished", result
    before = [e for e in applied_ledger(read_ledgers(first), first_history) if e.step < final.step]
    after = applied_ledger(read_ledgers(second), result.view.history)
    assert min(e.step for e in after) == final.step, "the second run resumes at the final checkpoint's step"
    counts = epoch_counts(before + after)
    for epoch, counter in counts.items():
        assert sorted(counter) == list(range(DATASET)) and set(counter.values()) == {1}, f"epoch {epoch}"
    assert sorted(collections.Counter(e.step for e in before + after)) == list(range(STEPS))
    for worker, tensors in final_params(second).items():
        for name, tensor in fixed_run.params.items():
            torch.testing.assert_close(tensors[name], tensor, rtol=1e-9, atol=1e-11, msg=f"{worker} {name}")
