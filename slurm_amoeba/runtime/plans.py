"""Training plans per worker count: predicted memory and step time, the frontier, the fastest plan that fits.

An elastic job lives at many sizes, and the best way to train differs between them (TensorOpt, arXiv 2004.10856:
a frontier of strategies trading time against memory per device count). A :class:`Plan` says how one generation
of ``n`` workers trains: replicated state (the runtime's own gradient all-reduce, like DDP) or sharded state
(FSDP2), activation checkpointing per block on or off, the largest micro-batch (the rest of a worker's share of the
fixed global batch becomes gradient accumulation), and, for sharded state on a GPU, parameters, gradients and
optimizer state offloaded to host memory.

:class:`PlanSpace` predicts each plan's peak memory per worker and step time from a :class:`ModelProfile` — the
facts a short measured probe of the model on one process gives (:mod:`slurm_amoeba.runtime.plan_probe`: torch's
``MemTracker`` for bytes, timed passes for seconds) — and a linear model of how they scale with the micro-batch and
the worker count; it answers the frontier per ``n``, the fastest plan under a per-worker memory budget and the
smallest ``n`` at which the job fits at all. :class:`~slurm_amoeba.runtime.planned.PlannedState` switches to each
size's plan at every resize; the agent reports :meth:`PlanSpace.report` to the daemon (DESIGN.md, control flow).

This module is pure: no torch, no I/O; the tables in ``tests/unit/runtime/test_plans.py`` pin it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Any

from slurm_amoeba.runtime.errors import RuntimeConfigError
from slurm_amoeba.runtime.planner import split_evenly


class Layout(str, enum.Enum):
    """Where a generation keeps the model's state.

    ``REPLICATED``: every worker holds all parameters, gradients and optimizer state; gradients are all-reduced
    (runtime/gradients.py). ``SHARDED``: FSDP2 (``fully_shard`` per block and on the root) holds ``1/n`` of each and
    all-gathers one block's parameters at a time.
    """

    REPLICATED = "replicated"
    SHARDED = "sharded"


@dataclasses.dataclass(frozen=True, order=True)
class Plan:
    """How one generation trains.

    Attributes:
        layout: replicated or sharded state.
        checkpointing: recompute each block's activations in backward instead of keeping them.
        micro_batch: the most samples one forward/backward holds (the sampler's ``max_local_batch`` for the
            generation); a worker's share beyond it is accumulated.
        offload: sharded state kept in host memory between uses (FSDP2's ``CPUOffloadPolicy``; GPU only).
    """

    layout: Layout
    checkpointing: bool
    micro_batch: int
    offload: bool = False

    def __post_init__(self) -> None:
        if self.micro_batch < 1:
            raise RuntimeConfigError(f"a plan's micro_batch={self.micro_batch} is invalid: it must be at least 1")
        if self.offload and self.layout is not Layout.SHARDED:
            raise RuntimeConfigError("offload=True needs layout=sharded: torch offloads FSDP2's sharded state only")

    def describe(self) -> str:
        """A short name, e.g. ``sharded+ckpt/mb4``."""
        parts = [self.layout.value] + ["ckpt"] * self.checkpointing + ["offload"] * self.offload
        return f"{'+'.join(parts)}/mb{self.micro_batch}"

    def to_json(self) -> dict[str, Any]:
        """The plan as a JSON object."""
        return {
            "layout": self.layout.value,
            "checkpointing": self.checkpointing,
            "micro_batch": self.micro_batch,
            "offload": self.offload,
        }

    def to_codes(self) -> list[int]:
        """The plan as four integers (what rank 0 broadcasts so that every member applies the same plan)."""
        return [int(self.layout is Layout.SHARDED), int(self.checkpointing), self.micro_batch, int(self.offload)]

    @classmethod
    def from_codes(cls, codes: Iterable[int]) -> Plan:
        """Inverse of :meth:`to_codes`."""
        sharded, checkpointing, micro_batch, offload = (int(c) for c in codes)
        layout = Layout.SHARDED if sharded else Layout.REPLICATED
        return cls(layout, bool(checkpointing), micro_batch, bool(offload))


@dataclasses.dataclass(frozen=True)
class Linear:
    """``fixed + per_sample * samples``: how a micro-batch's bytes or seconds grow with its size."""

    fixed: float
    per_sample: float

    def at(self, samples: int) -> float:
        """The value for a micro-batch of ``samples``."""
        return self.fixed + self.per_sample * samples

    @classmethod
    def through(cls, small: tuple[int, float], large: tuple[int, float]) -> Linear:
        """The line through two measured points ``(samples, value)`` (a flat line through one when they coincide).

        Raises:
            RuntimeConfigError: the larger size is not above the smaller.
        """
        (s1, v1), (s2, v2) = small, large
        if s2 <= s1:
            raise RuntimeConfigError(f"probe sizes {s1} and {s2} must increase to fit a line")
        slope = max(0.0, (v2 - v1) / (s2 - s1))
        return cls(fixed=v1 - slope * s1, per_sample=slope)

    def to_json(self) -> list[float]:
        """``[fixed, per_sample]``."""
        return [self.fixed, self.per_sample]


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    """What the probe measured of one model on one process (bytes and seconds).

    Attributes:
        param_bytes: the parameters (gradients take as much).
        optimizer_bytes: the optimizer's state after a step.
        largest_unit_bytes: the parameters of the largest FSDP unit (a block, or what the root keeps for itself):
            what a sharded worker gathers at once.
        units: FSDP units (blocks plus the root).
        memory: peak bytes of one forward, backward and optimizer step beyond parameters, gradients and optimizer
            state, per micro-batch size, without checkpointing.
        memory_checkpointed: the same with each block checkpointed.
        compute: seconds of one forward and backward per micro-batch size, without checkpointing.
        compute_checkpointed: the same with each block checkpointed.
        optimizer_s: seconds of one optimizer step over all parameters.
        link_bytes_per_s: the bandwidth a collective moves bytes between workers at (a model input, not probed:
            the probe runs on one process).
        latency_s: the fixed cost of one collective.
    """

    param_bytes: int
    optimizer_bytes: int
    largest_unit_bytes: int
    units: int
    memory: Linear
    memory_checkpointed: Linear
    compute: Linear
    compute_checkpointed: Linear
    optimizer_s: float
    link_bytes_per_s: float = 1e9
    latency_s: float = 2e-4

    def to_json(self) -> dict[str, Any]:
        """The profile as a JSON object (for reports and the benchmark)."""
        return {
            "param_bytes": self.param_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "largest_unit_bytes": self.largest_unit_bytes,
            "units": self.units,
            "memory": self.memory.to_json(),
            "memory_checkpointed": self.memory_checkpointed.to_json(),
            "compute": self.compute.to_json(),
            "compute_checkpointed": self.compute_checkpointed.to_json(),
            "optimizer_s": self.optimizer_s,
            "link_bytes_per_s": self.link_bytes_per_s,
            "latency_s": self.latency_s,
        }


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A plan's predicted cost at one worker count.

    Attributes:
        plan: the plan.
        workers: the worker count.
        peak_bytes: predicted peak memory per worker (parameters, gradients, optimizer state, activations and
            temporaries on the training device; not the runtime's host-side copies for commits and joiners).
        step_time_s: predicted seconds per optimizer step.
    """

    plan: Plan
    workers: int
    peak_bytes: float
    step_time_s: float

    def beats(self, other: Estimate) -> bool:
        """Whether this estimate is no worse than ``other`` in time and memory and better in one."""
        no_worse = self.step_time_s <= other.step_time_s and self.peak_bytes <= other.peak_bytes
        return no_worse and (self.step_time_s < other.step_time_s or self.peak_bytes < other.peak_bytes)

    def to_json(self) -> dict[str, Any]:
        """The estimate as a JSON object."""
        return {
            "plan": self.plan.to_json(),
            "name": self.plan.describe(),
            "workers": self.workers,
            "peak_bytes": round(self.peak_bytes),
            "step_time_s": self.step_time_s,
        }


def _rank(estimate: Estimate) -> tuple[float, float, Plan]:
    """Order of preference: faster, then smaller, then the simpler plan (replicated, no checkpointing, larger
    micro-batch sort first through :class:`Plan`'s field order)."""
    return (estimate.step_time_s, estimate.peak_bytes, estimate.plan)


@dataclasses.dataclass(frozen=True)
class PlanSpace:
    """The plans of one job and their predicted costs at every worker count.

    Attributes:
        profile: the probe's measurements.
        global_batch: samples per optimizer step (fixed).
        memory_budget: bytes one worker may hold (``None``: no limit).
        max_micro_batch: the user's cap on a micro-batch (0: none).
        offload: offer offloaded plans (only where torch can offload: FSDP2 on a GPU).
    """

    profile: ModelProfile
    global_batch: int
    memory_budget: int | None = None
    max_micro_batch: int = 0
    offload: bool = False

    def __post_init__(self) -> None:
        if self.global_batch < 1:
            raise RuntimeConfigError(f"global_batch={self.global_batch} is invalid: it must be at least 1")
        if self.memory_budget is not None and self.memory_budget < 1:
            raise RuntimeConfigError(
                f"memory_budget={self.memory_budget} is invalid: give bytes per worker (e.g. 2 << 30) or None"
            )

    def share(self, workers: int) -> int:
        """The largest share of a global batch one of ``workers`` takes."""
        return max(split_evenly(self.global_batch, workers))

    def micro_batches(self, workers: int) -> list[int]:
        """The micro-batch sizes worth trying at ``workers``: one per accumulation count that powers of two of the
        share give, each the largest micro-batch that count makes, within the user's cap."""
        share = self.share(workers)
        sizes: set[int] = set()
        candidate = 1
        while candidate < share * 2:
            capped = min(candidate, share, self.max_micro_batch or share)
            accumulation = -(-share // capped)
            sizes.add(-(-share // accumulation))
            candidate *= 2
        return sorted(sizes)

    def plans(self, workers: int) -> list[Plan]:
        """Every plan at ``workers``."""
        layouts = [(Layout.REPLICATED, False), (Layout.SHARDED, False)] + [(Layout.SHARDED, True)] * self.offload
        return [
            Plan(layout, checkpointing, micro, offload)
            for layout, offload in layouts
            for checkpointing in (False, True)
            for micro in self.micro_batches(workers)
        ]

    def estimate(self, plan: Plan, workers: int) -> Estimate:
        """The predicted peak memory per worker and step time of ``plan`` at ``workers``.

        Memory: a replicated worker holds parameters, gradients and optimizer state; a sharded one ``1/n`` of each
        plus the largest unit gathered twice (the one in use and the one prefetched) and its unsharded gradient;
        an offloaded one only those gathered units; every worker adds the micro-batch's activations and
        temporaries as probed. Time: the micro-batches' forward and backward as probed, the optimizer step (over
        ``1/n`` of the parameters when sharded), and the collectives at ``link_bytes_per_s``: a replicated step
        all-reduces the gradients once; a sharded one all-gathers the parameters in every micro-batch's forward
        and backward and reduce-scatters the gradients once.

        Raises:
            RuntimeConfigError: ``workers`` is below 1 or above the global batch.
        """
        if not 1 <= workers <= self.global_batch:
            raise RuntimeConfigError(
                f"cannot estimate a plan at {workers} workers: the global batch {self.global_batch} needs 1 to "
                f"{self.global_batch} workers"
            )
        p = self.profile
        share = self.share(workers)
        accumulation = -(-share // plan.micro_batch)
        micro = -(-share // accumulation)
        activations = (p.memory_checkpointed if plan.checkpointing else p.memory).at(micro)
        pass_s = (p.compute_checkpointed if plan.checkpointing else p.compute).at(micro)
        moved = (workers - 1) / workers * p.param_bytes / p.link_bytes_per_s
        if plan.layout is Layout.REPLICATED:
            state: float = 2 * p.param_bytes + p.optimizer_bytes
            optimizer_s = p.optimizer_s
            comm_s = 0.0 if workers == 1 else 2 * moved + p.latency_s
        else:
            gathered = 3 * p.largest_unit_bytes
            state = gathered if plan.offload else gathered + (2 * p.param_bytes + p.optimizer_bytes) / workers
            optimizer_s = p.optimizer_s / workers
            collectives = p.units * (2 * accumulation + 1)
            comm_s = 0.0 if workers == 1 else (2 * accumulation + 1) * moved + collectives * p.latency_s
        return Estimate(plan, workers, state + activations, accumulation * pass_s + optimizer_s + comm_s)

    def estimates(self, workers: int) -> list[Estimate]:
        """Every plan's estimate at ``workers``, fastest first."""
        return sorted((self.estimate(plan, workers) for plan in self.plans(workers)), key=_rank)

    def frontier(self, workers: int) -> list[Estimate]:
        """The estimates at ``workers`` that no other beats in both time and memory, fastest first (memory falls
        along it)."""
        kept: list[Estimate] = []
        for estimate in self.estimates(workers):
            if not kept or estimate.peak_bytes < kept[-1].peak_bytes:
                kept.append(estimate)
        return kept

    def fits(self, estimate: Estimate) -> bool:
        """Whether ``estimate``'s peak is within the budget."""
        return self.memory_budget is None or estimate.peak_bytes <= self.memory_budget

    def best(self, workers: int) -> Estimate | None:
        """The fastest plan at ``workers`` that fits the budget, or ``None`` when none does."""
        return next((e for e in self.frontier(workers) if self.fits(e)), None)

    def min_feasible_workers(self, limit: int) -> int | None:
        """The smallest worker count, up to ``limit``, at which some plan fits (``None``: none up to ``limit``)."""
        return next((n for n in range(1, min(limit, self.global_batch) + 1) if self.best(n) is not None), None)

    def best_per_size(self, limit: int) -> dict[int, Estimate]:
        """The chosen estimate per worker count from 1 to ``limit`` (sizes where nothing fits are left out)."""
        chosen = {n: self.best(n) for n in range(1, min(limit, self.global_batch) + 1)}
        return {n: e for n, e in chosen.items() if e is not None}

    def report(self, limit: int) -> dict[str, Any]:
        """What the job reports to its agent and the daemon: the smallest feasible size and the predicted samples
        per second at each size up to ``limit`` that fits (``{"min_workers": 2, "samples_per_s": {"2": 51.0}}``;
        ``min_workers`` is 0 when nothing fits)."""
        best = self.best_per_size(limit)
        return {
            "min_workers": min(best, default=0),
            "samples_per_s": {str(n): round(self.global_batch / e.step_time_s, 3) for n, e in sorted(best.items())},
        }


def read_plan_report(raw: Mapping[str, Any]) -> tuple[int, dict[int, float]]:
    """Read a plan report (:meth:`PlanSpace.report`) back: the smallest feasible size and the predicted rates.

    Raises:
        RuntimeConfigError: a field is missing or not a size, a size is not a positive count, or a rate is not a
            finite number of at least 0.
    """
    try:
        minimum = raw["min_workers"]
        rates = dict(raw["samples_per_s"])
    except (KeyError, TypeError, ValueError):
        raise RuntimeConfigError(f"a plan report needs min_workers and samples_per_s, got {dict(raw)!r:.120}") from None
    if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 0:
        raise RuntimeConfigError(f"a plan report's min_workers={minimum!r} is not a worker count")
    predicted: dict[int, float] = {}
    for key, value in rates.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) > 0):
            raise RuntimeConfigError(f'a plan report\'s size {key!r} is not a worker count like "4"')
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
            raise RuntimeConfigError(f"a plan report's samples_per_s[{key!r}] = {value!r} is not a rate")
        predicted[int(key)] = float(value)
    return minimum, predicted
