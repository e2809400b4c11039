"""Errors and control-flow signals of the elastic runtime (DESIGN.md, layer ``runtime/``).

Errors derive from :class:`~slurm_amoeba.core.errors.AmoebaError`. Two exceptions are not errors but the two
events the elastic entry point (:func:`slurm_amoeba.runtime.run`) retries on: :class:`MembershipChanged` (the
workers agreed to switch generation at a step boundary; no rollback) and :class:`WorkerFailure` (a collective
failed, e.g. because a peer died; roll back to the last commit).
"""

from __future__ import annotations

from slurm_amoeba.core.errors import AmoebaError


class RuntimeConfigError(AmoebaError, ValueError):
    """The runtime was configured or used in a way that cannot work (bad sizes, missing init, misuse)."""


class BatchPlanError(RuntimeConfigError):
    """A global batch cannot be split over the workers, or a dataset is too small for one batch."""


class StateError(AmoebaError, ValueError):
    """Training state cannot be committed, sent or received (unsendable value, mismatched shapes)."""


class RuntimeTimeout(AmoebaError, TimeoutError):
    """A wait of the runtime passed its deadline (coordinator gone, admission never came)."""


class JobLostError(AmoebaError):
    """The coordinator declared the job lost (no worker left that holds the training state)."""


class MembershipChanged(Exception):
    """The workers agreed to end the current generation at this step boundary (no rollback needed)."""


class WorkerFailure(Exception):
    """A collective of the current generation failed; survivors roll back to the last commit.

    Attributes:
        generation: the generation whose collective failed.
    """

    def __init__(self, message: str, *, generation: int) -> None:
        super().__init__(message)
        self.generation = generation
