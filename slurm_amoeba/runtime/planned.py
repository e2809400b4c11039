"""The fastest plan that fits, at every size: a state that re-plans its layout at each resize, in memory.

:class:`PlannedState` extends :class:`~slurm_amoeba.runtime.fsdp.ShardedState` (which already keeps the full
model and optimizer state and builds the model again in each generation). At its construction, during the
worker's warm-up, it probes the model on this process (:mod:`~slurm_amoeba.runtime.plan_probe`) and builds the
:class:`~slurm_amoeba.runtime.plans.PlanSpace`; as each generation starts, rank 0 picks the fastest plan of that
size within the memory budget and broadcasts it (four integers), every member builds the model in that plan's
layout — replicated (the runtime's own gradient buckets) or sharded (``fully_shard`` per block and on the root),
each block checkpointed or not — loads the full state into it, and sets the sampler's micro-batch cap to the
plan's. So a job shrunk below what replicated state fits goes on sharded, and a grown one drops checkpointing
when it can; the samples are split by the same global cursor whatever the plan (DESIGN.md, layer ``runtime/``,
worker side).

It measures the first steps of every generation with :class:`~slurm_amoeba.runtime.plan_probe.PeakMeter` and
times the rest (:attr:`PlannedState.generations`), and puts the smallest feasible size and the predicted speed per
size in rank 0's progress report, which the agent forwards to the daemon.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

from slurm_amoeba.runtime.errors import RuntimeConfigError
from slurm_amoeba.runtime.fsdp import Built, ShardedReducer, ShardedState
from slurm_amoeba.runtime.gradients import GradientBuckets
from slurm_amoeba.runtime.plan_probe import Blocks, PeakMeter, ProbeLoss, checkpoint_blocks, probe_model
from slurm_amoeba.runtime.plans import Estimate, Layout, ModelProfile, Plan, PlanSpace
from slurm_amoeba.runtime.sampler import ElasticSampler
from slurm_amoeba.runtime.topology import GradientReducer

log = logging.getLogger(__name__)

#: Steps of each generation measured by the peak meter (the rest are timed).
METERED_STEPS = 2


@dataclasses.dataclass(frozen=True)
class Placement:
    """What ``build(placement)`` is handed: the generation's plan and mesh.

    Attributes:
        plan: the plan, or ``None`` for the plain model (the probe's and the initial build).
        mesh: the generation's device mesh when the plan is sharded, else ``None``.
        device: where the model trains (the probe's and each generation's device; ``None``: where it was made).
    """

    plan: Plan | None = None
    mesh: DeviceMesh | None = None
    device: torch.device | None = None

    def apply(self, model: torch.nn.Module, blocks: Iterable[torch.nn.Module]) -> None:
        """Lay ``model`` out as the plan says: move it to the device, checkpoint each block, then shard each block
        and the root over the mesh (offloaded when the plan says so). Call it in ``build`` after making the model
        and before making the optimizer; with no plan it only moves the model.

        Raises:
            RuntimeConfigError: a sharded plan without a mesh.
        """
        if self.device is not None:
            model.to(self.device)
        if self.plan is None:
            return
        if self.plan.checkpointing:
            checkpoint_blocks(blocks)
        if self.plan.layout is Layout.SHARDED:
            if self.mesh is None:
                raise RuntimeConfigError(f"plan {self.plan.describe()} is sharded but no mesh was given")
            policy = CPUOffloadPolicy() if self.plan.offload else OffloadPolicy()
            for block in blocks:
                fully_shard(block, mesh=self.mesh, offload_policy=policy)
            fully_shard(model, mesh=self.mesh, offload_policy=policy)


PlacedBuild = Callable[[Placement], Built]


@dataclasses.dataclass
class GenerationPlan:
    """One generation as this worker lived it: the plan, its prediction and what was measured.

    Attributes:
        generation: the generation's number.
        world_size: its worker count.
        estimate: the prediction for its plan.
        peak_bytes: measured peak over its first :data:`METERED_STEPS` steps (0 before they end).
        step_times_s: the durations of its later steps.
    """

    generation: int
    world_size: int
    estimate: Estimate
    peak_bytes: int = 0
    step_times_s: list[float] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object."""
        times = sorted(self.step_times_s)
        return {
            "generation": self.generation,
            "world_size": self.world_size,
            "plan": self.estimate.plan.describe(),
            "predicted_peak_bytes": round(self.estimate.peak_bytes),
            "peak_bytes": self.peak_bytes,
            "predicted_step_s": self.estimate.step_time_s,
            "step_s": times[len(times) // 2] if times else None,
            "steps_timed": len(times),
        }


class PlannedState(ShardedState):
    """A training state that trains each generation with the fastest plan that fits its size.

    Args:
        build: makes the model, calls ``placement.apply(model, blocks)``, then makes the optimizer and schedulers,
            returning :class:`~slurm_amoeba.runtime.fsdp.Built`; seeded (every worker builds the same initial
            model). Called once per generation and a few times by the probe.
        sampler: the elastic sampler; its ``max_local_batch`` caps the plans' micro-batches (0: none) and each
            generation sets it to its plan's.
        blocks: the model's repeated blocks (e.g. ``lambda m: m.blocks``): the units sharded and checkpointed.
        probe_loss: the loss of a model on a micro-batch of ``n`` samples of your data's shape (for the probe).
        extras: user values that survive resizes and rollbacks.
        memory_budget: bytes one worker may hold (the device's memory or a budget you set); ``None``: no limit, the
            fastest plan at every size.
        max_workers: the largest size reported to the daemon.
        profile: a profile measured before (skips the probe; e.g. to pin the predictions in a test).
        link_bytes_per_s: the bandwidth of the collectives in the prediction (the probe runs on one process).
        pinned: plans to use at given sizes instead of the fastest that fits (a site that knows better, or a test
            that wants a given layout).
        device: the device the probe runs on (the worker's, ``runtime.device``); the generations train on the
            process group's (the current GPU under NCCL, else the CPU).
        scaler: a ``torch.amp.GradScaler``, if any.

    Raises:
        RuntimeConfigError: no plan fits the budget at ``max_workers`` workers or fewer.
    """

    def __init__(
        self,
        build: PlacedBuild,
        sampler: ElasticSampler,
        *,
        blocks: Blocks,
        probe_loss: ProbeLoss,
        extras: Mapping[str, Any] | None = None,
        memory_budget: int | None = None,
        max_workers: int = 64,
        profile: ModelProfile | None = None,
        link_bytes_per_s: float | None = None,
        pinned: Mapping[int, Plan] | None = None,
        device: torch.device | None = None,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        super().__init__(lambda mesh: build(Placement()), sampler, extras, scaler=scaler)
        self._placed_build = build
        if profile is None:

            def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
                built = build(Placement(device=device))
                return built.model, built.optimizer

            profile = probe_model(make, probe_loss, blocks)
        if link_bytes_per_s is not None:
            profile = dataclasses.replace(profile, link_bytes_per_s=link_bytes_per_s)
        self.space = PlanSpace(
            profile,
            sampler.global_batch,
            memory_budget,
            max_micro_batch=sampler.planner.max_local_batch,
            offload=torch.cuda.is_available(),
        )
        self.max_workers = max_workers
        self.pinned = dict(pinned or {})
        self.min_workers = self.space.min_feasible_workers(max_workers)
        if self.min_workers is None:
            least = min(e.peak_bytes for e in self.space.estimates(max_workers))
            raise RuntimeConfigError(
                f"no plan fits memory_budget={memory_budget} bytes per worker at up to {max_workers} workers (the "
                f"smallest plan at {max_workers} needs {least:.0f} bytes): raise the budget, allow more workers or "
                "make the model smaller"
            )
        self.generations: list[GenerationPlan] = []
        self._meter: PeakMeter | None = None
        self._metered = 0
        self._last_step = 0.0

    # --------------------------------------------------------------------------------------------- the switch

    def gradient_reducer(self, previous: GradientReducer | None) -> GradientReducer:
        """Pick this generation's plan (rank 0's choice, broadcast), build the model in its layout, load the full
        state into it, set the micro-batch cap, and return its reducer. A collective.

        Raises:
            RuntimeConfigError: no plan fits at this generation's size.
            StateError: the full state does not fit the new model.
        """
        self._stop_meter()
        if not dist.is_initialized():
            return super().gradient_reducer(previous)
        if previous is not None:
            previous.close()
        workers = dist.get_world_size()
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        pinned = self.pinned.get(workers)
        plan = self._agree(self.space.best(workers) if pinned is None else self.space.estimate(pinned, workers), device)
        parts = self.capture_parts()
        mesh = None
        if plan.layout is Layout.SHARDED:
            self._builds += 1  # a new dimension name per build (see ShardedState.gradient_reducer)
            device_type = "cuda" if device is not None else "cpu"
            mesh = init_device_mesh(device_type, (workers,), mesh_dim_names=(f"amoeba{self._builds}",))
        self.mesh = mesh
        built = self._placed_build(Placement(plan, mesh, device))
        self.take_built(built, parts)
        self.sampler.planner = dataclasses.replace(self.sampler.planner, max_local_batch=plan.micro_batch)
        record = GenerationPlan(self._generation_number(), workers, self.space.estimate(plan, workers))
        self.generations.append(record)
        log.info(
            "generation %s: %s workers, plan %s (predicted %.1f MB, %.3f s per step)",
            record.generation,
            workers,
            plan.describe(),
            record.estimate.peak_bytes / 1e6,
            record.estimate.step_time_s,
        )
        self._meter = PeakMeter(self.model, self.optimizer)
        self._metered = 0
        self._meter.start()
        if plan.layout is Layout.SHARDED:
            return ShardedReducer(self.model, device or torch.device("cpu"))
        return GradientBuckets(self.model)

    def _agree(self, chosen: Estimate | None, device: torch.device | None) -> Plan:
        """Rank 0's plan, on every member (each probed on its own, so their predictions may differ slightly)."""
        codes = torch.tensor(chosen.plan.to_codes() if chosen is not None else [0, 0, 0, 0], device=device)
        dist.broadcast(codes, src=0)
        if int(codes[2]) == 0:
            raise RuntimeConfigError(
                f"no plan fits memory_budget={self.space.memory_budget} bytes per worker at {dist.get_world_size()} "
                f"workers; the job needs at least {self.min_workers} (min_workers in its report)"
            )
        return Plan.from_codes(int(c) for c in codes.tolist())

    def _generation_number(self) -> int:
        driver = self._driver
        current = getattr(driver, "generation", 0) if driver is not None else 0
        return int(current)

    # --------------------------------------------------------------------------------------------- measuring

    def after_step(self) -> None:
        """Count the step: stop the meter after the generation's first steps (or before a switch's gather), time
        the later steps; then what :class:`ShardedState` does."""
        now = time.perf_counter()
        if self.generations:
            record = self.generations[-1]
            if self._meter is not None:
                self._metered += 1
                if self._metered >= METERED_STEPS or self.switch_pending():
                    self._stop_meter()
            elif self._last_step:
                record.step_times_s.append(now - self._last_step)
        self._last_step = time.perf_counter()
        super().after_step()

    def commit(self) -> None:
        """Stop the meter (a commit's gather is not training memory), then commit (**a collective**)."""
        self._stop_meter()
        super().commit()
        self._last_step = time.perf_counter()

    def _stop_meter(self) -> None:
        meter, self._meter = self._meter, None
        if meter is not None:
            peak = meter.stop()
            if self.generations:
                self.generations[-1].peak_bytes = peak
        self._last_step = 0.0

    def progress_report(self) -> dict[str, Any]:
        """The position, plus ``plans``: the smallest feasible size and the predicted samples per second per size
        (what the agent forwards to the daemon)."""
        report = super().progress_report()
        report["plans"] = self.space.report(self.max_workers)
        return report
