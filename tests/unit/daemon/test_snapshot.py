"""Each step of the snapshot on its own: satellites, nodes, unmanaged jobs, GPUs given back, young pending jobs, a
planned job's smallest feasible size and predicted rates."""

from __future__ import annotations

import dataclasses

import pytest

from slurm_amoeba.daemon.agents import AgentRecord, Report
from slurm_amoeba.daemon.snapshot import (
    cap_young_pending,
    managed_job,
    placeable_nodes,
    show_released,
    split_satellites,
    unmanaged_job,
)
from slurm_amoeba.policy import JobPhase, NodeInfo
from slurm_amoeba.slurm import JobRecord
from slurm_amoeba.slurm import JobState as SlurmState
from tests.unit.daemon.fakes import OTHER_UID, job, node, report_body, satellite
from tests.unit.daemon.test_observer import NOW, agent, elastic_job
from tests.unit.policy.helpers import job as policy_job


def groups_of(*records: JobRecord) -> dict[str, list[JobRecord]]:
    groups: dict[str, list[JobRecord]] = {}
    for record in records:
        groups.setdefault(str(record.het_job_id or record.job_id), []).append(record)
    return groups


def test_split_satellites_gives_each_satellite_to_its_registered_parent_of_the_same_owner() -> None:
    groups = groups_of(
        *elastic_job(100),
        satellite(200, 100, gpus={"n2": 1}),
        satellite(201, 100, group="g2", uid=OTHER_UID, gpus={"n2": 1}),  # another user's: not the parent's
        satellite(202, 55, gpus={"n3": 1}),  # parent gone
        satellite(203, 300, gpus={"n3": 1}),  # parent runs but never registered
        job(300, gpus={"n4": 1}),
    )
    split = split_satellites(groups, {"100": agent("100")})
    assert {key: [r.job_id for r in records] for key, records in split.satellites.items()} == {"100": [200]}
    assert sorted(split.groups) == ["100", "201", "202", "203", "300"]
    assert [s.job_id for s in split.orphans] == ["202"] and split.orphans[0].parent == "55"
    assert "200" in groups  # the caller's mapping is left as it was


@pytest.mark.parametrize(
    ("submitted", "listed", "unclaimed"),
    [(NOW - 600, False, True), (NOW - 600, True, False), (NOW - 5, False, False)],
    ids=["old-and-unlisted", "listed", "too-young-to-tell"],
)
def test_a_satellite_the_agent_does_not_list_is_unclaimed_once_the_report_is_clearly_newer(
    submitted: float, listed: bool, unclaimed: bool
) -> None:
    record = agent("100")
    assert record.report is not None
    if listed:
        record.accept_report(dataclasses.replace(record.report, satellites=("200",)))
    groups = groups_of(*elastic_job(100), satellite(200, 100, gpus={"n2": 1}, submit_time=int(submitted)))
    split = split_satellites(groups, {"100": record})
    assert [s.job_id for s in split.unclaimed] == (["200"] if unclaimed else [])


def test_placeable_nodes_are_the_managed_partitions_nodes_with_gpus_each_once() -> None:
    nodes = [
        node("n1", partitions=("batch", "elastic")),
        node("n2", partitions=("debug", "elastic")),
        node("n3", partitions=("debug",)),
        node("n4", total=0),
        node("n1", partitions=("elastic",)),
    ]
    placeable = placeable_nodes(nodes, ["batch"], "elastic")
    assert [(n.name, n.partition, n.gpus_total) for n in placeable] == [("n1", "batch", 4), ("n2", "elastic", 4)]


@pytest.mark.parametrize(
    ("records", "phase", "gpus"),
    [
        ([job(7, gpus={"n1": 2, "n2": 1})], JobPhase.RUNNING, 3),
        ([job(7, state=SlurmState.PENDING, gpus_per_node=2, node_count=2, reason="Priority")], JobPhase.PENDING, 4),
        ([job(7, state=SlurmState.PENDING, gpus_per_node=2, reason="JobHeldUser")], None, 0),
        ([job(7, state=SlurmState.PENDING, gpus_per_node=2, partition="elastic")], None, 0),
        ([job(7, state=SlurmState.PENDING, gpus_per_node=0)], None, 0),
        ([job(7, gpus={})], None, 0),
    ],
    ids=["running-holds-gpus", "pending-for-gpus", "held-by-its-user", "not-in-a-regular-partition", "no-gpus", "cpu"],
)
def test_an_unmanaged_job_is_fixed_size_and_counted_in_gpus(
    records: list[JobRecord], phase: JobPhase | None, gpus: int
) -> None:
    info = unmanaged_job("7", records, pinned=False, regular_partitions=["batch"], now=NOW)
    if phase is None:
        assert info is None
        return
    assert info is not None and info.state is phase
    assert info.min_workers == info.max_workers == info.requested_workers == gpus


