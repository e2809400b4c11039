"""The daemon's executor: every action type is applied live (its effect on a fake Slurm and actuator) or refused."""

from __future__ import annotations

import dataclasses

import pytest

import slurm_amoeba.policy.actions as act
from slurm_amoeba.core.messages import Message, decode, encode
from slurm_amoeba.core.sharing import host_status_path
from slurm_amoeba.daemon.actuator import Actuator, Directive, QueueOrderer
from slurm_amoeba.daemon.admission import Admitter
from slurm_amoeba.daemon.agents import Beside, Registration, Report
from slurm_amoeba.daemon.config import Admission, DaemonConfig, QueueOrder, Sharing
from slurm_amoeba.daemon.executor import APPLIED, REFUSED, SHARING_OFF, LiveExecutor, live_refusal
from slurm_amoeba.daemon.ledger import Ledger
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.policy import JobInfo
from slurm_amoeba.slurm import JobState
from slurm_amoeba.slurm.marks import HoldMark
from tests.unit.daemon.fakes import ME, job, node
from tests.unit.daemon.test_admission import MemorySlurm
from tests.unit.policy.helpers import job as info

NOW = 2_000.0


class RecordingActuator(Actuator):
    """An actuator that keeps the directives instead of sending them."""

    def __init__(self) -> None:
        super().__init__(1, 1.0, 0)
        self.sent: list[Directive] = []

    def send(self, directive: Directive) -> None:
        self.sent.append(directive)


class World:
    """A ledger with job ``e`` registered (running 2 workers, range 1..4), an in-memory Slurm with pending job 7."""

    def __init__(self) -> None:
        self.metrics = DaemonMetrics()
        self.ledger = Ledger(DaemonConfig(), self.metrics, lambda: NOW)
        reg = Registration("e", "tcp://127.0.0.1:5000", 1, 4, 1, "batch", "elastic")
        self.ledger.register(reg, ME, "alice")
        self.ledger.agents["e"].report = Report(2, 1, 3, {}, (), (), NOW)
        self.slurm = MemorySlurm({7: job(7, state=JobState.PENDING, priority=500)}, [node("n0")])
        self.actuator = RecordingActuator()
        self.admitter = Admitter(Admission(enabled=True, holds_by="daemon"), self.slurm, self.metrics)
        self.orderer = QueueOrderer(QueueOrder(enabled=True), ("batch",), self.slurm, self.metrics)
        self.executor = LiveExecutor(
            self.ledger, self.actuator, self.metrics, admitter=self.admitter, orderer=self.orderer
        )
        self.jobs: dict[str, JobInfo] = {
            "e": info("e", 1, placement={"n0": 2}, low=1, high=4),
            "7": info("7", 2, priority=500, owner="bob"),
        }

    def apply(self, *actions: act.Action) -> dict[str, int]:
        done = self.executor.apply(actions, self.jobs, {"e"}, source="policy", now=NOW)
        self.executor.wait()
        return dict(done.ordered)


def test_every_action_type_is_either_applied_live_or_refused_with_its_reason() -> None:
    assert set(APPLIED) | set(REFUSED) == set(act.ACTION_TYPES)
    assert not set(APPLIED) & set(REFUSED)
    assert all(reason.strip() for reason in [*APPLIED.values(), *REFUSED.values()])


def test_a_resize_is_a_directive_to_the_agent_recorded_in_flight() -> None:
    world = World()
    assert world.apply(act.Resize("e", 4, reason="idle GPUs", batch=256)) == {"e": 4}
    (sent,) = world.actuator.sent
    assert (sent.job_id, sent.target, sent.reason, sent.batch, sent.vacate) == ("e", 4, "idle GPUs", 256, "")
    assert world.ledger.agents["e"].in_flight is not None


def test_a_resize_to_the_same_size_with_a_batch_is_a_batch_only_directive() -> None:
    world = World()
    world.apply(act.Resize("e", 2, batch=512))
    assert [(d.target, d.batch) for d in world.actuator.sent] == [(2, 512)]
    in_flight = world.ledger.agents["e"].in_flight
    assert in_flight is not None and in_flight.batch_only


@pytest.mark.parametrize(
    "action",
    [act.Resize("e", 2), act.Resize("x", 3), act.Resize("7", 3)],
    ids=["the-same-size-without-a-batch", "a-job-not-in-the-snapshot", "a-job-without-an-agent"],
)
def test_a_resize_that_changes_nothing_or_reaches_no_agent_sends_nothing(action: act.Resize) -> None:
    world = World()
    assert world.apply(action) == {}
    assert world.actuator.sent == []


