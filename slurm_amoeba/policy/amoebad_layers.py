"""The frozen layers of the ``amoebad`` policy: each layer's knobs and their checks (DESIGN.md, layer ``policy/``).

:class:`~slurm_amoeba.policy.amoebad.AmoebadPolicy` holds one of each (the elastic layer always, the others or
``None``); the elastic pass after Slurm's (:class:`~slurm_amoeba.policy.elastic_room.ElasticPass`) reads the
elastic, admission and whole-node layers; the LAS layer orders Slurm's queue. Here below both, so that neither
module needs the other's types.
"""

from __future__ import annotations

import dataclasses

from slurm_amoeba.policy.slurm_baseline import DEFAULT_MAX_HOLD_S
from slurm_amoeba.policy.types import PolicyError

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