def test_a_managed_job_gives_back_the_gpus_of_satellites_beyond_its_reported_size() -> None:
    records = elastic_job(100, gpus={"n1": 2})
    satellites = [satellite(200, 100, gpus={"n2": 1}), satellite(201, 100, group="g2", gpus={"n3": 1})]
    info, leaving = managed_job("100", records, satellites, agent("100", size=3), False, 10.0, NOW)
    assert info.workers == 3 and sum(info.placement.values()) == 3
    assert leaving == {"n3": 1}  # the newest satellite is the one on its way out


def test_show_released_frees_what_is_given_back_but_never_more_than_a_node_has() -> None:
    nodes = (NodeInfo("n1", 4, 1), NodeInfo("n2", 4, 3), NodeInfo("n3", 4, 0))
    shown = show_released(nodes, {"n1": 2, "n2": 4, "n9": 1})
    assert [n.gpus_free for n in shown] == [3, 4, 0]


def test_cap_young_pending_asks_only_for_what_is_free_and_leaves_a_young_job_that_would_get_nothing_to_slurm() -> None:
    jobs = [
        policy_job("young", 4, submit=NOW - 1),
        policy_job("old", 4, submit=NOW - 60),
        policy_job("run", 2, placement={"n0": 2}, submit=NOW - 1),
    ]
    kept, left = cap_young_pending(jobs, 3, NOW, 5.0)
    assert [(j.job_id, j.requested_workers) for j in kept] == [("young", 3), ("old", 4), ("run", 2)]
    assert left == ()
    kept, left = cap_young_pending(jobs, 0, NOW, 5.0)
    assert [j.job_id for j in kept] == ["old", "run"]
    assert left == (jobs[0],)  # as it was: it still waits in Slurm's queue
    assert cap_young_pending(jobs, 0, NOW, 0.0) == (tuple(jobs), ())


def planned_agent(min_workers: int, predicted: dict[str, float], size: int = 4) -> AgentRecord:
    """An agent (registered for 2..8 workers) whose latest report carries a planned job's ``plans``."""
    record = agent("100", low=2, high=8, size=None)
    body = {**report_body("100", size), "plans": {"min_workers": min_workers, "samples_per_s": predicted}}
    record.accept_report(Report.from_body(body, received_at=NOW - 1))
    return record


@pytest.mark.parametrize(
    ("feasible", "expected"),
    [
        (0, 2),  # no plans reported: the registration's minimum
        (1, 2),  # fits smaller than registered: the registration still holds
        (4, 4),  # fits only from 4 workers: never shrunk below
        (12, 8),  # fits nowhere up to the maximum: held at the maximum, never above it
    ],
)
def test_a_planned_jobs_smallest_feasible_size_raises_its_min_workers(feasible: int, expected: int) -> None:
    info, _ = managed_job("100", elastic_job(100, gpus={"n1": 4}), [], planned_agent(feasible, {}), False, 10.0, NOW)
    assert info.min_workers == expected
    assert info.requested_workers == expected and info.max_workers == 8  # the range stays valid for the policy


def test_a_stale_report_no_longer_raises_min_workers() -> None:
    record = planned_agent(4, {"4": 300.0})
    info, _ = managed_job("100", elastic_job(100, gpus={"n1": 4}), [], record, False, 10.0, NOW + 60)
    assert info.min_workers == 2 and info.throughput == {}


def test_predicted_rates_fill_the_throughput_at_sizes_never_run_and_measured_ones_win() -> None:
    # report_body measured 1..4 workers; the plans predict 4, 6 and 8
    record = planned_agent(2, {"4": 999.0, "6": 450.0, "8": 560.0})
    info, _ = managed_job("100", elastic_job(100, gpus={"n1": 4}), [], record, False, 10.0, NOW)
    assert dict(info.throughput) == {1: 100.0, 2: 190.0, 3: 270.0, 4: 340.0, 6: 450.0, 8: 560.0}
