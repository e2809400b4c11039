"""The study's synthetic snapshots are consistent, and every policy keeps the invariants on them."""

from __future__ import annotations

from benchmarks.sim_study import decision_times, synthetic_snapshot
from slurm_amoeba.policy import check_decisions, make_policy, policy_names


def test_synthetic_snapshots_are_reproducible_and_every_policy_keeps_the_invariants() -> None:
    snapshot = synthetic_snapshot(50, 8, 120, seed=3)
    assert snapshot == synthetic_snapshot(50, 8, 120, seed=3)
    held = sum(job.gpus for job in snapshot.running())
    assert held == snapshot.total_gpus - snapshot.free_gpus
    for name in policy_names():
        check_decisions(snapshot, make_policy(name).decide(snapshot, 1e5))


def test_decision_times_cover_every_policy() -> None:
    times = decision_times(synthetic_snapshot(20, 4, 30), repeats=1)
    assert set(times) == set(policy_names())
    assert all(seconds > 0 for seconds in times.values())
