"""First come, first served: the baseline every other policy is measured against.

Pending jobs start in submit order with their requested size on the nodes with the most free GPUs; the first job
that does not fit blocks the ones behind it (no backfill). Nothing running is ever preempted or resized.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from slurm_amoeba.policy.actions import Action, Start
from slurm_amoeba.policy.common import arrival_key, realize
from slurm_amoeba.policy.types import Snapshot


@dataclasses.dataclass(frozen=True)
class FifoPolicy:
    """Strict first come, first served with requested sizes.

    Attributes:
        name: ``"fifo"``.
        decides_on_events_only: ``True``: only arrivals and departures change the answer.
    """

    name: str = dataclasses.field(default="fifo", init=False)
    decides_on_events_only: bool = dataclasses.field(default=True, init=False)

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The action types it answers with: starts only."""
        return frozenset({Start})

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """Start pending jobs in submit order while the head of the queue fits.

        Args:
            snapshot: the cluster now.
            now: the current time (unused: FIFO depends only on the order of arrival).

        Returns:
            Start decisions.
        """
        free = snapshot.free_gpus
        targets: dict[str, int] = {}
        order = sorted(snapshot.startable(), key=arrival_key)
        for job in order:
            need = job.requested_workers * job.gpus_per_worker
            if need > free:
                break
            targets[job.job_id] = job.requested_workers
            free -= need
        return realize(snapshot, targets, order, {key: "fifo: head of the queue fits" for key in targets})
