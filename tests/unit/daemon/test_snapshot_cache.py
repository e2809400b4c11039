"""The incremental snapshot: nodes and unmanaged jobs whose Slurm records did not change are reused, and the
snapshot is the one a fresh build gives."""

from __future__ import annotations

import copy
import dataclasses
import random

from slurm_amoeba.daemon.agents import AgentRecord, InFlight, Report
from slurm_amoeba.daemon.observer import ClusterView, Observation
from slurm_amoeba.daemon.snapshot import SnapshotCache, build_snapshot
from slurm_amoeba.policy import JobInfo
from slurm_amoeba.slurm import JobRecord, NodeRecord
from slurm_amoeba.slurm import JobState as SlurmState
from tests.unit.daemon.fakes import job, node
from tests.unit.daemon.test_observer import NOW, agent, elastic_job


def cluster() -> tuple[list[JobRecord], list[NodeRecord]]:
    records = [
        job(7, gpus={"n1": 2}),
        job(8, gpus={"n2": 1, "n3": 1}),
        job(9, state=SlurmState.PENDING, gpus_per_node=4, reason="Resources"),
        job(10, state=SlurmState.PENDING, gpus_per_node=2, reason="Priority"),
        *elastic_job(100, gpus={"n4": 2}),
    ]
    return records, [node(f"n{i}", used=1 if i < 4 else 0) for i in range(1, 6)]


def snap(
    records: list[JobRecord],
    nodes: list[NodeRecord],
    now: float,
    reuse: SnapshotCache | None,
    pinned: tuple[str, ...] = (),
    regular_partitions: tuple[str, ...] = ("batch",),
    agents: dict[str, AgentRecord] | None = None,
) -> Observation:
    """A snapshot of freshly read records (equal to, not the same objects as, the last round's); job 100's agent
    registered (a new record equal to the last round's unless ``agents`` are given)."""
    view = ClusterView(tuple(copy.copy(r) for r in records), tuple(copy.copy(n) for n in nodes), now)
    agents = {"100": agent("100")} if agents is None else agents
    return build_snapshot(
        view,
        agents,
        pinned=pinned,
        regular_partitions=regular_partitions,
        elastic_partition="elastic",
        stale_after_s=60.0,
        now=now,
        reuse=reuse,
    )


def jobs_by_id(obs: Observation) -> dict[str, JobInfo]:
    return {info.job_id: info for info in obs.snapshot.jobs}


def test_a_round_where_one_job_changed_reuses_every_other_unmanaged_job_and_node() -> None:
    records, nodes = cluster()
    cache = SnapshotCache()
    first = jobs_by_id(snap(records, nodes, NOW, cache))
    records[2] = dataclasses.replace(records[2], priority=500)  # job 9's priority moved
    second_obs = snap(records, nodes, NOW + 5, cache)
    second = jobs_by_id(second_obs)
    assert second["9"] is not first["9"]
    assert second["7"] is first["7"] and second["8"] is first["8"] and second["10"] is first["10"]
    assert cache.built == 1 and cache.reused == 3 + 1 + len(nodes), "3 unmanaged jobs, the managed one, the nodes"
    assert second_obs.snapshot == snap(records, nodes, NOW + 5, None).snapshot


def test_a_reused_running_job_shows_the_service_it_attained_by_now() -> None:
    records, nodes = cluster()
    cache = SnapshotCache()
    snap(records, nodes, NOW, cache)
    later = snap(records, nodes, NOW + 60, cache)
    assert later.snapshot == snap(records, nodes, NOW + 60, None).snapshot
    assert jobs_by_id(later)["7"].attained_service == (NOW + 60 - records[0].start_time) * 2


def test_a_job_that_ended_disappears_and_is_forgotten() -> None:
    records, nodes = cluster()
    cache = SnapshotCache()
    snap(records, nodes, NOW, cache)
    gone = [r for r in records if r.job_id != 8]
    obs = snap(gone, nodes, NOW + 5, cache)
    assert "8" not in jobs_by_id(obs)
    back = snap(records, nodes, NOW + 10, cache)  # the same id again is built afresh, not taken from the cache
    assert cache.built == 1 and jobs_by_id(back)["8"] == jobs_by_id(snap(records, nodes, NOW + 10, None))["8"]


