"""Whole-node moves (policy/moves.py): which satellites move off which node for which pending job, by tables over 4
nodes of 4 GPUs, and the layer that adds them to a policy's answer."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from slurm_amoeba.policy import Action, JobInfo, JobPhase, NodeInfo, Resize, Snapshot
from slurm_amoeba.policy import Move as MoveAction
from slurm_amoeba.policy.moves import WholeNodeMoves, whole_node_moves


def Move(job_id: str, node: str, workers: int, for_job: str) -> tuple[str, str, int, str]:
    """A move as the tables write it (the reason left out)."""
    return (job_id, node, workers, for_job)


def elastic(job_id: str, workers: int, gpus_per_worker: int = 1) -> JobInfo:
    return JobInfo(
        job_id,
        JobPhase.RUNNING,
        0.0,
        requested_workers=workers,
        min_workers=1,
        max_workers=8,
        workers=workers,
        gpus_per_worker=gpus_per_worker,
    )


def rigid(job_id: str, gpus: int, priority: int = 100, submit: float = 10.0) -> JobInfo:
    return JobInfo(job_id, JobPhase.PENDING, submit, gpus, gpus, gpus, priority=priority)


def snapshot(free: Mapping[str, int], *pending: JobInfo) -> Snapshot:
    nodes = tuple(NodeInfo(name, 4, gpus) for name, gpus in free.items())
    return Snapshot(nodes, tuple(pending))


def whole_node_moves_of(
    snap: Snapshot,
    running: Sequence[JobInfo],
    satellites: Mapping[str, Mapping[str, int]],
    skip: Collection[str] = (),
) -> list[tuple[str, str, int, str]]:
    """The moves with ``running`` jobs added to the snapshot, each lending its satellites' GPUs per node."""
    lent = [
        dataclasses.replace(
            info, lent={node: gpus // info.gpus_per_worker for node, gpus in satellites.get(info.job_id, {}).items()}
        )
        for info in running
    ]
    snap = Snapshot(snap.nodes, (*snap.jobs, *lent))
    return [(m.job_id, m.node, m.workers, m.for_job) for m in whole_node_moves(snap, skip=skip)]


def test_a_rigid_job_that_finds_no_whole_node_gets_the_node_whose_satellite_moves_where_it_fits() -> None:
    # n1: E's satellite of 3 + 1 free; n2: 2 free; n3: 3 free; n4 full (E's own allocation and a rigid job).
    free = {"n1": 1, "n2": 2, "n3": 3, "n4": 0}
    moves = whole_node_moves_of(snapshot(free, rigid("9", 4)), [elastic("5", 4)], {"5": {"n1": 3}})
    assert moves == [Move("5", "n1", 3, "9")]


def test_no_move_when_a_node_is_whole_the_cluster_lacks_gpus_or_the_workers_fit_nowhere_else() -> None:
    job = [elastic("5", 4)]
    sats = {"5": {"n1": 3}}
    assert whole_node_moves_of(snapshot({"n1": 1, "n2": 4, "n3": 0, "n4": 0}, rigid("9", 4)), job, sats) == []
    assert whole_node_moves_of(snapshot({"n1": 1, "n2": 2, "n3": 0, "n4": 0}, rigid("9", 4)), job, sats) == []
    # 3 workers regrow as one satellite of 3: no other node has 3 free (2 + 2 is not one node).
    assert whole_node_moves_of(snapshot({"n1": 1, "n2": 2, "n3": 2, "n4": 0}, rigid("9", 4)), job, sats) == []
    # A job larger than a node is not one Slurm places on one node.
    assert whole_node_moves_of(snapshot({"n1": 1, "n2": 3, "n3": 3, "n4": 3}, rigid("9", 5)), job, sats) == []


def test_no_move_is_made_for_a_held_job_which_cannot_start() -> None:
    free = {"n1": 1, "n2": 2, "n3": 3, "n4": 0}
    held = dataclasses.replace(rigid("9", 4), held=True)
    assert whole_node_moves_of(snapshot(free, held), [elastic("5", 4)], {"5": {"n1": 3}}) == []
    assert whole_node_moves_of(snapshot(free, held, rigid("8", 4)), [elastic("5", 4)], {"5": {"n1": 3}}) == [
        Move("5", "n1", 3, "8")
    ]


def test_the_node_needing_the_fewest_gpus_moved_wins_and_each_node_and_job_moves_once() -> None:
    free = {"n1": 1, "n2": 2, "n3": 3, "n4": 3}
    jobs = [elastic("5", 4), elastic("6", 3)]
    sats = {"5": {"n1": 3}, "6": {"n2": 2}}
    assert whole_node_moves_of(snapshot(free, rigid("9", 4)), jobs, sats) == [Move("6", "n2", 2, "9")]
    # Two pending jobs in priority order: the first takes n2, the second n1 (n3/n4 absorb both regrowths).
    both = whole_node_moves_of(snapshot(free, rigid("8", 4, submit=20.0), rigid("9", 4, priority=200)), jobs, sats)
    assert both == [Move("6", "n2", 2, "9"), Move("5", "n1", 3, "8")]
    # A pending job a move was ordered for lately is passed over.
    assert whole_node_moves_of(snapshot(free, rigid("9", 4)), jobs, sats, skip={"9"}) == []


def test_two_jobs_satellites_on_one_node_move_together_and_workers_of_two_gpus_regrow_by_node() -> None:
    free = {"n1": 0, "n2": 2, "n3": 2, "n4": 1}
    jobs = [elastic("5", 3), elastic("6", 4)]
    sats = {"5": {"n1": 2}, "6": {"n1": 2}}
    assert whole_node_moves_of(snapshot(free, rigid("9", 4)), jobs, sats) == [
        Move("5", "n1", 2, "9"),
        Move("6", "n1", 2, "9"),
    ]
    wide = [elastic("7", 3, gpus_per_worker=2)]  # one worker of 2 GPUs on n1 beside 2 free; n2 has room for it
    assert whole_node_moves_of(
        snapshot({"n1": 2, "n2": 2, "n3": 1, "n4": 1}, rigid("9", 4)), wide, {"7": {"n1": 2}}
    ) == [Move("7", "n1", 1, "9")]


def test_the_move_carries_the_sentence_its_agent_logs_and_skips_jobs_excluded() -> None:
    running = dataclasses.replace(elastic("5", 4), lent={"n1": 3})
    snap = Snapshot(snapshot({"n1": 1, "n2": 2, "n3": 3, "n4": 0}).nodes, (rigid("9", 4), running))
    (move,) = whole_node_moves(snap)
    assert move.reason == "amoebad: moves 3 worker(s) off n1 so that job 9 starts on one node"
    assert whole_node_moves(snap, exclude={"5"}) == []


class Answers:
    """An inner policy that answers with fixed actions."""

    name = "inner"
    decides_on_events_only = True
    emits: frozenset[type[Action]] = frozenset({Resize})

    def __init__(self, *actions: Action) -> None:
        self.actions = list(actions)

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        return self.actions


def test_the_layer_adds_moves_to_the_inner_answer_for_jobs_it_does_not_act_on_and_none_for_recent_ones() -> None:
    running = dataclasses.replace(elastic("5", 4), lent={"n1": 3}, placement={"n1": 3, "n4": 1})
    snap = Snapshot(snapshot({"n1": 1, "n2": 2, "n3": 3, "n4": 0}).nodes, (rigid("9", 4), running))
    grow = Resize("5", 5, reason="grow")
    layer = WholeNodeMoves(Answers())
    assert (layer.name, layer.emits) == ("inner", frozenset({Resize, MoveAction}))
    (move,) = layer.decide(snap, 0.0)
    assert isinstance(move, MoveAction) and (move.job_id, move.for_job) == ("5", "9")
    assert WholeNodeMoves(Answers(grow)).decide(snap, 0.0) == [grow], "the inner policy acts on job 5"
    assert WholeNodeMoves(Answers(), recent={"9"}).decide(snap, 0.0) == [], "a node is being vacated for job 9"
    assert WholeNodeMoves(Answers(), recent={"5"}).decide(snap, 0.0) == [], "job 5 moved lately"
