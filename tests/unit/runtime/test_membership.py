"""The coordinator's membership state machine, driven as a plain object by simulated workers."""

from __future__ import annotations

import collections
import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_amoeba.runtime.membership import (
    AbortGeneration,
    Membership,
    MembershipConfig,
    Phase,
    SendAssignment,
    SetWant,
    WorkerStatus,
)
from slurm_amoeba.runtime.planner import GlobalBatchPlanner
from slurm_amoeba.runtime.protocol import AssignAction, Assignment, EventKind, GenerationPlan, WorkerEvent


@dataclasses.dataclass
class SimWorker:
    """What a simulated worker process knows."""

    worker_id: str
    alive: bool = True
    sigterm: bool = False
    generation: int = 0
    step: int = 0
    committed: int = 0
    inbox: list[Assignment] = dataclasses.field(default_factory=list)
    seq: int = 0


class SimJob:
    """Simulated workers around a :class:`Membership`, with a fake clock."""

    def __init__(self, initial: int, max_workers: int = 8, allowed: tuple[int, ...] = ()) -> None:
        self.m = Membership(
            MembershipConfig(
                initial_workers=initial, max_workers=max_workers, report_timeout_s=5, heartbeat_timeout_s=8
            )
        )
        self.now = 0.0
        self.workers: dict[str, SimWorker] = {}
        self.want = 0
        self.aborted: list[int] = []
        self.allowed = allowed
        self.count = 0
        for _ in range(initial):
            self.add()
        self.tick()

    def event(self, worker: str, kind: EventKind, **fields: object) -> None:
        self.m.handle(WorkerEvent(kind=kind, worker=worker, time=self.now, **fields), self.now)  # type: ignore[arg-type]

    def add(self) -> str:
        worker_id = f"w{self.count}"
        self.count += 1
        self.workers[worker_id] = SimWorker(worker_id)
        self.event(worker_id, EventKind.REGISTERED, pid=1, host="h")
        self.event(worker_id, EventKind.READY, allowed_sizes=self.allowed)
        return worker_id

    def tick(self, seconds: float = 0.01) -> list[SendAssignment]:
        self.now += seconds
        for worker_id, worker in self.workers.items():
            if worker.alive:
                self.m.heartbeat(worker_id, self.now)
        sent = []
        for action in self.m.decide(self.now):
            if isinstance(action, SetWant):
                self.want = action.generation
            elif isinstance(action, AbortGeneration):
                self.aborted.append(action.generation)
            else:
                worker = self.workers[action.worker]
                assert action.seq == worker.seq, "assignments must be numbered consecutively per worker"
                worker.seq += 1
                worker.inbox.append(action.assignment)
                sent.append(action)
        return sent

    @property
    def plan(self) -> GenerationPlan:
        assert self.m.plan is not None
        return self.m.plan

    def apply_assignments(self) -> None:
        for worker in self.workers.values():
            while worker.inbox and worker.alive:
                assignment = worker.inbox.pop(0)
                if assignment.action is AssignAction.JOIN:
                    assert assignment.plan is not None
                    worker.generation = assignment.plan.generation
                    if assignment.plan.start_step is not None:
                        worker.step = worker.committed = assignment.plan.start_step
                elif assignment.action in (AssignAction.LEAVE, AssignAction.FINISH):
                    worker.alive = False

    def boundary(self, failed: bool = False) -> None:
        """Every live member reports the end of the current generation."""
        for member in self.plan.members:
            worker = self.workers[member]
            if worker.alive and worker.generation == self.m.generation:
                self.event(
                    member,
                    EventKind.REPORT,
                    generation=self.m.generation,
                    step=worker.step,
                    committed_step=worker.committed,
                    leaving=worker.sigterm,
                    failed=failed,
                )
                if worker.sigterm:
                    worker.alive = False

    def train(self, steps: int, commit_every: int = 3) -> None:
        for member in self.plan.members:
            worker = self.workers[member]
            if worker.alive:
                for _ in range(steps):
                    worker.step += 1
                    if worker.step % commit_every == 0:
                        worker.committed = worker.step


