"""The study's synthetic snapshots are consistent, every policy keeps the invariants on them, and the default
section's cells (the pooled p99) read right."""

from __future__ import annotations

from benchmarks.sim_study import _versus, decision_times, pooled_p99, synthetic_snapshot
from slurm_amoeba.policy import check_actions, make_policy, policy_names
from slurm_amoeba.sim.metrics import percentile
from slurm_amoeba.sim.runner import RunOutcome


def test_synthetic_snapshots_are_reproducible_and_every_policy_keeps_the_invariants() -> None:
    snapshot = synthetic_snapshot(50, 8, 120, seed=3)
    assert snapshot == synthetic_snapshot(50, 8, 120, seed=3)
    held = sum(job.gpus for job in snapshot.running())
    assert held == snapshot.total_gpus - snapshot.free_gpus
    for name in policy_names():
        check_actions(snapshot, make_policy(name).decide(snapshot, 1e5))


def test_decision_times_cover_every_policy() -> None:
    times = decision_times(synthetic_snapshot(20, 4, 30), repeats=1)
    assert set(times) == set(policy_names())
    assert all(seconds > 0 for seconds in times.values())


def _outcome(jcts: list[float]) -> RunOutcome:
    summary = {"avg_jct_s": sum(jcts) / len(jcts), "p99_jct_s": percentile(jcts, 0.99)}
    return RunOutcome("slurm", "w", summary, jcts, [], 4)


def test_the_pooled_p99_is_the_tail_of_the_family_not_the_mean_of_the_workloads_p99s() -> None:
    # One workload with a single long job, one without: each workload's p99 sits near its longest job, the family's
    # pooled p99 (200 jobs) below the one long job.
    spiky, flat = [1.0] * 99 + [100.0], [1.0] * 100
    assert pooled_p99([spiky, flat]) == percentile(spiky + flat, 0.99) == 1.0
    assert (percentile(spiky, 0.99) + percentile(flat, 0.99)) / 2 > 1.4
    # A row that halves the long job: the mean p99 drops, the pooled p99 stays, and the cells say both.
    base = [_outcome(spiky), _outcome(flat)]
    row = [_outcome([1.0] * 99 + [50.0]), _outcome(flat)]
    cells = _versus(row, base).split(" | ")
    assert cells[2] == f"{1.0 / 3600:.3f} (+0.0%)"
    assert cells[1].endswith("(-16.7%)")
    assert cells[4] == "0 of 2 (-25 +0)"
