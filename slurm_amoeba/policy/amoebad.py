"""The ``amoebad`` policy: Slurm's baseline with the daemon on top, composed of layers (DESIGN.md, layer ``policy/``).

What a site running ``amoebad`` would see, for the simulator (``amoeba-sim run --policy amoebad``, or
``--daemon-config FILE`` to build it from the daemon's own configuration). :class:`AmoebadPolicy` is the ``slurm``
baseline (:class:`~slurm_amoeba.policy.slurm_baseline.SlurmBaselinePolicy`, every Slurm knob the same) whose hooks
are filled by frozen layers (:mod:`slurm_amoeba.policy.amoebad_layers`, where their knobs are described; named here
too):

- :class:`ElasticLayer`, always present: elastic jobs are submitted at their minimum (or at their request), their
  loans above what Slurm counts as taken are free for Slurm's decisions, are given back, least useful first (on the
  nodes where a start fits best, with ``compact_starts``), when a job Slurm starts needs them, and the GPUs left
  idle go to the elastic jobs with the least attained service first (:mod:`slurm_amoeba.policy.elastic_room`).
- :class:`AdmissionLayer`, optional: an elastic job is held until its *requested* size is available now, and then
  starts at that size (live: ``admission.enabled``, with ``scontrol hold``/``release``).
- :class:`WholeNodeLayer`, optional, with admission: a job Slurm starts that fits on one node is put on one node by
  moving elastic jobs' workers off it (live: ``whole_node_starts``).
- :class:`LasOrderLayer`, optional: Slurm's queue in 2D-LAS order, as the daemon sets it through job priorities
  (live: ``queue_order.enabled``).

A layer present or absent replaces the switches of a flat knob list; combinations that mean nothing (a whole-node
layer without admission, an admission of jobs submitted at their request) are refused when the policy is built.

By name, :func:`make_amoebad` takes Slurm's knobs as the ``slurm`` policy names them, a layer's name as a switch
(``admission=True``) and a layer's knobs as ``layer.knob`` (``**{"admission.max_hold_s": 0.0}``, on the command
line ``--knob admission=true --knob admission.max_hold_s=0``); :func:`amoebad_knobs` lists them with their defaults.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from slurm_amoeba.core.errors import unknown_key_message
from slurm_amoeba.policy.actions import Action, Place, Resize
from slurm_amoeba.policy.amoebad_layers import AdmissionLayer, ElasticLayer, LasOrderLayer, WholeNodeLayer
from slurm_amoeba.policy.common import SizeAction, base_size
from slurm_amoeba.policy.elastic_room import ElasticPass, admission_keeps, compact_growth, spares, spares_tail
from slurm_amoeba.policy.queue_order import las_key
from slurm_amoeba.policy.slurm_baseline import SlurmBaselinePolicy, SlurmRound
from slurm_amoeba.policy.types import JobInfo, JobPhase, PolicyError, Snapshot

__all__ = [
    "LAYERS",
    "OPTIONAL_LAYERS",
    "AdmissionLayer",
    "AmoebadPolicy",
    "ElasticLayer",
    "LasOrderLayer",
    "WholeNodeLayer",
    "amoebad_knobs",
    "make_amoebad",
]


@dataclasses.dataclass(frozen=True)
class AmoebadPolicy(SlurmBaselinePolicy):
    """Slurm's baseline with ``amoebad`` on top (see the module): Slurm's knobs, then the layers.

    Attributes:
        elastic: the elastic backfill.
        admission: holding elastic jobs for their requested size, or ``None`` (the plain daemon).
        whole_node: whole-node starts (needs ``admission``), or ``None``.
        las_order: Slurm's queue in 2D-LAS order, or ``None`` (Slurm's multifactor order).
        name: ``"amoebad"``.
    """

    name: str = dataclasses.field(default="amoebad", init=False)
    elastic: ElasticLayer = dataclasses.field(default_factory=ElasticLayer)
    admission: AdmissionLayer | None = None
    whole_node: WholeNodeLayer | None = None
    las_order: LasOrderLayer | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.admission is not None and self.elastic.at_request:
            raise PolicyError(
                "the admission layer holds jobs submitted at their minimum until their request is free; with "
                "elastic.submitted_at='request' Slurm already waits for the request: drop one of the two"
            )
        if self.whole_node is not None and self.admission is None:
            raise PolicyError(
                "the whole-node layer is modelled under the admission layer only; add admission=true or drop whole_node"
            )
        if (self.whole_node is not None or self._compact_admissions) and not self.elastic.compact_starts:
            raise PolicyError(
                "whole-node starts and admission.compact_admissions place starts on chosen nodes, which needs "
                "elastic.compact_starts=true"
            )

    @property
    def _compact_admissions(self) -> bool:
        return self.admission is not None and self.admission.compact_admissions

    # -- the hooks of the baseline ---------------------------------------------------------------------------

    def queue_order(self, snapshot: Snapshot, now: float) -> list[JobInfo]:
        """Slurm's order, or with the LAS layer: partition tier, 2D-LAS queue, submit time, id."""
        las = self.las_order
        if las is None:
            return super().queue_order(snapshot, now)
        thresholds = las.thresholds_gpu_s
        return sorted(
            snapshot.startable(),
            key=lambda job: (-self._partition(job).priority_tier, *las_key(job, thresholds)),
        )

    def slurm_holds(self, job: JobInfo) -> int:
        """An elastic job's workers up to :meth:`slurm_floor` (its loans above count as free); a rigid job's all."""
        if job.is_resizable:
            return min(self.slurm_floor(job), job.workers) * job.gpus_per_worker
        return job.gpus

    def admission_holds(self) -> Callable[[JobInfo], int] | None:
        """With admission and ``slurm_takes_loans_only``: an admission may take extras down to the minimum, which a
        job Slurm starts may not, so admissions keep a profile of their own."""
        if self.admission is None or not self.admission.slurm_takes_loans_only or self.elastic.at_request:
            return None
        return lambda job: self.daemon_floor(job) * job.gpus_per_worker

    def start_size(self, job: JobInfo, now: float) -> int:
        """An elastic job starts at its minimum unless held for admission or submitted at its request."""
        if self.held_for_admission(job, now) or self.elastic.at_request:
            return job.requested_workers
        return base_size(job)

    def held_for_admission(self, job: JobInfo, now: float) -> bool:
        """With admission, a pending elastic job not yet ``max_hold_s`` old."""
        if self.admission is None:
            return False
        if 0 < self.admission.max_hold_s <= now - job.submit_time and job.state is JobPhase.PENDING:
            return False
        return job.is_elastic

    def lendable_for_admissions(self, snapshot: Snapshot, running: Sequence[JobInfo]) -> float:
        """With ``protect_requests``: free GPUs and running jobs' extras above what they keep
        (:func:`~slurm_amoeba.policy.elastic_room.admission_keeps`); otherwise no bound."""
        if self.admission is None or not self.admission.protect_requests:
            return math.inf
        keep = admission_keeps(self.elastic.min_gain)
        extras = sum(max(job.workers - keep(job), 0) * job.gpus_per_worker for job in running if job.is_resizable)
        return snapshot.free_gpus + extras

    def admission_size(
        self, job: JobInfo, snapshot: Snapshot, running: Sequence[JobInfo], taken: int, now: float
    ) -> int | None:
        """The size an elastic job admitted at its request starts at under :meth:`admission_spares` (``None`` when
        no such rule applies): its request when the free GPUs (less ``taken`` this round) and the extras the running
        jobs may give hold it, else what they hold if that is at least its minimum, else its request (taking from
        every job, as without the rule: an admission held until such jobs end waited for hours, docs/simulator.md)."""
        keep = self.admission_spares(job, snapshot, now)
        if keep is None:
            return None
        extras = sum(max(other.workers - keep(other), 0) * other.gpus_per_worker for other in running)
        size = min(job.requested_workers, (snapshot.free_gpus + extras - taken) // job.gpus_per_worker)
        return size if size >= job.min_workers else job.requested_workers

    def after_slurm(self, slurm: SlurmRound) -> dict[str, dict[str, int]]:
        """The daemon's elastic backfill: one :class:`~slurm_amoeba.policy.elastic_room.ElasticPass` over this
        decision."""
        return ElasticPass(
            self, slurm.snapshot, slurm.now, slurm.running, slurm.victims, slurm.targets, slurm.reasons
        ).run(slurm.started)

    def finish(self, actions: list[SizeAction], snapshot: Snapshot) -> list[SizeAction]:
        """With ``compact_growth``, growths kept on as few nodes as they need."""
        if not self.elastic.compact_growth:
            return actions
        by_id = snapshot.by_id()
        node_gpus = max((node.gpus_total for node in snapshot.nodes), default=1)
        kept = (compact_growth(action, by_id[action.job_id], node_gpus) for action in actions)
        return [action for action in kept if action is not None]

    @property
    def emits(self) -> frozenset[type[Action]]:
        """Slurm's starts and preemptions, the daemon's resizes, and with the whole-node layer its moves of
        running jobs to other nodes (places)."""
        kinds = super().emits | {Resize}
        return kinds | {Place} if self.whole_node is not None else kinds

    # -- what the elastic layer reads ------------------------------------------------------------------------

    def slurm_floor(self, job: JobInfo) -> int:
        """The workers of a running elastic job that a job Slurm starts cannot take: its request when submitted at
        it or under admission with ``slurm_takes_loans_only``, else its minimum."""
        loans_only = self.admission is not None and self.admission.slurm_takes_loans_only
        if loans_only or self.elastic.at_request:
            return max(job.requested_workers, job.min_workers)
        return job.min_workers

    def admission_spares(self, job: JobInfo, snapshot: Snapshot, now: float) -> Callable[[JobInfo], int] | None:
        """For an elastic job the daemon admits: the fewest workers each running job keeps for it when the free GPUs
        and the others' extras hold it, or ``None`` (no such rule: every elastic job down to its minimum).

        ``spare_tail_factor``: :func:`~slurm_amoeba.policy.elastic_room.spares_tail`, while the other pending jobs
        ask for at most ``spare_tail_queue_share`` of the cluster's GPUs; ``spare_longer_jobs``:
        :func:`~slurm_amoeba.policy.elastic_room.spares`.
        """
        admission = self.admission
        if admission is None or not self.held_for_admission(job, now):
            return None
        if admission.spare_tail_factor > 0:
            queued = sum(o.requested_workers * o.gpus_per_worker for o in snapshot.pending() if o.job_id != job.job_id)
            if queued <= admission.spare_tail_queue_share * snapshot.total_gpus:
                return spares_tail(self.time_left, admission.spare_tail_factor * self.time_left(job))
        if admission.spare_longer_jobs:
            return spares(self.elastic.min_gain, self.time_left, self.time_left(job))
        return None

    def daemon_floor(self, job: JobInfo) -> int:
        """The fewest workers the daemon leaves a running elastic job: its minimum, or when submitted at its request
        that size (Slurm allocated that much; only the loans above it are the daemon's)."""
        return max(job.requested_workers, job.min_workers) if self.elastic.at_request else job.min_workers


#: The layers by the name a knob carries before its dot, with their classes.
LAYERS: dict[str, type[ElasticLayer | AdmissionLayer | WholeNodeLayer | LasOrderLayer]] = {
    "elastic": ElasticLayer,
    "admission": AdmissionLayer,
    "whole_node": WholeNodeLayer,
    "las_order": LasOrderLayer,
}

#: The layers that may be absent: their name is a switch.
OPTIONAL_LAYERS = ("admission", "whole_node", "las_order")


def amoebad_knobs() -> dict[str, object]:
    """The knobs :func:`make_amoebad` takes, with their defaults: Slurm's (as the ``slurm`` policy's), each optional
    layer's switch (``admission``: ``False``), then every layer's knobs as ``layer.knob``."""
    knobs: dict[str, object] = {
        field.name: field.default for field in dataclasses.fields(SlurmBaselinePolicy) if field.init
    }
    knobs.update(dict.fromkeys(OPTIONAL_LAYERS, False))
    for layer, cls in LAYERS.items():
        for field in dataclasses.fields(cls):
            knobs[f"{layer}.{field.name}"] = field.default
    return knobs


def make_amoebad(**knobs: Any) -> AmoebadPolicy:
    """Build :class:`AmoebadPolicy` from flat knobs (:func:`amoebad_knobs`).

    ``admission=True`` adds the admission layer with its defaults; ``admission.max_hold_s=0.0`` sets one of its
    knobs, which needs the layer switched on; the elastic layer is always present.

    Raises:
        PolicyError: an unknown knob (the message lists the valid ones), a knob of a layer that is off, or a
            combination of layers that is refused (:class:`AmoebadPolicy`).
    """
    valid = amoebad_knobs()
    unknown = sorted(set(knobs) - set(valid))
    if unknown:
        raise PolicyError(unknown_key_message("policy 'amoebad'", ", ".join(unknown), valid))
    slurm = {key: value for key, value in knobs.items() if "." not in key and key not in OPTIONAL_LAYERS}
    layers: dict[str, Any] = {}
    for layer, cls in LAYERS.items():
        settings = {key.split(".", 1)[1]: value for key, value in knobs.items() if key.startswith(f"{layer}.")}
        switch = knobs.get(layer, layer == "elastic")
        if not isinstance(switch, bool):
            raise PolicyError(f"{layer}={switch!r} switches the {layer} layer: give true or false")
        if settings and not switch:
            raise PolicyError(
                f"{', '.join(f'{layer}.{key}' for key in settings)} set, but the {layer} layer is off: "
                f"add {layer}=true or drop the setting"
            )
        layers[layer] = cls(**settings) if switch else None
    return AmoebadPolicy(**slurm, **layers)
