"""The job's life beyond one allocation: the plan's rows for a requeue and a restart from a disk checkpoint, and the
agent applying them against a Slurm in memory, a coordinator view the test edits and fake worker steps."""

from __future__ import annotations

import dataclasses
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_amoeba.agent.agent import Agent
from slurm_amoeba.agent.config import AgentConfig
from slurm_amoeba.agent.entry import parent_alive, parent_started
from slurm_amoeba.agent.groups import GroupState, WorkerGroup, worker_ids
from slurm_amoeba.agent.lifecycle import ENDED_BY_SIGNAL, checkpoint_directory
from slurm_amoeba.agent.plan import (
    CoordinatorSeen,
    JobFailed,
    Limits,
    MainGroupEnded,
    Observation,
    Requeue,
    RestartFromCheckpoint,
    Stop,
    plan,
)
from slurm_amoeba.core.layout import AGENT_STATUS_FILE
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.runtime.failures import FailureClass
from slurm_amoeba.runtime.membership import Phase, WorkerStatus
from slurm_amoeba.slurm import JobState, StepRecord
from tests.unit.agent.fakes import PARENT, FakeClock, FakeCoordinator, FakeSlurm, FakeSteps

LIMITS = Limits(min_workers=2, workers_per_satellite=4)
MAIN = WorkerGroup("g0", False, worker_ids("g0", 2), PARENT, GroupState.RUNNING, 0.0, running_at=0.0)


def seen(phase: Phase = Phase.RUNNING, **fields: object) -> Observation:
    """An observation of a 2-worker job whose main group trains."""
    statuses = dict.fromkeys(MAIN.worker_ids, WorkerStatus.MEMBER if phase is Phase.RUNNING else WorkerStatus.DEAD)
    base = Observation(now=100.0, target=2, groups=[MAIN.copy()], coordinator=CoordinatorSeen(phase, statuses))
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


LOST = CoordinatorSeen(Phase.LOST, dict.fromkeys(MAIN.worker_ids, WorkerStatus.DEAD), lost_reason="every member died")
USER_ERROR = dataclasses.replace(LOST, failure=FailureClass.USER, lost_reason="ValueError on every member")


@pytest.mark.parametrize(
    ("observation", "expected"),
    [
        (seen(requeue_reason="signal SIGUSR1"), [Requeue("signal SIGUSR1")]),
        (seen(requeue_reason="signal SIGUSR1", stop_reason="signal SIGTERM"), [Stop("signal SIGTERM")]),
        (
            seen(coordinator=LOST, checkpoint_step=20, restarts_left=1),
            [RestartFromCheckpoint("every member died", 20)],
        ),
        (
            seen(main_step_status=137, checkpoint_step=20, restarts_left=3),
            [RestartFromCheckpoint("the main worker group ended with status 137", 20)],
        ),
        (seen(main_step_status=137, checkpoint_step=None, restarts_left=3), [MainGroupEnded(137)]),
        (seen(main_step_status=137, checkpoint_step=20, restarts_left=0), [MainGroupEnded(137)]),
        (seen(main_step_status=0, checkpoint_step=20, restarts_left=3), [MainGroupEnded(0)]),
        (
            seen(
                coordinator=CoordinatorSeen(Phase.FINISHED, dict.fromkeys(MAIN.worker_ids, WorkerStatus.DONE)),
                main_step_status=1,
                checkpoint_step=20,
                restarts_left=3,
            ),
            [MainGroupEnded(1)],
        ),
        (
            seen(coordinator=USER_ERROR, main_step_status=1, checkpoint_step=20, restarts_left=3),
            [JobFailed(FailureClass.USER, "ValueError on every member", None)],
        ),
    ],
    ids=[
        "usr1-requeues",
        "a-stop-wins-over-a-requeue",
        "lost-with-a-checkpoint-restarts",
        "main-group-killed-with-a-checkpoint-restarts",
        "no-checkpoint-ends-as-before",
        "no-restart-left-ends",
        "a-clean-exit-is-no-loss",
        "finished-training-is-no-loss",
        "a-user-error-ends-instead-of-restarting",
    ],
)
def test_the_plan_requeues_on_a_warning_and_restarts_a_lost_job_from_its_checkpoint(
    observation: Observation, expected: list[object]
) -> None:
    assert plan(observation, LIMITS) == expected


# ----------------------------------------------------------------------------------------------- the agent

