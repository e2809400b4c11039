"""The operator's drain as a policy wrapper: while it is on, every elastic job goes to its minimum and stays there.

``amoebactl drain`` (DESIGN.md, control flow) is a decision like any other, so it is made here, purely, and not in
the daemon's loop: :class:`DrainPolicy` wraps any :class:`~slurm_amoeba.policy.types.Policy`. Switched off it is
the wrapped policy; switched on it does not ask the wrapped policy at all (a drain is for maintenance: nothing
grows, nothing moves) and answers with one :class:`~slurm_amoeba.policy.actions.Resize` per running elastic job
above its minimum. The caller acts on those as on any policy's actions, after
:func:`~slurm_amoeba.policy.check.check_actions`.

A drain outranks a pin (a job's owner may pin the job, but only an operator drains), so a caller that honours the
drain shows no job pinned in the snapshot it passes while draining; a job still resizing is left to finish first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

from slurm_amoeba.policy.actions import Action, Resize
from slurm_amoeba.policy.layer import PolicyLayer
from slurm_amoeba.policy.types import Snapshot

#: The reason every drain resize carries (the agent logs it).
DRAIN_REASON = "drain: an operator asked every elastic job to its minimum"


def drain_actions(snapshot: Snapshot) -> list[Resize]:
    """One shrink to its minimum for every running job that may be resized now and holds more than its minimum.

    Args:
        snapshot: the cluster now.

    Returns:
        The resizes, in snapshot order; the agents (or Slurm) pick which workers leave, so no placement.
    """
    return [
        Resize(job.job_id, job.min_workers, reason=DRAIN_REASON)
        for job in snapshot.running()
        if job.is_resizable and job.workers > job.min_workers
    ]


@dataclasses.dataclass(frozen=True)
class DrainPolicy(PolicyLayer):
    """Any policy, with the operator's drain switch in front of it (see the module docstring).

    Attributes:
        inner: the policy that decides while the drain is off.
        draining: whether the drain is on.
    """

    adds: ClassVar[frozenset[type[Action]]] = frozenset({Resize})

    draining: bool = True

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """The drain's resizes while it is on, the wrapped policy's actions otherwise.

        Args:
            snapshot: the cluster now.
            now: the current time in seconds.

        Returns:
            At most one size-changing action per job.
        """
        if self.draining:
            return drain_actions(snapshot)
        return self.inner.decide(snapshot, now)
