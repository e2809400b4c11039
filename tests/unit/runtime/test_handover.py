"""A preempted worker that is the only holder of the state hands it to a warm joiner before it leaves: the job goes
on exactly once with the fixed-size run's parameters, instead of being lost (found by the chaos runs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.runtime.conftest import ReferenceRun
from tests.unit.runtime.jobs import NEVER, ToyJob, final_params
from tests.unit.runtime.test_elastic_job import assert_exactly_once, assert_same_params


@pytest.mark.timeout(120)
def test_sigterm_of_the_only_member_while_a_joiner_is_warm_hands_the_state_over(
    tmp_path: Path, fixed_run: ReferenceRun
) -> None:
    out = tmp_path / "job"
    with ToyJob(out, workers=1, hold=True) as toy:
        job = toy.job
        toy.release(6)
        view = toy.wait_members(1)
        toy.wait_held(6)
        assert view.plan is not None
        (only,) = view.plan.members
        job.terminate(only)  # held between steps: the SIGTERM and the admission meet at the same boundary
        (joiner,) = job.add(1)
        toy.wait_ready([joiner])
        toy.release(NEVER)
        result = toy.finish()
    assert result.phase.value == "finished", result
    plans = [r.plan for r in result.view.history]
    assert [p.members for p in plans] == [(only,), (only, joiner), (joiner,)]
    assert "hands the state over" in plans[1].reason and plans[1].source == only
    assert json.loads((out / f"result-{only}.json").read_text())["status"] == "left"
    assert_exactly_once(out, result.view.history)
    assert_same_params(fixed_run, final_params(out), expected_workers=1)
