"""The agent's loop, a few rounds at a time, against a Slurm in memory and a coordinator view the test edits.

Each round is what :meth:`Agent.round` does in the loop: observe, plan, apply. The tests check what reaches Slurm
(sbatch scripts and their environment, scancel), what reaches the coordinator (leave requests, deaths), and the
agent's bookkeeping and history.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_amoeba.agent.agent import Agent
from slurm_amoeba.agent.config import AgentConfig
from slurm_amoeba.agent.groups import GroupState
from slurm_amoeba.agent.plan import PlaceBeside
from slurm_amoeba.agent.status import adaptive_fields, memory_gib
from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.core.messages import MAX_MEMORY_GIB, MAX_NOISE_SCALE, MAX_STEP_TIMES, Message, decode, encode
from slurm_amoeba.core.sharing import ShareRole
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.runtime.failures import FailureClass
from slurm_amoeba.runtime.membership import Phase, WorkerStatus
from slurm_amoeba.runtime.share import ShareDirective
from slurm_amoeba.slurm import JobState
from tests.unit.agent.fakes import PARENT, FakeClock, FakeCoordinator, FakeSlurm, FakeSteps
from tests.unit.test_messages import PLACE

Parts = tuple[Agent, FakeSlurm, FakeCoordinator, FakeSteps, FakeClock]


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
    slurm, coordinator, steps, clock = FakeSlurm(), FakeCoordinator(), FakeSteps(), FakeClock()
    agent = Agent(config, slurm, coordinator=coordinator, step_starter=steps, clock=clock)
    agent.start_main_group()
    coordinator.members("g0-0", "g0-1")
    yield agent, slurm, coordinator, steps, clock
    agent.shutdown()


def rounds(agent: Agent, clock: FakeClock, count: int = 1) -> int | None:
    """Run ``count`` rounds two seconds apart (each polls Slurm); the first exit status, if the job ended."""
    for _ in range(count):
        status = agent.round()
        clock.advance(2.0)
        if status is not None:
            return status
    return None


def grow_into_a_running_satellite(parts: Parts, target: int, node: str = "") -> None:
    """Grow to ``target`` with one satellite (job 101, group g1) that Slurm starts (on ``node``, when given) and whose
    workers join."""
    agent, slurm, coordinator, _, clock = parts
    agent.resize(target)
    rounds(agent, clock)
    slurm.set_state(101, JobState.RUNNING)
    if node:
        slurm.records[101] = dataclasses.replace(slurm.records[101], nodes=(node,))
    coordinator.members(*(f"g1-{i}" for i in range(target - 2)))
    rounds(agent, clock)


def events(agent: Agent) -> list[str]:
    return [e["event"] for e in agent.journal.history]


def test_the_main_group_runs_the_minimum_workers_in_the_worker_component(parts: Parts) -> None:
    agent, _, _, steps, _ = parts
    (main,) = steps.started
    assert (main.options.ntasks, main.options.het_group, main.options.gpus_per_task) == (2, 1, 1)
    assert main.command == [sys.executable, "-m", "slurm_amoeba.agent.entry", "worker", "--group", "g0", "--",
                            "python", "train.py"]  # fmt: skip
    assert main.env["AMOEBA_PARENT_JOB"] == str(PARENT) and main.env["AMOEBA_STORE_ADDR"] == "10.0.0.1"
    assert [g.name for g in agent.groups] == ["g0"] and agent.planned_size() == 2


def test_a_grow_submits_a_satellite_that_carries_the_parents_account_qos_and_features(parts: Parts) -> None:
    agent, slurm, _, _, clock = parts
    agent.resize(4, "idle GPUs")
    assert rounds(agent, clock) is None
    (sub,) = slurm.submissions
    assert "#SBATCH --job-name=amoeba-sat-42-g1" in sub.script and "#SBATCH --partition=elastic" in sub.script
    assert "#SBATCH --comment=amoeba-parent=42" in sub.script and "#SBATCH --ntasks=2" in sub.script
    for line in ("--account=physics", "--qos=high", "--constraint=a100"):
        assert f"#SBATCH {line}\n" in sub.script
    assert "--reservation" not in sub.script
    # The satellite is a job of its own: none of the parent's SLURM_* variables, but the cluster and the store.
    assert not [k for k in sub.env if k.startswith("SLURM_") and k != "SLURM_CONF"]
    assert sub.env["SLURM_CONF"] == "/etc/slurm/slurm.conf" and sub.env["AMOEBA_STORE_ADDR"] == "10.0.0.1"
    assert sub.env["AMOEBA_PARENT_JOB"] == str(PARENT)
    assert [(g.name, g.slurm_job, g.state) for g in agent.groups][1:] == [("g1", 101, GroupState.PENDING)]
    assert events(agent)[-2:] == ["resize_requested", "satellite_submitted"]


def test_a_satellite_that_slurm_starts_runs_and_its_wait_is_recorded(parts: Parts) -> None:
    agent, slurm, _, _, clock = parts
    agent.resize(4)
    rounds(agent, clock)
    slurm.set_state(101, JobState.RUNNING)
    rounds(agent, clock, 2)
    assert agent.groups[1].state is GroupState.RUNNING and agent.groups[1].running_at == 1_002.0
    running = [e for e in agent.journal.history if e["event"] == "satellite_running"]
    assert len(running) == 1 and running[0]["waited_s"] == 2.0


def test_a_grow_beyond_one_node_takes_one_satellite_per_node(parts: Parts) -> None:
    agent, slurm, _, _, clock = parts
    agent.resize(8)
    rounds(agent, clock)
    assert ["#SBATCH --ntasks=4" in s.script for s in slurm.submissions] == [True, False]
    assert "#SBATCH --ntasks=2" in slurm.submissions[1].script and agent.planned_size() == 8


def test_a_refused_satellite_lowers_the_target_and_is_not_retried(parts: Parts) -> None:
    agent, slurm, _, _, clock = parts
    slurm.refuse = True
    agent.resize(8)
    rounds(agent, clock, 3)
    assert slurm.submissions == [] and agent.target == 2
    assert events(agent).count("grow_failed") == 1


def test_a_preempted_satellite_is_released_its_workers_marked_dead_and_the_target_follows(parts: Parts) -> None:
    agent, slurm, coordinator, _, clock = parts
    grow_into_a_running_satellite(parts, 4)
    slurm.set_state(101, JobState.CANCELLED, "Preempted")
    rounds(agent, clock)
    assert slurm.cancelled == [101] and [w for w, _ in coordinator.deaths] == ["g1-0", "g1-1"]
    assert agent.groups[1].end_reason == "preempted" and agent.target == 2
    rounds(agent, clock, 2)
    assert len(slurm.submissions) == 1, "the job does not fight Slurm for a preempted satellite"


def test_a_shrink_asks_workers_to_leave_then_releases_their_satellite(parts: Parts) -> None:
    agent, slurm, coordinator, _, clock = parts
    grow_into_a_running_satellite(parts, 4)
    agent.resize(2, "a regular job waits")
    rounds(agent, clock)
    assert coordinator.leave_requests == ["g1-0", "g1-1"] and slurm.cancelled == []
    assert agent.groups[1].state is GroupState.LEAVING and agent.planned_size() == 2
    coordinator.statuses.update({"g1-0": WorkerStatus.LEFT, "g1-1": WorkerStatus.LEFT})
    rounds(agent, clock)
    assert slurm.cancelled == [101] and agent.groups[1].end_reason == "shrink" and coordinator.deaths == []


def test_a_dead_worker_retires_its_group_and_the_job_regrows_without_its_node(parts: Parts) -> None:
    agent, slurm, coordinator, _, clock = parts
    grow_into_a_running_satellite(parts, 4, "n3")
    coordinator.statuses["g1-0"] = WorkerStatus.DEAD
    rounds(agent, clock)
    # A worker that died without a word is an infrastructure failure: the target stays, a satellite replaces it.
    assert coordinator.leave_requests == ["g1-1"] and agent.target == 4
    assert events(agent)[-3:] == ["worker_lost", "group_retired", "satellite_submitted"]
    assert agent.groups[1].failure is FailureClass.INFRASTRUCTURE
    assert agent.groups[1].nodes == ("n3",)
    assert "#SBATCH --exclude=n3" in slurm.submissions[-1].script
    coordinator.statuses["g1-1"] = WorkerStatus.LEFT
    rounds(agent, clock)
    # The survivors were asked to leave: their satellite goes as after a shrink, without lowering anything.
    assert slurm.cancelled == [101] and agent.groups[1].end_reason == "shrink" and agent.target == 4


def test_a_failed_squeue_decides_nothing(parts: Parts) -> None:
    agent, slurm, _, _, clock = parts
    agent.resize(3)
    rounds(agent, clock)
    slurm.down = True
    slurm.forget(101)
    rounds(agent, clock, 2)
    assert agent.groups[1].state is GroupState.PENDING and slurm.cancelled == []
    slurm.down = False
    rounds(agent, clock)
    assert agent.groups[1].end_reason == "satellite gone" and agent.target == 2


def test_an_unknown_node_size_grows_one_worker_per_satellite(parts: Parts) -> None:
    agent, slurm, _, _, clock = parts
    slurm.sinfo_down = True
    agent.resize(4)
    rounds(agent, clock)
    assert ["#SBATCH --ntasks=1" in s.script for s in slurm.submissions] == [True, True]


def test_training_finished_stops_a_lingering_main_step_after_the_grace(parts: Parts) -> None:
    agent, _, coordinator, steps, clock = parts
    coordinator.phase = Phase.FINISHED
    coordinator.statuses.update({"g0-0": WorkerStatus.DONE, "g0-1": WorkerStatus.DEAD})
    agent.resize(6)
    assert rounds(agent, clock, 15) is None and steps.started[0].signals == []
    assert agent.planned_size() == 2, "no resize after the end"
    assert rounds(agent, clock, 2) == 143
    assert steps.started[0].signals == [signal.SIGTERM] and events(agent)[-1] == "main_group_stopped"


def test_the_main_groups_status_ends_the_job(parts: Parts) -> None:
    agent, _, _, steps, clock = parts
    steps.started[0].status = 0
    assert rounds(agent, clock) == 0 and events(agent)[-1] == "main_group_ended"


def test_a_stop_ends_the_job_and_shutdown_releases_every_satellite(parts: Parts) -> None:
    agent, slurm, coordinator, steps, clock = parts
    grow_into_a_running_satellite(parts, 6)
    agent.stop("signal SIGTERM")
    assert rounds(agent, clock) == 143
    agent.shutdown()
    assert sorted(slurm.cancelled) == [101] and {w for w, _ in coordinator.deaths} == {"g1-0", "g1-1", "g1-2", "g1-3"}
    assert all(g.state is GroupState.ENDED for g in agent.groups[1:]) and coordinator.closed
    assert steps.started[0].signals == [signal.SIGTERM]
    agent.shutdown()
    assert sorted(slurm.cancelled) == [101], "a second shutdown releases nothing twice"


def test_a_resize_outside_the_range_is_refused_with_the_range(parts: Parts) -> None:
    agent = parts[0]
    for target in (1, 9):
        with pytest.raises(SpecError, match=r"outside this job's range 2\.\.8"):
            agent.resize(target)
    assert agent.target == 2


def test_the_status_document_shows_groups_target_and_history(parts: Parts) -> None:
    agent, _, coordinator, _, clock = parts
    agent.resize(3)
    rounds(agent, clock)
    agent.write_status(coordinator.view())
    status = agent.status()
    assert (status["job_id"], status["target"], status["phase"]) == (str(PARENT), 3, "running")
    assert [g["name"] for g in status["groups"]] == ["g0", "g1"] and status["groups"][1]["state"] == "pending"
    assert (agent.config.state_dir / "agent-status.json").is_file()


ADAPTIVE_PROGRESS = {
    "global_batch": 64,
    "base_batch": 32,
    "max_batch": 512,
    "noise_scale": 250.5,
    "grad_variance": 1.0,
    "grad_sq": 0.004,
    "efficiency": 0.8,
    "gain": 1.6,
    "lr_rule": "adascale",
    "lr_factor": 1.6,
    "scaled_steps": 10.0,
    "measured_steps": 40,
    "batch_source": "runtime",
    "policy_batch": None,
    "step_time_s": [[2, 32, 0.05, 10], [2, 64, 0.08, 30]],
}


def test_an_adaptive_jobs_report_carries_its_statistics_bounded(parts: Parts, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, _, coordinator, _, _ = parts
    sent: list[dict[str, object]] = []
    monkeypatch.setattr(agent.link, "endpoint", "tcp://127.0.0.1:1")
    monkeypatch.setattr(agent.link, "report", lambda body: sent.append(dict(body)))
    agent.report_to_daemon(coordinator.view())
    assert "adaptive" not in sent[-1], "a fixed-batch job reports no statistics"
    many = [[w, b, 0.01 * w, w + b] for w in range(1, 9) for b in (32, 64, 128, 256, 512)]
    coordinator.progress = {"adaptive": {**ADAPTIVE_PROGRESS, "step_time_s": many, "noise_scale": 1e300}}
    agent.report_to_daemon(coordinator.view())
    adaptive = sent[-1]["adaptive"]
    assert isinstance(adaptive, dict)
    assert adaptive["global_batch"] == 64 and adaptive["noise_scale"] == MAX_NOISE_SCALE
    assert len(adaptive["step_time_s"]) == MAX_STEP_TIMES and "lr_rule" not in adaptive
    decode(encode(Message("report", sent[-1])))  # what the daemon's door accepts
    for broken in (
        {**ADAPTIVE_PROGRESS, "global_batch": 16},  # below the initial batch
        {**ADAPTIVE_PROGRESS, "max_batch": 1 << 30},
        {**ADAPTIVE_PROGRESS, "base_batch": True},
        "not an object",
    ):
        assert adaptive_fields({"adaptive": broken}) is None, broken
    odd = adaptive_fields(
        {"adaptive": {**ADAPTIVE_PROGRESS, "noise_scale": float("nan"), "step_time_s": [[0, 1, 1.0, 1], [1, 2, -1, 1]]}}
    )
    assert odd is not None and odd["noise_scale"] is None and odd["step_time_s"] == []


def test_a_sharing_jobs_report_states_the_memory_its_worker_peaked_at_in_gib_once_measured(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, _, coordinator, _, _ = parts
    sent: list[dict[str, object]] = []
    monkeypatch.setattr(agent.link, "endpoint", "tcp://127.0.0.1:1")
    monkeypatch.setattr(agent.link, "report", lambda body: sent.append(dict(body)))
    coordinator.progress = {"share": {"role": "guaranteed", "memory_peak_bytes": None}}
    agent.report_to_daemon(coordinator.view())
    assert "memory_gib" not in sent[-1], "nothing measured yet: nothing stated"
    coordinator.progress = {"share": {"role": "guaranteed", "memory_peak_bytes": (12 << 30) + 1}}
    agent.report_to_daemon(coordinator.view())
    assert sent[-1]["memory_gib"] == 12 + 1 / 1024, "rounded up to a whole MiB: never less than the worker holds"
    assert decode(encode(Message("report", sent[-1]))).body["memory_gib"] == sent[-1]["memory_gib"]
    assert agent.status(coordinator.view())["memory_gib"] == sent[-1]["memory_gib"]


@pytest.mark.parametrize(
    "share",
    [None, "not an object", {}, {"memory_peak_bytes": -1}, {"memory_peak_bytes": True}, {"memory_peak_bytes": 2.5}],
)
def test_no_memory_is_stated_for_a_job_that_does_not_share_or_a_peak_that_is_not_a_byte_count(share: object) -> None:
    assert memory_gib({} if share is None else {"share": share}) is None


def test_a_memory_peak_beyond_what_the_daemon_takes_is_not_stated() -> None:
    assert memory_gib({"share": {"memory_peak_bytes": MAX_MEMORY_GIB << 30}}) == MAX_MEMORY_GIB
    assert memory_gib({"share": {"memory_peak_bytes": (MAX_MEMORY_GIB << 30) + 1}}) is None


def test_a_move_directive_vacates_the_node_once_and_keeps_the_size(parts: Parts) -> None:
    agent, slurm, coordinator, _, clock = parts
    grow_into_a_running_satellite(parts, 4, "n3")
    assert agent.groups[1].nodes == ("n3",)
    reply = decode(encode(Message("resize", {"job_id": str(PARENT), "target": 4, "reason": "r", "vacate": "n3"})))
    agent.resize(int(reply.body["target"]), str(reply.body["reason"]))
    agent.order_move(str(reply.body["vacate"]), str(reply.body["reason"]))
    rounds(agent, clock)
    assert coordinator.leave_requests == ["g1-0", "g1-1"] and agent.target == 4
    moved = slurm.submissions[-1].script
    assert "#SBATCH --exclude=n3" in moved and "#SBATCH --ntasks=2" in moved
    assert agent.planned_size() == 4 and events(agent).count("move_requested") == 1
    rounds(agent, clock, 2)  # taken once: no second leave, no second satellite
    assert coordinator.leave_requests == ["g1-0", "g1-1"] and len(slurm.submissions) == 2


#: A share as the daemon's directive carries it (core/messages.check_place_beside): one worker beside job 77 on s1.
ONE_BESIDE = {**PLACE, "nodes": {"s1": 1}}


def test_the_workers_placed_beside_a_host_get_an_opportunistic_directive_cleared_when_the_place_is_taken_back(
    parts: Parts,
) -> None:
    agent, slurm, coordinator, _, clock = parts
    order = {"job_id": str(PARENT), "target": 3, "reason": "pays", "place_beside": ONE_BESIDE}
    wire = decode(encode(Message("resize", order))).body
    agent.resize(int(wire["target"]), str(wire["reason"]))
    agent.order_beside(PlaceBeside.from_body(wire["place_beside"]), str(wire["reason"]))
    rounds(agent, clock)
    assert "#SBATCH --nodelist=s1" in slurm.submissions[-1].script and agent.groups[1].beside == "77"
    expected = ShareDirective(
        ShareRole.OPPORTUNISTIC,
        partner_status_path="/dev/shm/amoeba-share-77.json",
        partner_uid=1001,
        workers=("g1-0",),
        seq=1,
        pace_bound=0.05,
        sub_batch=8,
    )
    assert coordinator.shares == [expected], "published with the satellite: in force when its worker joins"
    slurm.set_state(101, JobState.RUNNING)
    coordinator.members("g1-0")
    rounds(agent, clock, 2)
    assert len(coordinator.shares) == 1, "published again only when it changes"

    agent.resize(2, "the host needs its GPU back")
    rounds(agent, clock)
    assert coordinator.leave_requests == ["g1-0"]
    cleared = coordinator.shares[-1]
    assert (cleared.role, cleared.workers, cleared.seq) == (ShareRole.OPPORTUNISTIC, ("g1-0",), 2)
    assert (cleared.partner_status_path, cleared.memory_cap_bytes, cleared.sub_batch) == ("", 0, 0)
    assert events(agent).count("share_directive") == 1 and events(agent).count("share_cleared") == 1
    rounds(agent, clock, 2)
    assert len(coordinator.shares) == 2, "cleared once"


def test_the_daemons_memory_cap_reaches_the_directive_of_the_workers_placed_beside_the_host_and_changes_live(
    parts: Parts,
) -> None:
    agent, slurm, coordinator, _, clock = parts
    order = {
        "job_id": str(PARENT),
        "target": 3,
        "reason": "pays",
        "place_beside": {**ONE_BESIDE, "memory_cap_bytes": 6 << 30},
    }
    wire = decode(encode(Message("resize", order))).body
    agent.resize(int(wire["target"]), str(wire["reason"]))
    agent.order_beside(PlaceBeside.from_body(wire["place_beside"]), str(wire["reason"]))
    rounds(agent, clock)
    published = coordinator.shares[-1]
    assert published.workers == ("g1-0",) and published.memory_cap_bytes == 6 << 30
    assert ShareDirective.from_json(published.to_json()).memory_cap_bytes == 6 << 30, "as the worker reads it"
    slurm.set_state(101, JobState.RUNNING)
    coordinator.members("g1-0")
    rounds(agent, clock)

    lower = {**order, "place_beside": {**ONE_BESIDE, "memory_cap_bytes": 4 << 30}}
    wire = decode(encode(Message("resize", lower))).body
    agent.resize(int(wire["target"]), str(wire["reason"]))
    agent.order_beside(PlaceBeside.from_body(wire["place_beside"]), str(wire["reason"]))
    rounds(agent, clock, 2)
    assert len(slurm.submissions) == 1, "the size kept: no second satellite"
    assert [s.memory_cap_bytes for s in coordinator.shares] == [6 << 30, 4 << 30], "the lower cap, published once"
    assert coordinator.shares[-1].workers == ("g1-0",) and coordinator.shares[-1].partner_uid == 1001

    elsewhere = {**order, "place_beside": {**ONE_BESIDE, "host": "78", "memory_cap_bytes": 1 << 30}}
    wire = decode(encode(Message("resize", elsewhere))).body
    agent.order_beside(PlaceBeside.from_body(wire["place_beside"]), str(wire["reason"]))
    rounds(agent, clock)
    assert coordinator.shares[-1].memory_cap_bytes == 4 << 30, "an order beside another host is not these terms"


def test_a_job_placed_nowhere_beside_another_publishes_no_share_directive(parts: Parts) -> None:
    agent, _, coordinator, _, clock = parts
    grow_into_a_running_satellite(parts, 4)
    agent.resize(2)
    rounds(agent, clock, 2)
    assert coordinator.shares == []
