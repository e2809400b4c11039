"""The ``amoebad`` policy: Slurm's baseline with the daemon on top, composed of layers (DESIGN.md, layer ``policy/``).

What a site running ``amoebad`` would see, for the simulator (``amoeba-sim run --policy amoebad``, or
``--daemon-config FILE`` to build it from the daemon's own configuration). :class:`AmoebadPolicy` is the ``slurm``
baseline (:class:`~slurm_amoeba.policy.slurm_baseline.SlurmBaselinePolicy`, every Slurm knob the same) whose hooks
are filled by frozen layers:

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
from slurm_amoeba.policy.common import SizeAction, base_size
from slurm_amoeba.policy.elastic_room import admission_keeps, compact_growth, elastic_layer, spared_size
from slurm_amoeba.policy.queue_order import las_key
from slurm_amoeba.policy.slurm_baseline import DEFAULT_MAX_HOLD_S, SlurmBaselinePolicy
from slurm_amoeba.policy.types import JobInfo, JobPhase, PolicyError, Snapshot

#: How the daemon's elastic jobs are submitted (:attr:`ElasticLayer.submitted_at`).
SUBMITTED_AT = ("minimum", "request")

#: The 2D-LAS threshold of Tiresias and of the live daemon's ``queue_order.thresholds_gpu_s`` (16 GPU-hours).
DEFAULT_LAS_THRESHOLD_GPU_S = 16 * 3600.0


def _not_negative(layer: str, **values: float) -> None:
    for knob, value in values.items():
        if not value >= 0:
            raise PolicyError(f"{layer}.{knob}={value} must be 0 or more")


@dataclasses.dataclass(frozen=True)
class ElasticLayer:
    """The daemon's elastic backfill on top of Slurm.

    Attributes:
        min_gain: the smallest marginal efficiency worth a grow (as ``elastic-backfill``'s).
        grow_by_service: idle GPUs go to the elastic jobs with the least attained service first (``False``: the
            largest speedup gain), as ``elastic-backfill`` does.
        submitted_at: ``"minimum"``: elastic jobs are submitted at their minimum and Slurm starts them as soon as
            that fits; ``"request"``: at their requested size (no operator rights needed), so that Slurm starts each
            at that size, with its own reservation, and counts it as taken; the daemon then lends only idle GPUs
            above requests and takes back only those.
        restore_requests: idle GPUs go first to running jobs below their requested size *and* behind it
            (:func:`~slurm_amoeba.policy.elastic_room.request_credit` negative), the most behind first, up to their
            request; the rest as ``grow_by_service`` says. A what-if, off (docs/simulator.md).
        compact_starts: the extras given back for a job Slurm starts are taken on the nodes where the job then fits
            on the fewest nodes (best fit), instead of the least useful extras wherever they run: a job spread over
            nodes whose GPUs were lent out trains up to 2.5x slower (measured placements).
        compact_growth: a job grows only onto as few nodes as its new size needs (or no more nodes than it spans
            already): a worker count's measured speed assumes a compact placement.
    """

    min_gain: float = 0.1
    grow_by_service: bool = True
    submitted_at: str = "minimum"
    restore_requests: bool = False
    compact_starts: bool = True
    compact_growth: bool = True

    def __post_init__(self) -> None:
        _not_negative("elastic", min_gain=self.min_gain)
        if self.submitted_at not in SUBMITTED_AT:
            raise PolicyError(f"elastic.submitted_at={self.submitted_at!r} is not one of {', '.join(SUBMITTED_AT)}")

    @property
    def at_request(self) -> bool:
        """Whether elastic jobs are submitted at their requested size."""
        return self.submitted_at == "request"


@dataclasses.dataclass(frozen=True)
class AdmissionLayer:
    """The daemon holds an elastic job until its requested size is available now (live: ``admission.enabled``).

    A held job is admitted once its requested size fits now (free GPUs and other jobs' extras above their minimum,
    without delaying a reservation) and starts at that size; until then it holds no reservation. Its extras above
    the minimum stay reclaimable for later starts.

    Attributes:
        max_hold_s: a pending elastic job submitted this many seconds ago or more is no longer held: Slurm starts it
            at its minimum with its own reservation, as the live daemon's ``admission.max_hold_s`` releases it;
            0 holds without bound.
        slurm_takes_loans_only: a job Slurm starts may take only the loans above running elastic jobs' requests:
            their workers up to the request count as taken, as in Slurm alone (those satellites would run in a
            partition Slurm does not preempt; not built live, where every satellite runs in the preemptible one).
            Only the daemon's own admissions take a job below its request. ``False``: every extra above a job's
            minimum is Slurm's to take, as live.
        protect_requests: an admission does not take below its request a running job that cannot use a worker above
            its request and is not ahead of it (:func:`~slurm_amoeba.policy.elastic_room.admission_keeps`). A
            what-if, off: it held admissions long at full load (docs/simulator.md).
        compact_admissions: an elastic job admitted at its request that fits on one node but finds none whole starts
            smaller on the node with the most room (at least its minimum) instead of spread (needs the elastic
            layer's ``compact_starts``). A what-if, off.
        spare_longer_jobs: an admission takes below its request no running job that cannot use a worker above it,
            is not ahead of it and has more time left than the arrival's time limit
            (:func:`~slurm_amoeba.policy.elastic_room.spares`): the arrival starts smaller instead (at least its
            minimum), or, when even its minimum does not fit so, takes from every job. A what-if, off.
        spare_tail_factor: while the other pending jobs ask for at most ``spare_tail_queue_share`` of the cluster's
            GPUs, an admission takes below its request no running job with more than this many times the arrival's
            time limit left (:func:`~slurm_amoeba.policy.elastic_room.spares_tail`): such a job may be the
            workload's tail. A what-if of the simulator, 0 (off).
        spare_tail_queue_share: with ``spare_tail_factor``, the largest share of the cluster's GPUs the other
            pending jobs may ask for while that rule applies.
    """

    max_hold_s: float = DEFAULT_MAX_HOLD_S
    slurm_takes_loans_only: bool = True
    protect_requests: bool = False
    compact_admissions: bool = False
    spare_longer_jobs: bool = False
    spare_tail_factor: float = 0.0
    spare_tail_queue_share: float = 0.25

    def __post_init__(self) -> None:
        _not_negative(
            "admission",
            max_hold_s=self.max_hold_s,
            spare_tail_factor=self.spare_tail_factor,
            spare_tail_queue_share=self.spare_tail_queue_share,
        )


@dataclasses.dataclass(frozen=True)
class WholeNodeLayer:
    """A job Slurm starts that fits on one node but finds no node whole (free GPUs and loans) is put on one node by
    moving elastic jobs' workers above their minimum off it to free GPUs elsewhere (same size, one move each);
    spread over nodes it trains up to 2.6x slower (measured placements). Live: ``whole_node_starts``.

    Attributes:
        moves_minimum: every worker of the running elastic jobs on the node may move, not only those above their
            minimum (a moved job keeps its size and pays one move). Live this would be a requeue of the elastic
            job's own allocation, which the daemon does not do: a what-if, off.
    """

    moves_minimum: bool = False


@dataclasses.dataclass(frozen=True)
class LasOrderLayer:
    """Slurm's queue in 2D-LAS order (Tiresias's queue without its preemptions): the pending jobs of a partition
    tier are tested by how many thresholds their attained GPU-seconds passed, then by submit time, then by id
    (:func:`~slurm_amoeba.policy.queue_order.las_key`, the live layer's key). Live: ``queue_order.enabled``, the
    daemon setting job priorities (:class:`~slurm_amoeba.policy.queue_order.QueueOrderLayer`).

    Attributes:
        thresholds_gpu_s: attained GPU-seconds at which a job moves to the next queue (increasing, above 0).
    """

    thresholds_gpu_s: tuple[float, ...] = (DEFAULT_LAS_THRESHOLD_GPU_S,)

    def __post_init__(self) -> None:
        thresholds = tuple(float(value) for value in self.thresholds_gpu_s)
        if not thresholds or any(value <= 0 for value in thresholds) or list(thresholds) != sorted(set(thresholds)):
            raise PolicyError(
                f"las_order.thresholds_gpu_s={self.thresholds_gpu_s!r} must be increasing GPU-seconds above 0, "
                f"e.g. ({DEFAULT_LAS_THRESHOLD_GPU_S:g},)"
            )
        object.__setattr__(self, "thresholds_gpu_s", thresholds)


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
        """:func:`~slurm_amoeba.policy.elastic_room.spared_size`."""
        return spared_size(self, job, snapshot, running, taken, now)

    def after_slurm(
        self,
        snapshot: Snapshot,
        now: float,
        running: Sequence[JobInfo],
        started: Sequence[JobInfo],
        victims: set[str],
        targets: dict[str, int],
        reasons: dict[str, str],
    ) -> dict[str, dict[str, int]]:
        """The daemon's elastic backfill (:func:`~slurm_amoeba.policy.elastic_room.elastic_layer`)."""
        return elastic_layer(self, snapshot, now, running, started, victims, targets, reasons)

    def finish(self, actions: list[SizeAction], snapshot: Snapshot) -> list[SizeAction]:
        """With ``compact_growth``, growths kept on as few nodes as they need."""
        if not self.elastic.compact_growth:
            return actions
        by_id = {job.job_id: job for job in snapshot.jobs}
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