def test_a_resizing_job_gets_no_directive() -> None:
    world = World()
    world.jobs["e"] = info("e", 1, placement={"n0": 2}, low=1, high=4, resizing=True)
    world.apply(act.Resize("e", 4))
    assert world.actuator.sent == []


def test_a_move_keeps_the_agents_target_and_vacates_the_node() -> None:
    world = World()
    assert world.apply(act.Move("e", "n1", 1, for_job="7", reason="room for 7")) == {"e": 3}
    (sent,) = world.actuator.sent
    assert (sent.target, sent.vacate, sent.reason) == (3, "n1", "room for 7")
    assert world.ledger.moves == {"e": NOW, "7": NOW}, "the moved job and the one moved for, held off"
    world.ledger.expire_resizes(NOW + world.ledger.config.resize_timeout_s)
    assert world.ledger.moves == {}


def test_a_pinned_job_gets_no_directive() -> None:
    world = World()
    world.jobs["e"] = info("e", 1, placement={"n0": 2}, low=1, high=4, pinned=True)
    assert world.apply(act.Resize("e", 4)) == {} and world.actuator.sent == []


def test_a_hold_marks_then_holds_and_a_release_releases_and_clears_the_mark() -> None:
    world = World()
    world.apply(act.Hold("7", reason="waiting for 2 GPUs"))
    assert world.slurm.calls == [("comment", 7, HoldMark(int(NOW), 500, 2).text()), ("hold", 7, None)]
    assert "7" in world.admitter.marks
    world.slurm.calls.clear()
    world.jobs["7"] = dataclasses.replace(world.jobs["7"], held=True, held_since=NOW)  # the next round's snapshot
    world.apply(act.Release("7", reason="free now"))
    assert world.slurm.calls == [("release", 7, None), ("comment", 7, ""), ("priority", 7, 500)]
    assert "7" not in world.admitter.marks


def test_a_release_of_a_job_the_daemon_does_not_hold_calls_nothing() -> None:
    world = World()
    world.apply(act.Release("7"))
    assert world.slurm.calls == []


def test_a_priority_is_set_in_slurm_and_given_back_when_the_daemon_stops() -> None:
    world = World()
    world.apply(act.SetPriority("7", 900))
    assert world.slurm.calls == [("priority", 7, 900)]
    world.executor.close()
    assert world.slurm.calls[-1] == ("priority", 7, 500)


def test_the_stop_releases_the_jobs_the_daemon_holds() -> None:
    world = World()
    world.apply(act.Hold("7"))
    world.executor.close()
    assert ("release", 7, None) in world.slurm.calls and world.admitter.marks == {}


def test_starts_and_preemptions_are_slurms_recorded_and_never_sent() -> None:
    world = World()
    done = world.executor.apply([act.Start("7", 2), act.Preempt("e")], world.jobs, {"e"}, source="policy", now=NOW)
    assert (dict(done.recorded), world.actuator.sent, world.slurm.calls) == ({"start": 1, "preempt": 1}, [], [])
    assert 'amoeba_slurm_actions_total{action="start"} 1.0' in world.metrics.registry.render()


def test_a_policy_that_can_place_is_refused_with_the_policy_the_action_and_why() -> None:
    refusal = live_refusal("sjf-bsbf", frozenset({act.Resize, act.Place}), sharing=True)
    assert refusal.startswith("policy 'sjf-bsbf' cannot run in amoebad") and "its place actions" in refusal
    assert REFUSED[act.Place] in refusal
    with pytest.raises(TypeError, match="cannot apply"):
        World().executor.apply([act.Place("e", {"n0": 2})], {}, set(), source="policy", now=NOW)


def test_a_policy_that_shares_is_refused_while_the_sites_sharing_switch_is_off_and_accepted_with_it_on() -> None:
    refusal = live_refusal("sjf-bsbf", frozenset({act.Start, act.Share}))
    assert "its share actions cannot be applied live" in refusal and SHARING_OFF in refusal
    assert "sharing.enabled" in refusal
    assert live_refusal("sjf-bsbf", frozenset({act.Start, act.Share}), sharing=True) == ""