def test_first_generation_waits_for_the_initial_workers_then_keeps_ready_order() -> None:
    job = SimJob(initial=2)
    assert job.m.phase is Phase.RUNNING
    assert job.plan.members == ("w0", "w1") and job.plan.source == "w0" and job.plan.joiners == ("w1",)
    assert job.plan.sync and not job.plan.rollback


def test_ready_joiner_asks_for_a_switch_and_joins_behind_the_survivors() -> None:
    job = SimJob(initial=2)
    job.apply_assignments()
    job.train(5)
    job.add()
    job.tick()
    assert job.want == 1
    job.boundary()
    job.tick()
    assert job.plan.members == ("w0", "w1", "w2")
    assert job.plan.joiners == ("w2",) and job.plan.sync and job.plan.start_step == 5


def test_killed_member_triggers_rollback_to_the_newest_common_commit() -> None:
    job = SimJob(initial=3)
    job.apply_assignments()
    job.train(5)  # committed at 3
    job.workers["w1"].alive = False
    job.m.mark_dead("w1", "signal 9")
    job.boundary(failed=True)
    job.tick()
    assert job.plan.members == ("w0", "w2")
    assert job.plan.rollback and job.plan.start_step == 3 and not job.plan.sync


def test_member_that_never_reports_is_dropped_after_the_report_deadline() -> None:
    job = SimJob(initial=2)
    job.apply_assignments()
    job.event("w0", EventKind.REPORT, generation=1, step=0, committed_step=0, failed=True)
    job.tick(1)
    assert job.m.phase is Phase.ENDING
    job.tick(6)
    assert job.plan.members == ("w0",) and job.plan.rollback
    assert job.m.workers["w1"].status is WorkerStatus.DEAD


def test_last_member_leaving_loses_the_job_and_releases_waiting_workers() -> None:
    job = SimJob(initial=1)
    job.apply_assignments()
    job.workers["w0"].sigterm = True
    job.boundary()
    job.tick()
    assert job.m.phase is Phase.LOST and "no worker" in job.m.lost_reason


def test_sizes_the_global_batch_does_not_accept_put_extra_workers_on_standby() -> None:
    allowed = tuple(GlobalBatchPlanner(12, even=True).allowed_world_sizes(8))
    job = SimJob(initial=4, allowed=allowed)
    job.apply_assignments()
    job.workers["w3"].sigterm = True
    job.add()  # 3 staying + 1 joiner = 4 -> allowed
    job.workers["w2"].alive = False
    job.m.mark_dead("w2", "gone")  # now 2 staying + 1 joiner = 3 -> allowed
    job.boundary(failed=True)
    job.tick()
    assert job.plan.world_size in allowed
    assert job.plan.members == ("w0", "w1", "w4")


