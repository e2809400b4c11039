"""Why Slurm keeps a job pending: squeue's reason codes (``state_reason`` in ``squeue --json``, ``%r``).

Part of the Slurm layer (DESIGN.md, ``slurm/``): the daemon's snapshot step asks :func:`waits_for_resources` which
pending jobs free GPUs could start, and :func:`is_held` which jobs are held; neither spells a reason code itself.
Slurm names many more reasons (``squeue(1)``, "JOB REASON CODES"); only those the project tells apart are members
of :class:`PendingReason`, and every other one reads as a job that waits for resources.
"""

from __future__ import annotations

import enum


class PendingReason(str, enum.Enum):
    """The reason codes the project tells apart, as squeue spells them."""

    RESOURCES = "Resources"
    PRIORITY = "Priority"
    HELD_BY_USER = "JobHeldUser"
    HELD_BY_ADMIN = "JobHeldAdmin"
    DEPENDENCY = "Dependency"
    DEPENDENCY_NEVER_SATISFIED = "DependencyNeverSatisfied"
    BEGIN_TIME = "BeginTime"
    PARTITION_DOWN = "PartitionDown"
    PARTITION_INACTIVE = "PartitionInactive"
    PARTITION_TIME_LIMIT = "PartitionTimeLimit"
    ASSOCIATION_GRES_LIMIT = "AssocGrpGRES"
    QOS_GRES_PER_USER_LIMIT = "QOSMaxGRESPerUser"


#: Reasons of jobs that cannot start whatever GPUs are free: held, waiting for another job or a time, in a
#: partition that cannot run them, or at a GPU limit of their association or QOS.
BLOCKED_REASONS = frozenset(
    {
        PendingReason.HELD_BY_USER,
        PendingReason.HELD_BY_ADMIN,
        PendingReason.DEPENDENCY,
        PendingReason.DEPENDENCY_NEVER_SATISFIED,
        PendingReason.BEGIN_TIME,
        PendingReason.PARTITION_DOWN,
        PendingReason.PARTITION_INACTIVE,
        PendingReason.PARTITION_TIME_LIMIT,
        PendingReason.ASSOCIATION_GRES_LIMIT,
        PendingReason.QOS_GRES_PER_USER_LIMIT,
    }
)
_BLOCKED_CODES = frozenset(reason.value for reason in BLOCKED_REASONS)


def waits_for_resources(reason: str) -> bool:
    """Whether a pending job with this reason code could start once enough resources are free.

    False for the :data:`BLOCKED_REASONS`; True for every other code (``Resources``, ``Priority``, ``None``, codes
    this module does not name).
    """
    return reason not in _BLOCKED_CODES


def is_held(reason: str) -> bool:
    """Whether the reason code says the job is held (``JobHeldUser``, ``JobHeldAdmin``: every ``JobHeld*`` code)."""
    return reason.startswith("JobHeld")
