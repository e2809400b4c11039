"""Shortest job first with GPU sharing: SJF-FFS and SJF-BSBF.

Both admit jobs shortest remaining time first (an oracle in the simulator) with their requested size, preempting
running jobs that lose their place, exactly as :class:`~slurm_amoeba.policy.srtf.SrtfPolicy` does. A pending job
that is not admitted may instead *share* the GPUs of a running job that keeps running, has at least as many
workers and no partner yet; the sharer runs with a sub-batch and gradient accumulation, so that its
global batch stays the same, and both jobs slow down by the measured co-location factors
(``Snapshot.colocation``).

- **SJF-FFS** (first-fit sharing) shares with the first such running job, whatever it costs.
- **SJF-BSBF** (best sharing benefit first, Ye et al., arXiv 2407.13088) shares only when the pair's summed
  completion times are lower together than one after the other, and picks the partner with the largest benefit;
  a pair whose slowdown was never measured is not shared.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from slurm_amoeba.policy.actions import Action, Preempt, Share, Start
from slurm_amoeba.policy.common import realize
from slurm_amoeba.policy.srtf import admit_shortest_first
from slurm_amoeba.policy.types import JobInfo, JobPhase, PolicyError, Snapshot

#: The fraction of its solo speed a job keeps on a shared GPU when the pair was never measured (time slicing).
UNMEASURED_COLOCATION = 0.5


def sharing_benefit(mine: float, partner: float, keep_mine: float, keep_partner: float) -> float:
    """Seconds of summed completion time saved by running two jobs together instead of one after the other.

    One after the other, the running partner finishes after ``partner`` seconds and the new job after
    ``partner + mine``. Together, both run at their co-located speeds until the first finishes; the other then runs
    alone.

    Args:
        mine: remaining seconds of the new job alone.
        partner: remaining seconds of the running job alone.
        keep_mine: fraction of its speed the new job keeps while sharing (0, 1].
        keep_partner: fraction of its speed the running job keeps while sharing (0, 1].

    Returns:
        The saving; negative when sharing is worse.
    """
    sequential = partner + (partner + mine)
    t_partner = partner / keep_partner
    t_mine = mine / keep_mine
    if t_partner <= t_mine:
        first = t_partner
        second = first + (mine - keep_mine * first)
    else:
        first = t_mine
        second = first + (partner - keep_partner * first)
    return sequential - (first + second)


def _remaining(job: JobInfo) -> float:
    remaining = job.remaining_time()
    return math.inf if remaining is None else remaining


@dataclasses.dataclass(frozen=True)
class SjfSharingPolicy:
    """Preemptive shortest-remaining-first with GPU sharing, first fit or best benefit first.

    Attributes:
        best_benefit: ``True`` for SJF-BSBF, ``False`` for SJF-FFS.
        name: ``"sjf-bsbf"`` or ``"sjf-ffs"``.
        decides_on_events_only: ``True``: only arrivals and departures change the answer.
    """

    best_benefit: bool = True
    name: str = dataclasses.field(default="", init=False)
    decides_on_events_only: bool = dataclasses.field(default=True, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", "sjf-bsbf" if self.best_benefit else "sjf-ffs")

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The action types it answers with: starts, preempts and GPU shares."""
        return frozenset({Start, Preempt, Share})

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """Admit jobs shortest first; place the ones left waiting on a partner's GPUs where allowed.

        Args:
            snapshot: the cluster now.
            now: the current time (unused).

        Returns:
            Start and preempt decisions, some starts sharing a running job's GPUs.
        """
        targets, order = admit_shortest_first(snapshot)
        reasons = {key: f"{self.name}: admitted by remaining time" for key, size in targets.items() if size}
        decisions: list[Action] = list(realize(snapshot, targets, order, reasons))
        decided = {decision.job_id: decision for decision in decisions}
        hosting = {job.shared_with for job in snapshot.jobs if job.shared_with is not None}
        partners = [
            job
            for job in sorted(snapshot.running(), key=lambda j: (j.submit_time, j.job_id))
            if job.shared_with is None and job.job_id not in hosting and job.job_id not in decided
        ]
        remaining = {job.job_id: job.remaining_time(job.workers) for job in partners}
        for job in order:
            if job.state is not JobPhase.PENDING or job.job_id in decided:
                continue
            partner = self._pick_partner(job, partners, snapshot.colocation, remaining)
            if partner is None:
                continue
            partners.remove(partner)
            decisions.append(
                Share(
                    job.job_id,
                    partner.job_id,
                    job.requested_workers,
                    _subset(partner.placement, job.requested_workers),
                    f"{self.name}: shares the GPUs of {partner.job_id}",
                )
            )
        return decisions

    def _pick_partner(
        self,
        job: JobInfo,
        partners: Sequence[JobInfo],
        colocation: Mapping[tuple[str, str], float],
        remaining: Mapping[str, float | None],
    ) -> JobInfo | None:
        fitting = [
            other
            for other in partners
            if other.gpus_per_worker == job.gpus_per_worker and other.workers >= job.requested_workers
        ]
        if not self.best_benefit:
            return fitting[0] if fitting else None
        best: JobInfo | None = None
        best_gain = 0.0
        mine = _remaining(job)
        if math.isinf(mine) or not colocation:
            return None  # no oracle or no measured slowdowns: the benefit cannot be known
        for other in fitting:
            keep_mine = colocation.get((job.job_type, other.job_type))
            keep_other = colocation.get((other.job_type, job.job_type))
            theirs = remaining[other.job_id]
            if keep_mine is None or keep_other is None or theirs is None:
                continue
            if not (0.0 < keep_mine <= 1.0 and 0.0 < keep_other <= 1.0):
                raise PolicyError(
                    f"co-location factors ({keep_mine}, {keep_other}) for {job.job_type}/{other.job_type} "
                    f"must lie in (0, 1]"
                )
            gain = sharing_benefit(mine, theirs, keep_mine, keep_other)
            if gain > best_gain:
                best, best_gain = other, gain
        return best


def _subset(placement: Mapping[str, int], workers: int) -> dict[str, int]:
    result: dict[str, int] = {}
    left = workers
    for name, count in placement.items():
        if left == 0:
            break
        take = min(count, left)
        result[name] = take
        left -= take
    return result
