"""Jobs with an adaptive batch: each allocation runs the global batch of highest goodput, after Pollux.

The model, from the facts of Pollux's artifact (its validation traces and its goodput function), not its code:

- A validation row of an application run at initial batch ``M0`` holds, per epoch, ``grad_sqr`` (the squared norm
  of the true gradient, ``|G|^2``) and ``grad_var`` (the variance of the gradient estimate *at batch* ``M0``, i.e.
  the per-sample variance ``tr(Sigma)`` divided by ``M0``). The gradient noise scale in samples is then
  ``phi = tr(Sigma) / |G|^2 = M0 * grad_var / grad_sqr``.
- One step at global batch ``M`` makes as much progress as ``gain(M) = (var + sqr) / (var / s + sqr)`` steps at
  ``M0``, with ``s = M / M0``: the expected decrease of the loss of one SGD step whose variance is ``var / s`` (the
  learning rate scaled as AdaScale does) over that of a step at ``M0``. Per sample this is the statistical
  efficiency ``E(M) = gain(M) / s = (phi + M0) / (phi + M)`` (multiply numerator and denominator by
  ``M0 / sqr``): 1 at ``M0``, ``M0 / M`` when the gradient is exact (``phi = 0``), 1 when noise dominates. It is
  :func:`slurm_amoeba.policy.goodput.efficiency` with ``noise_scale = phi``.
- Progress is counted in steps at ``M0`` (``M0`` samples each), as for fixed-batch jobs
  (:mod:`slurm_amoeba.sim.application`), so a job's progress per second is its goodput divided by ``M0``:
  ``goodput = throughput x E(M)`` in samples at the initial batch per second.
- An adaptive job may run any global batch ``M0 <= M <= max_batch`` (the largest validated batch of the
  application); ``M = replicas x local x (accum + 1)`` with the local batch at most the application's largest
  measured one and as few accumulation steps as that allows (a single replica above ``M0`` accumulates at least
  twice, as for fixed-batch jobs in the artifact). At every placement and epoch it runs the batch of highest
  goodput, which is what the runtime does when left alone (docs/runtime.md §12) and what the goodput policy
  assumes; the gradient statistics of a batch between two validated ones are interpolated linearly, as for
  fixed-batch jobs.

The candidate batches per placement are a Pareto frontier (a larger batch is kept only when its step is slower),
computed once per placement; an epoch then costs one pass over it. Everything is cached per application.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Iterable, Mapping, Sequence

from slurm_amoeba.sim.application import Application, canonical_placement
from slurm_amoeba.sim.data import SimError
from slurm_amoeba.sim.engine import ModelFactory, TraceWorkModel, WorkModel
from slurm_amoeba.sim.workload import JobSpec, is_elastic_pick

#: Per-replica batch sizes tried between the smallest and the largest feasible one (geometric), besides every
#: measured local batch of the placement's curve.
CANDIDATES_PER_PLACEMENT = 48


def noise_scale(app: Application, batch: int, epoch: int) -> float:
    """The gradient noise scale ``phi = M0 * grad_var / grad_sqr`` in samples (see the module docstring)."""
    sqr, var = app.grad_stats(batch, epoch)
    return math.inf if sqr <= 0 else app.init_batch * var / sqr


class AdaptiveBatch:
    """The best batch of one application per placement and epoch, cached.

    Attributes:
        app: the application.
    """

    def __init__(self, app: Application) -> None:
        """Prepare the caches for one application."""
        self.app = app
        self._frontier: dict[tuple[tuple[int, ...], int | None], list[tuple[int, float]]] = {}
        self._best: dict[tuple[tuple[int, ...], int, int | None], tuple[int, float]] = {}

    def plan(self, replicas: int, per_replica: int, max_local: int | None = None) -> tuple[int, int]:
        """(local batch, extra accumulation steps) for ``per_replica`` samples per replica and step."""
        limit = max_local or self.app.max_local_batch
        accum = math.ceil(per_replica / limit - 1e-9) - 1
        if replicas == 1 and per_replica > self.app.init_batch:
            accum = max(1, accum)
        return math.ceil(per_replica / (accum + 1) - 1e-9), accum

    def _per_replica_candidates(self, replicas: int) -> Iterable[int]:
        app = self.app
        low = max(1, math.ceil(app.init_batch / replicas - 1e-9))
        high = app.max_batch // replicas
        if high < low:
            return [low]
        values = {low, high}
        ratio = (high / low) ** (1.0 / CANDIDATES_PER_PLACEMENT) if high > low else 1.0
        value = float(low)
        while value < high:
            values.add(round(value))
            value *= ratio
        for local in app.measured_local_batches():
            for accum in range(0, 1 + high // max(1, int(local))):
                if low <= int(local) * (accum + 1) <= high:
                    values.add(int(local) * (accum + 1))
        return sorted(values)

    def frontier(self, placement: tuple[int, ...], max_local: int | None = None) -> list[tuple[int, float]]:
        """(global batch, seconds per step) worth trying on a placement, batch ascending, seconds ascending."""
        canon = canonical_placement(placement)
        key = (canon, max_local)
        cached = self._frontier.get(key)
        if cached is not None:
            return cached
        replicas = sum(canon)
        points: dict[int, float] = {}
        for per_replica in self._per_replica_candidates(replicas):
            local, accum = self.plan(replicas, per_replica, max_local)
            batch = replicas * local * (accum + 1)
            step, sync = self.app.step_time(canon, local)
            seconds = step + (step - sync) * accum
            if batch not in points or seconds < points[batch]:
                points[batch] = seconds
        frontier: list[tuple[int, float]] = []
        for batch, seconds in sorted(points.items(), key=lambda item: (item[1], -item[0])):
            if not frontier or batch > frontier[-1][0]:
                frontier.append((batch, seconds))
        self._frontier[key] = frontier
        return frontier

    def best(self, placement: tuple[int, ...], epoch: int, max_local: int | None = None) -> tuple[int, float]:
        """The global batch of highest goodput on ``placement`` in ``epoch``, and the progress per second there."""
        canon = canonical_placement(placement)
        key = (canon, epoch, max_local)
        cached = self._best.get(key)
        if cached is not None:
            return cached
        app = self.app
        best = (0, 0.0)
        for batch, seconds in self.frontier(canon, max_local):
            rate = app.gain(min(max(batch, app.init_batch), app.max_batch), epoch) / seconds
            if rate > best[1]:
                best = (batch, rate)
        self._best[key] = best
        return best


_ADAPTIVE: dict[int, AdaptiveBatch] = {}


def adaptive_batch(app: Application) -> AdaptiveBatch:
    """The (shared, cached) adaptive-batch model of an application."""
    found = _ADAPTIVE.get(id(app))
    if found is None or found.app is not app:
        found = AdaptiveBatch(app)
        _ADAPTIVE[id(app)] = found
    return found


class AdaptiveWorkModel(TraceWorkModel):
    """A job of one of Pollux's applications whose global batch adapts to each placement and epoch.

    Its rate is the best goodput (:meth:`AdaptiveBatch.best`); the policy's table (:meth:`table`) is that goodput
    per size on the fewest nodes in the job's current epoch, relative to the requested size in the same epoch: the
    rate table the daemon builds from the runtime's report (``goodput_rates``), here from the traces themselves.
    The oracle's remaining time (``remaining_seconds``) is at the requested size with the adaptive batch.
    """

    varies_by_epoch = True

    def __init__(self, app: Application, batch_size: int, requested: int, gpus_per_node: int) -> None:
        """See :class:`~slurm_amoeba.sim.engine.TraceWorkModel`; ``batch_size`` is the job's initial batch."""
        self._adaptive = adaptive_batch(app)
        self._tables: dict[tuple[int, int, int], dict[int, float]] = {}
        super().__init__(app, batch_size, requested, gpus_per_node)

    def rate(self, placement: tuple[int, ...], epoch: int, micro_batch: int | None) -> float:
        """Progress per second at the best batch (a sharer's local batch bounded by its micro-batch)."""
        return self._adaptive.best(placement, epoch, micro_batch)[1]

    def batch(self, placement: tuple[int, ...], epoch: int) -> int:
        """The global batch the job runs on ``placement`` in ``epoch``."""
        return self._adaptive.best(placement, epoch)[0]

    def table(self, low: int, high: int, epoch: int) -> dict[int, float]:
        """Goodput per size in ``epoch``, relative to the requested size's in that epoch."""
        epoch = min(epoch, len(self.epoch_ends) - 1)
        key = (low, high, epoch)
        cached = self._tables.get(key)
        if cached is None:
            base = self._req_rate[epoch]
            cached = {size: self.rate(self._compact(size), epoch, None) / base for size in range(low, high + 1)}
            self._tables[key] = cached
        return cached


