"""Shortest job first with GPU sharing: SJF-BSBF, AntMan-style opportunistic sharing, and SJF-FFS.

Policies of the control and simulation flows (DESIGN.md); the pairing rules they share live in
:mod:`slurm_amoeba.policy.pairing`, which is what makes the daemon and the simulator pair jobs alike.

- **SJF-BSBF** (``sjf-bsbf``; best sharing benefit first, Ye et al., arXiv 2407.13088) and **AntMan**
  (``antman``; opportunistic sharing, Xiao et al., OSDI'20) are :class:`PairingPolicy`: non-preemptive shortest job
  first. Pending jobs, shortest first (remaining time at the requested size: the simulator's oracle or the runtime's
  estimate, else what the time limit leaves), start exclusively when their requested size is free; no running job
  is ever preempted for another's start. A pending job that does not fit may run on the GPUs of a running job
  that runs exclusively, has no partner and is neither resizing nor pinned, with the sharer's micro-batch and
  gradient accumulation searched so that it fits the memory the host leaves
  (:func:`~slurm_amoeba.policy.pairing.plan_pair`): SJF-BSBF pairs only
  when the pair's summed completion time falls, best benefit first; AntMan pairs whenever the sharer makes
  progress while paced so that the host keeps ``1 - pace_bound`` of its speed (with ``promote``, it also moves a
  sharer onto GPUs of its own, a :class:`Place`, once its requested size is free). Both shrink or evict a sharer
  when its host needs its memory back (:func:`~slurm_amoeba.policy.pairing.reclaims`); AntMan also evicts one whose
  host measurably lost more than its bound. A running job that may grow beside a host (``JobInfo.grows_beside``,
  the live daemon's opportunistic jobs) is paired as a waiting job is, in the same shortest-first order.
- **SJF-FFS** (``sjf-ffs``, :class:`SjfSharingPolicy`; first-fit sharing) admits jobs shortest remaining time first
  with their requested size, preempting running jobs that lose their place, exactly as
  :class:`~slurm_amoeba.policy.srtf.SrtfPolicy` does; a pending job left waiting shares the GPUs of the first
  running job that keeps running, has at least as many workers and no partner, whatever it costs, without a
  sub-batch search (both jobs halve their micro-batch).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from slurm_amoeba.policy.actions import Action, Place, Preempt, Share, Start
from slurm_amoeba.policy.common import FreeGpus, SizeAction, admit_in_order, realize
from slurm_amoeba.policy.pairing import (
    ShareMode,
    open_hosts,
    placement_within,
    plan_pair,
    reclaims,
    remaining_seconds,
)
from slurm_amoeba.policy.srtf import admit_shortest_first
from slurm_amoeba.policy.types import JobInfo, JobPhase, PolicyError, Snapshot

#: The host's allowed slowdown under opportunistic sharing by default: it keeps 95% of its exclusive speed.
DEFAULT_PACE_BOUND = 0.05


def shortest_first_key(job: JobInfo) -> tuple[float, float, str]:
    """Sort key of shortest job first: seconds left at the requested size (the oracle's or the runtime's estimate,
    else what the time limit leaves, else last), then submit order."""
    remaining = remaining_seconds(job)
    return (math.inf if remaining is None else remaining, job.submit_time, job.job_id)


def growing_beside(snapshot: Snapshot) -> list[JobInfo]:
    """Running jobs whose further workers may run beside a host (``JobInfo.grows_beside``: the live daemon's
    opportunistic jobs), paired as a waiting job is: not pinned, resizing or sharing, hosting nobody."""
    hosting = {job.shared_with for job in snapshot.jobs if job.shared_with is not None}
    return [
        job
        for job in snapshot.running()
        if job.grows_beside
        and not job.pinned
        and not job.resizing
        and job.shared_with is None
        and job.job_id not in hosting
    ]


@dataclasses.dataclass(frozen=True)
class PairingPolicy:
    """Non-preemptive shortest job first with GPU sharing by the pairing rules (see the module).

    Attributes:
        mode: SJF-BSBF's benefit rule or AntMan's opportunistic sharing.
        pace_bound: under opportunistic sharing, the host's allowed slowdown (it keeps ``1 - pace_bound`` of its
            exclusive speed); unused by the benefit rule.
        promote: under opportunistic sharing, move a sharer onto GPUs of its own (a :class:`Place`) once its
            requested size is free; ``False`` leaves it beside its host until the host is done (it then runs alone
            on those GPUs), which the live daemon can apply without moving workers.
        name: ``"sjf-bsbf"`` or ``"antman"``.
        decides_on_events_only: ``True``: only arrivals, departures and size changes change the answer.
    """

    mode: ShareMode = ShareMode.BENEFIT
    pace_bound: float = DEFAULT_PACE_BOUND
    promote: bool = False
    name: str = dataclasses.field(default="", init=False)
    decides_on_events_only: bool = dataclasses.field(default=True, init=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.pace_bound < 1.0:
            raise PolicyError(
                f"pace_bound={self.pace_bound} must lie in [0, 1) (0.05: a host keeps 95% of its exclusive speed)"
            )
        object.__setattr__(self, "name", "sjf-bsbf" if self.mode is ShareMode.BENEFIT else "antman")

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The action types it answers with: starts, shares, evictions (preempts of sharers) and, opportunistic,
        the places that give a sharer GPUs of its own."""
        kinds: set[type[Action]] = {Start, Preempt, Share}
        if self.mode is ShareMode.OPPORTUNISTIC and self.promote:
            kinds.add(Place)
        return frozenset(kinds)

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """Start the shortest pending jobs that fit, pair the others where the rule allows, reclaim for hosts.

        Args:
            snapshot: the cluster now.
            now: the current time (unused).

        Returns:
            Starts, shares, places (opportunistic) and evictions; never a preemption of a job on its own GPUs.
        """
        bound = self.pace_bound if self.mode is ShareMode.OPPORTUNISTIC else None
        decisions: list[Action] = list(reclaims(snapshot, bound))
        decided = {action.job_id for action in decisions}
        waiting = sorted(
            (job for job in snapshot.jobs if job.state is JobPhase.PENDING and not job.held), key=shortest_first_key
        )
        targets = admit_in_order(waiting, snapshot.free_gpus)
        reasons = dict.fromkeys(targets, f"{self.name}: shortest first, its size is free")
        starts = realize(snapshot, targets, waiting, reasons)
        decisions.extend(starts)
        decided.update(action.job_id for action in starts)
        if self.mode is ShareMode.OPPORTUNISTIC and self.promote:
            decisions.extend(self._promote(snapshot, starts, decided))
        # a host being resized or pinned is left alone (the daemon takes a sharer back from a host that changes)
        hosts = [host for host in open_hosts(snapshot, decided) if not host.resizing and not host.pinned]
        for job in sorted([*waiting, *growing_beside(snapshot)], key=shortest_first_key):
            if job.job_id in decided:
                continue
            plan = plan_pair(job, [host for host in hosts if host is not job], snapshot, self.mode, self.pace_bound)
            if plan is None:
                continue
            hosts = [host for host in hosts if host is not plan.host and host is not job]
            decided.update((job.job_id, plan.host.job_id))  # a host is no sharer, a sharer no host, in one answer
            batch = (
                "its own micro-batch"
                if plan.sub_batch is None
                else f"micro-batch {plan.sub_batch} x {plan.accumulation}"
            )
            decisions.append(
                Share(
                    job.job_id,
                    plan.host.job_id,
                    job.requested_workers,
                    placement_within(plan.host, job.requested_workers),
                    f"{self.name}: beside {plan.host.job_id} with {batch} "
                    f"(keeps {plan.keep_sharer:.0%}, host {plan.keep_host:.0%})",
                    sub_batch=plan.sub_batch,
                    accumulation=plan.accumulation,
                    pace_bound=bound,
                )
            )
        return decisions

    def _promote(self, snapshot: Snapshot, starts: Sequence[SizeAction], decided: set[str]) -> list[Action]:
        """Opportunistic sharers, shortest first, that get GPUs of their own from what the starts left free."""
        free = FreeGpus(snapshot.free_by_node())
        for action in starts:
            job = snapshot.job(action.job_id)
            for name, count in action.placement.items():
                free.change(name, -count * job.gpus_per_worker)
        sharers = sorted(
            (job for job in snapshot.running() if job.shared_with is not None and job.job_id not in decided),
            key=shortest_first_key,
        )
        places: list[Action] = []
        for job in sharers:
            placement = free.place(job.workers, job.gpus_per_worker)
            if placement is None:
                continue
            decided.add(job.job_id)
            places.append(Place(job.job_id, placement, f"{self.name}: GPUs of its own are free, leaves its host"))
        return places


