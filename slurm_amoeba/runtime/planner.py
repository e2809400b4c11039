"""Global-batch planner: how one fixed global batch is split into local batches and gradient accumulation.

The user fixes the global batch; the number of workers changes under it (DESIGN.md, "Data position and batch
semantics are the runtime's job"). For a step of ``n`` samples over ``W`` workers the planner gives each worker a
contiguous share of ``n // W`` or ``n // W + 1`` samples, and splits each share into the same number of
micro-batches (gradient accumulation) so that no micro-batch exceeds the memory cap ``max_local_batch``.

Each micro-batch's loss is weighted by ``micro_batch_size / n`` and gradients are summed over workers, so the
gradient equals the mean-loss gradient of the whole global batch whatever the split — uneven splits included.
This module is pure: no torch, no I/O.
"""

from __future__ import annotations

import dataclasses

from slurm_amoeba.runtime.errors import BatchPlanError


def split_evenly(total: int, parts: int) -> list[int]:
    """Split ``total`` items into ``parts`` contiguous sizes differing by at most one, larger ones first.

    Args:
        total: number of items (0 or more).
        parts: number of parts (1 or more).

    Returns:
        The sizes, summing to ``total``.

    Raises:
        BatchPlanError: ``parts`` is below 1 or ``total`` is negative.
    """
    if parts < 1:
        raise BatchPlanError(f"cannot split {total} items into {parts} parts: the number of parts must be at least 1")
    if total < 0:
        raise BatchPlanError(f"cannot split {total} items: the count must not be negative")
    base, extra = divmod(total, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How one optimizer step's samples are split over the workers.

    Attributes:
        step_samples: samples in this step (the global batch, or fewer for the last step of an epoch).
        world_size: number of workers.
        micro_batches: for each rank, the sizes of its micro-batches in order (all ranks have the same number of
            micro-batches except that trailing empty ones are dropped; a rank may have none in a short last step).
    """

    step_samples: int
    world_size: int
    micro_batches: tuple[tuple[int, ...], ...]

    @property
    def accumulation(self) -> int:
        """Gradient-accumulation steps: the most micro-batches any rank runs."""
        return max((len(m) for m in self.micro_batches), default=0)

    def local_size(self, rank: int) -> int:
        """Samples rank ``rank`` processes in this step."""
        return sum(self.micro_batches[rank])

    def local_offset(self, rank: int) -> int:
        """Position of rank ``rank``'s first sample within the step's global batch."""
        return sum(sum(m) for m in self.micro_batches[:rank])


@dataclasses.dataclass(frozen=True)
class GlobalBatchPlanner:
    """Splits a fixed global batch over a changing number of workers.

    Attributes:
        global_batch: samples per optimizer step, fixed for the whole run.
        max_local_batch: memory cap: the most samples one forward/backward pass may hold (0 = no cap); the rest
            of a worker's share goes to gradient accumulation.
        even: require equal local batches (e.g. for BatchNorm statistics): the global batch must then be a
            multiple of the worker count. The short last step of an epoch is always split as evenly as possible.
        max_accumulation: refuse plans that need more micro-batches per step than this (0 = no limit).
    """

    global_batch: int
    max_local_batch: int = 0
    even: bool = False
    max_accumulation: int = 0

    def __post_init__(self) -> None:
        if self.global_batch < 1:
            raise BatchPlanError(f"global_batch={self.global_batch} is invalid: it must be at least 1 sample")
        if self.max_local_batch < 0:
            raise BatchPlanError(
                f"max_local_batch={self.max_local_batch} is invalid: use 0 for no cap or a positive sample count"
            )
        if self.max_accumulation < 0:
            raise BatchPlanError(
                f"max_accumulation={self.max_accumulation} is invalid: use 0 for no limit or a positive count"
            )

    def check_world_size(self, world_size: int) -> None:
        """Check that a full global batch can be split over ``world_size`` workers.

        Args:
            world_size: the number of workers.

        Raises:
            BatchPlanError: fewer samples than workers, an uneven split where ``even`` was asked for, or more
                accumulation steps than ``max_accumulation``.
        """
        if world_size < 1:
            raise BatchPlanError(f"world size {world_size} is invalid: a step needs at least 1 worker")
        if self.global_batch < world_size:
            raise BatchPlanError(
                f"global batch {self.global_batch} is smaller than the worker count {world_size}: every worker "
                f"needs at least one sample per step; raise global_batch to at least {world_size} or run at most "
                f"{self.global_batch} workers"
            )
        if self.even and self.global_batch % world_size:
            lower = self.global_batch - self.global_batch % world_size
            raise BatchPlanError(
                f"global batch {self.global_batch} cannot be split evenly over {world_size} workers (even=True): "
                f"use a multiple of {world_size} such as {lower} or {lower + world_size}, or allow uneven splits"
            )
        accumulation = self._accumulation(-(-self.global_batch // world_size))
        if self.max_accumulation and accumulation > self.max_accumulation:
            raise BatchPlanError(
                f"global batch {self.global_batch} over {world_size} workers with max_local_batch="
                f"{self.max_local_batch} needs {accumulation} accumulation steps, more than max_accumulation="
                f"{self.max_accumulation}; add workers, raise the memory cap or lower the global batch"
            )

    def allowed_world_sizes(self, limit: int) -> list[int]:
        """World sizes from 1 to ``limit`` that :meth:`check_world_size` accepts.

        Args:
            limit: the largest size to consider.

        Returns:
            The accepted sizes in increasing order.
        """
        sizes = []
        for size in range(1, limit + 1):
            try:
                self.check_world_size(size)
            except BatchPlanError:
                continue
            sizes.append(size)
        return sizes

    def _accumulation(self, share: int) -> int:
        if share == 0:
            return 0
        if self.max_local_batch == 0:
            return 1
        return -(-share // self.max_local_batch)

    def plan(self, step_samples: int, world_size: int, idle: frozenset[int] = frozenset()) -> StepPlan:
        """Plan one step of ``step_samples`` samples (at most the global batch) over ``world_size`` workers.

        Args:
            step_samples: samples in this step; the global batch, or fewer for the last step of an epoch.
            world_size: number of workers.
            idle: ranks that take no samples in this step (joiners still receiving the state in the first step of
                a generation); the others split the step as a world of their own size would.

        Returns:
            The plan.

        Raises:
            BatchPlanError: the world size (or the number of ranks not idle) cannot take a global batch (see
                :meth:`check_world_size`), an idle rank is outside the world, or ``step_samples`` is not between 1
                and the global batch.
        """
        self.check_world_size(world_size)
        if not 1 <= step_samples <= self.global_batch:
            raise BatchPlanError(
                f"a step of {step_samples} samples is invalid: it must hold 1 to global_batch="
                f"{self.global_batch} samples"
            )
        if any(not 0 <= rank < world_size for rank in idle):
            raise BatchPlanError(f"idle ranks {sorted(idle)} are not all ranks of a world of {world_size} workers")
        working = world_size - len(idle)
        if idle:
            self.check_world_size(working)
        shares = iter(split_evenly(step_samples, working))
        accumulation = self._accumulation(-(-step_samples // working))
        micro = tuple(
            () if rank in idle else tuple(s for s in split_evenly(next(shares), accumulation) if s > 0)
            for rank in range(world_size)
        )
        return StepPlan(step_samples=step_samples, world_size=world_size, micro_batches=micro)
