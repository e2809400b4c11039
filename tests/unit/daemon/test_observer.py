"""From Slurm's records and the agents' reports to the policy's snapshot (pure functions, no Slurm)."""

from __future__ import annotations

from collections.abc import Sequence

from slurm_amoeba.daemon.agents import AgentRecord, InFlight, Registration, Report
from slurm_amoeba.daemon.observer import ClusterView, Observation, satellite_parent
from slurm_amoeba.daemon.snapshot import build_snapshot, fit_placement
from slurm_amoeba.policy import Action, JobPhase, Resize, check_actions, make_policy
from slurm_amoeba.slurm import JobRecord, NodeRecord
from slurm_amoeba.slurm import JobState as SlurmState
from tests.unit.daemon.fakes import ME, OTHER_UID, job, node, satellite

NOW = 10_000.0


def agent(job_id: str, low: int = 2, high: int = 8, size: int | None = 2, target: int | None = None) -> AgentRecord:
    reg = Registration(job_id, "tcp://127.0.0.1:5000", low, high, 1, "batch", "elastic")
    record = AgentRecord(registration=reg, uid=ME, user="alice", registered_at=NOW - 30)
    if size is not None:
        report = Report(size, 1, size if target is None else target, {2: 100.0, 4: 190.0, 8: 350.0}, (), (), NOW - 1)
        record.accept_report(report)
    return record


def snapshot_of(
    jobs: list[JobRecord],
    nodes: list[NodeRecord],
    agents: dict[str, AgentRecord],
    pinned: tuple[str, ...] = (),
    make_room_after_s: float = 0.0,
) -> Observation:
    view = ClusterView(tuple(jobs), tuple(nodes), NOW)
    return build_snapshot(
        view,
        agents,
        pinned=pinned,
        regular_partitions=["batch"],
        elastic_partition="elastic",
        stale_after_s=10.0,
        now=NOW,
        make_room_after_s=make_room_after_s,
    )


def elastic_job(leader: int = 100, gpus: dict[str, int] | None = None) -> list[JobRecord]:
    """A heterogeneous elastic job: component 0 the agent (no GPU), component 1 the minimum workers."""
    return [
        job(leader, het_job_id=leader, het_job_offset=0, gpus={}),
        job(leader + 1, het_job_id=leader, het_job_offset=1, gpus=gpus or {"n1": 2}),
    ]


def test_satellites_are_recognised_by_the_agents_name_and_comment() -> None:
    assert satellite_parent(satellite(7, 100)) == "100"
    assert satellite_parent(job(7, name="amoeba-sat-100-g2")) == "100"  # no comment: the name decides
    assert satellite_parent(job(7, name="amoeba-sat-100-g2", comment="amoeba-parent=99")) is None
    assert satellite_parent(job(7, name="train")) is None


def test_a_managed_job_counts_its_satellites_and_its_agents_size() -> None:
    jobs = [*elastic_job(), satellite(200, 100, gpus={"n2": 1}), satellite(201, 100, group="g2", gpus={"n2": 1})]
    obs = snapshot_of(jobs, [node("n1", used=2), node("n2", used=2)], {"100": agent("100", size=4)})
    info = obs.managed["100"]
    assert (info.workers, info.min_workers, info.max_workers) == (4, 2, 8)
    assert dict(info.placement) == {"n1": 2, "n2": 2}
    assert info.is_resizable
    assert [j.job_id for j in obs.snapshot.jobs] == ["100"]  # satellites are part of their parent, not jobs
    assert obs.orphans == () and obs.gone == ()


