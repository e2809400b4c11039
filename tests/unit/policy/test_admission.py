"""Admission at the requested size as a layer (policy/admission.py): which pending elastic jobs it holds and
releases on a snapshot, the starvation bound counted from submission, reservations, Slurm's order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any, ClassVar

from slurm_amoeba.policy.actions import Action, Hold, Release
from slurm_amoeba.policy.admission import AdmissionGate, slurm_rule
from slurm_amoeba.policy.amoebad import AmoebadPolicy
from slurm_amoeba.policy.fifo import FifoPolicy
from slurm_amoeba.policy.types import JobInfo, Snapshot
from tests.unit.policy.helpers import job, snapshot

NOW = 1_000.0


def elastic(job_id: str, low: int, high: int, *, submit: float = NOW - 10, **extra: Any) -> JobInfo:
    """A pending elastic job of range ``low..high``, ten minutes' limit unless given, submitted a little before NOW."""
    extra.setdefault("time_limit", 600.0)
    return job(job_id, low, low=low, high=high, submit=submit, **extra)


def running(job_id: str, gpus: int, *, left: float = 300.0) -> JobInfo:
    """A running fixed-size job on node n0 (then n1) that reaches its time limit in ``left`` seconds."""
    placement = {"n0": min(gpus, 4), **({"n1": gpus - 4} if gpus > 4 else {})}
    return job(job_id, gpus, placement=placement, time_limit=600.0, executed_time=600.0 - left)


def verdicts(jobs: Sequence[JobInfo], gate: AdmissionGate | None = None, now: float = NOW) -> list[Hold | Release]:
    return (gate or AdmissionGate(FifoPolicy())).verdicts(snapshot([4, 4], jobs), now)


def named(actions: Sequence[Action]) -> list[tuple[str, str]]:
    return [(type(a).__name__, a.job_id) for a in actions]


def test_a_job_whose_requested_size_is_not_free_is_held_and_released_once_it_is() -> None:
    assert named(verdicts([running("r", 6), elastic("e", 2, 4)])) == [("Hold", "e")]
    held = elastic("e", 2, 4, held=True, held_since=NOW - 5)
    assert verdicts([running("r", 6), held]) == []  # still waiting: nothing to do
    (release,) = verdicts([running("r", 4), held])
    assert isinstance(release, Release) and release.job_id == "e" and not release.starved
    assert verdicts([running("r", 4), elastic("e", 2, 4)]) == []  # room now: never held


def test_the_starvation_bound_counts_from_submission_and_releases_the_job_starved() -> None:
    gate = AdmissionGate(FifoPolicy(), slurm_rule(max_hold_s=60.0))
    young = elastic("e", 2, 4, submit=NOW - 59, held=True, held_since=NOW - 30)
    assert verdicts([running("r", 6), young], gate) == []
    old = elastic("e", 2, 4, submit=NOW - 60, held=True, held_since=NOW - 30)
    (release,) = verdicts([running("r", 6), old], gate)
    assert isinstance(release, Release) and release.starved and "admission.max_hold_s 60" in release.reason
    assert verdicts([running("r", 6), elastic("e", 2, 4, submit=NOW - 60)], gate) == []  # never held


def test_a_hold_that_is_not_the_daemons_is_left_alone() -> None:
    theirs = elastic("e", 2, 4, held=True)  # held by its owner or an admin: no hold mark
    assert verdicts([running("r", 4), theirs]) == []


def test_a_job_is_not_started_ahead_of_an_earlier_jobs_reservation_unless_it_ends_before_it_is_needed() -> None:
    big = job("big", 8, time_limit=600.0, submit=NOW - 100, priority=200)  # first in Slurm's order: 8 GPUs at 300 s
    assert named(verdicts([running("r", 4), big, elastic("e", 2, 4)])) == [("Hold", "e")]
    short = elastic("e", 2, 4, time_limit=200.0)  # done before r's GPUs are big's
    assert verdicts([running("r", 4), big, short]) == []


def test_an_unlimited_job_never_fits_before_a_reservation() -> None:
    big = job("big", 8, time_limit=600.0, submit=NOW - 100, priority=200)
    assert named(verdicts([running("r", 4), big, elastic("e", 2, 4, time_limit=None)])) == [("Hold", "e")]


def test_the_rule_follows_slurms_order_priority_then_submit_time_then_id() -> None:
    first, second = elastic("1", 2, 4, priority=100), elastic("2", 2, 4, priority=200)
    assert named(verdicts([running("r", 4), first, second])) == [("Hold", "1")]
    first, second = elastic("1", 2, 4, submit=NOW - 5), elastic("2", 2, 4, submit=NOW - 9)
    assert named(verdicts([running("r", 4), first, second])) == [("Hold", "1")]
    first, second = elastic("2", 2, 4), elastic("1", 2, 4)
    assert named(verdicts([running("r", 4), first, second])) == [("Hold", "2")]


def test_jobs_of_other_partitions_and_users_are_not_gated_and_the_inner_answer_passes_through() -> None:
    jobs = [running("r", 6), elastic("e", 2, 4, owner="bob"), elastic("f", 2, 4, partition="other")]
    gate = AdmissionGate(FifoPolicy(), users=frozenset({"alice"}))
    assert verdicts(jobs, gate) == []
    gate = AdmissionGate(FifoPolicy(), partitions=frozenset({"batch"}))
    assert verdicts(jobs, gate) == []
    inner = FifoPolicy().decide(snapshot([4, 4], [running("r", 6), elastic("e", 2, 4)]), NOW)
    both = AdmissionGate(FifoPolicy()).decide(snapshot([4, 4], [running("r", 6), elastic("e", 2, 4)]), NOW)
    assert list(both) == [*inner, *verdicts([running("r", 6), elastic("e", 2, 4)])]
    assert AdmissionGate(FifoPolicy()).emits == FifoPolicy().emits | {Hold, Release}


def test_a_hold_states_the_requested_size_the_job_waits_for_not_its_minimum() -> None:
    (hold,) = verdicts([running("r", 6), elastic("e", 2, 4)])
    assert isinstance(hold, Hold) and hold.wants_gpus == 4
    capped = AdmissionGate(FifoPolicy(), max_workers=3)
    (hold,) = verdicts([running("r", 6), elastic("e", 2, 16)], capped)
    assert isinstance(hold, Hold) and hold.wants_gpus == 3


class CountingRule(AmoebadPolicy):
    """Slurm's rule as the gate asks it (:func:`slurm_rule`), counting its decisions."""

    asked: ClassVar[int] = 0

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        CountingRule.asked += 1
        return super().decide(snapshot, now)


def test_the_rule_is_asked_only_when_a_pending_job_is_gated() -> None:
    rule = slurm_rule()
    gate = AdmissionGate(FifoPolicy(), CountingRule(**{f.name: getattr(rule, f.name) for f in fields(rule) if f.init}))
    # Running jobs and a pending rigid job only (most rounds of a large site): no verdict to give, no model to run.
    assert verdicts([running("r", 6), job("p", 4, submit=NOW - 5)], gate) == [] and CountingRule.asked == 0
    assert named(verdicts([running("r", 6), elastic("e", 2, 4)], gate)) == [("Hold", "e")] and CountingRule.asked == 1