class SharingWorld:
    """Host ``h`` (guaranteed, 1 worker on share node s1), sharer ``o`` (opportunistic, 1 worker of 1..2 on n0),
    ``p`` (did not opt in, 1 worker of 1..2 on n0); sharing on, partition ``share`` allows 1 sharer per node."""

    def __init__(self, *, enabled: bool = True, limit: int = 1, sharer_mode: str | None = "opportunistic") -> None:
        self.metrics = DaemonMetrics()
        self.ledger = Ledger(DaemonConfig(), self.metrics, lambda: NOW)
        modes = {"h": ("guaranteed", "share"), "o": (sharer_mode, "share"), "p": (None, "")}
        for job_id, (mode, partition) in modes.items():
            reg = Registration(job_id, "tcp://127.0.0.1:5000", 1, 2, 1, "batch", "elastic", mode, partition)
            self.ledger.register(reg, ME, "alice")
            self.ledger.agents[job_id].report = Report(1, 1, 1, {}, (), (), NOW)
        self.actuator = RecordingActuator()
        sharing = Sharing(enabled=enabled, partitions={"share": limit})
        self.executor = LiveExecutor(self.ledger, self.actuator, self.metrics, sharing=sharing)
        self.jobs: dict[str, JobInfo] = {
            "h": info("h", 1, placement={"s1": 1}, low=1, high=2),
            "o": info("o", 1, placement={"n0": 1}, low=1, high=2),
            "p": info("p", 1, placement={"n0": 1}, low=1, high=2),
        }

    def apply(self, *actions: act.Action) -> dict[str, int]:
        return dict(self.executor.apply(actions, self.jobs, set(self.jobs), source="policy", now=NOW).ordered)


def crowded() -> SharingWorld:
    """A world where another job's worker runs beside ``h`` on s1 already."""
    world = SharingWorld()
    world.ledger.agents["p"].beside = Beside("h", "share", {"s1": 1}, "opportunistic", ME, HOST_STATUS)
    return world


#: Where host ``h`` writes its status on its node (the convention both sides derive).
HOST_STATUS = str(host_status_path("h"))


def test_a_share_of_two_opted_in_jobs_sends_the_sharer_its_place_beside_the_host() -> None:
    world = SharingWorld()
    assert world.apply(act.Share("o", "h", 2, {"s1": 1}, reason="pays")) == {"o": 2}
    (sent,) = world.actuator.sent
    assert (sent.job_id, sent.target, sent.reason) == ("o", 2, "pays")
    assert sent.place_beside == Beside("h", "share", {"s1": 1}, "opportunistic", ME, HOST_STATUS)
    assert world.ledger.agents["o"].beside == sent.place_beside
    assert 'amoeba_decisions_total{kind="share",source="policy"} 1.0' in world.metrics.registry.render()


def test_a_share_directive_carries_the_hosts_uid_and_status_file_and_the_policys_pace_bound_and_sub_batch() -> None:
    world = SharingWorld()
    world.ledger.agents["h"].uid = ME + 7  # the host's owner is another user than the sharer's
    share = act.Share("o", "h", 2, {"s1": 1}, sub_batch=8, accumulation=4, pace_bound=0.05)
    assert world.apply(share) == {"o": 2}
    (sent,) = world.actuator.sent
    assert sent.place_beside is not None
    body = sent.place_beside.to_body()
    assert (body["host_uid"], body["status_path"]) == (ME + 7, str(host_status_path("h")))
    assert (body["pace_bound"], body["sub_batch"]) == (0.05, 8)
    wire = {**body, "host": "77"}  # the wire takes Slurm's job ids only
    order = {"job_id": "78", "target": 2, "reason": "r", "place_beside": wire}
    assert decode(encode(Message("resize", order))).body["place_beside"] == wire


@pytest.mark.parametrize(
    ("world", "action", "why"),
    [
        (SharingWorld(enabled=False), act.Share("o", "h", 2, {"s1": 1}), "GPU sharing is off"),
        (SharingWorld(), act.Share("p", "h", 2, {"s1": 1}), "job p opted in as nothing: only a job submitted with"),
        (SharingWorld(sharer_mode="guaranteed"), act.Share("o", "h", 2, {"s1": 1}), "opted in as guaranteed"),
        (SharingWorld(), act.Share("o", "p", 2, {"n0": 1}), "host job p did not opt in to sharing (--share)"),
        (SharingWorld(limit=0), act.Share("o", "h", 2, {"s1": 1}), "which hosts no sharer: name it in sharing.part"),
        (SharingWorld(), act.Share("o", "h", 2, {"n9": 1}), "node n9 is not one of host job h's nodes (s1)"),
        (crowded(), act.Share("o", "h", 2, {"s1": 1}), "2 sharer worker(s) beside job h on s1 is over sharing.par"),
        (SharingWorld(), act.Share("o", "h", 3, {"s1": 1}), "but it keeps its own 1: give placement the workers"),
        (SharingWorld(), act.Share("7", "h", 1, {"s1": 1}), "must both run with a registered agent"),
    ],
    ids=[
        "sharing-off",
        "a-sharer-that-did-not-opt-in",
        "a-guaranteed-sharer",
        "a-host-that-did-not-opt-in",
        "a-partition-without-sharers",
        "a-node-of-another-job",
        "more-sharers-than-the-partition-allows",
        "a-size-that-drops-the-sharers-own-workers",
        "a-pending-sharer",
    ],
)
def test_a_share_that_is_not_allowed_sends_nothing_and_says_why(
    world: SharingWorld, action: act.Share, why: str
) -> None:
    assert why in world.executor.share_refusal(action, world.jobs, set(world.jobs))
    assert world.apply(action) == {}
    assert world.actuator.sent == [] and world.ledger.agents["o"].beside is None


