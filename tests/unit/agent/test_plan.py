"""The agent's decisions by tables: each row is one round's observation and the actions the plan must return.

The job in every row has the main group ``g0`` (2 workers, the job's minimum, Slurm job 42) and satellites ``g1``,
``g2``, ... (Slurm jobs 101, 102, ...). Rows name what they check as sentences.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from slurm_amoeba.agent.groups import GroupState, WorkerGroup, planned_size, worker_ids
from slurm_amoeba.agent.plan import (
    ENDING_ACTIONS,
    Action,
    AskToLeave,
    CoordinatorSeen,
    JobFailed,
    Limits,
    LowerTarget,
    MainGroupEnded,
    NodeFailing,
    Observation,
    PlaceBeside,
    ReleaseSatellite,
    RetireGroup,
    SatelliteStarted,
    Stop,
    StopMainStep,
    SubmitSatellite,
    WorkerLost,
    final_releases,
    new_satellite_group,
    plan,
    record,
    workers_per_satellite,
)
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.runtime.failures import ErrorReport, FailureClass
from slurm_amoeba.runtime.membership import Phase, WorkerStatus
from slurm_amoeba.slurm import JobRecord, JobState
from tests.unit.agent.fakes import next_round, squeue

NOW = 1_000.0
LIMITS = Limits(min_workers=2, workers_per_satellite=4)
MEMBER, LEFT, DONE, DEAD, FAILED, READY = (
    WorkerStatus.MEMBER,
    WorkerStatus.LEFT,
    WorkerStatus.DONE,
    WorkerStatus.DEAD,
    WorkerStatus.FAILED,
    WorkerStatus.READY,
)
USER, RESOURCE, INFRA = FailureClass.USER, FailureClass.RESOURCE, FailureClass.INFRASTRUCTURE


def main_group() -> WorkerGroup:
    return WorkerGroup("g0", False, worker_ids("g0", 2), 42, GroupState.RUNNING, 0.0, running_at=0.0)


def sat(
    name: str,
    workers: int,
    state: GroupState = GroupState.RUNNING,
    *,
    leaving: Sequence[str] = (),
    nodes: Sequence[str] = (),
    failure: FailureClass | None = None,
) -> WorkerGroup:
    """Satellite group ``gN`` (Slurm job 100 + N), requested at N seconds; a running one runs since then."""
    index = int(name[1:])
    running = state is not GroupState.PENDING
    return WorkerGroup(
        name,
        True,
        worker_ids(name, workers),
        100 + index,
        state,
        float(index),
        running_at=float(index) if running else None,
        leaving=set(leaving),
        nodes=tuple(nodes),
        failure=failure,
    )


def members(*groups: WorkerGroup) -> dict[str, WorkerStatus]:
    """Every worker of these groups is a member."""
    return {w: MEMBER for g in groups for w in g.worker_ids}


def seen(
    groups: Sequence[WorkerGroup],
    target: int,
    workers: dict[str, WorkerStatus] | None = None,
    *,
    phase: Phase = Phase.RUNNING,
    satellites: dict[int, JobRecord] | None = None,
    over_since: float | None = None,
    main_status: int | None = None,
    stop: str = "",
    errors: Sequence[ErrorReport] = (),
    failure: FailureClass | None = None,
    lost_reason: str = "",
) -> Observation:
    """An observation; by default every worker of every running group is a member."""
    if workers is None:
        workers = members(*[g for g in groups if g.state is not GroupState.PENDING])
    return Observation(
        now=NOW,
        target=target,
        groups=list(groups),
        coordinator=CoordinatorSeen(phase, workers, tuple(errors), failure, lost_reason),
        satellites=satellites,
        training_over_since=over_since,
        main_step_status=main_status,
        stop_reason=stop,
    )


def release(group: str, reason: str, *dead: str, failure: FailureClass | None = None) -> ReleaseSatellite:
    return ReleaseSatellite(group, 100 + int(group[1:]), reason, tuple(dead), NOW, failure)


def error(worker: str, failure: FailureClass = USER, gen: int = 3, step: int = 20) -> ErrorReport:
    return ErrorReport(worker, gen, step, failure, "ValueError", "user error: ValueError: bad", "Traceback ...")


G0 = main_group()
G1, G2 = sat("g1", 2), sat("g2", 2)
G1_PENDING = sat("g1", 2, GroupState.PENDING)

# (id, observation, limits, expected actions); kept as a table by hand
# fmt: off
ROWS: list[tuple[str, Observation, Limits, list[Action]]] = [
    # --- the end
    ("a signal stops the job before anything else", seen([G0], 4, stop="signal SIGTERM"), LIMITS,
     [Stop("signal SIGTERM")]),
    ("a signal wins over the main group's end", seen([G0], 2, stop="signal SIGINT", main_status=1), LIMITS,
     [Stop("signal SIGINT")]),
    ("the main group's end ends the job with its status", seen([G0, G1], 8, main_status=0), LIMITS,
     [MainGroupEnded(0)]),
    ("a failed main group ends the job with its failure", seen([G0], 2, main_status=137), LIMITS,
     [MainGroupEnded(137)]),
    ("a user error the coordinator ended the job on ends it at once, with the error behind it",
     seen([G0, G1], 4, {w: FAILED for w in ["g0-0", "g0-1", "g1-0", "g1-1"]}, phase=Phase.LOST, failure=USER,
          lost_reason="user error: every member raised ValueError at step 20", main_status=1,
          errors=[error("g0-0", INFRA, gen=1), error("g0-1"), error("g0-0"), error("g1-0"), error("g1-1")]),
     LIMITS, [JobFailed(USER, "user error: every member raised ValueError at step 20", error("g0-1"))]),
    ("a signal wins over a failure", seen([G0], 2, stop="signal SIGTERM", failure=USER), LIMITS,
     [Stop("signal SIGTERM")]),
    ("a lost job without a verdict waits for its main step as before",
     seen([G0], 2, {"g0-0": FAILED, "g0-1": MEMBER}, phase=Phase.LOST, errors=[error("g0-0")], over_since=NOW),
     LIMITS, []),
    # --- satellites as Slurm shows them
    ("a pending satellite that Slurm started runs now",
     seen([G0, G1_PENDING], 4, satellites={101: squeue(101)}), LIMITS,
     [SatelliteStarted("g1", 101, NOW, ("n1",))]),
    ("a pending satellite that still waits changes nothing",
     seen([G0, G1_PENDING], 4, satellites={101: squeue(101, JobState.PENDING, "Resources")}), LIMITS, []),
    ("a running satellite is noted running only once", seen([G0, G1], 4, satellites={101: squeue(101)}), LIMITS, []),
    ("a preempted satellite is released, its workers marked dead, and the target follows",
     seen([G0, G1], 4, satellites={101: squeue(101, JobState.CANCELLED, "Preempted")}), LIMITS,
     [release("g1", "preempted", "g1-0", "g1-1"), LowerTarget(2, 4)]),
    ("a satellite in state PREEMPTED is released as preempted",
     seen([G0, G1], 4, satellites={101: squeue(101, JobState.PREEMPTED)}), LIMITS,
     [release("g1", "preempted", "g1-0", "g1-1"), LowerTarget(2, 4)]),
    ("a satellite squeue forgot is released as gone", seen([G0, G1], 4, satellites={}), LIMITS,
     [release("g1", "satellite gone", "g1-0", "g1-1"), LowerTarget(2, 4)]),
    ("a satellite in an unknown state is released as gone",
     seen([G0, G1], 4, satellites={101: squeue(101, JobState.UNKNOWN)}), LIMITS,
     [release("g1", "satellite gone", "g1-0", "g1-1"), LowerTarget(2, 4)]),
    ("a satellite whose node failed is released as an infrastructure failure and the job regrows at once",
     seen([G0, G1], 4, satellites={101: squeue(101, JobState.NODE_FAIL)}), LIMITS,
     [release("g1", "satellite node_fail", "g1-0", "g1-1", failure=INFRA), SubmitSatellite("g2", 2, NOW, 2)]),
    ("a satellite's regrowth excludes the node that failed under it",
     seen([G0, sat("g1", 2, nodes=["n4"])], 4, satellites={101: squeue(101, JobState.NODE_FAIL)}), LIMITS,
     [release("g1", "satellite node_fail", "g1-0", "g1-1", failure=INFRA),
      SubmitSatellite("g2", 2, NOW, 2, ("n4",))]),
    ("a satellite that Slurm ended out of memory is a resource failure: the target follows",
     seen([G0, G1], 4, satellites={101: squeue(101, JobState.OUT_OF_MEMORY)}), LIMITS,
     [release("g1", "satellite out_of_memory", "g1-0", "g1-1", failure=RESOURCE), LowerTarget(2, 4)]),
    ("a satellite that failed after its workers reported a user error is not regrown",
     seen([G0, G1], 4, {**members(G0), "g1-0": FAILED, "g1-1": FAILED}, errors=[error("g1-0"), error("g1-1")],
          satellites={101: squeue(101, JobState.FAILED, "NonZeroExitCode")}), LIMITS,
     [release("g1", "satellite failed", failure=USER), LowerTarget(2, 4)]),
    ("a satellite whose worker step died (its batch script exits) is released, its workers marked dead",
     seen([G0, G1], 4, satellites={101: squeue(101, JobState.FAILED, "NonZeroExitCode")}), LIMITS,
     [release("g1", "satellite failed", "g1-0", "g1-1"), LowerTarget(2, 4)]),
    ("a satellite that completed while its workers still count is released like a loss",
     seen([G0, G1], 4, satellites={101: squeue(101, JobState.COMPLETED)}), LIMITS,
     [release("g1", "satellite completed", "g1-0", "g1-1"), LowerTarget(2, 4)]),
    ("a satellite that is completing still holds its workers",
     seen([G0, G1], 4, satellites={101: squeue(101, JobState.COMPLETING)}), LIMITS, []),
    ("a pending satellite cancelled by someone else is released and not fought for",
     seen([G0, G1_PENDING], 4, satellites={101: squeue(101, JobState.CANCELLED)}), LIMITS,
     [release("g1", "satellite cancelled"), LowerTarget(2, 4)]),
    ("workers already gone are not marked dead again",
     seen([G0, G1], 4, {**members(G0), "g1-0": LEFT, "g1-1": MEMBER}, satellites={}), LIMITS,
     [release("g1", "satellite gone", "g1-1"), LowerTarget(2, 4)]),
    ("a loss leaves a target the job still meets alone",
     seen([G0, G1, sat("g2", 2)], 4, satellites={101: squeue(101), 102: squeue(102, JobState.CANCELLED, "Preempted")}),
     LIMITS, [release("g2", "preempted", "g2-0", "g2-1")]),
    ("a satellite leaving on a shrink that Slurm ended lowers nothing",
     seen([G0, sat("g1", 2, GroupState.LEAVING, leaving=["g1-0", "g1-1"])], 2,
          satellites={101: squeue(101, JobState.CANCELLED)}), LIMITS,
     [release("g1", "satellite cancelled", "g1-0", "g1-1")]),
    ("without a Slurm poll this round nothing is decided about satellites", seen([G0, G1], 4), LIMITS, []),
    ("an ended satellite is not looked at again",
     seen([G0, sat("g1", 2, GroupState.ENDED)], 2, {**members(G0)}, satellites={}), LIMITS, []),
    # --- training over
    ("the main step that outlives training by the grace is stopped",
     seen([G0], 2, {"g0-0": DONE, "g0-1": DEAD}, phase=Phase.FINISHED, over_since=NOW - 31), LIMITS,
     [StopMainStep(Phase.FINISHED)]),
    ("a lost job's lingering step is stopped after the satellites' news",
     seen([G0, G1], 4, {"g0-0": DEAD, "g0-1": MEMBER, **members(G1)}, phase=Phase.LOST, over_since=NOW - 60,
          satellites={101: squeue(101, JobState.CANCELLED, "Preempted")}), LIMITS,
     [release("g1", "preempted", "g1-0", "g1-1"), LowerTarget(2, 4), StopMainStep(Phase.LOST)]),
    ("within the grace after training nothing grows or shrinks",
     seen([G0, G1], 8, {"g0-0": DONE, "g0-1": DONE, **members(G1)}, phase=Phase.FINISHED, over_since=NOW - 5),
     LIMITS, []),
    ("no resize after the end, and satellites whose workers finished are released",
     seen([G0, G1], 8, {w: DONE for w in ["g0-0", "g0-1", "g1-0", "g1-1"]}, phase=Phase.FINISHED, over_since=NOW),
     LIMITS, [release("g1", "training finished")]),
    ("the grace counts from when the agent first saw the end",
     seen([G0], 2, phase=Phase.FINISHED, over_since=NOW - 30), LIMITS, []),
    ("a generation ending is not the end of training", seen([G0], 4, phase=Phase.ENDING), LIMITS,
     [SubmitSatellite("g1", 2, NOW, 2)]),
    # --- workers as the coordinator sees them
    ("a satellite whose workers left on a shrink is released",
     seen([G0, sat("g1", 2, GroupState.LEAVING, leaving=["g1-0", "g1-1"])], 2, {**members(G0), "g1-0": LEFT,
          "g1-1": LEFT}), LIMITS, [release("g1", "shrink")]),
    ("a satellite whose workers all finished is released as finished",
     seen([G0, G1], 4, {**members(G0), "g1-0": DONE, "g1-1": DONE}, phase=Phase.FINISHED, over_since=NOW), LIMITS,
     [release("g1", "training finished")]),
    ("a satellite whose workers finished before the coordinator says so is released, and nothing regrows",
     seen([G0, G1], 4, {**members(G0), "g1-0": DONE, "g1-1": DONE}), LIMITS, [release("g1", "training finished")]),
    ("a satellite whose workers left unasked is released and the target follows",
     seen([G0, G1], 4, {**members(G0), "g1-0": LEFT, "g1-1": FAILED}), LIMITS,
     [release("g1", "its workers left (preempted or failed)", failure=USER), LowerTarget(2, 4)]),
    ("a satellite whose workers died without a word is an infrastructure failure: regrow without its node",
     seen([G0, sat("g1", 2, nodes=["n4"])], 4, {**members(G0), "g1-0": DEAD, "g1-1": DEAD}), LIMITS,
     [release("g1", "its workers left (preempted or failed)", failure=INFRA),
      SubmitSatellite("g2", 2, NOW, 2, ("n4",))]),
    ("workers that reported a communication failure are an infrastructure failure",
     seen([G0, sat("g1", 1, nodes=["n3"])], 3, {**members(G0), "g1-0": FAILED}, errors=[error("g1-0", INFRA)]),
     LIMITS, [release("g1", "its workers left (preempted or failed)", failure=INFRA),
              SubmitSatellite("g2", 1, NOW, 2, ("n3",))]),
    ("a second infrastructure failure on one node names it to the daemon",
     seen([G0, sat("g1", 2, GroupState.ENDED, nodes=["n4"], failure=INFRA), sat("g2", 2, nodes=["n4"])], 4,
          {**members(G0), "g2-0": DEAD, "g2-1": DEAD}), LIMITS,
     [release("g2", "its workers left (preempted or failed)", failure=INFRA), NodeFailing("n4", 2),
      SubmitSatellite("g3", 2, NOW, 2, ("n4",))]),
    ("a node where workers left on preemption is not excluded",
     seen([G0, sat("g1", 2, GroupState.ENDED, nodes=["n4"]), sat("g2", 2, nodes=["n2"])], 4,
          {**members(G0), "g2-0": LEFT, "g2-1": LEFT}), LIMITS,
     [release("g2", "its workers left (preempted or failed)"), LowerTarget(2, 4)]),
    ("a worker that left on its own no longer counts",
     seen([G0, G1], 4, {**members(G0), "g1-0": MEMBER, "g1-1": LEFT}), LIMITS,
     [WorkerLost("g1", "g1-1", LEFT), LowerTarget(3, 4)]),
    ("a dead worker retires the rest of its group",
     seen([G0, G1], 4, {**members(G0), "g1-0": DEAD, "g1-1": MEMBER}), LIMITS,
     [WorkerLost("g1", "g1-0", DEAD, INFRA), RetireGroup("g1", ("g1-1",)), SubmitSatellite("g2", 2, NOW, 2)]),
    ("a failed worker retires the rest of its group",
     seen([G0, sat("g1", 3)], 5, {**members(G0), "g1-0": MEMBER, "g1-1": MEMBER, "g1-2": FAILED}), LIMITS,
     [WorkerLost("g1", "g1-2", FAILED, USER), RetireGroup("g1", ("g1-0", "g1-1")), LowerTarget(2, 5)]),
    ("a worker asked to leave that left is no loss",
     seen([G0, sat("g1", 2, leaving=["g1-1"])], 3, {**members(G0), "g1-0": MEMBER, "g1-1": LEFT}), LIMITS, []),
    ("workers still warming up (not registered yet) are not lost",
     seen([G0, G1], 4, {**members(G0), "g1-0": READY}), LIMITS, []),
    ("a leaving group's gone worker is not counted twice",
     seen([G0, sat("g1", 2, GroupState.LEAVING, leaving=["g1-0", "g1-1"])], 2, {**members(G0), "g1-0": LEFT,
          "g1-1": MEMBER}), LIMITS, []),
    ("the main group's workers are the runtime's business, not the agent's",
     seen([G0], 2, {"g0-0": DEAD, "g0-1": MEMBER}), LIMITS, []),
    # --- reconcile: grow
    ("a grow submits one satellite for the missing workers", seen([G0], 4), LIMITS,
     [SubmitSatellite("g1", 2, NOW, 2)]),
    ("a grow takes one satellite per node's worth of workers", seen([G0], 8), LIMITS,
     [SubmitSatellite("g1", 4, NOW, 2), SubmitSatellite("g2", 2, NOW, 6)]),
    ("while the node size is unknown each satellite holds one worker", seen([G0], 4), Limits(2, 1),
     [SubmitSatellite("g1", 1, NOW, 2), SubmitSatellite("g2", 1, NOW, 3)]),
    ("new groups are named after every group the job ever had",
     seen([G0, sat("g1", 2, GroupState.ENDED)], 3, {**members(G0)}), LIMITS, [SubmitSatellite("g2", 1, NOW, 2)]),
    ("a pending satellite counts toward the size: no second submission", seen([G0, G1_PENDING], 4), LIMITS, []),
    ("a target the job has changes nothing", seen([G0, G1], 4), LIMITS, []),
    ("a grow counts only workers not asked to leave",
     seen([G0, sat("g1", 2, leaving=["g1-1"])], 4), LIMITS, [SubmitSatellite("g2", 1, NOW, 3)]),
    ("a loss and a grow in one round: the grow aims at the lowered target",
     seen([G0, G1], 6, satellites={101: squeue(101, JobState.CANCELLED, "Preempted")}), LIMITS,
     [release("g1", "preempted", "g1-0", "g1-1"), LowerTarget(2, 6)]),
    # --- reconcile: shrink
    ("a shrink asks a whole satellite's workers to leave", seen([G0, G1], 2), LIMITS,
     [AskToLeave("g1", ("g1-0", "g1-1"))]),
    ("a shrink by one takes the newest satellite's last worker", seen([G0, G1], 3), LIMITS,
     [AskToLeave("g1", ("g1-1",))]),
    ("a shrink releases a satellite that has not started instead", seen([G0, G1, sat("g2", 2, GroupState.PENDING)],
     4), LIMITS, [release("g2", "shrink before it started")]),
    ("a shrink takes pending satellites, then the newest whole groups, then part of one",
     seen([G0, G1, G2, sat("g3", 1, GroupState.PENDING)], 3), LIMITS,
     [release("g3", "shrink before it started"), AskToLeave("g2", ("g2-0", "g2-1")), AskToLeave("g1", ("g1-1",))]),
    ("a shrink by part of a pending satellite replaces it with a smaller one",
     seen([G0, sat("g1", 3, GroupState.PENDING)], 4), LIMITS,
     [release("g1", "shrink before it started"), SubmitSatellite("g2", 2, NOW, 2)]),
    ("a shrink never takes the main group's workers", seen([G0], 1), Limits(1, 4), []),
]
# fmt: on


@pytest.mark.parametrize(("observation", "limits", "expected"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_plan_decides_each_round_as_the_table_says(
    observation: Observation, limits: Limits, expected: list[Action]
) -> None:
    assert plan(observation, limits) == expected


@pytest.mark.parametrize(("observation", "limits", "expected"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_an_applied_plan_is_not_planned_again(observation: Observation, limits: Limits, expected: list[Action]) -> None:
    actions = plan(observation, limits)
    if any(isinstance(a, ENDING_ACTIONS) for a in actions):
        return  # the loop ended
    assert plan(next_round(observation, actions), limits) == []


@pytest.mark.parametrize(("observation", "limits", "expected"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_the_plan_leaves_its_observation_unchanged(
    observation: Observation, limits: Limits, expected: list[Action]
) -> None:
    before = [g.to_json() for g in observation.groups]
    plan(observation, limits)
    assert [g.to_json() for g in observation.groups] == before


def test_a_refused_satellite_leaves_the_target_at_what_the_job_has_with_the_earlier_ones() -> None:
    first, second = plan(seen([G0], 8), LIMITS)
    assert isinstance(first, SubmitSatellite) and isinstance(second, SubmitSatellite)
    assert (first.target_if_refused, second.target_if_refused) == (2, 6)


def test_a_loss_never_lowers_the_target_below_the_jobs_minimum() -> None:
    observation = seen([G0, G1], 4, satellites={101: squeue(101, JobState.CANCELLED, "Preempted")})
    # (The main group holds the minimum; were it smaller, the job would grow back to the minimum.)
    assert plan(observation, Limits(3, 4))[1:] == [LowerTarget(3, 4), SubmitSatellite("g2", 1, NOW, 2)]


def test_recording_a_shrink_of_every_worker_makes_the_group_leave() -> None:
    groups = [main_group(), sat("g1", 2)]
    record(groups, AskToLeave("g1", ("g1-0",)))
    after_one = (groups[1].state, planned_size(groups))
    record(groups, AskToLeave("g1", ("g1-1",)))
    assert after_one == (GroupState.RUNNING, 3) and (groups[1].state, planned_size(groups)) == (GroupState.LEAVING, 2)


def test_recording_a_release_ends_the_group_with_its_reason_and_time() -> None:
    groups = [main_group(), sat("g1", 2)]
    record(groups, release("g1", "preempted"))
    assert (groups[1].state, groups[1].end_reason, groups[1].ended_at) == (GroupState.ENDED, "preempted", NOW)


def test_an_action_for_an_unknown_group_changes_nothing() -> None:
    groups = [main_group()]
    record(groups, release("g7", "shrink"))
    assert [g.to_json() for g in groups] == [main_group().to_json()]


def test_when_the_job_ends_every_satellite_not_yet_released_is_released() -> None:
    ended = sat("g1", 1, GroupState.ENDED)
    groups = [main_group(), ended, sat("g2", 2), sat("g3", 1, GroupState.PENDING)]
    coordinator = CoordinatorSeen(Phase.RUNNING, {"g2-0": MEMBER, "g2-1": LEFT})
    assert final_releases(groups, coordinator, NOW) == [
        release("g2", "job ended", "g2-0"),
        release("g3", "job ended"),
    ]


@pytest.mark.parametrize(
    ("gpus_per_worker", "node_gpus", "expected"),
    [(1, 4, 4), (2, 4, 2), (3, 4, 1), (8, 4, 1), (1, None, 1), (0, None, 8), (0, 4, 8), (1, 0, 1)],
)
def test_a_satellite_holds_one_nodes_worth_of_workers(
    gpus_per_worker: int, node_gpus: int | None, expected: int
) -> None:
    spec = ElasticSpec(2, 8, gpus_per_worker=gpus_per_worker)
    assert workers_per_satellite(spec, node_gpus) == expected


@pytest.mark.parametrize(
    ("status", "failure"),
    [(0, None), (1, USER), (139, USER), (137, INFRA), (143, INFRA)],
)
def test_the_main_groups_end_carries_the_class_of_its_status(status: int, failure: FailureClass | None) -> None:
    (ended,) = plan(seen([G0], 2, main_status=status), LIMITS)
    assert isinstance(ended, MainGroupEnded) and ended.status == status and ended.failure is failure


def test_a_move_asks_the_satellites_on_the_node_to_leave_and_grows_them_back_elsewhere() -> None:
    g1, g2 = sat("g1", 3, nodes=("n1",)), sat("g2", 2, nodes=("n2",))
    moved = Observation(**{**seen([main_group(), g1, g2], 7).__dict__, "vacate": "n1"})
    assert plan(moved, LIMITS) == [
        AskToLeave("g1", ("g1-0", "g1-1", "g1-2")),
        SubmitSatellite("g3", 3, NOW, 4, ("n1",)),  # the size kept: 3 workers elsewhere, never on n1
    ]
    # Nodes that failed the job stay excluded beside the vacated one.
    failed = sat("g3", 1, GroupState.ENDED, nodes=("n0",), failure=INFRA)
    moved = Observation(**{**seen([main_group(), g1, g2, failed], 7).__dict__, "vacate": "n1"})
    assert plan(moved, LIMITS)[-1] == SubmitSatellite("g4", 3, NOW, 4, ("n0", "n1"))


BESIDE = PlaceBeside("77", "share", {"s1": 2}, "opportunistic")


def test_a_share_grows_one_satellite_per_worker_beside_the_host_before_any_of_its_own() -> None:
    shared = Observation(**{**seen([main_group()], 5).__dict__, "beside": BESIDE})
    assert plan(shared, LIMITS) == [
        SubmitSatellite("g1", 1, NOW, 2, beside=BESIDE, node="s1"),
        SubmitSatellite("g2", 1, NOW, 3, beside=BESIDE, node="s1"),
        SubmitSatellite("g3", 1, NOW, 4),  # the rest of the target on GPUs of its own
    ]
    first = plan(shared, LIMITS)[0]
    assert isinstance(first, SubmitSatellite)
    group = new_satellite_group(first, 501)
    assert group.beside == "77" and new_satellite_group(SubmitSatellite("g3", 1, NOW, 4), 502).beside == ""


def test_a_place_beside_order_carries_the_daemons_memory_cap_and_none_when_the_directive_gives_none() -> None:
    from tests.unit.test_messages import PLACE

    assert PlaceBeside.from_body(PLACE).memory_cap_bytes == 0
    assert PlaceBeside.from_body({**PLACE, "memory_cap_bytes": 6 << 30}).memory_cap_bytes == 6 << 30


def test_a_shrink_gives_the_places_beside_another_job_back_first() -> None:
    own, beside = sat("g1", 1), sat("g2", 1)
    beside.beside = "77"
    own.requested_at = 5.0  # the job's own satellite is the newest: without sharing it would leave first
    assert plan(seen([main_group(), own, beside], 3), LIMITS) == [AskToLeave("g2", ("g2-0",))]


def test_a_move_off_a_node_without_a_running_satellite_of_the_job_does_nothing() -> None:
    pending = sat("g1", 2, GroupState.PENDING)
    for groups in ([main_group(), sat("g1", 2, nodes=("n2",))], [main_group(), pending]):
        moved = Observation(**{**seen(groups, 4).__dict__, "vacate": "n1"})
        assert plan(moved, LIMITS) == []
