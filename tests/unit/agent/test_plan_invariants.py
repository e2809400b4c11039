"""Invariants of the agent's plan over random rounds: whatever the job looks like, a round's actions keep its promises.

A round is drawn as the agent could see it: a main group of the job's minimum, up to four satellites in any state
with any workers asked to leave, any worker statuses, any phase, Slurm polled or not with any satellite states.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_amoeba.agent.groups import GroupState, WorkerGroup, planned_size, worker_ids
from slurm_amoeba.agent.plan import (
    ENDING_ACTIONS,
    AskToLeave,
    CoordinatorSeen,
    Limits,
    LowerTarget,
    Observation,
    SubmitSatellite,
    plan,
)
from slurm_amoeba.runtime.membership import Phase, WorkerStatus
from slurm_amoeba.slurm import JobRecord, JobState
from tests.unit.agent.fakes import next_round, squeue

NOW = 1_000.0


@st.composite
def rounds(draw: st.DrawFn) -> tuple[Observation, Limits]:
    minimum = draw(st.integers(1, 3))
    groups = [WorkerGroup("g0", False, worker_ids("g0", minimum), 42, GroupState.RUNNING, 0.0, running_at=0.0)]
    for index in range(1, draw(st.integers(0, 4)) + 1):
        name = f"g{index}"
        state = draw(st.sampled_from(GroupState))
        workers = worker_ids(name, draw(st.integers(1, 4)))
        leaving = set(workers) if state is GroupState.LEAVING else draw(st.sets(st.sampled_from(workers)))
        running_at = None if state is GroupState.PENDING else float(index)
        groups.append(WorkerGroup(name, True, workers, 100 + index, state, float(index), running_at, leaving=leaving))
    statuses: dict[str, WorkerStatus] = {}
    for group in groups:
        if group.state is not GroupState.PENDING:
            for worker in group.worker_ids:
                status = draw(st.none() | st.sampled_from(WorkerStatus))
                if status is not None:
                    statuses[worker] = status
    satellites: dict[int, JobRecord] | None = None
    if draw(st.booleans()):
        satellites = {}
        for group in groups[1:]:
            state = draw(st.none() | st.sampled_from(JobState))
            if state is not None:
                satellites[group.slurm_job] = squeue(
                    group.slurm_job, state, draw(st.sampled_from(["None", "Preempted"]))
                )
    phase = draw(st.sampled_from(Phase))
    over_since = NOW - draw(st.floats(0, 100)) if phase.is_over() else None
    target = draw(st.integers(minimum, minimum + 8))
    observation = Observation(NOW, target, groups, CoordinatorSeen(phase, statuses), satellites, over_since)
    return observation, Limits(minimum, draw(st.integers(1, 4)))


@settings(max_examples=400, deadline=None)
@given(rounds())
def test_a_round_keeps_the_jobs_promises(drawn: tuple[Observation, Limits]) -> None:
    observation, limits = drawn
    actions = plan(observation, limits)
    ending = [i for i, a in enumerate(actions) if isinstance(a, ENDING_ACTIONS)]
    assert ending in ([], [len(actions) - 1]), "an ending action is the last one"
    assert all(getattr(a, "group", None) != "g0" for a in actions), "the main group is never resized"
    for action in actions:
        if isinstance(action, SubmitSatellite):
            assert 1 <= action.workers <= limits.workers_per_satellite
        if isinstance(action, LowerTarget):
            assert limits.min_workers <= action.target < action.previous
    # A worker that finished means training ends at that step on every member (the coordinator may not say so yet).
    finishing = any(s is WorkerStatus.DONE for s in observation.coordinator.workers.values())
    if observation.coordinator.phase.is_over() or finishing:
        assert not [a for a in actions if isinstance(a, SubmitSatellite | AskToLeave)], "no resize after the end"
    after = next_round(observation, actions)
    if not ending and not observation.coordinator.phase.is_over() and not finishing:
        assert planned_size(after.groups) == after.target, "a round reaches its target"
    if not ending:
        assert plan(after, limits) == [], "an applied plan is not planned again"