def test_a_share_sized_as_only_its_workers_beside_the_host_keeps_the_sharers_own_workers_too() -> None:
    world = SharingWorld()
    assert world.apply(act.Share("o", "h", 1, {"s1": 1})) == {"o": 2}
    assert [d.target for d in world.actuator.sent] == [2]


def test_a_job_that_did_not_opt_in_is_never_placed_beside_another_nor_hosts_one() -> None:
    world = SharingWorld()
    for action in (act.Share("p", "h", 2, {"s1": 1}), act.Share("o", "p", 2, {"n0": 1})):
        assert world.apply(action) == {}
    assert world.actuator.sent == []


def test_the_host_resized_takes_its_place_back_from_the_sharer_first() -> None:
    world = SharingWorld()
    world.apply(act.Share("o", "h", 2, {"s1": 1}))
    world.ledger.agents["o"].in_flight = None
    world.ledger.agents["o"].report = Report(2, 2, 2, {}, (), (), NOW)
    world.jobs["o"] = info("o", 1, placement={"n0": 1, "s1": 1}, low=1, high=2)
    world.actuator.sent.clear()
    assert world.apply(act.Resize("h", 2), act.Resize("o", 2, batch=64)) == {"o": 1, "h": 2}
    unshare, host = world.actuator.sent
    assert (unshare.job_id, unshare.target, unshare.place_beside) == ("o", 1, None)
    assert unshare.reason == "host job h needs its GPUs back" and host.job_id == "h"
    assert world.ledger.agents["o"].beside is None


def test_a_sharer_whose_host_is_gone_is_ordered_back_to_its_own_workers() -> None:
    world = SharingWorld()
    world.apply(act.Share("o", "h", 2, {"s1": 1}))
    world.ledger.agents["o"].report = Report(2, 2, 2, {}, (), (), NOW)
    world.actuator.sent.clear()
    del world.jobs["h"]
    assert world.apply() == {"o": 1}
    assert [(d.job_id, d.target, d.reason) for d in world.actuator.sent] == [("o", 1, "host job h is gone")]


def test_a_sharer_the_policy_evicts_is_ordered_back_to_its_own_workers() -> None:
    world = SharingWorld()
    world.apply(act.Share("o", "h", 2, {"s1": 1}))
    world.ledger.agents["o"].in_flight = None
    world.ledger.agents["o"].report = Report(2, 2, 2, {}, (), (), NOW)
    world.actuator.sent.clear()
    assert world.apply(act.Preempt("o", reason="its host fell below its bound")) == {"o": 1}
    assert [(d.job_id, d.target, d.reason) for d in world.actuator.sent] == [("o", 1, "evicted from beside host job h")]
    assert world.ledger.agents["o"].beside is None


def test_the_policy_may_shrink_a_sharer_to_its_own_workers_but_not_grow_it() -> None:
    world = SharingWorld()
    world.apply(act.Share("o", "h", 2, {"s1": 1}))
    world.ledger.agents["o"].in_flight = None
    world.jobs["o"] = info("o", 1, placement={"n0": 1, "s1": 1}, low=1, high=3)
    world.actuator.sent.clear()
    assert world.apply(act.Resize("o", 3)) == {} and world.actuator.sent == []
    assert world.apply(act.Resize("o", 1)) == {"o": 1}
    assert world.ledger.agents["o"].beside is None


def test_a_policy_that_only_resizes_starts_and_preempts_is_accepted() -> None:
    assert live_refusal("elastic", frozenset({act.Start, act.Resize, act.Preempt})) == ""


def test_a_host_an_operator_resized_takes_its_place_back_at_the_next_round() -> None:
    world = SharingWorld()
    world.apply(act.Share("o", "h", 2, {"s1": 1}))
    world.ledger.agents["o"].in_flight = None
    world.ledger.agents["o"].report = Report(2, 2, 2, {}, (), (), NOW)
    world.actuator.sent.clear()
    assert world.apply() == {}, "nothing changes while the host keeps its size"
    world.ledger.order(world.ledger.agents["h"], 2, "amoebactl resize by uid 0", "ctl")
    assert world.apply() == {"o": 1}
    assert [(d.job_id, d.target, d.reason) for d in world.actuator.sent] == [("o", 1, "host job h needs its GPUs back")]