def test_a_job_is_resizing_while_its_agent_moves_a_satellite_pends_or_a_resize_is_in_flight() -> None:
    nodes = [node("n1", used=2), node("n2")]
    moving = snapshot_of(elastic_job(), nodes, {"100": agent("100", size=2, target=3)})
    assert moving.managed["100"].resizing
    pending_sat = snapshot_of(
        [*elastic_job(), satellite(200, 100, state=SlurmState.PENDING)], nodes, {"100": agent("100")}
    )
    assert pending_sat.managed["100"].resizing
    ordered = agent("100")
    ordered.in_flight = InFlight(target=4, ordered_at=NOW - 2, source="policy", reason="test")
    assert snapshot_of(elastic_job(), nodes, {"100": ordered}).managed["100"].resizing
    silent = agent("100")
    assert silent.report is not None
    silent.report = Report(2, 1, 2, {}, (), (), NOW - 60)
    assert snapshot_of(elastic_job(), nodes, {"100": silent}).managed["100"].resizing
    never = agent("100", size=None)
    info = snapshot_of(elastic_job(), nodes, {"100": never}).managed["100"]
    assert info.resizing and info.workers == 2  # sized from Slurm until the agent reports


def test_pending_regular_jobs_wait_for_gpus_but_held_ones_and_the_elastic_partitions_do_not() -> None:
    jobs = [
        *elastic_job(),
        job(300, state=SlurmState.PENDING, gpus_per_node=4, node_count=2, reason="Resources"),
        job(301, state=SlurmState.PENDING, gpus_per_node=4, reason="JobHeldUser"),
        job(302, state=SlurmState.PENDING, gpus_per_node=4, partition="elastic"),
        job(303, state=SlurmState.PENDING, gpus_per_node=0),
        job(304, gpus={"n2": 3}),
    ]
    obs = snapshot_of(jobs, [node("n1", used=2), node("n2", used=3)], {"100": agent("100")})
    pending = obs.snapshot.pending()
    assert [(j.job_id, j.requested_workers) for j in pending] == [("300", 8)]
    running = {j.job_id: j for j in obs.snapshot.running()}
    assert running["304"].workers == 3 and not running["304"].is_elastic
    assert (obs.regular_pending, obs.regular_running) == (1, 1)


def test_a_satellite_whose_parent_is_gone_is_an_orphan_and_still_holds_its_gpus() -> None:
    obs = snapshot_of([satellite(200, 100, gpus={"n2": 2})], [node("n1"), node("n2", used=2)], {})
    assert [(s.job_id, s.parent, s.gpus) for s in obs.orphans] == [("200", "100", 2)]
    assert obs.snapshot.job("200").workers == 2


def test_a_satellite_of_another_user_is_not_counted_for_the_parent() -> None:
    jobs = [*elastic_job(), satellite(200, 100, uid=OTHER_UID, user="mallory", gpus={"n2": 2})]
    obs = snapshot_of(jobs, [node("n1", used=2), node("n2", used=2)], {"100": agent("100")})
    assert dict(obs.managed["100"].placement) == {"n1": 2}
    assert obs.snapshot.job("200").owner == "mallory"


def test_a_satellite_the_agent_does_not_list_is_unclaimed() -> None:
    record = agent("100", size=3)
    assert record.report is not None
    record.report = Report(3, 1, 3, {}, ("201",), (), NOW)
    jobs = [*elastic_job(), satellite(200, 100, gpus={"n2": 1}, submit_time=int(NOW) - 100)]
    obs = snapshot_of(jobs, [node("n1", used=2), node("n2", used=1)], {"100": record})
    assert [s.job_id for s in obs.unclaimed] == ["200"]


def test_registered_jobs_slurm_no_longer_runs_are_gone() -> None:
    finished = [job(100, state=SlurmState.COMPLETED)]
    assert snapshot_of(finished, [node("n1")], {"100": agent("100")}).gone == ("100",)


def test_pins_reach_the_policy() -> None:
    obs = snapshot_of(elastic_job(), [node("n1", used=2)], {"100": agent("100")}, pinned=("100",))
    assert obs.managed["100"].pinned and not obs.managed["100"].is_resizable


