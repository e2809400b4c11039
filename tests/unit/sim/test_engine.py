"""The event engine on small workloads whose outcome can be worked out by hand."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from slurm_amoeba.policy import Action, PolicyError, Resize, Share, Snapshot, Start, make_policy
from slurm_amoeba.sim.application import load_applications
from slurm_amoeba.sim.data import SimError
from slurm_amoeba.sim.engine import SimConfig, Simulator, trace_models
from slurm_amoeba.sim.workload import JobSpec


def _run(jobs: Sequence[JobSpec], policy: str, **config: float) -> Simulator:
    return Simulator(jobs, make_policy(policy), SimConfig(**config), trace_models({}, 4))  # type: ignore[arg-type]


def test_a_lone_job_waits_for_the_tick_pays_the_restart_and_runs_its_duration() -> None:
    result = _run([JobSpec("a", 10, 2, duration=100)], "fifo", nodes=1).run()
    (record,) = result.jobs
    assert record.first_start == 60
    assert record.completion == pytest.approx(60 + 30 + 100)
    assert result.summary()["avg_queue_s"] == pytest.approx(50)
    assert result.gpu_util() == pytest.approx(2 * 130 / (4 * 180))


def test_growing_pays_the_resize_cost_and_the_grow_lag_and_speeds_the_job_up() -> None:
    elastic = JobSpec("e", 0, 2, duration=400, min_workers=1, max_workers=4)
    regular = JobSpec("r", 0, 2, duration=50)
    ends = {}
    for cost, lag in ((1.0, 0.0), (30.0, 0.0), (0.01, 10.0)):
        result = _run([elastic, regular], "elastic-backfill", nodes=1, resize_cost=cost, grow_lag=lag).run()
        record = {job.name: job for job in result.jobs}
        ends[cost, lag] = record["e"].completion
        assert record["e"].resizes == 1
        assert record["r"].completion == pytest.approx(80)
    # e starts with 2 workers (its minimum plus the GPU r leaves), paused until 30; r finishes at 80, so at the
    # tick at 120 e grows to 4 workers (twice the speed) with 90 of its 400 done.
    assert ends[1.0, 0.0] == pytest.approx(120 + 1 + (400 - 90) / 2)
    assert ends[30.0, 0.0] == pytest.approx(120 + 30 + (400 - 90) / 2)
    # With a lag, it trains 10 s more at half the new speed: the same as pausing 5 s at the new speed.
    assert ends[0.01, 10.0] == pytest.approx(120 + 0.01 + 5 + (400 - 90) / 2)


def test_with_a_start_grow_lag_a_job_started_above_its_minimum_trains_at_its_minimum_until_the_lag() -> None:
    job = JobSpec("e", 0, 1, duration=400, min_workers=1, max_workers=4)
    records = {}
    for lag in (None, 50.0, 10.0):
        config = SimConfig(nodes=1, restart_cost=30.0, start_grow_lag=lag)
        policy = make_policy("amoebad")
        (records[lag],) = Simulator([job], policy, config, trace_models({}, 4)).run().jobs
    start = records[None].first_start
    assert start is not None and records[50.0].first_start == records[10.0].first_start == start
    # Started at 4 workers (the idle node): without a lag it pays only the start; with one it trains at 1 worker
    # (a quarter of the speed) from 30 to 50 s, the same as pausing 20 * 3/4 = 15 s at 4 workers, and counts a grow.
    assert records[None].completion == pytest.approx(start + 30 + 400 / 4)
    assert records[None].resizes == 0
    assert records[50.0].completion == pytest.approx(start + 30 + 15 + 400 / 4)
    assert records[50.0].resizes == 1
    # A lag shorter than the start itself costs nothing more: the extras are there before the first step.
    assert records[10.0].completion == pytest.approx(start + 30 + 400 / 4)


def test_a_guest_shares_its_hosts_gpus_and_runs_alone_once_the_host_is_done() -> None:
    jobs = [JobSpec("a", 0, 2, duration=100), JobSpec("b", 0, 2, duration=100)]
    result = _run(jobs, "sjf-ffs", nodes=1, gpus_per_node=2).run()
    done = {record.name: record.completion for record in result.jobs}
    # a: alone 30..60 (30 done), then at half speed: 70 left -> 200. b: joins at 60, paused to 90, half speed
    # until 200 (55 done), then alone: 45 left -> 245.
    assert done == pytest.approx({"a": 200.0, "b": 245.0})


def test_a_job_larger_than_the_cluster_is_refused_with_the_fix() -> None:
    with pytest.raises(SimError, match="job big requests 80 GPUs but the cluster has 64 .* use more --nodes"):
        _run([JobSpec("big", 0, 80, duration=1)], "fifo")


def test_an_elastic_job_whose_request_exceeds_the_cluster_is_refused_even_for_elastic_policies() -> None:
    with pytest.raises(SimError, match=r"job big \(line 7\) requests 80 GPUs"):
        _run([JobSpec("big", 0, 80, duration=1, min_workers=8, line=7)], "e-tiresias")


def test_an_unknown_application_is_refused() -> None:
    with pytest.raises(SimError, match="unknown application 'gpt'"):
        _run([JobSpec("x", 0, 1, "gpt", 64)], "fifo")


def test_the_horizon_leaves_late_jobs_unfinished() -> None:
    result = _run([JobSpec("a", 0, 1, duration=10), JobSpec("b", 0, 1, duration=10_000)], "fifo", horizon=600).run()
    assert result.summary()["unfinished"] == 1


def test_an_event_driven_policy_is_not_asked_between_events() -> None:
    jobs = [JobSpec("a", 0, 1, duration=10), JobSpec("b", 1_000_000, 1, duration=10)]
    sim = _run(jobs, "fifo")
    result = sim.run()
    assert result.decisions <= 4
    assert all(record.completion is not None for record in result.jobs)


class _Greedy:
    """A broken policy: starts every pending job whatever the room."""

    name = "greedy"
    decides_on_events_only = False
    emits: frozenset[type[Action]] = frozenset({Start})

    def decide(self, snapshot: Snapshot, now: float) -> list[Action]:
        node = snapshot.nodes[0].name
        return [Start(job.job_id, job.requested_workers, {node: job.requested_workers}) for job in snapshot.pending()]


def test_a_policy_that_over_commits_stops_the_run_with_the_invariant() -> None:
    jobs = [JobSpec("a", 0, 3, duration=10), JobSpec("b", 0, 3, duration=10)]
    sim = Simulator(jobs, _Greedy(), SimConfig(nodes=1), trace_models({}, 4))
    with pytest.raises(PolicyError, match="node node000 would hold 6 GPUs"):
        sim.run()


def test_trace_jobs_run_for_their_modelled_time(data_dir: Path) -> None:
    apps = load_applications(data_dir / "pollux" / "traces")
    spec = JobSpec("c", 0, 4, "cifar10", 512)
    sim = Simulator([spec], make_policy("fifo"), SimConfig(), trace_models(apps, 4))
    model = trace_models(apps, 4)(spec)
    result = sim.run()
    assert result.jobs[0].completion == pytest.approx(30 + model.remaining_seconds(0, 0.0), rel=1e-9)


@pytest.mark.parametrize(
    "bad", [{"nodes": 0}, {"interval": 0}, {"resize_cost": -1}, {"grow_lag": -1}, {"start_grow_lag": -1}]
)
def test_bad_cluster_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(SimError):
        SimConfig(**bad)  # type: ignore[arg-type]


class _Idle:
    """A broken policy: never starts anything."""

    name = "idle"
    decides_on_events_only = False
    emits: frozenset[type[Action]] = frozenset()

    def decide(self, snapshot: Snapshot, now: float) -> list[Action]:
        return []


def test_a_policy_that_leaves_jobs_waiting_on_an_idle_cluster_stops_the_run() -> None:
    sim = Simulator([JobSpec("a", 0, 1, duration=10)], _Idle(), SimConfig(nodes=1), trace_models({}, 4))
    with pytest.raises(SimError, match="policy idle starts none of the 1 waiting jobs on an idle cluster"):
        sim.run()


class _Script:
    """A policy that plays back fixed decisions at given ticks."""

    name = "script"
    decides_on_events_only = False
    emits: frozenset[type[Action]] = frozenset({Start, Resize, Share})

    def __init__(self, plan: dict[float, list[Action]]) -> None:
        self.plan = plan

    def decide(self, snapshot: Snapshot, now: float) -> list[Action]:
        return self.plan.get(now, [])


def test_a_host_that_grows_keeps_its_guest_and_the_gpus_add_up() -> None:
    jobs = [JobSpec("h", 0, 2, duration=1000, min_workers=2, max_workers=4), JobSpec("g", 0, 2, duration=1000)]
    plan: dict[float, list[Action]] = {
        0.0: [Start("h", 2, {"node000": 2})],
        60.0: [Share("g", "h", 2, {"node000": 2})],
        120.0: [Resize("h", 4, {"node000": 4})],
    }
    sim = Simulator(jobs, _Script(plan), SimConfig(nodes=1, horizon=200), trace_models({}, 4))
    result = sim.run()
    # Two GPUs held from 0, four from 120 (the guest's GPUs are the host's, never counted twice).
    assert result.usage[-1] == (120.0, 4)
    assert max(used for _, used in result.usage) == 4


def test_a_queue_depth_changes_nothing_for_fifo() -> None:
    jobs = [JobSpec(f"j{i:03d}", i * 7.0, 1 + i % 4, duration=50.0 + (i * 37) % 400) for i in range(120)]
    runs = [_run(jobs, "fifo", nodes=1, gpus_per_node=4, queue_depth=depth).run() for depth in (0, 3)]
    exact, shallow = ({record.name: record for record in run.jobs} for run in runs)
    assert exact == shallow
    assert max(record.first_start or 0.0 for record in exact.values()) > 10_000  # the queue really was long


class _ScriptedShare:
    """Starts the first job alone, then shares its GPUs with the second with the given plan; records snapshots."""

    name = "scripted-share"
    decides_on_events_only = True
    emits = frozenset({Start, Share})

    def __init__(self, sub_batch: int | None, accumulation: int | None, pace_bound: float | None) -> None:
        self.plan = (sub_batch, accumulation, pace_bound)
        self.seen: list[Snapshot] = []

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        self.seen.append(snapshot)
        if {job.job_id for job in snapshot.jobs} != {"a", "b"}:
            return []
        host = snapshot.job("a")
        guest = snapshot.job("b")
        if not host.workers:
            return [Start("a", 2, {"node000": 2})]
        if not guest.workers and host.shared_with is None:
            sub_batch, accumulation, pace_bound = self.plan
            return [Share("b", "a", 2, {"node000": 2}, "", sub_batch, accumulation, pace_bound)]
        return []


def test_a_paced_sharer_leaves_its_host_its_bound_and_takes_the_rest() -> None:
    jobs = [JobSpec("a", 0, 2, duration=100), JobSpec("b", 0, 2, duration=100)]
    policy = _ScriptedShare(None, None, 0.1)
    config = SimConfig(nodes=1, gpus_per_node=2)
    result = Simulator(jobs, policy, config, trace_models({}, 2), {("", ""): 0.5}).run()
    done = {record.name: record.completion for record in result.jobs}
    # a: alone 30..60 (30 done), then keeps 90 % (the bound), not the 50 % of the pair unpaced: 70 / 0.9 more.
    # b: joins at 60, paused to 90, runs at 0.1 / 0.5 of its co-located 0.5 until a is done, then alone.
    a_done = 60 + 70 / 0.9
    assert done["a"] == pytest.approx(a_done)
    assert done["b"] == pytest.approx(a_done + 100 - 0.1 * (a_done - 90))


def test_a_sharer_runs_the_shares_sub_batch_and_the_policy_sees_its_memory() -> None:
    apps = load_applications()
    app = apps["cifar10"]
    jobs = [JobSpec("a", 0, 2, "cifar10", 256), JobSpec("b", 0, 2, "cifar10", 256)]
    config = SimConfig(nodes=1, gpus_per_node=2)
    completion: dict[int, float] = {}
    for sub_batch in (128, 32):
        _, accumulation = app.plan_batch(256, 2, sub_batch)
        policy = _ScriptedShare(sub_batch, accumulation + 1, None)
        result = Simulator(jobs, policy, config, trace_models(apps, 2), {}).run()
        completion[sub_batch] = next(record.completion for record in result.jobs if record.name == "b") or 0.0
        shared = next(snap.job("b") for snap in policy.seen if snap.job("b").shared_with == "a")
        assert shared.memory_gib == pytest.approx(16.0 * sub_batch / app.max_local_batch)
        assert set(shared.micro_batches) >= {32, 128}, "the policy is shown the micro-batches it may search"
    assert completion[32] > completion[128], "a smaller micro-batch with more accumulation runs slower"
