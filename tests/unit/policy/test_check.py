"""check_actions rejects each kind of broken invariant with a message naming the job."""

from __future__ import annotations

import dataclasses

import pytest

import slurm_amoeba.policy.actions as act
from slurm_amoeba.policy import PolicyError, Snapshot, check_actions

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
        (act.Start("ghost", 1), "not in the snapshot"),
        (act.Resize("fixed", 3, {"n0": 3}), "not elastic"),
        (act.Resize("el", 1, {"n0": 1}), "outside its range"),
        (act.Resize("el", 9, {"n0": 4, "n1": 5}), "outside its range"),
        (act.Resize("el", 6, {"n0": 4, "n1": 2}), "node n0 would hold"),
        (act.Resize("el", 5, {"n1": 4}), "holds 4 workers"),
        (act.Resize("el", 5, {"nx": 5}), "node 'nx'"),
        (act.Resize("wait", 2), "only for a running job"),
        (act.Preempt("wait"), "only for a running job"),
        (act.Start("el", 4), "only for a pending job"),
        (act.Place("el", {"n1": 3}), "keeps the job's 4 workers"),
        (act.Share("wait", "nobody", 2, {"n1": 2}), "does not run"),
        (act.Move("el", "n9", 1, "wait"), "where it runs no worker"),
        (act.Move("el", "n0", 3, "wait"), "a move of 3 workers off node n0"),
        (act.Move("el", "n0", 1, "ghost"), "for job 'ghost'"),
        (act.Hold("el"), "only for a pending job"),
        (act.Release("fixed"), "only for a pending job"),
        (act.SetPriority("el", 10), "only for a pending job"),
    ],
)
def test_check_rejects(action: act.Action, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        check_actions(_cluster(), [action])


def test_check_rejects_two_size_actions_for_one_job() -> None:
    snap = snapshot([4], [job("a", 1)])
    with pytest.raises(PolicyError, match="two actions change the size"):
        check_actions(snap, [act.Start("a", 1, {"n0": 1}), act.Start("a", 1, {"n0": 1})])


def test_check_rejects_a_move_and_a_resize_of_one_job() -> None:
    snap = snapshot([4, 4], [job("e", 1, low=1, high=4, placement={"n0": 2}), job("w", 1)])
    with pytest.raises(PolicyError, match="two actions change the size"):
        check_actions(snap, [act.Move("e", "n0", 1, "w"), act.Resize("e", 1)])


def test_check_rejects_holding_and_releasing_one_job() -> None:
    snap = snapshot([4], [job("w", 1)])
    with pytest.raises(PolicyError, match="both held and released"):
        check_actions(snap, [act.Hold("w"), act.Release("w")])


def test_check_accepts_a_hold_and_a_priority_beside_a_start_of_another_job() -> None:
    snap = snapshot([4], [job("w", 1), job("x", 1, submit=1)])
    check_actions(snap, [act.Hold("w"), act.SetPriority("w", 5), act.Start("x", 1)])


def test_check_rejects_a_move_with_no_room_left_elsewhere() -> None:
    snap = snapshot([4, 4], [job("e", 1, low=1, high=8, placement={"n0": 4, "n1": 4}), job("w", 4)])
    with pytest.raises(PolicyError, match="without a placement"):
        check_actions(snap, [act.Move("e", "n0", 4, "w"), act.Start("w", 4, {"n0": 4})])


def test_check_rejects_a_second_guest_on_one_host() -> None:
    snap = snapshot([4], [job("h", 4, placement={"n0": 4}), job("g1", 2), job("g2", 2)])
    actions = [act.Share("g1", "h", 2, {"n0": 2}), act.Share("g2", "h", 2, {"n0": 2})]
    with pytest.raises(PolicyError, match="more than one job"):
        check_actions(snap, actions)


def test_check_accepts_a_shrink_that_frees_room_for_a_start() -> None:
    snap = snapshot([4], [job("el", 2, low=2, high=4, placement={"n0": 4}), job("new", 2, submit=1)])
    check_actions(snap, [act.Start("new", 2, {"n0": 2}), act.Resize("el", 2, {"n0": 2})])


def test_a_job_left_to_slurm_may_get_a_priority_but_nothing_else() -> None:
    young = job("young", 4, submit=9)
    snap = dataclasses.replace(_cluster(), left_to_slurm=(young,))
    check_actions(snap, [act.SetPriority("young", 7)])
    with pytest.raises(PolicyError, match="'young', which is not in the snapshot"):
        check_actions(snap, [act.Start("young", 4)])
    with pytest.raises(PolicyError, match="'young', which is not in the snapshot"):
        check_actions(snap, [act.Hold("young")])
