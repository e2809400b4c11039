"""One worker's stage on ending its generation: the transitions of runtime.worker.Switch, by table."""

from __future__ import annotations

import pytest

from slurm_amoeba.runtime.worker import Switch, SwitchStage

RUNNING, WANTED, IN_STEP, AGREED = (
    SwitchStage.RUNNING,
    SwitchStage.WANTED,
    SwitchStage.AGREED_IN_STEP,
    SwitchStage.AGREED,
)


def run(calls: list[tuple[str, object]]) -> Switch:
    switch = Switch()
    switch.begin(3)
    for name, arg in calls:
        method = getattr(switch, name)
        method() if arg is None else method(arg)
    return switch


@pytest.mark.parametrize(
    ("calls", "stage"),
    [
        pytest.param([], RUNNING, id="a_new_generation_runs"),
        pytest.param([("see_want", 3)], WANTED, id="the_coordinators_wish_for_this_generation_is_wanted"),
        pytest.param([("see_want", 2)], RUNNING, id="a_wish_for_an_earlier_generation_is_ignored"),
        pytest.param([("reduced", True)], IN_STEP, id="a_reduce_that_sums_a_wish_agrees_within_the_step"),
        pytest.param([("see_want", 3), ("reduced", False)], WANTED, id="a_reduce_that_missed_the_wish_keeps_it"),
        pytest.param([("reduced", True), ("end_step", None)], AGREED, id="the_agreement_holds_once_the_step_ended"),
        pytest.param([("end_step", None)], RUNNING, id="a_step_without_agreement_changes_nothing"),
        pytest.param([("reduced", True), ("reduced", False)], IN_STEP, id="an_agreement_is_not_taken_back"),
        pytest.param(
            [("reduced", True), ("end_step", None), ("see_want", 3)], AGREED, id="a_late_wish_leaves_the_agreement"
        ),
        pytest.param([("reduced", True), ("end_step", None), ("begin", 4)], RUNNING, id="a_new_generation_forgets"),
        pytest.param([("begin", 4), ("see_want", 3)], RUNNING, id="the_heartbeats_read_of_the_old_generation_is_late"),
    ],
)
def test_the_switch_moves_as_its_transitions_say(calls: list[tuple[str, object]], stage: SwitchStage) -> None:
    assert run(calls).stage is stage


def test_only_an_agreement_made_in_an_ended_step_ends_the_generation_and_every_stage_but_running_asks() -> None:
    switch = run([("see_want", 3)])
    assert switch.asks() and switch.knows_want(3) and not switch.knows_want(4) and not switch.agreed()
    switch.reduced(True)
    assert not switch.agreed()
    switch.end_step()
    assert switch.agreed() and switch.asks()
    assert not run([]).asks() and not run([]).knows_want(3)
