"""check_decisions rejects each kind of broken invariant with a message naming the job."""

from __future__ import annotations

import pytest

from slurm_amoeba.policy import Decision, PolicyError, check_decisions

from .helpers import job, snapshot


@pytest.mark.parametrize(
    ("decision", "message"),
    [
        (Decision("ghost", 1), "not in the snapshot"),
        (Decision("fixed", 3, {"n0": 3}), "not elastic"),
        (Decision("el", 1, {"n0": 1}), "outside its range"),
        (Decision("el", 9, {"n0": 4, "n1": 5}), "outside its range"),
        (Decision("el", 6, {"n0": 4, "n1": 2}), "node n0 would hold"),
        (Decision("el", 5, {"n1": 4}), "holds 4 workers"),
        (Decision("el", 5, {"nx": 5}), "node 'nx'"),
        (Decision("wait", 0), "cannot be preempted"),
        (Decision("wait", 2, {"n1": 2}, share_with="nobody"), "does not run"),
    ],
)
def test_check_rejects(decision: Decision, message: str) -> None:
    snap = snapshot(
        [4, 4],
        [
            job("fixed", 2, placement={"n0": 2}),
            job("el", 2, low=2, high=8, placement={"n0": 2, "n1": 2}),
            job("wait", 2, submit=3),
        ],
    )
    with pytest.raises(PolicyError, match=message):
        check_decisions(snap, [decision])


def test_check_rejects_two_decisions_for_one_job() -> None:
    snap = snapshot([4], [job("a", 1)])
    with pytest.raises(PolicyError, match="two decisions"):
        check_decisions(snap, [Decision("a", 1, {"n0": 1}), Decision("a", 1, {"n0": 1})])


def test_check_rejects_a_second_guest_on_one_host() -> None:
    snap = snapshot([4], [job("h", 4, placement={"n0": 4}), job("g1", 2), job("g2", 2)])
    decisions = [Decision("g1", 2, {"n0": 2}, share_with="h"), Decision("g2", 2, {"n0": 2}, share_with="h")]
    with pytest.raises(PolicyError, match="more than one job"):
        check_decisions(snap, decisions)


def test_check_accepts_a_shrink_that_frees_room_for_a_start() -> None:
    snap = snapshot([4], [job("el", 2, low=2, high=4, placement={"n0": 4}), job("new", 2, submit=1)])
    check_decisions(snap, [Decision("new", 2, {"n0": 2}), Decision("el", 2, {"n0": 2})])
