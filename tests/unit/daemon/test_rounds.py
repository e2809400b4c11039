"""The round's decide step as plain functions: which decisions the daemon acts on, the drain, a broken invariant."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from slurm_amoeba.daemon.observer import Observation
from slurm_amoeba.daemon.rounds import decide, resize_targets
from slurm_amoeba.policy import Decision, JobInfo, Snapshot
from slurm_amoeba.policy.drain import DRAIN_REASON
from tests.unit.policy.helpers import job, snapshot


class Fixed:
    """A policy that answers with fixed decisions."""

    name = "fixed"
    decides_on_events_only = True

    def __init__(self, *decisions: Decision) -> None:
        self.decisions = list(decisions)

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Decision]:
        return self.decisions


def observation(jobs: Sequence[JobInfo], managed: Sequence[str]) -> Observation:
    snap = snapshot([4, 4], jobs)
    return Observation(
        snapshot=snap,
        managed={info.job_id: info for info in jobs if info.job_id in managed},
        orphans=(),
        unclaimed=(),
        gone=(),
        regular_running=0,
        regular_pending=0,
    )


ELASTIC = job("e", 1, placement={"n0": 2}, low=1, high=4)


@pytest.mark.parametrize(
    ("info", "is_managed", "decision", "expected"),
    [
        (ELASTIC, True, Decision("e", 4, reason="idle GPUs"), {"e": (4, "idle GPUs")}),
        (ELASTIC, True, Decision("e", 3), {"e": (3, "fixed")}),
        (ELASTIC, False, Decision("e", 4), {}),
        (ELASTIC, True, Decision("e", 2), {}),
        (ELASTIC, True, Decision("e", 0), {}),
        (job("e", 1, placement={"n0": 2}, low=1, high=4, pinned=True), True, Decision("e", 4), {}),
        (job("e", 1, placement={"n0": 2}, low=1, high=4, resizing=True), True, Decision("e", 4), {}),
        (job("r", 2, placement={"n0": 2}), True, Decision("r", 2), {}),
    ],
    ids=[
        "a-grow-with-its-reason",
        "no-reason-means-the-policys-name",
        "an-unmanaged-job-is-slurms",
        "the-same-size-is-no-resize",
        "a-preemption-is-slurms",
        "a-pinned-job",
        "a-resizing-job",
        "a-fixed-size-job",
    ],
)
def test_the_daemon_acts_only_on_resizes_of_managed_jobs_that_may_resize_now(
    info: JobInfo, is_managed: bool, decision: Decision, expected: dict[str, tuple[int, str]]
) -> None:
    managed = {info.job_id: info} if is_managed else {}
    targets, reasons = resize_targets(managed, [decision], "fixed")
    assert {job_id: (targets[job_id], reasons[job_id]) for job_id in targets} == expected


def test_the_policys_resizes_become_the_plan() -> None:
    plan = decide(Fixed(Decision("e", 4, reason="grow")), observation([ELASTIC], ["e"]), 0.0, draining=False)
    assert (dict(plan.targets), plan.source, plan.error) == ({"e": 4}, "policy", "")


def test_a_drain_plans_every_managed_job_to_its_minimum_without_asking_the_policy() -> None:
    big = job("e", 1, placement={"n0": 3}, low=1, high=4)
    plan = decide(Fixed(Decision("e", 4)), observation([big], ["e"]), 0.0, draining=True)
    assert (dict(plan.targets), dict(plan.reasons), plan.source) == ({"e": 1}, {"e": DRAIN_REASON}, "drain")


def test_decisions_that_break_an_invariant_plan_nothing_and_say_why() -> None:
    plan = decide(Fixed(Decision("e", 9)), observation([ELASTIC], ["e"]), 0.0, draining=False)
    assert plan.targets == {} and plan.error.startswith("policy error: job e: 9 workers lies outside its range")