OPS = st.lists(
    st.tuples(st.sampled_from(["add", "leave", "sigterm", "kill", "train", "hang"]), st.integers(0, 7)),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(initial=st.integers(1, 4), max_workers=st.integers(4, 6), ops=OPS)
def test_random_resize_and_kill_sequences_keep_membership_invariants(
    initial: int, max_workers: int, ops: list[tuple[str, int]]
) -> None:
    job = SimJob(initial=initial, max_workers=max_workers)
    job.apply_assignments()
    for op, pick in ops:
        if job.m.phase.is_over():
            break
        members = [m for m in job.plan.members if job.workers[m].alive]
        victim = members[pick % len(members)] if members else None
        killed = False
        if op == "add":
            job.add()
        elif op == "leave" and victim and len(members) > 1:
            job.m.request_leave(victim)
        elif op == "sigterm" and victim:
            job.workers[victim].sigterm = True
        elif op in ("kill", "hang") and victim:
            job.workers[victim].alive = False
            if op == "kill":
                job.m.mark_dead(victim, "signal 9")
            killed = True
        elif op == "train":
            job.train(pick + 1)
        job.tick()
        before = job.plan
        old_members = [m for m in before.members if job.workers[m].alive]
        ending = killed or job.want == job.m.generation or any(job.workers[m].sigterm for m in old_members)
        if ending:
            job.boundary(failed=killed)
            for _ in range(3):
                job.tick(3)  # past the report deadline on the third tick
        after = job.plan
        if after.generation != before.generation and not job.m.phase.is_over():
            staying = [
                m
                for m in before.members
                if job.workers[m].alive and not job.workers[m].sigterm and not job.m.workers[m].leave_requested
            ]
            assert len(after.members) <= max_workers
            assert len(set(after.members)) == len(after.members)
            assert list(after.members[: len(staying)]) == staying[: len(after.members)], "survivors keep their order"
            assert all(job.workers[m].alive for m in after.members), "a dead or departed worker was admitted"
            assert after.rollback == killed
            assert after.sync == bool(after.joiners)
            assert after.source in after.members and after.source not in after.joiners
            assert set(after.joiners) == set(after.members) - set(staying)
        job.apply_assignments()
        job.want = 0 if job.want != job.m.generation else job.want
    statuses = collections.Counter(i.status for i in job.m.workers.values())
    assert statuses[WorkerStatus.MEMBER] <= max_workers


def test_joiners_added_together_wait_for_each_other_to_join_in_one_switch() -> None:
    job = SimJob(initial=1)
    job.apply_assignments()
    job.event("w1", EventKind.REGISTERED, pid=2, host="h")
    job.event("w2", EventKind.REGISTERED, pid=3, host="h")
    job.workers["w1"], job.workers["w2"] = SimWorker("w1"), SimWorker("w2")
    job.event("w1", EventKind.READY)
    job.tick()
    assert job.want == 0, "w2 is still warming up"
    job.event("w2", EventKind.READY)
    job.tick()
    assert job.want == 1
    job.boundary()
    job.tick()
    assert job.plan.members == ("w0", "w1", "w2")


def test_ready_joiner_stops_waiting_for_a_slow_one_after_the_batch_window() -> None:
    job = SimJob(initial=1)
    job.apply_assignments()
    job.event("w1", EventKind.REGISTERED, pid=2, host="h")
    job.event("w2", EventKind.REGISTERED, pid=3, host="h")
    job.workers["w1"], job.workers["w2"] = SimWorker("w1"), SimWorker("w2")
    job.event("w1", EventKind.READY)
    job.tick()
    assert job.want == 0
    job.tick(29)
    assert job.want == 0
    job.tick(2)
    assert job.want == 1


def test_first_generation_starts_without_an_initial_worker_that_died_before_registering() -> None:
    m = Membership(MembershipConfig(initial_workers=2))
    m.handle(WorkerEvent(kind=EventKind.REGISTERED, worker="w0", time=0.0), 0.0)
    m.mark_dead("w1", "process exited with signal 9")
    m.handle(WorkerEvent(kind=EventKind.READY, worker="w0", time=0.1), 0.1)
    m.decide(0.2)
    assert m.plan is not None and m.plan.members == ("w0",)
    assert m.workers["w1"].status is WorkerStatus.DEAD


def test_joiner_whose_first_generation_failed_to_form_receives_the_state_next_time() -> None:
    job = SimJob(initial=2)
    job.apply_assignments()
    job.train(4)  # w0 and w1 committed at 3
    job.add()
    job.tick()
    job.boundary()
    job.tick()
    assert list(job.plan.members) == ["w0", "w1", "w2"]
    # w1 dies while the generation forms; w2 reports before it ever received the state (no commit).
    job.workers["w1"].alive = False
    job.m.mark_dead("w1", "signal 9")
    job.event("w0", EventKind.REPORT, generation=2, step=4, committed_step=4, failed=True)
    job.event("w2", EventKind.REPORT, generation=2, step=0, committed_step=-1, failed=True)
    job.tick()
    assert job.plan.members == ("w0", "w2")
    assert job.plan.joiners == ("w2",) and job.plan.source == "w0" and job.plan.sync and job.plan.rollback


def test_generation_whose_only_reporters_never_held_the_state_loses_the_job() -> None:
    job = SimJob(initial=1)
    job.apply_assignments()
    job.add()
    job.tick()
    job.boundary()
    job.tick()
    job.workers["w0"].alive = False
    job.m.mark_dead("w0", "signal 9")
    job.event("w1", EventKind.REPORT, generation=2, step=0, committed_step=-1, failed=True)
    job.tick()
    assert job.m.phase is Phase.LOST


def test_a_first_generation_that_failed_while_forming_starts_over_with_the_survivors() -> None:
    # Found by scripts/chaos-runtime (seed 6113): w1 killed while the first generation formed; w0 reported the failure
    # without a commit (it never entered the generation), which used to lose the job although nothing was trained.
    job = SimJob(initial=2)
    assert job.plan.start_step is None
    job.workers["w1"].alive = False
    job.m.mark_dead("w1", "signal 9")
    job.event("w0", EventKind.REPORT, generation=1, step=0, committed_step=-1, failed=True, missing=("w1",))
    job.tick()
    assert job.m.phase is Phase.RUNNING
    assert job.plan.generation == 2 and job.plan.members == ("w0",) and job.plan.source == "w0"
    assert not job.plan.rollback and job.plan.start_step is None and not job.plan.sync
    assert job.plan.reason.startswith("first generation again")
    job.add()  # a ready worker joins the fresh start like a first generation's: the source sends it the state
    job.apply_assignments()
    job.train(3)
    job.tick()
    job.boundary()
    job.tick()
    grown = job.m.plan
    assert grown is not None and grown.members == ("w0", "w2") and grown.joiners == ("w2",) and grown.start_step == 3


def test_job_finished_by_one_member_stays_finished_when_another_dies_at_the_end() -> None:
    job = SimJob(initial=2)
    job.apply_assignments()
    job.event("w0", EventKind.DONE)
    job.m.mark_dead("w1", "process exited with signal 9")
    job.tick()
    assert job.m.phase is Phase.FINISHED


def test_last_holder_leaving_with_a_warm_joiner_hands_the_state_over_then_leaves() -> None:
    job = SimJob(initial=1)
    job.apply_assignments()
    job.train(4)
    job.add()
    job.workers["w0"].sigterm = True  # preempted while the joiner waits: the job must not be lost
    job.boundary()
    job.workers["w0"].alive = True  # it waits for the coordinator's answer instead of exiting at once
    job.tick()
    assert job.plan.members == ("w0", "w1") and job.plan.source == "w0" and job.plan.joiners == ("w1",)
    assert "hands the state over" in job.plan.reason
    job.apply_assignments()
    job.tick()
    assert job.want == job.plan.generation, "the leaver asks for the next switch at once"
    job.train(1)
    job.boundary()
    job.tick()
    after = job.m.plan
    assert job.m.phase is Phase.RUNNING and after is not None and after.members == ("w1",) and not after.sync
    assert job.m.workers["w0"].status is WorkerStatus.LEFT


def test_job_whose_every_initial_worker_exits_before_the_first_generation_is_lost_not_left_waiting() -> None:
    m = Membership(MembershipConfig(initial_workers=2))
    m.handle(WorkerEvent(kind=EventKind.REGISTERED, worker="w0", time=0.0), 0.0)
    m.mark_dead("w1", "process exited with status 1")
    m.decide(0.1)
    assert not m.phase.is_over(), "w0 may still come up"
    m.mark_dead("w0", "process exited with status 1")
    m.decide(0.2)
    assert m.phase is Phase.LOST and "before the first generation" in m.lost_reason


def test_a_worker_asked_to_leave_before_it_registered_leaves_when_ready_instead_of_joining() -> None:
    job = SimJob(initial=1)
    job.apply_assignments()
    job.train(3)
    job.m.request_leave("w1", unstarted=True)  # its satellite runs, the process is still importing torch
    assert "w1" not in job.m.workers, "no phantom worker: nothing is warming up yet"
    job.add()
    sent = job.tick()
    assert job.m.workers["w1"].status is WorkerStatus.LEFT
    assert any(a.worker == "w1" and a.assignment.action is AssignAction.LEAVE for a in sent)
    assert job.plan.members == ("w0",) and job.want == 0, "the members are not asked to switch for it"


def test_a_member_at_another_step_than_the_source_receives_the_state_like_a_joiner() -> None:
    job = SimJob(initial=3)
    job.apply_assignments()
    job.train(5)
    job.workers["w2"].step = 4  # its report says another step than the source's (w0 at 5)
    job.m.request_leave("w1")
    job.tick()
    job.boundary()
    job.tick()
    assert job.plan.members == ("w0", "w2") and job.plan.source == "w0" and job.plan.start_step == 5
    assert job.plan.joiners == ("w2",) and job.plan.sync
