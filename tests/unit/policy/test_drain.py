"""The operator's drain as a policy wrapper: every resizable elastic job to its minimum, nothing else."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from slurm_amoeba.policy import (
    Action,
    DrainPolicy,
    ElasticBackfillPolicy,
    FifoPolicy,
    JobInfo,
    Resize,
    Snapshot,
    Start,
    check_actions,
    drain_actions,
)
from slurm_amoeba.policy.drain import DRAIN_REASON

from .helpers import job, sizes, snapshot


class Recording:
    """A policy that answers with fixed actions and counts its calls."""

    name = "recording"
    decides_on_events_only = True
    emits: frozenset[type[Action]] = frozenset({Start, Resize})

    def __init__(self, decisions: Sequence[Action] = ()) -> None:
        self.decisions = list(decisions)
        self.calls = 0

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        self.calls += 1
        return self.decisions


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        pytest.param([job("e", 2, placement={"n0": 4}, low=2, high=8)], {"e": 2}, id="above-its-minimum-shrinks"),
        pytest.param([job("e", 2, placement={"n0": 2}, low=2, high=8)], {}, id="at-its-minimum-stays"),
        pytest.param([job("fixed", 4, placement={"n0": 4})], {}, id="a-regular-job-is-not-touched"),
        pytest.param([job("p", 2, low=2, high=8)], {}, id="a-pending-job-is-not-started"),
        pytest.param(
            [job("e", 1, placement={"n0": 3}, low=1, high=4, resizing=True)], {}, id="a-resizing-job-finishes-first"
        ),
        pytest.param(
            [job("e", 1, placement={"n0": 3}, low=1, high=4, pinned=True)], {}, id="a-job-shown-pinned-is-left-alone"
        ),
        pytest.param(
            [
                job("a", 1, placement={"n0": 4}, low=1, high=4),
                job("b", 2, placement={"n1": 3}, low=2, high=4, gpus_per_worker=1),
                job("c", 1, placement={"n1": 1}),
            ],
            {"a": 1, "b": 2},
            id="every-elastic-job-at-once",
        ),
    ],
)
def test_a_drain_shrinks_every_resizable_elastic_job_to_its_minimum(
    jobs: list[JobInfo], expected: dict[str, int]
) -> None:
    snap = snapshot([4, 4], jobs)
    decisions = drain_actions(snap)
    assert sizes(decisions) == expected
    assert all(decision.reason == DRAIN_REASON and not decision.placement for decision in decisions)
    check_actions(snap, decisions)


def test_while_draining_the_wrapped_policy_is_not_asked() -> None:
    inner = Recording([Resize("e", 4)])
    snap = snapshot([4], [job("e", 1, placement={"n0": 2}, low=1, high=4)])
    assert sizes(DrainPolicy(inner).decide(snap, 0.0)) == {"e": 1}
    assert inner.calls == 0


def test_with_the_drain_off_the_wrapped_policy_decides_alone() -> None:
    inner = Recording([Resize("e", 4)])
    snap = snapshot([4], [job("e", 1, placement={"n0": 2}, low=1, high=4)])
    assert DrainPolicy(inner, draining=False).decide(snap, 0.0) == [Resize("e", 4)]
    assert inner.calls == 1


@pytest.mark.parametrize("inner", [ElasticBackfillPolicy(), FifoPolicy()], ids=lambda p: p.name)
def test_the_wrapper_goes_by_the_wrapped_policys_name(inner: ElasticBackfillPolicy | FifoPolicy) -> None:
    wrapped = DrainPolicy(inner)
    assert wrapped.name == inner.name
    assert wrapped.decides_on_events_only == inner.decides_on_events_only


def test_the_wrapper_emits_the_wrapped_policys_actions_and_its_resizes() -> None:
    assert DrainPolicy(FifoPolicy()).emits == {Start, Resize}
