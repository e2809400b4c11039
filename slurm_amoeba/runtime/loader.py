"""The elastic data loader: this rank's steps of the epoch over an ordinary ``DataLoader``, and its processes.

:class:`ElasticDataLoader` wraps ``torch.utils.data.DataLoader`` (worker processes, pinning and persistent workers
all work): it feeds the loader this rank's micro-batches, as the :class:`~slurm_amoeba.runtime.sampler.ElasticSampler`
splits the rest of the epoch over the current generation, and regroups them into :class:`Step`\\ s. The rank and
world size come from the topology the loader is given, or else the one :func:`slurm_amoeba.runtime.run` binds to
the state that holds the loader's sampler (DESIGN.md, layer ``runtime/``, worker side).

Loader processes exit with their parent on every path. Slurm sends SIGTERM to every process of a step on
preemption, loader processes included, and a loader process that died of it would crash training before the
graceful leave: so they ignore SIGTERM while their parent trains. At interpreter exit (normal or through an
exception) the parent first raises a shared flag, and then multiprocessing's own exit handler sends its SIGTERM,
which they now obey; if the parent dies of a signal (SIGTERM without the runtime, SIGKILL), the kernel kills them
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from torch.utils.data import DataLoader, Dataset, Sampler

from slurm_amoeba.runtime.errors import RuntimeConfigError
from slurm_amoeba.runtime.sampler import ElasticSampler, StepAssignment
from slurm_amoeba.runtime.topology import Topology, idle_ranks

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere torch's watchdog notices)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return


class _LoaderProcessGuard:
    """``worker_init_fn`` of loader processes: die with the parent, ignore SIGTERM until the parent exits.

    Args:
        parent_pid: the training process.
        exiting: a shared byte the parent sets to 1 at interpreter exit.
        user_init: the user's own ``worker_init_fn``, run afterwards.
    """

    def __init__(self, parent_pid: int, exiting: Any, user_init: Callable[[int], None] | None) -> None:
        self.parent_pid = parent_pid
        self.exiting = exiting
        self.user_init = user_init

    def __call__(self, worker: int) -> None:
        _die_with_parent()
        if os.getppid() != self.parent_pid:  # the parent died before the request took effect
            os._exit(0)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.user_init is not None:
            self.user_init(worker)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self.exiting.value or os.getppid() != self.parent_pid:
            os._exit(0)
        # Otherwise a preemption signal for the whole step: the parent leaves gracefully, then stops us.


def _mark_exiting(exiting: Any) -> None:
    exiting.value = 1


def _guard_processes(loader_kwargs: dict[str, Any]) -> None:
    """Install :class:`_LoaderProcessGuard` as the loader's ``worker_init_fn`` and the parent's exit hook."""
    context = loader_kwargs.get("multiprocessing_context") or multiprocessing
    if isinstance(context, str):
        context = multiprocessing.get_context(context)
    exiting = context.RawValue("b", 0)
    # Registered after multiprocessing's own exit handler, so it runs before it (atexit is last in, first out).
    atexit.register(_mark_exiting, exiting)
    loader_kwargs["worker_init_fn"] = _LoaderProcessGuard(os.getpid(), exiting, loader_kwargs.get("worker_init_fn"))


class _LazyPlan:
    """This rank's steps from the sampler's position to the end of the epoch (or to the next step where an adaptive
    batch may change), each planned when first asked for.

    The loader is iterated afresh after every switch; planning the whole rest of the epoch there costs every member
    time proportional to the dataset at each switch (about 50 ms per million samples, more with the epoch's first
    permutation), while a step's plan costs microseconds. The ``DataLoader`` (reading micro-batches ahead) and the
    loader's steps both read this one plan, so they agree.
    """

    def __init__(self, sampler: ElasticSampler, topology: Topology) -> None:
        rank, world_size = topology.rank, topology.world_size
        sampler.planner.check_world_size(world_size)
        self._sampler, self._rank, self._world_size, self._topology = sampler, rank, world_size, topology
        self._where = dataclasses.replace(sampler.progress)
        self._steps: list[StepAssignment] = []
        self._complete = False

    def get(self, index: int) -> StepAssignment | None:
        """The ``index``-th step of the plan, or ``None`` past its end."""
        while len(self._steps) <= index and not self._complete:
            self._plan_next()
        return self._steps[index] if index < len(self._steps) else None

    def _plan_next(self) -> None:
        sampler, where = self._sampler, self._where
        if where.cursor >= sampler.dataset_size:
            self._complete = True
            return
        idle = idle_ranks(self._topology, where.step)
        assignment = sampler.assignment(self._rank, self._world_size, where, idle)
        self._steps.append(assignment)
        where.cursor += assignment.plan.step_samples
        where.step += 1
        if sampler.max_global_batch is not None and where.step % sampler.adapt_every == 0:
            self._complete = True  # the batch may change here: the next iteration plans the rest

    def steps(self) -> Iterator[StepAssignment]:
        """The plan's steps in order."""
        index = 0
        while (assignment := self.get(index)) is not None:
            yield assignment
            index += 1

    def micro_batches(self) -> Iterator[list[int]]:
        """This rank's micro-batches of every step in order (what the ``DataLoader`` loads)."""
        for assignment in self.steps():
            for micro in assignment.micro_indices:
                yield list(micro)