def test_fit_placement_always_adds_up_to_the_size() -> None:
    assert fit_placement({"n1": 2, "n2": 1}, 1, 3) == {"n1": 2, "n2": 1}
    assert sum(fit_placement({"n1": 2, "n2": 1}, 1, 2).values()) == 2
    assert fit_placement({"n1": 2}, 1, 4) == {"n1": 4}
    assert fit_placement({"n1": 4, "n2": 2}, 2, 3) == {"n1": 2, "n2": 1}
    assert fit_placement({}, 1, 2) == {}


def resized(actions: Sequence[Action]) -> list[tuple[str, int]]:
    """(job, size) of each action, every one of which must be a resize."""
    assert all(isinstance(action, Resize) for action in actions), actions
    return [(action.job_id, action.workers) for action in actions if isinstance(action, Resize)]


def test_the_default_policy_grows_into_idle_gpus_and_shrinks_for_a_pending_regular_job() -> None:
    policy = make_policy("elastic-backfill", start_pending=False)
    nodes = [node("n1", used=2), node("n2")]
    idle = snapshot_of(elastic_job(), nodes, {"100": agent("100")})
    decisions = policy.decide(idle.snapshot, NOW)
    check_actions(idle.snapshot, decisions)
    assert resized(decisions) == [("100", 8)]  # 2 held + 6 idle GPUs
    jobs = [
        *elastic_job(),
        satellite(200, 100, gpus={"n2": 4}),
        job(300, state=SlurmState.PENDING, gpus_per_node=4, reason="Resources", submit_time=int(NOW) - 60),
    ]
    busy = snapshot_of(jobs, [node("n1", used=2), node("n2", used=4)], {"100": agent("100", size=6)})
    assert busy.snapshot.job("300").state is JobPhase.PENDING
    decisions = policy.decide(busy.snapshot, NOW)
    check_actions(busy.snapshot, decisions)
    assert resized(decisions) == [("100", 4)]


def test_gpus_a_job_is_giving_back_are_shown_free_so_nobody_else_shrinks_for_them() -> None:
    # The agent reports 2 workers (a satellite was preempted or shrunk) but Slurm still lists the satellite.
    jobs = [*elastic_job(), satellite(200, 100, gpus={"n2": 4}), job(300, state=SlurmState.PENDING, gpus_per_node=4)]
    nodes = [node("n1", used=2), node("n2", used=4)]
    obs = snapshot_of(jobs, nodes, {"100": agent("100", size=2)})
    assert obs.snapshot.free_by_node() == {"n1": 2, "n2": 4}
    assert dict(obs.managed["100"].placement) == {"n1": 2}
    growing = snapshot_of(jobs, nodes, {"100": agent("100", size=2, target=6)})
    assert growing.snapshot.free_by_node() == {"n1": 2, "n2": 0}  # a satellite whose workers are still joining
    ordered = agent("100", size=2)  # its last report predates the grow order the daemon just sent
    ordered.in_flight = InFlight(target=6, ordered_at=NOW - 1, source="policy", reason="test", acknowledged=True)
    assert snapshot_of(jobs, nodes, {"100": ordered}).snapshot.free_by_node() == {"n1": 2, "n2": 0}


def test_a_young_pending_job_asks_only_for_what_is_free_until_it_has_waited_long_enough() -> None:
    young = job(300, state=SlurmState.PENDING, gpus_per_node=4, submit_time=int(NOW) - 2)
    jobs = [*elastic_job(), satellite(200, 100, gpus={"n2": 4}), young]
    nodes = [node("n1", used=2), node("n2", used=4)]
    policy = make_policy("elastic-backfill", start_pending=False)
    fresh = snapshot_of(jobs, nodes, {"100": agent("100", size=6)}, make_room_after_s=5)
    assert fresh.snapshot.job("300").requested_workers == 2  # holds back the 2 free GPUs, shrinks nobody
    assert policy.decide(fresh.snapshot, NOW) == []
    waited = snapshot_of(jobs, nodes, {"100": agent("100", size=6)}, make_room_after_s=1)
    assert waited.snapshot.job("300").requested_workers == 4
    assert resized(policy.decide(waited.snapshot, NOW)) == [("100", 4)]
