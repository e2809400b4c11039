"""Admission at the requested size as a layer: holds and releases from the ``amoebad`` policy's own admission rule
(DESIGN.md, control flow; docs/admin.md, section 8c).

The simulator's ``amoebad`` policy (:class:`~slurm_amoeba.policy.amoebad.AmoebadPolicy` with its
:class:`~slurm_amoeba.policy.amoebad.AdmissionLayer`) decides which pending elastic jobs wait for their requested
size: Slurm's backfill with reservations, in Slurm's queue order, where a gated elastic job (one the admission layer
holds: :meth:`~slurm_amoeba.policy.amoebad.AmoebadPolicy.held_for_admission`) starts only when its requested size
fits *now* (free GPUs and running elastic jobs' workers above their minimum) for its whole time limit without
delaying a reservation made before it, and holds no reservation meanwhile. :class:`AdmissionGate` asks that same
policy, on the live snapshot, which gated jobs it would start now, and turns its answer into typed actions:

- :class:`~slurm_amoeba.policy.actions.Hold` for a gated elastic job it would not start that Slurm does not hold yet;
- :class:`~slurm_amoeba.policy.actions.Release` for a job the daemon holds (``JobInfo.held_since``) that it starts
  now, and with ``starved`` for one that is no longer gated: pending ``max_hold_s`` since its submission, it is an
  ordinary pending job that Slurm starts at its minimum.

The rule is asked with Slurm's own queue order (:func:`slurm_rule`): the live snapshot's ``priority`` is the
priority Slurm computed (for a job the daemon holds, the one it had before the hold), so every multifactor weight
is 0 and the order is Slurm's: priority, then submit time, then id. Jobs outside ``partitions`` or ``users`` are
not gated: the rule sees them as ordinary jobs of their minimum. The inner policy's answer passes through unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import ClassVar

from slurm_amoeba.policy.actions import Action, Hold, Release, Start
from slurm_amoeba.policy.amoebad import AdmissionLayer, AmoebadPolicy
from slurm_amoeba.policy.layer import PolicyLayer
from slurm_amoeba.policy.slurm_baseline import DEFAULT_MAX_HOLD_S
from slurm_amoeba.policy.types import JobInfo, JobPhase, Snapshot


def slurm_rule(max_hold_s: float = DEFAULT_MAX_HOLD_S) -> AmoebadPolicy:
    """The ``amoebad`` policy with its admission layer, ordering jobs as Slurm does live (see the module docstring).

    Args:
        max_hold_s: the admission layer's bound (``admission.max_hold_s``; 0: none).
    """
    return AmoebadPolicy(
        weight_age=0.0,
        weight_job_size=0.0,
        weight_fairshare=0.0,
        weight_partition=0.0,
        admission=AdmissionLayer(max_hold_s=max_hold_s),
    )


@dataclasses.dataclass(frozen=True)
class AdmissionGate(PolicyLayer):
    """A policy with the admission rule's holds and releases added to its answer (see the module docstring).

    Attributes:
        inner: the policy whose answer the holds and releases are added to.
        rule: the policy whose admission decides (:func:`slurm_rule`).
        partitions: only pending jobs of these partitions are gated (empty: every partition).
        users: only these users' jobs are gated (empty: everyone's).
        max_workers: the site's cap on an elastic job's workers: its requested size is its maximum, capped by this.
    """

    adds: ClassVar[frozenset[type[Action]]] = frozenset({Hold, Release})
    #: A held job's bound runs out with time.
    changes_with_time: ClassVar[bool] = True

    rule: AmoebadPolicy = dataclasses.field(default_factory=slurm_rule)
    partitions: Collection[str] = frozenset()
    users: Collection[str] = frozenset()
    max_workers: int = 1 << 30

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """The inner policy's actions, then the holds and releases (:meth:`verdicts`)."""
        return [*self.inner.decide(snapshot, now), *self.verdicts(snapshot, now)]

    def gated(self, job: JobInfo) -> bool:
        """Whether the layer decides about a pending job: elastic, of the partitions and users it admits."""
        return (
            job.state is JobPhase.PENDING
            and job.is_elastic
            and (not self.partitions or job.partition in self.partitions)
            and (not self.users or job.owner in self.users)
        )

    def rule_view(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot as the rule sees it: a gated job asks for its requested size (its maximum, capped by the
        site and the cluster) and is not held (the rule decides that), other pending elastic jobs are ordinary
        jobs of their minimum."""
        jobs: list[JobInfo] = []
        for job in snapshot.jobs:
            if job.state is not JobPhase.PENDING or not job.is_elastic:
                jobs.append(job)
            elif self.gated(job):
                fits = snapshot.total_gpus // job.gpus_per_worker
                request = max(job.min_workers, min(job.max_workers, self.max_workers, fits))
                jobs.append(dataclasses.replace(job, requested_workers=request, held=False))
            else:
                low = job.min_workers
                jobs.append(dataclasses.replace(job, requested_workers=low, max_workers=low))
        return dataclasses.replace(snapshot, jobs=tuple(jobs))

    def verdicts(self, snapshot: Snapshot, now: float) -> list[Hold | Release]:
        """The holds and releases of this round (see the module docstring), in snapshot order.

        Only gated jobs get a verdict, so with none pending the rule is not asked: its Slurm model (backfill with
        reservations over the whole queue) is most of a round's time on a large cluster.
        """
        if not any(self.gated(job) for job in snapshot.jobs):
            return []
        view = self.rule_view(snapshot)
        starts = {action.job_id for action in self.rule.decide(view, now) if isinstance(action, Start)}
        lendable = snapshot.free_gpus + sum(
            (job.workers - self.rule.daemon_floor(job)) * job.gpus_per_worker
            for job in snapshot.running()
            if job.is_resizable
        )
        out: list[Hold | Release] = []
        for seen, job in zip(snapshot.jobs, view.jobs, strict=True):
            if not self.gated(seen):
                continue
            wanted = job.requested_workers * job.gpus_per_worker
            ours = seen.held and seen.held_since is not None
            if not self.rule.held_for_admission(job, now):
                if ours:
                    out.append(Release(job.job_id, self._starved(job, now), starved=True))
            elif job.job_id in starts:
                if ours:
                    out.append(
                        Release(job.job_id, f"its requested {wanted} GPUs are free or lendable now ({lendable})")
                    )
            elif not seen.held:
                out.append(Hold(job.job_id, f"waiting for {wanted} GPUs ({lendable} free or lendable)", wanted))
        return out

    def _starved(self, job: JobInfo, now: float) -> str:
        bound = self.rule.admission.max_hold_s if self.rule.admission is not None else 0.0
        return (
            f"pending {now - job.submit_time:.0f} s >= admission.max_hold_s {bound:g} s; it starts at its minimum "
            f"({job.min_workers * job.gpus_per_worker} GPUs) when Slurm can"
        )
