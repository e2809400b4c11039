"""Exactly-once elastic data: a deterministic per-epoch permutation, a global cursor, and a loader on top.

Every epoch has one permutation of the dataset, drawn from ``seed`` and the epoch number, identical in every
worker. A single global cursor says how many samples of the epoch have been consumed by *applied* optimizer steps.
Each step takes the next ``global_batch`` samples of the permutation (fewer at the end of the epoch), and the
:class:`~slurm_amoeba.runtime.planner.GlobalBatchPlanner` splits them over the current workers. After a resize or a
rollback the rest of the epoch is simply re-split from the cursor, so no sample is lost or seen twice and a rolled
back step's samples are redone (DESIGN.md, "Data position and batch semantics are the runtime's job").

The loader on top (:class:`~slurm_amoeba.runtime.loader.ElasticDataLoader`) asks the sampler for this rank's
steps; the sampler knows the current generation's rank and world size through the topology that
:func:`slurm_amoeba.runtime.run` binds to the training state, and thereby to its sampler (:meth:`ElasticSampler.bind`).
"""

from __future__ import annotations

import dataclasses
import os

import torch

from slurm_amoeba.core.runtime_env import ENV_MAX_LOCAL_BATCH
from slurm_amoeba.runtime.errors import BatchPlanError, StateError
from slurm_amoeba.runtime.planner import GlobalBatchPlanner, StepPlan
from slurm_amoeba.runtime.topology import Topology


@dataclasses.dataclass
class Progress:
    """Where training stands in the data: part of the training state, committed and sent with it.

    Attributes:
        epoch: the current epoch (0-based).
        cursor: samples of the current epoch consumed by applied steps.
        step: optimizer steps applied since the start of training (all epochs).
    """

    epoch: int = 0
    cursor: int = 0
    step: int = 0


@dataclasses.dataclass(frozen=True)
class StepAssignment:
    """One step as seen by one rank: which samples it processes, in which micro-batches.

    Attributes:
        epoch: the epoch of the step.
        step: the global step index.
        cursor: the epoch cursor before the step.
        plan: the split of the step over all ranks.
        rank: the rank this assignment is for.
        micro_indices: this rank's dataset indices, one list per micro-batch.
    """

    epoch: int
    step: int
    cursor: int
    plan: StepPlan
    rank: int
    micro_indices: tuple[tuple[int, ...], ...]

    @property
    def indices(self) -> list[int]:
        """All of this rank's dataset indices in the step."""
        return [i for micro in self.micro_indices for i in micro]

    def weight(self, micro: int) -> float:
        """Loss weight of micro-batch ``micro``: its share of the whole step's samples."""
        return len(self.micro_indices[micro]) / self.plan.step_samples


#: The permutations an :class:`ElasticSampler` can draw (its ``order``).
ORDERS = ("elastic", "distributed")


def _cap_from_environment() -> int:
    text = os.environ.get(ENV_MAX_LOCAL_BATCH, "") or "0"
    if not text.isdigit():
        raise BatchPlanError(f"{ENV_MAX_LOCAL_BATCH}={text!r} is not a whole number of samples (0 = no cap)")
    return int(text)


