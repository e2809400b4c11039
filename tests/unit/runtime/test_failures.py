"""Failure classes: exceptions, process exits and the end-the-job verdict, by tables."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
import torch

from slurm_amoeba.local import LocalJob
from slurm_amoeba.runtime.caught import classify_exception, failure_message
from slurm_amoeba.runtime.errors import JobLostError, RuntimeTimeout, StateError, WorkerFailure
from slurm_amoeba.runtime.failures import (
    ErrorReport,
    FailureClass,
    WorkerExit,
    classify_exit,
    exit_signal,
    user_error_verdict,
)

USER, RESOURCE, INFRA = FailureClass.USER, FailureClass.RESOURCE, FailureClass.INFRASTRUCTURE


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ValueError("bad label 11"), USER),
        (ZeroDivisionError(), USER),
        (KeyError("fc.weight"), USER),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 9x1)"), USER),
        (StateError("state extra 'f' holds a file"), USER),
        (SystemExit(3), USER),
        (MemoryError(), RESOURCE),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), RESOURCE),
        (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), RESOURCE),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"), RESOURCE),
        (WorkerFailure("gradient all-reduce failed in generation 3", generation=3), INFRA),
        (RuntimeTimeout("waited 30 s for the coordinator"), INFRA),
        (JobLostError("no worker holding the state is left"), INFRA),
        (torch.distributed.DistNetworkError("Connection reset by peer"), INFRA),
        (KeyboardInterrupt(), INFRA),
    ],
)
def test_classify_exception_tells_user_code_from_memory_and_communication(
    exc: BaseException, expected: FailureClass
) -> None:
    assert classify_exception(exc) is expected


@pytest.mark.parametrize(
    ("returncode", "expected"),
    [(-9, signal.SIGKILL), (137, signal.SIGKILL), (-11, signal.SIGSEGV), (143, signal.SIGTERM), (1, None), (0, None)],
)
def test_exit_signal_reads_negative_and_shell_encoded_statuses(
    returncode: int, expected: signal.Signals | None
) -> None:
    assert exit_signal(returncode) == expected


@pytest.mark.parametrize(
    ("ended", "expected"),
    [
        (WorkerExit(0), None),
        (WorkerExit(1), USER),  # the script failed before or outside the runtime (import error, bad argument)
        (WorkerExit(-signal.SIGSEGV), USER),  # crashed itself (native code)
        (WorkerExit(128 + signal.SIGABRT), USER),
        (WorkerExit(-signal.SIGKILL), INFRA),  # killed from outside
        (WorkerExit(128 + signal.SIGTERM), INFRA),
        (WorkerExit(None), INFRA),  # no status: lost with its node
        (WorkerExit(1, reported=RESOURCE), RESOURCE),  # what the worker said wins over the status
        (WorkerExit(-signal.SIGKILL, out_of_memory=True), RESOURCE),  # Slurm's OUT_OF_MEMORY: the cgroup OOM killer
        (WorkerExit(1, reported=USER, node_failed=True), INFRA),  # a failing node explains everything
        (WorkerExit(0, preempted=True), INFRA),
    ],
)
def test_classify_exit_orders_slurm_then_the_workers_report_then_the_status(
    ended: WorkerExit, expected: FailureClass | None
) -> None:
    assert classify_exit(ended) is expected


def test_only_user_errors_are_not_retried() -> None:
    assert [c.is_retried() for c in FailureClass] == [False, True, True]


def report(
    worker: str, failure: FailureClass = USER, step: int = 20, error: str = "ValueError", gen: int = 1
) -> ErrorReport:
    return ErrorReport(worker=worker, generation=gen, step=step, failure=failure, error=error)


MEMBERS = ("w0", "w1", "w2")


@pytest.mark.parametrize(
    ("reports", "earlier", "expected"),
    [
        ([], [], None),
        ([report("w0"), report("w1"), report("w2")], [], "user error: every member raised ValueError at step 20"),
        ([report("w0"), report("w1")], [], None),  # w2 did not fail: it may be data-dependent, shrink and retry
        ([report("w0"), report("w1"), report("w2", error="KeyError")], [], None),
        ([report("w0"), report("w1"), report("w2", step=21)], [], None),
        ([report(w, RESOURCE) for w in MEMBERS], [], "out of memory on every member at step 20"),
        ([report(w, INFRA) for w in MEMBERS], [], None),  # e.g. the store went away: not the user's code
        ([report("w1", gen=2)], [report("w0", gen=1)], "user error: w1 raised ValueError at step 20 again"),
        ([report("w1", gen=2, step=25)], [report("w0", gen=1)], None),  # another step: not the same failure
        ([report("w1", gen=2)], [report("w0", INFRA, gen=1)], None),
    ],
)
def test_user_error_verdict_ends_the_job_only_for_a_failure_that_a_retry_repeats(
    reports: list[ErrorReport], earlier: list[ErrorReport], expected: str | None
) -> None:
    verdict = user_error_verdict(reports, MEMBERS, earlier)
    if expected is None:
        assert verdict is None
    else:
        assert verdict is not None and verdict.reason.startswith(expected), verdict
        assert verdict.failure is (RESOURCE if expected.startswith("out of memory") else USER)


def test_user_error_verdict_without_members_decides_nothing() -> None:
    assert user_error_verdict([report("w0")], ()) is None


def test_failure_message_names_the_class_type_and_text() -> None:
    assert failure_message(ValueError("bad batch")) == "user error: ValueError: bad batch"
    assert failure_message(MemoryError()) == "resource error: MemoryError: "


RAISING = Path(__file__).with_name("raising_train.py")


@pytest.mark.timeout(120)
def test_a_user_error_on_every_rank_ends_the_job_at_once_with_the_class_and_the_traceback(tmp_path: Path) -> None:
    command = [sys.executable, str(RAISING), "--raise-at", "3"]
    root = str(Path(__file__).parents[3])
    with LocalJob(command, initial_workers=2, job_id="raising", log_dir=tmp_path, env={"PYTHONPATH": root}) as job:
        result = job.wait(90)
        logs = {w: job.log_tail(w, 40) for w in result.view.workers}
    assert result.phase.value == "lost", result
    assert result.view.failure is USER and result.view.lost_reason.startswith("user error: every member raised")
    assert {e.error for e in result.view.errors} == {"ValueError"} and len(result.view.errors) == 2
    assert all("Traceback" in e.traceback for e in result.view.errors)
    (record,) = result.view.history
    assert record.ended_at is not None and record.ended_at - record.formed_at < 10
    for worker, info in result.view.workers.items():
        assert info.status.value == "failed" and info.reason == "user error: ValueError: bad batch at step 3", worker
        assert "ValueError: bad batch at step 3" in logs[worker] and "Traceback" in logs[worker]
        assert result.returncodes[worker] == 1