Parts = tuple[Agent, FakeSlurm, FakeCoordinator, FakeSteps, FakeClock]


def make_agent(
    state_dir: Path, **config: object
) -> tuple[Agent, FakeSlurm, list[FakeCoordinator], FakeSteps, FakeClock]:
    """An agent of a 2:8 job with fake Slurm, steps and clock; every coordinator it makes is kept in a list."""
    settings = AgentConfig(
        job_id=str(PARENT),
        spec=ElasticSpec(2, 8, gpus_per_worker=1),
        command=("python", "train.py"),
        state_dir=state_dir,
        advertise_addr="10.0.0.1",
        **config,  # type: ignore[arg-type]
    )
    coordinators: list[FakeCoordinator] = []

    def new_coordinator() -> FakeCoordinator:
        coordinators.append(FakeCoordinator())
        return coordinators[-1]

    slurm, steps, clock = FakeSlurm(), FakeSteps(), FakeClock()
    agent = Agent(settings, slurm, step_starter=steps, clock=clock, new_coordinator=new_coordinator)
    return agent, slurm, coordinators, steps, clock


@pytest.fixture
def parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Parts]:
    """A started agent whose main group trains and whose satellite g1 (job 101) runs two more workers."""
    monkeypatch.setenv("SLURM_JOB_ID", str(PARENT))
    monkeypatch.delenv("AMOEBA_CHECKPOINT_DIR", raising=False)
    agent, slurm, coordinators, steps, clock = make_agent(tmp_path / "state")
    coordinator = coordinators[0]
    agent.start_main_group()
    coordinator.members("g0-0", "g0-1")
    agent.resize(4)
    agent.round()
    slurm.set_state(101, JobState.RUNNING)
    clock.advance(2)
    agent.round()
    coordinator.members("g1-0", "g1-1")
    yield agent, slurm, coordinator, steps, clock
    agent.shutdown()


def events(agent: Agent) -> list[str]:
    return [e["event"] for e in agent.journal.history]


def write_checkpoint_marker(directory: Path, step: int) -> None:
    """What a complete checkpoint of ``step`` looks like to the agent (it reads only names and the marker)."""
    path = directory / f"step-{step:09d}-ab12-g1"
    path.mkdir(parents=True)
    (path / "COMPLETE").write_text(str(step))


def test_usr1_asks_every_worker_to_leave_at_once_then_releases_the_satellites_and_requeues_the_job(
    parts: Parts,
) -> None:
    agent, slurm, coordinator, steps, _ = parts
    write_checkpoint_marker(agent.config.state_dir / "checkpoints", 37)
    agent._on_signal(signal.SIGUSR1, None)
    status = agent.round()
    assert status == ENDED_BY_SIGNAL
    # The satellite's workers through the coordinator, the main group by SIGTERM: one step boundary for all.
    assert coordinator.leave_requests == ["g1-0", "g1-1"]
    assert steps.started[0].signals == [signal.SIGTERM]
    assert slurm.cancelled == [101] and slurm.requeued == [PARENT]
    assert events(agent)[-4:] == ["requeue_requested", "checkpoint_saved", "satellite_released", "requeued"]
    assert agent.journal.history[-3]["step"] == 37
    written = json.loads((agent.config.state_dir / AGENT_STATUS_FILE).read_text())
    assert written["history"][-1]["event"] == "requeued", "the status says so before Slurm ends the agent"


def test_a_pending_satellite_is_released_at_once_when_the_job_requeues(parts: Parts) -> None:
    agent, slurm, coordinator, _, _ = parts
    agent.resize(6)
    agent.round()  # satellite 102 (g2) submitted, pending
    agent._on_signal(signal.SIGUSR1, None)
    agent.round()
    assert 102 in slurm.cancelled and coordinator.leave_requests == ["g1-0", "g1-1"]


