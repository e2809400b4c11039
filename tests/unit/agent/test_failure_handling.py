"""The agent acting on failure classes: a failure a retry repeats ends the job at once with the traceback in its
output and the class in its history; a satellite lost to its node is replaced on another node."""

from __future__ import annotations

import dataclasses

import pytest

from slurm_amoeba.runtime.failures import ErrorReport, FailureClass
from slurm_amoeba.runtime.membership import Phase, WorkerStatus
from slurm_amoeba.runtime.view import CoordinatorView
from slurm_amoeba.slurm import JobState
from tests.unit.agent import test_agent
from tests.unit.agent.fakes import FakeCoordinator
from tests.unit.agent.test_agent import Parts

parts = test_agent.parts  # the fixture: a started agent of a 2:8 job whose main group runs, on fakes

TRACEBACK = 'Traceback (most recent call last):\n  File "train.py", line 20, in step\nValueError: bad label 11\n'


@dataclasses.dataclass
class FailingCoordinator(FakeCoordinator):
    """A fake coordinator whose view also carries error reports and the failure that ended the job."""

    errors: tuple[ErrorReport, ...] = ()
    failure: FailureClass | None = None
    lost_reason: str = ""

    def view(self) -> CoordinatorView:
        view = super().view()
        return dataclasses.replace(view, errors=self.errors, failure=self.failure, lost_reason=self.lost_reason)


@pytest.fixture
def failing(parts: Parts) -> FailingCoordinator:
    """``parts``' agent (tests/unit/agent/test_agent.py) with a coordinator whose view carries errors and failures."""
    agent, _, coordinator, _, _ = parts
    agent.coordinator = replacement = FailingCoordinator(statuses=coordinator.statuses)
    return replacement


def test_a_user_error_on_every_member_ends_the_job_with_the_traceback_in_its_output_and_the_class_in_history(
    parts: Parts, failing: FailingCoordinator, capsys: pytest.CaptureFixture[str]
) -> None:
    agent, slurm, _, steps, _ = parts
    coordinator = failing
    agent.resize(4)
    agent.round()
    slurm.set_state(101, JobState.RUNNING)
    coordinator.members("g1-0", "g1-1")
    agent.round()
    reports = tuple(
        ErrorReport(w, 1, 20, FailureClass.USER, "ValueError", "user error: ValueError: bad label 11", TRACEBACK)
        for w in ("g0-0", "g0-1", "g1-0", "g1-1")
    )
    coordinator.statuses.update(dict.fromkeys(coordinator.statuses, WorkerStatus.FAILED))
    coordinator.phase, coordinator.errors, coordinator.failure = Phase.LOST, reports, FailureClass.USER
    coordinator.lost_reason = "user error: every member raised ValueError at step 20"
    status = agent.round()
    assert status is not None and status != 0
    out = capsys.readouterr().out
    assert "the job failed (user error, not retried): user error: every member raised ValueError at step 20" in out
    assert TRACEBACK.rstrip() in out and "g0-0 at step 20" in out
    (event,) = [e for e in agent.journal.history if e["event"] == "job_failed"]
    assert event["failure"] == "user" and event["error"] == "ValueError" and event["step"] == 20
    assert steps.started[0].signals  # the main step was stopped
    agent.shutdown()
    assert slurm.cancelled == [101]  # no satellite left


def test_a_satellite_whose_node_failed_is_replaced_by_one_that_excludes_the_node(
    parts: Parts, failing: FailingCoordinator
) -> None:
    agent, slurm, _, _, clock = parts
    coordinator = failing
    agent.resize(4)
    agent.round()
    slurm.records[101] = dataclasses.replace(slurm.records[101], state=JobState.RUNNING, nodes=("n4",))
    coordinator.members("g1-0", "g1-1")
    clock.advance(2)
    agent.round()
    slurm.set_state(101, JobState.NODE_FAIL)
    clock.advance(2)
    agent.round()
    assert slurm.cancelled == [101] and agent.target == 4
    assert "#SBATCH --exclude=n4" in slurm.submissions[-1].script
    released = [e for e in agent.journal.history if e["event"] == "satellite_released"]
    assert released[-1]["failure"] == "infrastructure" and released[-1]["reason"] == "satellite node_fail"
