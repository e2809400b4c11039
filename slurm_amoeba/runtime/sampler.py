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
    ) -> None:
        if max_local_batch is None:
            max_local_batch = _cap_from_environment()
        self.planner = GlobalBatchPlanner(
            global_batch=global_batch, max_local_batch=max_local_batch, even=even, max_accumulation=max_accumulation
        )
        if dataset_size < global_batch:
            raise BatchPlanError(
                f"the dataset of {dataset_size} samples is smaller than one global batch of {global_batch}: "
                f"lower global_batch to at most {dataset_size} or use a larger dataset"
            )
        self.dataset_size = dataset_size
        self.seed = seed
        self.shuffle = shuffle
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
                generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                self._perm = torch.randperm(self.dataset_size, generator=generator).tolist()
            else:
                self._perm = list(range(self.dataset_size))
            self._perm_epoch = epoch
        return self._perm

    def step_samples(self, cursor: int) -> int:
        """Samples in the step that starts at ``cursor``."""
        return min(self.global_batch, self.dataset_size - cursor)

    def assignment(self, rank: int, world_size: int, progress: Progress | None = None) -> StepAssignment:
        """The step at ``progress`` (default: the current one) as seen by ``rank`` of ``world_size``.

        Args:
            rank: the rank.
            world_size: the number of workers.
            progress: the position; the sampler's own by default.

        Returns:
            The assignment.

        Raises:
            BatchPlanError: the world size cannot take the global batch.
        """
        where = progress if progress is not None else self.progress
        if not 0 <= rank < world_size:
            raise BatchPlanError(f"rank {rank} is outside a world of {world_size} workers")
        plan = self.planner.plan(self.step_samples(where.cursor), world_size)
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
        """The position, as JSON-friendly numbers."""
        return dataclasses.asdict(self.progress)

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


__all__ = ["ElasticSampler", "Progress", "StepAssignment"]
