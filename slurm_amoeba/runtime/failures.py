"""Failure classes: why a worker stopped, and when the job as a whole must end instead of shrinking.

Retrying a deterministic bug in the training code wastes GPUs: every retry fails the same way. So each failure
gets a class (DESIGN.md, layer ``runtime/``; shared by the worker side, which classifies the exception it caught
(:mod:`slurm_amoeba.runtime.caught`), and the coordinator and agent sides, which classify a process's exit and
decide):

* **user** — the training code raised (a Python exception, a crash of the process itself: ``SIGSEGV``,
  ``SIGABRT``), or the script exited with an error before or outside the runtime. Ends the job when it is the
  same on every member, or comes back after a rollback at the same step (:func:`user_error_verdict`).
* **resource** — out of memory at this size (CUDA or host allocator, Slurm's ``OUT_OF_MEMORY``).
* **infrastructure** — killed from outside (``SIGKILL``, ``SIGTERM``), node failure, preemption, a collective or
  the store timing out: shrink and go on (the runtime's failure path).

Everything here is a pure function of its inputs (no clock, no I/O, no torch), tested by tables.
"""

from __future__ import annotations

import dataclasses
import enum
import signal
from collections.abc import Sequence

from slurm_amoeba.runtime.protocol import WorkerEvent


class FailureClass(str, enum.Enum):
    """Why a worker failed (see the module docstring)."""

    USER = "user"
    RESOURCE = "resource"
    INFRASTRUCTURE = "infrastructure"

    def is_retried(self) -> bool:
        """Whether the job shrinks and goes on after one such failure (user errors may end it)."""
        return self is not FailureClass.USER


# Signals a process gets from outside (the launcher, Slurm, the kernel's OOM killer is told apart by Slurm).
_OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGBUS})


@dataclasses.dataclass(frozen=True)
class WorkerExit:
    """How a worker process ended, as its launcher and Slurm saw it.

    Attributes:
        returncode: the process's exit status (negative: killed by that signal; 128 + n from a shell or srun:
            signal n), or ``None`` when it is unknown (the node was lost).
        reported: the class the worker reported itself before exiting (its ERROR event), if any.
        node_failed: Slurm marked the worker's node down or its job ``NODE_FAIL``.
        preempted: Slurm preempted the worker's job.
        out_of_memory: Slurm ended the step ``OUT_OF_MEMORY`` (the cgroup's OOM killer).
    """

    returncode: int | None
    reported: FailureClass | None = None
    node_failed: bool = False
    preempted: bool = False
    out_of_memory: bool = False


def exit_signal(returncode: int) -> signal.Signals | None:
    """The signal that ended a process with ``returncode`` (``-n``, or ``128 + n`` through a shell), or ``None``."""
    number = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 128 + 65 else 0
    try:
        return signal.Signals(number) if number else None
    except ValueError:
        return None


def classify_exit(ended: WorkerExit) -> FailureClass | None:
    """The class of a worker process's end, or ``None`` for a clean exit (status 0, nothing reported).

    First match wins: the node failed or the job was preempted (infrastructure); Slurm saw out of memory
    (resource); the worker reported a class; no status at all (infrastructure: lost with its node); a signal from
    outside (infrastructure) or one the process raised itself, like ``SIGSEGV`` or ``SIGABRT`` (user); any other
    non-zero status (user: the script failed before or outside the runtime).
    """
    if ended.node_failed or ended.preempted:
        return FailureClass.INFRASTRUCTURE
    if ended.out_of_memory:
        return FailureClass.RESOURCE
    if ended.reported is not None:
        return ended.reported
    if ended.returncode is None:
        return FailureClass.INFRASTRUCTURE
    if ended.returncode == 0:
        return None
    signum = exit_signal(ended.returncode)
    if signum is not None:
        return FailureClass.INFRASTRUCTURE if signum in _OUTSIDE_SIGNALS else FailureClass.USER
    return FailureClass.USER


@dataclasses.dataclass(frozen=True)
class ErrorReport:
    """One worker's failure in one generation, as the coordinator collects them.

    Attributes:
        worker: the worker id.
        generation: the generation it failed in.
        step: its global step when it failed.
        failure: the class.
        error: the exception's type name (``"ValueError"``); compared across members, so not the message, which
            may name the rank.
        message: the worker's sentence (:func:`~slurm_amoeba.runtime.caught.failure_message`), not compared.
        traceback: the end of its traceback, not compared.
    """

    worker: str
    generation: int
    step: int
    failure: FailureClass
    error: str
    message: str = dataclasses.field(default="", compare=False)
    traceback: str = dataclasses.field(default="", compare=False, repr=False)

    @classmethod
    def of(cls, event: WorkerEvent, generation: int) -> ErrorReport:
        """The report of a worker's ``error`` event, in ``generation`` when the event names none.

        A worker that sent no class (an older runtime) is taken at its word's first part
        (``"user error: ..."``), else as a user error: its code raised.
        """
        word = event.failure or event.message.split(" error:", 1)[0]
        try:
            failure = FailureClass(word)
        except ValueError:
            failure = FailureClass.USER
        return cls(
            worker=event.worker,
            generation=event.generation or generation,
            step=event.step,
            failure=failure,
            error=event.error or "unknown",
            message=event.message,
            traceback=event.traceback,
        )


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Why the job must end rather than shrink (:func:`user_error_verdict`).

    Attributes:
        failure: the class of the failure that ends it (user or resource).
        reason: a sentence for the job's history and output.
    """

    failure: FailureClass
    reason: str


def user_error_verdict(
    reports: Sequence[ErrorReport], members: Sequence[str], earlier: Sequence[ErrorReport] = ()
) -> Verdict | None:
    """Whether the job must end now rather than shrink, and why.

    It must when the failure is in the training code, so that a retry fails again: every member of the generation
    raised the same user error (or ran out of memory) at the same step, or a member raised a user error at a step
    where one of the same type was raised before a rollback (``earlier``: reports of previous generations).

    Args:
        reports: this generation's failures.
        members: the generation's members.
        earlier: failures of the job's previous generations.

    Returns:
        The class and a sentence for the job's history and output, or ``None``: shrink and go on.
    """
    if not members:
        return None
    by_worker = {r.worker: r for r in reports}
    if set(members) <= set(by_worker):
        kinds = {(by_worker[m].failure, by_worker[m].error, by_worker[m].step) for m in members}
        if len(kinds) == 1:
            failure, error, step = kinds.pop()
            if failure is FailureClass.USER:
                return Verdict(failure, f"user error: every member raised {error} at step {step}")
            if failure is FailureClass.RESOURCE:
                return Verdict(
                    failure, f"out of memory on every member at step {step}: lower max_local_batch or the model's size"
                )
    seen = {(r.error, r.step) for r in earlier if r.failure is FailureClass.USER}
    for report in reports:
        if report.failure is FailureClass.USER and (report.error, report.step) in seen:
            return Verdict(
                FailureClass.USER,
                f"user error: {report.worker} raised {report.error} at step {report.step} again after a rollback "
                "to the last commit",
            )
    return None
