"""Must-show: a seeded job resized 2 -> 3 -> 1 -> 4, with a graceful leave and a SIGKILL, ends where a fixed-size
run of the same seed ends, and every sample is applied exactly once per epoch in both (CPU, gloo, local mode).
"""

from __future__ import annotations

import collections
import json
import tempfile
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_amoeba.runtime.membership import GenerationRecord
from tests.unit.runtime.conftest import ReferenceRun
from tests.unit.runtime.jobs import (
    NEVER,
    LedgerEntry,
    ToyJob,
    applied_ledger,
    epoch_counts,
    final_params,
    read_ledgers,
)

EPOCHS = 5
DATASET = 100
GLOBAL_BATCH = 12
STEPS = EPOCHS * -(-DATASET // GLOBAL_BATCH)


def assert_exactly_once(out: Path, history: tuple[object, ...]) -> None:
    entries = applied_ledger(read_ledgers(out), history)  # type: ignore[arg-type]
    counts = epoch_counts(entries)
    assert sorted(counts) == list(range(EPOCHS))
    for epoch, counter in counts.items():
        assert sorted(counter) == list(range(DATASET)), f"epoch {epoch} misses samples"
        assert set(counter.values()) == {1}, f"epoch {epoch} applied some samples twice"
    per_step: dict[int, int] = collections.Counter()
    for entry in entries:
        assert entry.torchrun == [str(entry.rank), str(entry.world_size)], "RANK/WORLD_SIZE follow the generation"
        per_step[entry.step] += len(entry.indices)
        assert all(m <= 4 for m in entry.micro), "a micro-batch exceeded the memory cap"
    assert sorted(per_step) == list(range(STEPS))
    for step, samples in per_step.items():
        expected = GLOBAL_BATCH if (step + 1) % 9 else DATASET % GLOBAL_BATCH
        assert samples == expected, f"step {step} applied {samples} samples instead of {expected}"


@pytest.mark.timeout(200)
def test_resized_job_with_leave_and_kill_matches_fixed_size_run_exactly_once(
    tmp_path: Path, fixed_run: ReferenceRun
) -> None:
    fixed_out, fixed_result = fixed_run.out, fixed_run.result
    out = tmp_path / "elastic"
    # DataLoader worker processes (persistent across resizes) in the elastic run only: results must not change.
    # A warm_up that every joiner rehearses (random data, a forward and backward): nothing of it may show.
    extra = ["--step-delay", "0.01", "--loader-workers", "1", "--warm-up"]
    with ToyJob(out, workers=2, hold=True, extra_args=extra) as toy:
        job = toy.job
        toy.release(4)
        toy.wait_members(2)
        toy.wait_held(4)
        (joiner,) = job.add(1)
        toy.wait_ready([joiner])
        toy.release(12)
        view = toy.wait_members(3)

        toy.wait_held(12)
        assert view.plan is not None
        for leaver in view.plan.members[:2]:  # rank 0 leaves too: the source moves to the last member
            job.remove(leaver)
        toy.release(20)
        toy.wait_members(1)

        toy.wait_held(20)
        joiners = job.add(3)
        toy.wait_ready(joiners)
        toy.release(28)
        view = toy.wait_members(4)

        toy.wait_held(28)
        assert view.plan is not None
        job.terminate(view.plan.members[1])  # SIGTERM: graceful leave, like Slurm preemption
        toy.release(33)
        view = toy.wait_members(3)

        toy.wait_held(33)
        assert view.plan is not None
        victim = view.plan.members[-1]
        toy.release(NEVER)
        killed = time.monotonic()
        job.kill(victim)  # SIGKILL mid-training: survivors roll back to the last commit
        toy.wait_members(2)
        recovered_s = time.monotonic() - killed
        result = toy.finish()
    # Every survivor fails at once (not at the 10 s report deadline): one that sees the dead peer closes its own
    # connections, which wakes the others.
    assert recovered_s < 5, f"recovery after the SIGKILL took {recovered_s:.1f} s"

    assert result.phase.value == "finished", result
    sizes = [r.plan.world_size for r in result.view.history]
    assert sizes == [2, 3, 1, 4, 3, 2], sizes
    assert result.view.history[-1].plan.rollback
    assert result.returncodes[victim] == -9

    raw, applied = read_ledgers(out), applied_ledger(read_ledgers(out), result.view.history)
    assert len(raw) > len(applied), "the SIGKILL after step 32 must roll back and redo steps 30..32"
    assert_exactly_once(fixed_out, fixed_result.view.history)
    assert_exactly_once(out, result.view.history)

    assert_same_params(fixed_run, final_params(out), expected_workers=2)
    assert_joiners_idle_first(applied, result.view.history)
    endings = {p.stem.removeprefix("result-"): json.loads(p.read_text()) for p in out.glob("result-*.json")}
    finishers = [w for w, e in endings.items() if e["status"] == "finished"]
    assert sorted(endings[w]["rank"] for w in finishers) == [0, 1]
    for worker, ending in endings.items():
        if ending["status"] == "left":  # a leaver holds no rank: a ported `if rank == 0: save()` does not run
            assert (ending["rank"], ending["RANK"], ending["now"]) == (None, None, -1), worker


def assert_joiners_idle_first(entries: list[LedgerEntry], history: tuple[GenerationRecord, ...]) -> None:
    """In the first step of a generation that members and joiners formed, the joiners took no samples and the
    members split the step among themselves (runtime/topology.py, idle_ranks)."""
    checked = 0
    for record in history:
        plan = record.plan
        if not plan.joiners or plan.start_step is None or plan.rollback:
            continue
        first = [e for e in entries if e.generation == plan.generation and e.step == plan.start_step]
        assert {e.worker for e in first} == set(plan.members), (plan, first)
        members = [e for e in first if e.worker not in plan.joiners]
        assert all(not e.indices for e in first if e.worker in plan.joiners), first
        assert sum(len(e.indices) for e in members) == first[0].step_samples
        assert max(len(e.indices) for e in members) == -(-first[0].step_samples // len(members))
        checked += 1
    assert checked >= 2, "the run had two scale-outs"


def assert_same_params(
    reference: ReferenceRun, params: dict[str, dict[str, torch.Tensor]], expected_workers: int
) -> None:
    """Every finishing worker ends with the reference run's parameters (float64; summation order only)."""
    assert len(params) == expected_workers
    for worker, tensors in params.items():
        for name, tensor in reference.params.items():
            torch.testing.assert_close(tensors[name], tensor, rtol=1e-9, atol=1e-11, msg=f"{worker} {name}")


RESIZES = st.lists(st.sampled_from(["add", "add2", "remove", "term", "kill"]), min_size=1, max_size=3)


@pytest.mark.timeout(240)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=RESIZES)
def test_random_resizes_and_kills_of_real_workers_keep_exactly_once_and_the_global_batch(
    fixed_run: ReferenceRun, ops: list[str]
) -> None:
    with tempfile.TemporaryDirectory(prefix="amoeba-prop-") as tmp:
        out = Path(tmp)
        with ToyJob(out, workers=2, hold=True) as toy:
            job = toy.job
            size, hold = 2, 4
            toy.release(hold)
            for op in ops:
                view = toy.wait_members(size)
                toy.wait_held(hold)
                assert view.plan is not None
                members = list(view.plan.members)
                if op.startswith("add"):
                    added = job.add(2 if op == "add2" else 1)
                    toy.wait_ready(added)
                    size += len(added)
                elif size > 1:
                    if op == "remove":
                        job.remove(members[0])
                    elif op == "term":
                        job.terminate(members[-1])
                    else:
                        job.kill(members[len(members) // 2])
                    size -= 1
                hold += 6
                toy.release(hold)
            toy.wait_members(size)
            result = toy.finish()
        assert result.phase.value == "finished", result
        assert_exactly_once(out, result.view.history)
        assert_same_params(fixed_run, final_params(out), expected_workers=size)


@pytest.mark.timeout(120)
def test_stopped_worker_is_caught_by_the_collective_timeout_and_the_rest_go_on(
    tmp_path: Path, fixed_run: ReferenceRun
) -> None:
    out = tmp_path / "job"
    toy = ToyJob(out, workers=3, hold=True, collective_timeout_s=3, heartbeat_timeout_s=6)
    with toy:
        toy.release(6)
        view = toy.wait_members(3)
        toy.wait_held(6)
        assert view.plan is not None
        frozen = view.plan.members[1]
        toy.job.pause(frozen)  # SIGSTOP: hangs instead of dying, no connection reset
        started = time.monotonic()
        toy.release(NEVER)
        toy.wait_members(2)
        noticed = time.monotonic() - started
        result = toy.finish()
    assert noticed < 3 + 3 + 5, f"the hung worker took {noticed:.1f} s to be dropped"
    assert result.phase.value == "finished"
    assert result.view.workers[frozen].status.value == "dead"
    assert result.view.history[-1].plan.rollback
    assert_exactly_once(out, result.view.history)
    assert_same_params(fixed_run, final_params(out), expected_workers=2)