@dataclasses.dataclass(frozen=True)
class SjfSharingPolicy:
    """Preemptive shortest-remaining-first with first-fit GPU sharing (SJF-FFS).

    Attributes:
        name: ``"sjf-ffs"``.
        decides_on_events_only: ``True``: only arrivals and departures change the answer.
    """

    name: str = dataclasses.field(default="sjf-ffs", init=False)
    decides_on_events_only: bool = dataclasses.field(default=True, init=False)

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The action types it answers with: starts, preempts and GPU shares."""
        return frozenset({Start, Preempt, Share})

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """Admit jobs shortest first; place the ones left waiting on the first partner's GPUs that fits.

        Args:
            snapshot: the cluster now.
            now: the current time (unused).

        Returns:
            Start and preempt decisions, some starts sharing a running job's GPUs.
        """
        targets, order = admit_shortest_first(snapshot)
        reasons = {key: f"{self.name}: admitted by remaining time" for key, size in targets.items() if size}
        decisions: list[Action] = list(realize(snapshot, targets, order, reasons))
        decided = {decision.job_id for decision in decisions}
        partners = open_hosts(snapshot, decided)
        for job in order:
            if job.state is not JobPhase.PENDING or job.job_id in decided:
                continue
            partner = next(
                (
                    other
                    for other in partners
                    if other.gpus_per_worker == job.gpus_per_worker and other.workers >= job.requested_workers
                ),
                None,
            )
            if partner is None:
                continue
            partners.remove(partner)
            decisions.append(
                Share(
                    job.job_id,
                    partner.job_id,
                    job.requested_workers,
                    placement_within(partner, job.requested_workers),
                    f"{self.name}: shares the GPUs of {partner.job_id}",
                )
            )
        return decisions
