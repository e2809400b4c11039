"""Exactly-once elastic data: a deterministic per-epoch permutation, a global cursor, and a loader on top.

Every epoch has one permutation of the dataset, drawn from ``seed`` and the epoch number, identical in every
worker. A single global cursor says how many samples of the epoch have been consumed by *applied* optimizer steps.
Each step takes the next ``global_batch`` samples of the permutation (fewer at the end of the epoch), and the
:class:`~slurm_amoeba.runtime.planner.GlobalBatchPlanner` splits them over the current workers. After a resize or a
rollback the rest of the epoch is simply re-split from the cursor, so no sample is lost or seen twice and a rolled
back step's samples are redone (DESIGN.md, "Data position and batch semantics are the runtime's job").

:class:`ElasticDataLoader` wraps the ordinary ``torch.utils.data.DataLoader`` (worker processes, pinning and
persistent workers all work): it feeds the loader this rank's micro-batches and regroups them into :class:`Step`\\ s.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from slurm_amoeba.core.runtime_env import ENV_MAX_LOCAL_BATCH
from slurm_amoeba.runtime.errors import BatchPlanError, MembershipChanged, RuntimeConfigError
from slurm_amoeba.runtime.planner import GlobalBatchPlanner, StepPlan


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
        self._perm_epoch = -1
        self._perm: list[int] = []

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
        from slurm_amoeba.runtime.errors import StateError

        progress = Progress(epoch=int(state["epoch"]), cursor=int(state["cursor"]), step=int(state["step"]))
        if not 0 <= progress.cursor < self.dataset_size or progress.epoch < 0 or progress.step < 0:
            raise StateError(
                f"sampler position {state} does not fit a dataset of {self.dataset_size} samples: the cursor must "
                "be in [0, dataset_size) and epoch and step must not be negative"
            )
        self.progress = progress


class Topology(Protocol):
    """What the loader needs to know about the current generation."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def check_boundary(self) -> None:
        """Raise :class:`MembershipChanged` when the workers agreed to switch at this step boundary."""


class _IgnoreSigterm:
    """``worker_init_fn`` for loader worker processes: ignore SIGTERM, then run the user's own init function."""

    def __init__(self, user_init: Callable[[int], None] | None) -> None:
        self.user_init = user_init

    def __call__(self, worker: int) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.user_init is not None:
            self.user_init(worker)


class _SwappableBatchSampler(Sampler[list[int]]):
    """A batch sampler whose batches the loader replaces before each new iteration of the ``DataLoader``."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(list(self.batches))

    def __len__(self) -> int:
        return len(self.batches)


@dataclasses.dataclass
class Step:
    """One optimizer step of this rank: iterate it for ``(batch, weight)`` pairs, then call ``state.step()``.

    Multiply each micro-batch's mean loss by ``weight`` before ``backward()``; the runtime sums gradients over
    workers, which then equals the mean-loss gradient of the whole global batch.

    Attributes:
        assignment: which samples this rank processes in the step.
    """

    assignment: StepAssignment
    _next_batch: Callable[[], Any]
    _before_last: Callable[[], None] | None = None
    consumed: int = 0

    @property
    def epoch(self) -> int:
        """The step's epoch."""
        return self.assignment.epoch

    @property
    def index(self) -> int:
        """The global step index."""
        return self.assignment.step

    @property
    def indices(self) -> list[int]:
        """This rank's dataset indices in this step."""
        return self.assignment.indices

    def __iter__(self) -> Iterator[tuple[Any, float]]:
        count = len(self.assignment.micro_indices)
        while self.consumed < count:
            batch = self._next_batch()
            if self.consumed == count - 1 and self._before_last is not None:
                self._before_last()  # the runtime starts reducing gradients during this backward
            weight = self.assignment.weight(self.consumed)
            self.consumed += 1
            yield batch, weight


