"""Every registered policy keeps the cluster's invariants on random snapshots (hypothesis)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_amoeba.policy import (
    ElasticBackfillPolicy,
    JobPhase,
    Place,
    Preempt,
    Resize,
    Share,
    Snapshot,
    Start,
    check_actions,
    make_policy,
    policy_names,
)

from .strategies import snapshots

_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("name", policy_names())
@_SETTINGS
@given(snapshot=snapshots(), now=st.floats(0, 100_000))
def test_actions_never_break_an_invariant(name: str, snapshot: Snapshot, now: float) -> None:
    policy = make_policy(name)
    actions = policy.decide(snapshot, now)
    check_actions(snapshot, actions)
    assert {type(action) for action in actions} <= policy.emits, "a policy answers only with the types it declares"
    jobs = {job.job_id: job for job in snapshot.jobs}
    held_after = snapshot.total_gpus - snapshot.free_gpus
    for action in actions:
        assert isinstance(action, (Start, Resize, Preempt, Place, Share)), f"{action} is not a size action"
        job = jobs[action.job_id]
        if isinstance(action, Resize) and action.workers != job.workers:
            assert job.is_elastic and not job.pinned and not job.resizing
        if action.workers:
            assert job.min_workers <= action.workers <= job.max_workers
        if job.shared_with is None and job.state is JobPhase.RUNNING:
            held_after -= job.gpus
        if not isinstance(action, Share):
            held_after += action.workers * job.gpus_per_worker
    assert held_after <= snapshot.total_gpus


@_SETTINGS
@given(snapshot=snapshots(), now=st.floats(0, 100_000))
def test_backfill_in_the_daemon_never_starts_a_job(snapshot: Snapshot, now: float) -> None:
    decisions = ElasticBackfillPolicy(start_pending=False).decide(snapshot, now)
    jobs = {job.job_id: job for job in snapshot.jobs}
    assert all(jobs[decision.job_id].state is JobPhase.RUNNING for decision in decisions)
    check_actions(snapshot, decisions)


@pytest.mark.parametrize("name", policy_names())
@settings(max_examples=40, deadline=None)
@given(snapshot=snapshots(), now=st.floats(0, 100_000))
def test_policies_are_pure_functions_of_snapshot_and_time(name: str, snapshot: Snapshot, now: float) -> None:
    policy = make_policy(name)
    before = copy.deepcopy(snapshot)
    assert list(policy.decide(snapshot, now)) == list(policy.decide(snapshot, now))
    assert snapshot == before  # the inputs are left as they were
