"""Worker side: the failure class of an exception a worker caught, and the ``error`` event that reports it.

A worker whose ``train(state)`` or runtime raised tells the coordinator why before it exits
(:class:`~slurm_amoeba.runtime.worker.WorkerRuntime`, DESIGN.md, layer ``runtime/``, worker side): the class
(:class:`~slurm_amoeba.runtime.failures.FailureClass`), the exception's type and the end of its traceback. Telling
out of memory and torch.distributed's errors apart needs torch, so this lives on the worker side; the classes and
the verdicts on them (:mod:`slurm_amoeba.runtime.failures`) stay torch-free for the coordinator and the agent.
"""

from __future__ import annotations

import traceback

import torch

from slurm_amoeba.runtime.errors import JobLostError, RuntimeTimeout, WorkerFailure
from slurm_amoeba.runtime.failures import FailureClass

TRACEBACK_CHARS = 8000
"""The most of a traceback a worker's ``error`` event carries (its end: the raising frame and the exception)."""


# Messages of the allocators' out-of-memory errors (torch raises a plain RuntimeError for the host allocator).
_OUT_OF_MEMORY = ("CUDA out of memory", "HIP out of memory", "DefaultCPUAllocator: can't allocate memory")


def classify_exception(exc: BaseException) -> FailureClass:
    """The class of an exception that ended ``train(state)`` or the runtime in a worker.

    Args:
        exc: the exception.

    Returns:
        ``resource`` for out of memory; ``infrastructure`` for the runtime's and torch.distributed's
        communication errors (a peer or the store is gone) and an interrupt; ``user`` for everything else.
    """
    if isinstance(exc, MemoryError | torch.OutOfMemoryError):
        return FailureClass.RESOURCE
    if isinstance(exc, RuntimeError) and any(text in str(exc) for text in _OUT_OF_MEMORY):
        return FailureClass.RESOURCE
    if isinstance(exc, WorkerFailure | RuntimeTimeout | JobLostError | torch.distributed.DistError | KeyboardInterrupt):
        return FailureClass.INFRASTRUCTURE
    return FailureClass.USER


def failure_message(exc: BaseException) -> str:
    """What a failing worker tells the coordinator (its reason in the view): ``"user error: ValueError: ..."``."""
    return f"{classify_exception(exc).value} error: {type(exc).__name__}: {exc}"


def error_fields(exc: BaseException) -> dict[str, str]:
    """The fields of a worker's ``error`` event about ``exc`` (:class:`~slurm_amoeba.runtime.protocol.WorkerEvent`):
    ``message`` (:func:`failure_message`), ``failure`` (the class's value), ``error`` (the exception's type name) and
    ``traceback`` (its last :data:`TRACEBACK_CHARS` characters)."""
    text = "".join(traceback.format_exception(exc))
    return {
        "message": failure_message(exc),
        "failure": classify_exception(exc).value,
        "error": type(exc).__name__,
        "traceback": text[-TRACEBACK_CHARS:],
    }
