"""The agent acting on failure classes: a failure a retry repeats ends the job at once with the traceback in its
output and the class in its history; a satellite lost to its node is replaced on another node."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_amoeba.agent.agent import Agent
from slurm_amoeba.agent.config import AgentConfig
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.runtime.coordinator import CoordinatorView
from slurm_amoeba.runtime.failures import ErrorReport, FailureClass
from slurm_amoeba.runtime.membership import Phase, WorkerStatus
from slurm_amoeba.slurm import JobState
from tests.unit.agent.fakes import PARENT, FakeClock, FakeCoordinator, FakeSlurm, FakeSteps

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


Parts = tuple[Agent, FakeSlurm, FailingCoordinator, FakeSteps, FakeClock]


@pytest.fixture
def parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Parts]:
    """A started agent of a 2:8 job (one GPU per worker; nodes of 4 GPUs) whose main group runs."""
    monkeypatch.setenv("SLURM_JOB_ID", str(PARENT))
    monkeypatch.setenv("SLURM_HET_SIZE", "2")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    config = AgentConfig(
        job_id=str(PARENT),
        spec=ElasticSpec(2, 8, gpus_per_worker=1),
        command=("python", "train.py"),
        state_dir=tmp_path / "state",
        advertise_addr="10.0.0.1",
    )
    slurm, coordinator, steps, clock = FakeSlurm(), FailingCoordinator(), FakeSteps(), FakeClock()
    agent = Agent(config, slurm, coordinator=coordinator, step_starter=steps, clock=clock)
    agent.start_main_group()
    coordinator.members("g0-0", "g0-1")
    yield agent, slurm, coordinator, steps, clock
    agent.shutdown()


def test_a_user_error_on_every_member_ends_the_job_with_the_traceback_in_its_output_and_the_class_in_history(
    parts: Parts, capsys: pytest.CaptureFixture[str]
) -> None:
    agent, slurm, coordinator, steps, _ = parts
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


def test_a_satellite_whose_node_failed_is_replaced_by_one_that_excludes_the_node(parts: Parts) -> None:
    agent, slurm, coordinator, _, clock = parts
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
