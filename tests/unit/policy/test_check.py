"""check_actions rejects each kind of broken invariant with a message naming the job."""

from __future__ import annotations

import pytest

from slurm_amoeba.policy import (
    Action,
    Hold,
    Move,
    Place,
    PolicyError,
    Preempt,
    Release,
    Resize,
    SetPriority,
    Share,
    Snapshot,
    Start,
    check_actions,
)

from .helpers import job, snapshot


def _cluster() -> Snapshot:
    return snapshot(
        [4, 4],
        [
            job("fixed", 2, placement={"n0": 2}),
            job("el", 2, low=2, high=8, placement={"n0": 2, "n1": 2}),
            job("wait", 2, submit=3),
        ],
    )


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (Start("ghost", 1), "not in the snapshot"),
        (Resize("fixed", 3, {"n0": 3}), "not elastic"),
        (Resize("el", 1, {"n0": 1}), "outside its range"),
        (Resize("el", 9, {"n0": 4, "n1": 5}), "outside its range"),
        (Resize("el", 6, {"n0": 4, "n1": 2}), "node n0 would hold"),
        (Resize("el", 5, {"n1": 4}), "holds 4 workers"),
        (Resize("el", 5, {"nx": 5}), "node 'nx'"),
        (Resize("wait", 2), "only for a running job"),
        (Preempt("wait"), "only for a running job"),
        (Start("el", 4), "only for a pending job"),
        (Place("el", {"n1": 3}), "keeps the job's 4 workers"),
        (Share("wait", "nobody", 2, {"n1": 2}), "does not run"),
        (Move("el", "n9", 1, "wait"), "where it runs no worker"),
        (Move("el", "n0", 3, "wait"), "a move of 3 workers off node n0"),
        (Move("el", "n0", 1, "ghost"), "for job 'ghost'"),
        (Hold("el"), "only for a pending job"),
        (Release("fixed"), "only for a pending job"),
        (SetPriority("el", 10), "only for a pending job"),
    ],
)
def test_check_rejects(action: Action, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        check_actions(_cluster(), [action])


def test_check_rejects_two_size_actions_for_one_job() -> None:
    snap = snapshot([4], [job("a", 1)])
    with pytest.raises(PolicyError, match="two actions change the size"):
        check_actions(snap, [Start("a", 1, {"n0": 1}), Start("a", 1, {"n0": 1})])


def test_check_rejects_a_move_and_a_resize_of_one_job() -> None:
    snap = snapshot([4, 4], [job("e", 1, low=1, high=4, placement={"n0": 2}), job("w", 1)])
    with pytest.raises(PolicyError, match="two actions change the size"):
        check_actions(snap, [Move("e", "n0", 1, "w"), Resize("e", 1)])


def test_check_rejects_holding_and_releasing_one_job() -> None:
    snap = snapshot([4], [job("w", 1)])
    with pytest.raises(PolicyError, match="both held and released"):
        check_actions(snap, [Hold("w"), Release("w")])


def test_check_accepts_a_hold_and_a_priority_beside_a_start_of_another_job() -> None:
    snap = snapshot([4], [job("w", 1), job("x", 1, submit=1)])
    check_actions(snap, [Hold("w"), SetPriority("w", 5), Start("x", 1)])


def test_check_rejects_a_move_with_no_room_left_elsewhere() -> None:
    snap = snapshot([4, 4], [job("e", 1, low=1, high=8, placement={"n0": 4, "n1": 4}), job("w", 4)])
    with pytest.raises(PolicyError, match="without a placement"):
        check_actions(snap, [Move("e", "n0", 4, "w"), Start("w", 4, {"n0": 4})])


def test_check_rejects_a_second_guest_on_one_host() -> None:
    snap = snapshot([4], [job("h", 4, placement={"n0": 4}), job("g1", 2), job("g2", 2)])
    actions = [Share("g1", "h", 2, {"n0": 2}), Share("g2", "h", 2, {"n0": 2})]
    with pytest.raises(PolicyError, match="more than one job"):
        check_actions(snap, actions)


def test_check_accepts_a_shrink_that_frees_room_for_a_start() -> None:
    snap = snapshot([4], [job("el", 2, low=2, high=4, placement={"n0": 4}), job("new", 2, submit=1)])
    check_actions(snap, [Start("new", 2, {"n0": 2}), Resize("el", 2, {"n0": 2})])