class ElasticDataLoader:
    """Iterates the steps left in the current epoch for this rank, over an ordinary ``DataLoader``.

    Re-iterate it after a membership change or rollback: it starts again at the sampler's cursor with the current
    world size. Pass ``persistent_workers=True`` with ``num_workers > 0`` to keep loader processes across resizes;
    they are then started by the constructor, i.e. during the worker's warm-up.

    Args:
        dataset: a map-style dataset of ``sampler.dataset_size`` samples.
        sampler: the elastic sampler (part of the :class:`~slurm_amoeba.runtime.state.TorchState`).
        topology: rank and world size source; the process's runtime by default.
        **loader_kwargs: ``DataLoader`` arguments except those that choose samples (``batch_size``, ``shuffle``,
            ``sampler``, ``batch_sampler``, ``drop_last``).

    Raises:
        RuntimeConfigError: a sample-choosing argument was given, or the dataset size does not match.
    """

    _FORBIDDEN = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")

    def __init__(
        self,
        dataset: Dataset[Any],
        sampler: ElasticSampler,
        *,
        topology: Topology | None = None,
        **loader_kwargs: Any,
    ) -> None:
        bad = sorted(k for k in loader_kwargs if k in self._FORBIDDEN)
        if bad:
            raise RuntimeConfigError(
                f"ElasticDataLoader chooses samples itself; remove {', '.join(bad)} from its arguments "
                "(set the global batch on the ElasticSampler)"
            )
        size = len(dataset)  # type: ignore[arg-type]
        if size != sampler.dataset_size:
            raise RuntimeConfigError(
                f"the dataset has {size} samples but the sampler was built for {sampler.dataset_size}; "
                "build the ElasticSampler with len(dataset)"
            )
        self.sampler = sampler
        self._topology = topology
        self._batches = _SwappableBatchSampler()
        if loader_kwargs.get("num_workers", 0):
            # Slurm preemption signals every process of the step, loader workers included; a loader worker that
            # dies of SIGTERM would crash training before the graceful leave. They exit with their parent anyway.
            loader_kwargs["worker_init_fn"] = _IgnoreSigterm(loader_kwargs.get("worker_init_fn"))
        self._loader: DataLoader[Any] = DataLoader(dataset, batch_sampler=self._batches, **loader_kwargs)
        if loader_kwargs.get("num_workers", 0) and loader_kwargs.get("persistent_workers", False):
            # Start the loader processes now, during the background warm-up, not after joining.
            iter(self._loader)

    def _current_topology(self) -> Topology:
        if self._topology is not None:
            return self._topology
        from slurm_amoeba.runtime.worker import get_runtime

        return get_runtime()

    def __iter__(self) -> Iterator[Step]:
        topology = self._current_topology()
        topology.check_boundary()
        assignments = self.sampler.remaining_assignments(topology.rank, topology.world_size)
        self._batches.batches = [list(m) for a in assignments for m in a.micro_indices]
        if not self._batches.batches:
            # Every step left in the epoch is empty for this rank (possible only in a short last step).
            batches: Iterator[Any] = iter(())
        else:
            batches = iter(self._loader)
        return self._steps(assignments, batches, topology)

    def _steps(
        self, assignments: Sequence[StepAssignment], batches: Iterator[Any], topology: Topology
    ) -> Iterator[Step]:
        previous: Step | None = None
        for assignment in assignments:
            if previous is not None:
                if previous.consumed != len(previous.assignment.micro_indices):
                    raise RuntimeConfigError(
                        f"step {previous.index} yielded {len(previous.assignment.micro_indices)} micro-batches but "
                        f"only {previous.consumed} were used; iterate every micro-batch of a step"
                    )
                if self.sampler.progress.step != previous.index + 1:
                    raise RuntimeConfigError(
                        f"step {previous.index} ended without state.step() (the sampler is at step "
                        f"{self.sampler.progress.step}); call state.step() once after each step's micro-batches"
                    )
                topology.check_boundary()
            if self.sampler.progress.step != assignment.step:
                raise RuntimeConfigError(
                    f"the sampler moved to step {self.sampler.progress.step} while the loader was at step "
                    f"{assignment.step}; do not advance the sampler outside state.step()"
                )
            hook = getattr(topology, "before_last_micro_batch", None)
            previous = Step(assignment=assignment, _next_batch=lambda: next(batches), _before_last=hook)
            yield previous


__all__ = [
    "ElasticDataLoader",
    "ElasticSampler",
    "MembershipChanged",
    "Progress",
    "Step",
    "StepAssignment",
    "Topology",
]