def test_the_job_requeues_itself_at_most_max_requeues_times_counting_its_earlier_runs(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    earlier = [{"t": 1.0, "event": "started"}, {"t": 2.0, "event": "requeued"}, {"t": 3.0, "event": "requeued"}]
    (state / AGENT_STATUS_FILE).write_text(json.dumps({"job_id": str(PARENT), "history": earlier}))
    agent, slurm, _, _, _ = make_agent(state, max_requeues=2)
    try:
        agent.life.resume({"SLURM_RESTART_COUNT": "2"})
        assert agent.life.requeues == 2
        assert events(agent) == ["started", "requeued", "requeued", "resumed"]
        agent.start_main_group()
        agent._on_signal(signal.SIGUSR1, None)
        assert agent.round() == ENDED_BY_SIGNAL
        assert slurm.requeued == [] and events(agent)[-1] == "requeue_refused"
        assert "max_requeues=2" in agent.journal.history[-1]["reason"]
    finally:
        agent.shutdown()


def test_a_run_after_one_that_ended_without_a_word_says_slurm_restarted_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    earlier = [{"t": 1.0, "event": "started"}, {"t": 2.0, "event": "generation"}]
    (state / AGENT_STATUS_FILE).write_text(json.dumps({"job_id": str(PARENT), "history": earlier}))
    agent, _, _, _, _ = make_agent(state)
    agent.life.resume({"SLURM_RESTART_COUNT": "1"})
    assert agent.life.requeues == 0
    assert events(agent) == ["started", "generation", "restarted_by_slurm"]
    assert agent.journal.history[-1]["previous_last_event"] == "generation"
    agent.shutdown()


def test_the_executor_hook_may_refuse_a_requeue_and_a_refused_scontrol_is_recorded(parts: Parts) -> None:
    agent, slurm, _, _, _ = parts
    agent.life.before_requeue = lambda: "checkpoint function returned None"
    agent._on_signal(signal.SIGUSR1, None)
    assert agent.round() == ENDED_BY_SIGNAL
    assert slurm.requeued == [] and agent.journal.history[-1] == {
        "t": agent.journal.history[-1]["t"],
        "event": "requeue_refused",
        "reason": "checkpoint function returned None",
    }


def test_a_requeue_slurm_refuses_ends_the_job_with_the_error_in_its_history(parts: Parts) -> None:
    agent, slurm, _, _, _ = parts
    slurm.refuse_requeue = True
    agent._on_signal(signal.SIGUSR1, None)
    assert agent.round() == ENDED_BY_SIGNAL
    assert events(agent)[-2:] == ["requeued", "requeue_failed"] and "not allowed" in agent.journal.history[-1]["error"]


def test_a_job_that_lost_every_worker_restarts_from_its_checkpoint_with_a_fresh_coordinator(parts: Parts) -> None:
    agent, slurm, coordinator, steps, clock = parts
    write_checkpoint_marker(agent.config.state_dir / "checkpoints", 20)
    steps.started[0].status = 137  # every main worker SIGKILLed: srun ends
    coordinator.statuses.update(dict.fromkeys(["g0-0", "g0-1", "g1-0", "g1-1"], WorkerStatus.DEAD))
    assert agent.round() is None, "the job goes on"
    assert coordinator.closed and agent.coordinator is not coordinator and agent.coordinator.started  # type: ignore[attr-defined]
    assert slurm.cancelled == [101]
    assert len(steps.started) == 2 and str(steps.started[1].options.output).endswith("worker-g0-run2-%t.log")
    assert [g.name for g in agent.groups] == ["g0", "g1"] and agent.groups[1].state is GroupState.ENDED
    assert agent.target == 2 and agent.life.restarts == 1
    assert events(agent)[-3:] == ["restarting", "satellite_released", "group_started"]
    restarting = agent.journal.history[-3]
    assert (restarting["event"], restarting["step"], restarting["restart"]) == ("restarting", 20, 1)
    # A later grow gets a new group name: the released satellite's files stay its own.
    agent.resize(4)
    clock.advance(2)
    agent.round()
    assert agent.groups[-1].name == "g2"


def test_restarts_are_bounded_per_allocation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AMOEBA_CHECKPOINT_DIR", raising=False)
    agent, _, coordinators, steps, clock = make_agent(tmp_path / "state", max_restarts=1)
    write_checkpoint_marker(tmp_path / "state" / "checkpoints", 5)
    try:
        agent.start_main_group()
        steps.started[-1].status = 137
        assert agent.round() is None and agent.life.restarts == 1
        clock.advance(2)
        steps.started[-1].status = 137
        assert agent.round() == 137, "no restart left: the job ends with the main group's status"
        assert len(coordinators) == 2
    finally:
        agent.shutdown()


def test_workers_checkpoint_under_the_state_dir_unless_told_otherwise(tmp_path: Path) -> None:
    assert checkpoint_directory({}, tmp_path) == tmp_path / "checkpoints"
    assert checkpoint_directory({"AMOEBA_CHECKPOINT_DIR": "/shared/ck"}, tmp_path) == Path("/shared/ck")
    assert checkpoint_directory({"AMOEBA_CHECKPOINT_DIR": "none"}, tmp_path) is None


def test_the_main_group_gets_the_default_checkpoint_directory(parts: Parts) -> None:
    agent, _, _, steps, _ = parts
    assert steps.started[0].env["AMOEBA_CHECKPOINT_DIR"] == str(agent.config.state_dir / "checkpoints")


def test_a_satellite_sees_its_parent_gone_once_the_parent_is_requeued_or_runs_again() -> None:
    slurm = FakeSlurm()
    started = parent_started(slurm, PARENT)
    assert started == 2 and parent_alive(slurm, PARENT, started)
    slurm.set_state(PARENT, JobState.PENDING, "BeginTime")  # requeued: its next run has a new agent and store
    assert not parent_alive(slurm, PARENT, started)
    slurm.records[PARENT] = dataclasses.replace(slurm.records[PARENT], state=JobState.RUNNING, start_time=500)
    assert not parent_alive(slurm, PARENT, started), "running again, from a later start"
    slurm.down = True
    assert parent_alive(slurm, PARENT, started), "a failed poll never kills"


def test_the_loop_goes_on_after_a_restart_until_the_new_main_group_ends(parts: Parts) -> None:
    agent, _, coordinator, steps, _ = parts
    write_checkpoint_marker(agent.config.state_dir / "checkpoints", 20)
    steps.started[0].status = 137
    coordinator.statuses.update(dict.fromkeys(["g0-0", "g0-1"], WorkerStatus.DEAD))
    finished_at_once = FakeSteps()

    def start(*args: Any, **kwargs: Any) -> Any:
        step = finished_at_once(*args, **kwargs)
        step.status = 0  # the restarted group trains to the end
        return step

    agent._start_step = start
    assert agent._loop() == 0
    assert [e for e in events(agent) if e in ("restarting", "main_group_ended")] == ["restarting", "main_group_ended"]


def test_the_main_groups_tasks_are_told_to_leave_through_slurm_not_through_srun(parts: Parts) -> None:
    agent, slurm, _, steps, _ = parts
    slurm.step_list.append(StepRecord(PARENT + 1, "0", "amoeba-workers-g0", ("n1",)))
    main = steps.started[0]

    cancel = slurm.cancel

    def leave_when_told(job_id: int, *, step: int | None = None, signal: str | None = None, full: bool = False) -> None:
        cancel(job_id, step=step, signal=signal, full=full)
        if signal == "TERM":
            main.status = 0  # the workers left at a step boundary: srun ends on its own

    slurm.cancel = leave_when_told  # type: ignore[method-assign]
    agent._on_signal(signal.SIGUSR1, None)
    agent.round()
    # SIGTERM to srun would end the step at once ("forcing job termination"): the tasks get it from Slurm.
    assert slurm.signalled == [(PARENT + 1, 0, "TERM")] and main.signals == []
    saved = next(e for e in agent.journal.history if e["event"] in ("checkpoint_saved", "no_checkpoint"))
    assert saved["workers_status"] == 0


def test_a_first_run_sets_an_earlier_jobs_checkpoints_aside_and_carries_no_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AMOEBA_CHECKPOINT_DIR", raising=False)
    state = tmp_path / "state"
    write_checkpoint_marker(state / "checkpoints", 90)  # an earlier job 42's, before Slurm's ids started again
    (state / AGENT_STATUS_FILE).write_text(json.dumps({"job_id": str(PARENT), "history": [{"t": 1, "event": "x"}]}))
    agent, _, _, _, _ = make_agent(state)
    agent.life.resume({})
    assert agent.life.requeues == 0 and events(agent) == []
    assert not (state / "checkpoints").exists() and len(list(state.glob("checkpoints.earlier-*"))) == 1
    agent.shutdown()


def test_a_scontrol_that_slurm_ends_while_requeueing_is_a_requeue_taken(parts: Parts) -> None:
    agent, slurm, _, _, _ = parts
    slurm.requeue_ends_scontrol = True  # measured: scontrol requeue of the job it runs in exits with -15
    agent._on_signal(signal.SIGUSR1, None)
    assert agent.round() == ENDED_BY_SIGNAL
    assert slurm.requeued == [PARENT] and events(agent)[-1] == "requeued"
