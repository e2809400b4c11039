"""Failure classes wired in: a worker's error event carries its class and traceback, and the coordinator's
membership ends the job on a failure that a retry repeats (every member, or again after a rollback)."""

from __future__ import annotations

from slurm_amoeba.runtime.caught import TRACEBACK_CHARS, error_fields
from slurm_amoeba.runtime.failures import ErrorReport, FailureClass
from slurm_amoeba.runtime.membership import Membership, MembershipConfig, Phase, WorkerStatus
from slurm_amoeba.runtime.protocol import EventKind, WorkerEvent

USER, INFRA = FailureClass.USER, FailureClass.INFRASTRUCTURE


def raise_in_user_code() -> None:
    raise ValueError("bad label 11")


def caught() -> BaseException:
    try:
        raise_in_user_code()
    except ValueError as exc:
        return exc
    raise AssertionError("unreachable")


def test_error_fields_carry_the_class_the_type_and_the_traceback_of_the_raising_frame() -> None:
    fields = error_fields(caught())
    assert fields["failure"] == "user" and fields["error"] == "ValueError"
    assert fields["message"] == "user error: ValueError: bad label 11"
    assert "Traceback" in fields["traceback"] and "raise_in_user_code" in fields["traceback"]


def test_a_long_traceback_keeps_its_end() -> None:
    fields = error_fields(RuntimeError("x" * (2 * TRACEBACK_CHARS)))
    assert len(fields["traceback"]) == TRACEBACK_CHARS and fields["traceback"].endswith("x\n")


def test_an_error_event_round_trips_with_its_class_and_traceback() -> None:
    fields = error_fields(caught())
    event = WorkerEvent(
        EventKind.ERROR,
        "w0",
        1.0,
        generation=2,
        step=20,
        message=fields["message"],
        failure=fields["failure"],
        error=fields["error"],
        traceback=fields["traceback"],
    )
    back = WorkerEvent.from_json(event.to_json())
    assert back == event
    report = ErrorReport.of(back, generation=7)
    assert (report.worker, report.generation, report.step, report.failure, report.error) == (
        "w0",
        2,
        20,
        USER,
        "ValueError",
    )
    assert "raise_in_user_code" in report.traceback


def test_an_error_event_without_a_class_is_read_from_its_message_else_taken_as_a_user_error() -> None:
    old = WorkerEvent(EventKind.ERROR, "w0", 1.0, step=3, message="infrastructure error: WorkerFailure: lost")
    assert ErrorReport.of(old, generation=4).failure is INFRA
    assert ErrorReport.of(old, generation=4).generation == 4
    bare = WorkerEvent(EventKind.ERROR, "w0", 1.0, step=3, message="exited")
    assert ErrorReport.of(bare, generation=1).failure is USER


# ----------------------------------------------------------------------------------------------- the membership


def started(workers: int = 2) -> Membership:
    """A membership whose first generation runs with ``w0``..``w{workers-1}``."""
    m = Membership(MembershipConfig(initial_workers=workers, report_timeout_s=5, heartbeat_timeout_s=60))
    for i in range(workers):
        m.handle(WorkerEvent(EventKind.REGISTERED, f"w{i}", 0.0, pid=1, host="h"), 0.0)
        m.handle(WorkerEvent(EventKind.READY, f"w{i}", 0.0), 0.0)
    m.decide(0.1)
    assert m.phase is Phase.RUNNING and m.generation == 1
    return m


def error(m: Membership, worker: str, step: int = 20, failure: FailureClass = USER, kind: str = "ValueError") -> None:
    message = f"{failure.value} error: {kind}: bad"
    event = WorkerEvent(
        EventKind.ERROR,
        worker,
        1.0,
        generation=m.generation,
        step=step,
        message=message,
        failure=failure.value,
        error=kind,
    )
    m.handle(event, 1.0)


def test_the_same_user_error_on_every_member_ends_the_job_with_its_class() -> None:
    m = started(3)
    for worker in ("w0", "w1", "w2"):
        error(m, worker)
    m.decide(1.1)
    assert m.phase is Phase.LOST and m.failure is USER
    assert m.lost_reason == "user error: every member raised ValueError at step 20"
    assert [e.worker for e in m.errors] == ["w0", "w1", "w2"]


def test_a_user_error_on_some_members_only_shrinks_and_a_repeat_after_the_rollback_ends_the_job() -> None:
    m = started(3)
    error(m, "w0")
    for worker in ("w1", "w2"):
        m.handle(WorkerEvent(EventKind.REPORT, worker, 1.0, generation=1, step=20, committed_step=19, failed=True), 1)
    m.decide(1.1)
    assert m.phase.value == "running" and m.generation == 2 and m.failure is None
    assert m.plan is not None and m.plan.members == ("w1", "w2") and m.plan.rollback
    error(m, "w1")  # a survivor meets the same bug at the same step (w2 has not reached it)
    m.decide(2.0)
    assert m.phase is Phase.LOST and m.failure is USER
    assert m.lost_reason.startswith("user error: w1 raised ValueError at step 20 again after a rollback")


def test_a_user_error_at_another_step_after_the_rollback_is_not_a_repeat() -> None:
    m = started(3)
    error(m, "w0")
    for worker in ("w1", "w2"):
        m.handle(WorkerEvent(EventKind.REPORT, worker, 1.0, generation=1, step=20, committed_step=19, failed=True), 1)
    m.decide(1.1)
    error(m, "w1", step=27)
    m.decide(2.0)
    assert m.phase is not Phase.LOST and m.failure is None and m.workers["w1"].status is WorkerStatus.FAILED


def test_communication_errors_on_every_member_are_no_verdict() -> None:
    m = started(2)
    for worker in ("w0", "w1"):
        error(m, worker, failure=INFRA, kind="WorkerFailure")
    m.decide(1.1)
    assert m.phase is Phase.LOST and m.failure is None
    assert m.lost_reason == "every member of generation 1 is gone"