def is_adaptive_pick(name: str, fraction: float) -> bool:
    """Whether a job is among the ``fraction`` of jobs given an adaptive batch (a stable hash of its name)."""
    return zlib.crc32(f"{name}/adaptive".encode()) % 10_000 < round(fraction * 10_000)


def mark_adaptive(jobs: Sequence[JobSpec], fraction: float) -> list[JobSpec]:
    """The jobs with ``fraction`` of those of an application marked adaptive (:func:`is_adaptive_pick`).

    Raises:
        SimError: ``fraction`` outside 0..1.
    """
    if not 0.0 <= fraction <= 1.0:
        raise SimError(f"adaptive fraction {fraction} must lie between 0 and 1")
    return [
        dataclasses.replace(job, adaptive=True)
        if job.application is not None and is_adaptive_pick(job.name, fraction)
        else job
        for job in jobs
    ]


def widen_adaptive(
    jobs: Sequence[JobSpec], max_replicas: Mapping[str, int], fraction: float, cluster_gpus: int
) -> list[JobSpec]:
    """Give the elastic adaptive jobs Pollux's range: 1 worker up to as many as their largest batch allows.

    An adaptive job's batch follows its size, so it has no reason to stay near its requested size: its range runs
    from one worker to the most replicas its application's largest batch splits over (``max_replicas``, keyed by
    job name) within the cluster. Jobs that are not adaptive, or not among the elastic ``fraction``
    (:func:`~slurm_amoeba.sim.workload.is_elastic_pick`), keep theirs.
    """
    return [
        dataclasses.replace(
            job,
            min_workers=1,
            max_workers=max(job.requested_workers, min(max_replicas.get(job.name, job.max_workers), cluster_gpus)),
        )
        if job.adaptive and is_elastic_pick(job.name, fraction)
        else job
        for job in jobs
    ]


def adaptive_models(applications: Mapping[str, Application], gpus_per_node: int, base: ModelFactory) -> ModelFactory:
    """A factory that builds :class:`AdaptiveWorkModel` for jobs marked adaptive and defers to ``base`` otherwise."""

    def build(spec: JobSpec) -> WorkModel:
        app = applications.get(spec.application or "")
        if spec.adaptive and app is not None:
            return AdaptiveWorkModel(app, spec.batch_size, spec.requested_workers, gpus_per_node)
        return base(spec)

    return build


__all__ = [
    "CANDIDATES_PER_PLACEMENT",
    "AdaptiveBatch",
    "AdaptiveWorkModel",
    "adaptive_batch",
    "adaptive_models",
    "is_adaptive_pick",
    "mark_adaptive",
    "noise_scale",
    "widen_adaptive",
]