def test_a_changed_node_is_rebuilt_and_the_others_are_reused() -> None:
    records, nodes = cluster()
    cache = SnapshotCache()
    before = snap(records, nodes, NOW, cache).snapshot.nodes
    nodes[4] = dataclasses.replace(nodes[4], gpus_used=3)
    after = snap(records, nodes, NOW + 5, cache).snapshot.nodes
    assert after[4] is not before[4] and after[4].gpus_free == 1
    assert all(a is b for a, b in zip(after[:4], before[:4], strict=True))


def test_new_partitions_or_a_new_pin_build_afresh() -> None:
    records, nodes = cluster()
    cache = SnapshotCache()
    snap(records, nodes, NOW, cache)
    pinned = snap(records, nodes, NOW, cache, pinned=("7",))
    assert jobs_by_id(pinned)["7"].pinned
    wider = snap(records, nodes, NOW, cache, regular_partitions=("batch", "debug"))
    assert (
        cache.reused == 0
        and wider.snapshot == snap(records, nodes, NOW, None, regular_partitions=("batch", "debug")).snapshot
    )


def test_the_incremental_snapshot_equals_a_fresh_one_round_after_round() -> None:
    rng = random.Random(3)
    records = [
        job(1000 + i, gpus={f"n{i % 20}": 1 + i % 3}, priority=rng.randrange(1, 100))
        if i % 3
        else job(1000 + i, state=SlurmState.PENDING, gpus_per_node=1 + i % 4, reason="Resources")
        for i in range(120)
    ]
    nodes = [node(f"n{i}", total=8, used=rng.randrange(0, 8)) for i in range(20)]
    cache = SnapshotCache()
    for step in range(12):
        now = NOW + 5 * step
        for index in rng.sample(range(len(records)), 6):
            records[index] = dataclasses.replace(records[index], priority=records[index].priority + 1)
        nodes[rng.randrange(len(nodes))] = dataclasses.replace(nodes[0], name=f"n{rng.randrange(20)}", gpus_used=2)
        if step % 4 == 3:
            records.pop(rng.randrange(len(records)))
        assert snap(records, nodes, now, cache).snapshot == snap(records, nodes, now, None).snapshot
    assert cache.reused > cache.built


def test_a_managed_job_is_rebuilt_when_its_agent_reports_or_is_ordered_and_reused_otherwise() -> None:
    records, nodes = cluster()
    agents = {"100": agent("100")}
    cache = SnapshotCache()
    first = snap(records, nodes, NOW, cache, agents=agents).managed["100"]
    later = snap(records, nodes, NOW + 5, cache, agents=agents)
    assert later.managed["100"] is first and cache.built == 0
    assert later.snapshot == snap(records, nodes, NOW + 5, None, agents=agents).snapshot, "its service by now"
    agents["100"].accept_report(Report(3, 2, 3, {2: 100.0, 3: 150.0}, (), (), NOW + 6))
    reported = snap(records, nodes, NOW + 7, cache, agents=agents)
    assert reported.managed["100"] is not first and reported.managed["100"].workers == 3
    agents["100"].in_flight = InFlight(target=4, ordered_at=NOW + 8, source="policy", reason="grow")
    ordered = snap(records, nodes, NOW + 9, cache, agents=agents)
    assert ordered.managed["100"].resizing and not reported.managed["100"].resizing
    stale = snap(records, nodes, NOW + 600, cache, agents=agents)  # no report for long: left alone
    assert stale.snapshot == snap(records, nodes, NOW + 600, None, agents=agents).snapshot


def test_a_later_report_that_says_the_same_keeps_the_managed_job_and_one_with_new_rates_does_not() -> None:
    records, nodes = cluster()
    agents = {"100": agent("100")}
    cache = SnapshotCache()
    first = snap(records, nodes, NOW, cache, agents=agents).managed["100"]
    same = agents["100"].report
    assert same is not None
    agents["100"].accept_report(dataclasses.replace(same, generation=2, history=({"event": "x"},), received_at=NOW + 4))
    assert snap(records, nodes, NOW + 5, cache, agents=agents).managed["100"] is first
    faster = {**same.throughput, 8: 390.0}
    agents["100"].accept_report(dataclasses.replace(same, throughput=faster, received_at=NOW + 9))
    rebuilt = snap(records, nodes, NOW + 10, cache, agents=agents)
    assert rebuilt.managed["100"] is not first
    assert rebuilt.snapshot == snap(records, nodes, NOW + 10, None, agents=agents).snapshot