class _SwappableBatchSampler(Sampler[list[int]]):
    """A batch sampler whose plan the loader replaces before each new iteration of the ``DataLoader``."""

    def __init__(self) -> None:
        self.plan: _LazyPlan | None = None

    def __iter__(self) -> Iterator[list[int]]:
        return iter(()) if self.plan is None else self.plan.micro_batches()

    def __len__(self) -> int:  # plans the whole rest of the epoch; the DataLoader's iteration does not ask
        return 0 if self.plan is None else sum(1 for _ in self.plan.micro_batches())


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
        topology: rank and world size source; by default the one bound to ``sampler`` by
            :func:`slurm_amoeba.runtime.run` (the sampler of the state it runs).
        overlap: start reducing gradient buckets during each step's last backward (``False`` for a ported loop,
            whose wrapper weights the gradients after backward, then reduces them).
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
        overlap: bool = True,
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
        self._overlap = overlap
        self._batches = _SwappableBatchSampler()
        if loader_kwargs.get("num_workers", 0):
            _guard_processes(loader_kwargs)  # see the module docstring
        self._loader: DataLoader[Any] = DataLoader(dataset, batch_sampler=self._batches, **loader_kwargs)
        if loader_kwargs.get("num_workers", 0) and loader_kwargs.get("persistent_workers", False):
            # Start the loader processes now, during the background warm-up, not after joining.
            iter(self._loader)

    def _current_topology(self) -> Topology:
        topology = self._topology or self.sampler.topology
        if topology is None:
            raise RuntimeConfigError(
                "the ElasticDataLoader does not know the current generation: iterate it inside "
                "slurm_amoeba.runtime.run(train, state) with a TorchState that holds its sampler, or pass topology="
            )
        return topology

    def __iter__(self) -> Iterator[Step]:
        topology = self._current_topology()
        topology.check_boundary()
        plan = _LazyPlan(self.sampler, topology)
        self._batches.plan = plan
        if next(plan.micro_batches(), None) is None:
            # Every step left in the epoch is empty for this rank (possible only in a short last step).
            batches: Iterator[Any] = iter(())
        else:
            batches = iter(self._loader)
        return self._steps(plan.steps(), batches, topology)

    def _steps(
        self, assignments: Iterator[StepAssignment], batches: Iterator[Any], topology: Topology
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
            hook = getattr(topology, "before_last_micro_batch", None) if self._overlap else None
            previous = Step(assignment=assignment, _next_batch=lambda: next(batches), _before_last=hook)
            yield previous


__all__ = ["ElasticDataLoader", "Step"]