class ElasticSampler:
    """Deterministic per-epoch permutation plus a global cursor, split over the current workers.

    Args:
        dataset_size: number of samples in the (map-style) dataset.
        global_batch: samples per optimizer step, fixed whatever the worker count.
        seed: permutation seed; epoch ``e`` uses ``seed`` and ``e``.
        shuffle: permute each epoch; ``False`` keeps dataset order.
        max_local_batch: memory cap per forward/backward pass (0 = none); see :class:`GlobalBatchPlanner`. By
            default the launcher's ``AMOEBA_MAX_LOCAL_BATCH`` (e.g. set from the worker's GPU memory), else none.
            The cap only changes how this worker cuts its own share into micro-batches, never which samples it
            gets, so workers with different memory may have different caps.
        even: require equal local batches (see :class:`GlobalBatchPlanner`).
        max_accumulation: most accumulation steps allowed per step (0 = no limit).
        max_global_batch: opt in to an **adaptive batch** (:mod:`slurm_amoeba.runtime.adaptive`): the global batch
            may then grow from ``global_batch`` up to this many samples, changed only between steps by
            :meth:`set_global_batch`; ``None`` (the default) keeps it fixed.
        adapt_every: with an adaptive batch, the steps between two chances to change it: the loader's iteration
            ends there (and at the end of each epoch), and the next iteration plans the steps at the new size.
        order: ``"elastic"`` (the default) draws epoch ``e``'s permutation from ``seed * 1_000_003 + e``;
            ``"distributed"`` draws it as ``torch.utils.data.DistributedSampler`` does (``seed + e``), so that step
            ``i`` of an epoch holds the same global samples as a DistributedSampler's step ``i`` with the same seed
            and shuffle, at any world size that divides the global batch (docs/port.md, "Data order").

    Raises:
        BatchPlanError: the dataset is smaller than one global batch, or the batch settings are invalid.
    """

    def __init__(
        self,
        dataset_size: int,
        global_batch: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        max_local_batch: int | None = None,
        even: bool = False,
        max_accumulation: int = 0,
        max_global_batch: int | None = None,
        adapt_every: int = 50,
        order: str = "elastic",
    ) -> None:
        if order not in ORDERS:
            raise BatchPlanError(f"order={order!r} is not one of {', '.join(ORDERS)}")
        _check_adaptive(
            dataset_size, global_batch, max_global_batch, adapt_every, even=even, accumulation=max_accumulation
        )
        self.min_global_batch = global_batch
        self.max_global_batch = max_global_batch
        self.adapt_every = adapt_every
        if max_local_batch is None:
            max_local_batch = _cap_from_environment()
        self.planner = GlobalBatchPlanner(
            global_batch=global_batch, max_local_batch=max_local_batch, even=even, max_accumulation=max_accumulation
        )
        self.user_local_batch = max_local_batch  # the user's own cap; a share cap only lowers it
        if dataset_size < global_batch:
            raise BatchPlanError(
                f"the dataset of {dataset_size} samples is smaller than one global batch of {global_batch}: "
                f"lower global_batch to at most {dataset_size} or use a larger dataset"
            )
        self.dataset_size = dataset_size
        self.seed = seed
        self.shuffle = shuffle
        self.order = order
        self.progress = Progress()
        self.topology: Topology | None = None
        self._perm_epoch = -1
        self._perm: list[int] = []

    def bind(self, topology: Topology | None) -> None:
        """Attach the current generation's topology (done by :meth:`TorchState.bind`; ``None`` detaches).

        Args:
            topology: rank, world size and step-boundary check of the current generation.
        """
        self.topology = topology

    @property
    def global_batch(self) -> int:
        """Samples per full optimizer step."""
        return self.planner.global_batch

    @property
    def adaptive(self) -> bool:
        """Whether the global batch may change (``max_global_batch`` was given)."""
        return self.max_global_batch is not None

    def cap_local_batch(self, micro_batch: int) -> int:
        """Plan this worker's next steps with micro-batches of at most ``micro_batch`` (a device memory cap,
        :mod:`~slurm_amoeba.runtime.shared_device`), never above the user's own ``max_local_batch``; 0 lifts the cap
        back to the user's. The global batch stays; the rest goes to gradient accumulation. Only this worker's
        split changes (its share of each step does not), so workers may differ.

        Returns:
            The micro-batch cap now in force (0: none).

        Raises:
            BatchPlanError: ``micro_batch`` is negative.
        """
        if micro_batch < 0:
            raise BatchPlanError(f"cap_local_batch({micro_batch}): give a micro-batch of 1 or more, or 0 for none")
        caps = [c for c in (micro_batch, self.user_local_batch) if c > 0]
        cap = min(caps, default=0)
        if cap != self.planner.max_local_batch:
            self.planner = dataclasses.replace(self.planner, max_local_batch=cap)
        return cap

    def set_global_batch(self, batch: int) -> None:
        """Change the global batch from the next step on (adaptive batch only; call it between steps).

        The cursor counts samples, so the rest of the epoch is simply planned at the new size: no sample is lost or
        seen twice. An iteration of the loader that is under way keeps its planned steps until it ends (at the next
        multiple of ``adapt_every`` steps or at the end of the epoch).

        Args:
            batch: the new global batch, from the initial ``global_batch`` to ``max_global_batch``.

        Raises:
            BatchPlanError: the sampler is not adaptive, ``batch`` is out of range, or the position is not where the
                loader's iteration ends (a multiple of ``adapt_every`` steps, or the start of an epoch).
        """
        where = self.progress
        if where.step % self.adapt_every and where.cursor:
            raise BatchPlanError(
                f"set_global_batch({batch}) at step {where.step}: the loader has planned the steps up to the next "
                f"multiple of adapt_every={self.adapt_every}; change the batch only there or at the start of an epoch"
            )
        self._apply_batch(batch)

    def _apply_batch(self, batch: int) -> None:
        if self.max_global_batch is None:
            raise BatchPlanError(
                f"set_global_batch({batch}) on a fixed-batch sampler: pass max_global_batch= to ElasticSampler to "
                "allow the global batch to change"
            )
        if not self.min_global_batch <= batch <= self.max_global_batch:
            raise BatchPlanError(
                f"global batch {batch} is outside the allowed range {self.min_global_batch}..{self.max_global_batch} "
                "(global_batch..max_global_batch of the ElasticSampler)"
            )
        if batch != self.planner.global_batch:
            self.planner = dataclasses.replace(self.planner, global_batch=batch)

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch (the last may be short)."""
        return -(-self.dataset_size // self.global_batch)

    def permutation(self, epoch: int) -> list[int]:
        """The order of the dataset in epoch ``epoch``; the same in every process.

        Args:
            epoch: the epoch.

        Returns:
            A permutation of ``range(dataset_size)``.
        """
        if epoch != self._perm_epoch:
            if self.shuffle:
                seed = self.seed + epoch if self.order == "distributed" else self.seed * 1_000_003 + epoch
                generator = torch.Generator().manual_seed(seed)
                self._perm = torch.randperm(self.dataset_size, generator=generator).tolist()
            else:
                self._perm = list(range(self.dataset_size))
            self._perm_epoch = epoch
        return self._perm

    def set_epoch(self, epoch: int) -> None:
        """Accepted where a script called ``DistributedSampler.set_epoch``: the epoch is the training state's.

        Raises:
            StateError: ``epoch`` is not the state's epoch (a loop not driven by ``remaining_epochs``).
        """
        if epoch != self.progress.epoch:
            raise StateError(
                f"set_epoch({epoch}) while the training state is in epoch {self.progress.epoch}: the elastic sampler "
                "follows the state; loop over job.remaining_epochs(...) and pass the epoch it yields"
            )

    def step_samples(self, cursor: int) -> int:
        """Samples in the step that starts at ``cursor``."""
        return min(self.global_batch, self.dataset_size - cursor)

    def assignment(
        self, rank: int, world_size: int, progress: Progress | None = None, idle: frozenset[int] = frozenset()
    ) -> StepAssignment:
        """The step at ``progress`` (default: the current one) as seen by ``rank`` of ``world_size``.

        Args:
            rank: the rank.
            world_size: the number of workers.
            progress: the position; the sampler's own by default.
            idle: ranks without samples in this step (see :meth:`GlobalBatchPlanner.plan`).

        Returns:
            The assignment.

        Raises:
            BatchPlanError: the world size cannot take the global batch.
        """
        where = progress if progress is not None else self.progress
        if not 0 <= rank < world_size:
            raise BatchPlanError(f"rank {rank} is outside a world of {world_size} workers")
        plan = self.planner.plan(self.step_samples(where.cursor), world_size, idle)
        perm = self.permutation(where.epoch)
        start = where.cursor + plan.local_offset(rank)
        micro: list[tuple[int, ...]] = []
        for size in plan.micro_batches[rank]:
            micro.append(tuple(perm[start : start + size]))
            start += size
        return StepAssignment(
            epoch=where.epoch,
            step=where.step,
            cursor=where.cursor,
            plan=plan,
            rank=rank,
            micro_indices=tuple(micro),
        )

    def remaining_assignments(self, rank: int, world_size: int) -> list[StepAssignment]:
        """Every step from the current position to the end of the current epoch, for ``rank``.

        Args:
            rank: the rank.
            world_size: the number of workers.

        Returns:
            The assignments in order (empty when the epoch is exhausted).

        Raises:
            BatchPlanError: the world size cannot take the global batch.
        """
        self.planner.check_world_size(world_size)
        where = dataclasses.replace(self.progress)
        out = []
        while where.cursor < self.dataset_size:
            assignment = self.assignment(rank, world_size, where)
            out.append(assignment)
            where.cursor += assignment.plan.step_samples
            where.step += 1
            if self.max_global_batch is not None and where.step % self.adapt_every == 0:
                break  # the batch may change here: the next iteration plans the rest
        return out

    def advance(self) -> int:
        """Record that the current step was applied: move the cursor, and start the next epoch when it is done.

        Returns:
            The number of samples the step consumed.
        """
        consumed = self.step_samples(self.progress.cursor)
        self.progress.cursor += consumed
        self.progress.step += 1
        if self.progress.cursor >= self.dataset_size:
            self.progress.epoch += 1
            self.progress.cursor = 0
        return consumed

    def state_dict(self) -> dict[str, int]:
        """The position (and an adaptive sampler's current global batch), as JSON-friendly numbers."""
        state = dataclasses.asdict(self.progress)
        if self.max_global_batch is not None:
            state["global_batch"] = self.global_batch
        return state

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore a position from :meth:`state_dict`.

        Args:
            state: the position.

        Raises:
            StateError: the position does not fit this dataset.
        """
        progress = Progress(epoch=int(state["epoch"]), cursor=int(state["cursor"]), step=int(state["step"]))
        if not 0 <= progress.cursor < self.dataset_size or progress.epoch < 0 or progress.step < 0:
            raise StateError(
                f"sampler position {state} does not fit a dataset of {self.dataset_size} samples: the cursor must "
                "be in [0, dataset_size) and epoch and step must not be negative"
            )
        self.progress = progress
        if self.max_global_batch is not None and "global_batch" in state:
            self._apply_batch(int(state["global_batch"]))  # the loader plans again after every load


def _check_adaptive(
    dataset_size: int, batch: int, max_batch: int | None, adapt_every: int, *, even: bool, accumulation: int
) -> None:
    """Refuse adaptive-batch settings the runtime cannot honour, saying which and what to do."""
    if max_batch is None:
        return
    if max_batch < batch:
        raise BatchPlanError(
            f"max_global_batch={max_batch} is below global_batch={batch}: the adaptive batch starts at global_batch "
            "and only grows; raise max_global_batch or leave it out for a fixed batch"
        )
    if max_batch > dataset_size:
        raise BatchPlanError(
            f"max_global_batch={max_batch} is larger than the dataset ({dataset_size} samples); lower it"
        )
    if even or accumulation:
        raise BatchPlanError(
            "an adaptive batch (max_global_batch=) needs even=False and max_accumulation=0: the batch it picks must "
            "fit every world size that the initial global_batch fits"
        )
    if adapt_every < 1:
        raise BatchPlanError(f"adapt_every={adapt_every} is invalid: it must be at least 1 step")


__all__ = ["ElasticSampler", "Progress", "StepAssignment"]
