"""The simulator's executor: one case per action type, each checking the change in the simulated cluster."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

import slurm_amoeba.policy.actions as act
from slurm_amoeba.policy import Snapshot, make_policy
from slurm_amoeba.sim.data import SimError
from slurm_amoeba.sim.engine import SimConfig, Simulator, trace_models
from slurm_amoeba.sim.executor import SimExecutor
from slurm_amoeba.sim.metrics import SimResult
from slurm_amoeba.sim.workload import JobSpec

#: A job that keeps the cluster busy, so that a round without a start never looks like a stuck run.
_BUSY = JobSpec("busy", 0, 1, duration=10_000)


class _Script:
    """Plays back fixed actions at given ticks (after FIFO's at tick 0, with ``fifo``) and records what it saw."""

    name = "script"
    decides_on_events_only = False
    emits: frozenset[type[act.Action]] = frozenset(act.ACTION_TYPES)

    def __init__(self, plan: Mapping[float, Sequence[act.Action]], fifo: bool = False) -> None:
        self.plan = plan
        self.fifo = make_policy("fifo") if fifo else None
        self.seen: dict[float, dict[str, tuple[int, bool, int, str | None]]] = {}

    def decide(self, snapshot: Snapshot, now: float) -> list[act.Action]:
        self.seen[now] = {job.job_id: (job.workers, job.held, job.priority, job.shared_with) for job in snapshot.jobs}
        actions = list(self.plan.get(now, []))
        if now == 0.0:
            actions.append(act.Start("busy", 1, {"node002": 1}))
        if self.fifo is not None:
            planned = {action.job_id for action in actions}
            actions += [action for action in self.fifo.decide(snapshot, now) if action.job_id not in planned]
        return actions


def _run(
    jobs: Sequence[JobSpec], script: _Script, horizon: float = 150.0, check: bool = True
) -> tuple[Simulator, SimResult]:
    sim = Simulator([*jobs, _BUSY], script, SimConfig(nodes=3, horizon=horizon, check=check), trace_models({}, 4))
    return sim, sim.run()


def _record(result: SimResult, name: str) -> tuple[int, int, int]:
    (record,) = [record for record in result.jobs if record.name == name]
    return record.resizes, record.preemptions, record.restarts


def test_the_executor_applies_every_action_type() -> None:
    assert SimExecutor(Simulator([_BUSY], _Script({}), SimConfig(), trace_models({}, 4))).applies == set(
        act.ACTION_TYPES
    )


def test_a_start_places_the_job_where_the_policy_said() -> None:
    sim, _ = _run([JobSpec("a", 0, 2, duration=1000)], _Script({0.0: [act.Start("a", 2, {"node001": 2})]}))
    assert sim.placement_of("a") == {"node001": 2}
    assert sim.free_by_node()["node001"] == 2


def test_a_resize_changes_the_size_and_counts_a_resize() -> None:
    job = JobSpec("e", 0, 2, duration=1000, min_workers=1, max_workers=4)
    sim, result = _run(
        [job], _Script({0.0: [act.Start("e", 2, {"node000": 2})], 60.0: [act.Resize("e", 4, {"node000": 4})]})
    )
    assert sim.workers_of("e") == 4 and sim.free_by_node()["node000"] == 0
    assert _record(result, "e") == (1, 0, 0)


def test_a_preempt_gives_the_gpus_back_and_the_job_waits_again() -> None:
    sim, result = _run(
        [JobSpec("a", 0, 2, duration=1000)], _Script({0.0: [act.Start("a", 2)], 60.0: [act.Preempt("a")]})
    )
    assert sim.workers_of("a") == 0 and sim.free_by_node()["node000"] + sim.free_by_node()["node001"] == 8
    assert _record(result, "a") == (0, 1, 0)


def test_a_place_keeps_the_size_on_new_nodes_and_counts_a_restart() -> None:
    plan: dict[float, list[act.Action]] = {
        0.0: [act.Start("a", 2, {"node000": 2})],
        60.0: [act.Place("a", {"node001": 2})],
    }
    sim, result = _run([JobSpec("a", 0, 2, duration=1000)], _Script(plan))
    assert sim.placement_of("a") == {"node001": 2} and sim.free_by_node()["node000"] == 4
    assert _record(result, "a") == (0, 0, 1)


def test_a_share_runs_the_guest_on_its_hosts_gpus() -> None:
    jobs = [JobSpec("h", 0, 4, duration=1000), JobSpec("g", 0, 2, duration=1000)]
    script = _Script({0.0: [act.Start("h", 4, {"node000": 4})], 60.0: [act.Share("g", "h", 2, {"node000": 2})]})
    sim, _ = _run(jobs, script)
    assert sim.placement_of("g") == {"node000": 2} and sim.free_by_node()["node000"] == 0
    assert script.seen[120.0]["g"][3] == "h"


def test_a_move_takes_the_workers_off_the_node_to_the_most_free_ones_at_a_resizes_cost() -> None:
    job = JobSpec("e", 0, 4, duration=1000, min_workers=1, max_workers=4)
    plan: dict[float, list[act.Action]] = {
        0.0: [act.Start("e", 4, {"node000": 2, "node001": 2})],
        60.0: [act.Move("e", "node000", 2, "busy")],
    }
    sim, result = _run([job], _Script(plan))
    assert sim.placement_of("e") == {"node001": 2, "node002": 2}, "node002 had the most free GPUs"
    assert sim.free_by_node()["node000"] == 4
    assert _record(result, "e") == (1, 0, 0)


def test_a_held_job_is_not_started_by_fifo() -> None:
    script = _Script({0.0: [act.Hold("a")]}, fifo=True)
    sim, _ = _run([JobSpec("a", 0, 2, duration=1000)], script)
    assert script.seen[60.0]["a"][:2] == (0, True)
    assert sim.workers_of("a") == 0, "a held job waits whatever the free GPUs"


def test_a_release_lets_fifo_start_the_job() -> None:
    script = _Script({0.0: [act.Hold("a")], 60.0: [act.Release("a")]}, fifo=True)
    sim, _ = _run([JobSpec("a", 0, 2, duration=1000)], script, horizon=200.0)
    assert script.seen[60.0]["a"][:2] == (0, True)
    assert sim.workers_of("a") == 2


def test_set_priority_changes_the_priority_the_policy_sees() -> None:
    script = _Script({0.0: [act.SetPriority("a", 7)]})
    _run([JobSpec("a", 0, 2, duration=1000)], script)
    assert script.seen[0.0]["a"][2] == 0
    assert script.seen[60.0]["a"][2] == 7


def test_a_move_without_room_elsewhere_stops_the_run() -> None:
    jobs = [JobSpec("e", 0, 4, duration=1000, min_workers=1, max_workers=4), JobSpec("f", 0, 7, duration=1000)]
    plan: dict[float, list[act.Action]] = {
        0.0: [act.Start("e", 4, {"node000": 4}), act.Start("f", 7, {"node001": 4, "node002": 3})],
        60.0: [act.Move("e", "node000", 4, "busy")],
    }
    with pytest.raises(SimError, match="no room on other nodes for its 4 workers on node000"):
        _run(jobs, _Script(plan), check=False)
