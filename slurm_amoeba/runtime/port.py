"""A torchrun DDP script made elastic in about five lines: the training loop stays the user's (docs/port.md).

::

    job = amoeba.init_process_group("gloo")                     # was: dist.init_process_group("gloo")
    model = job.wrap(model, optimizer, schedulers=[scheduler], scaler=scaler)           # was: DDP(model)
    sampler = amoeba.ElasticSampler(len(dataset), global_batch=64, order="distributed")  # was: DistributedSampler
    loader = job.data_loader(dataset, sampler, num_workers=2)   # was: DataLoader(..., sampler=sampler)
    for epoch in job.remaining_epochs(10):                      # was: range(10)
        sampler.set_epoch(epoch)
        for x, y in loader:                                     # a resize happens here, between two steps
            ...                                                 # the user's forward, backward, clipping, step

:func:`init_process_group` joins the job (:func:`slurm_amoeba.runtime.init`) and returns the :class:`ElasticLoop`,
which builds the :class:`~slurm_amoeba.runtime.state.TorchState` from what ``wrap`` and ``data_loader`` were given
and runs :func:`slurm_amoeba.runtime.run` in a thread of its own (:mod:`~slurm_amoeba.runtime.bridge`): admission,
switches, rollbacks and leaving happen inside the loader's iteration, at a step boundary. The wrapper
(:mod:`~slurm_amoeba.runtime.port_model`) sums the weighted gradients over the workers when backward ends, so
whatever the script does between ``backward()`` and the next batch sees the global batch's gradients (DESIGN.md,
layer ``runtime/``, worker side).
"""

from __future__ import annotations

import atexit
import logging
import signal
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import Dataset, default_collate

from slurm_amoeba.runtime.bridge import Bridge, Turn
from slurm_amoeba.runtime.checkpoint import CheckpointPolicy
from slurm_amoeba.runtime.errors import MembershipChanged, RuntimeConfigError, WorkerFailure
from slurm_amoeba.runtime.loader import ElasticDataLoader, Step
from slurm_amoeba.runtime.port_model import ElasticDDP
from slurm_amoeba.runtime.result import RunResult, RunStatus
from slurm_amoeba.runtime.sampler import ElasticSampler
from slurm_amoeba.runtime.sigterm import SigtermChain
from slurm_amoeba.runtime.state import TorchState
from slurm_amoeba.runtime.transfer import StateRefused
from slurm_amoeba.runtime.worker import WorkerRuntime, init

log = logging.getLogger(__name__)

#: Steps between the loop's own in-memory commits (what a failure rolls back to; a checkpoint policy writes the due
#: ones to disk).
DEFAULT_COMMIT_EVERY = 50


class LoopState(TorchState):
    """The state of a ported loop: joiners take their share of samples from their first step (the user's loop has no
    way to run a step without samples), so :attr:`joiners_may_idle` is off."""

    joiners_may_idle = False


class _RolledBack(Exception):
    """The loader's iteration starts again from the state's position (a failure was rolled back)."""


def seeded_position(sampler: ElasticSampler, start_epoch: int, step_in_epoch: int) -> dict[str, int]:
    """The sampler position of a script's own checkpoint: ``step_in_epoch`` steps of ``start_epoch`` done (as many as
    the epoch has: the next epoch's start)."""
    step = start_epoch * sampler.steps_per_epoch + step_in_epoch
    epoch, steps_done = divmod(step, sampler.steps_per_epoch)
    return {"epoch": epoch, "cursor": steps_done * sampler.global_batch, "step": step}


def init_process_group(
    backend: str | None = None,
    *,
    checkpoint: CheckpointPolicy | None = None,
    commit_every: int = DEFAULT_COMMIT_EVERY,
    environ: Mapping[str, str] | None = None,
    **torch_kwargs: Any,
) -> ElasticLoop:
    """Join the elastic job in place of ``torch.distributed.init_process_group`` (call it where the script did).

    Args:
        backend: accepted for the script's call; the runtime picks ``nccl`` on GPUs, else ``gloo``.
        checkpoint: write due commits to disk and resume from the newest complete checkpoint there; default
            ``AMOEBA_CHECKPOINT_*`` (docs/runtime.md section 8), else none.
        commit_every: steps between the loop's in-memory commits (0: only the runtime's own, at each resize).
        environ: the environment contract; ``os.environ`` by default.
        **torch_kwargs: the rest of the script's ``init_process_group`` call (``init_method``, ``timeout``, ...),
            ignored: the job's coordinator supplies the rendezvous.

    Returns:
        The loop object (``job``) whose ``wrap``, ``data_loader`` and ``remaining_epochs`` the script uses.

    Raises:
        RuntimeConfigError: the runtime was already initialised, or ``commit_every`` is negative.
        RuntimeTimeout: the coordinator's store cannot be reached.
    """
    if torch_kwargs:
        log.debug(
            "init_process_group: ignoring %s (the job's coordinator supplies the rendezvous)", sorted(torch_kwargs)
        )
    previous = signal.getsignal(signal.SIGTERM)
    runtime = init(environ)
    return ElasticLoop(runtime, SigtermChain(runtime.request_leave, previous), checkpoint, commit_every, backend)


# shape: the loop's one object: the pieces the script hands it, the step in flight, and the hand-over to the runtime
class ElasticLoop:
    """The elastic side of a ported script's loop (made by :func:`init_process_group`).

    Args:
        runtime: this process's runtime.
        signals: the SIGTERM chain.
        checkpoint: the disk checkpoint policy, if any.
        commit_every: steps between in-memory commits.
        backend: the backend the script asked for (informational).
    """

    def __init__(
        self,
        runtime: WorkerRuntime,
        signals: SigtermChain,
        checkpoint: CheckpointPolicy | None = None,
        commit_every: int = DEFAULT_COMMIT_EVERY,
        backend: str | None = None,
    ) -> None:
        if commit_every < 0:
            raise RuntimeConfigError(f"commit_every={commit_every}: give 0 (no commits of the loop's own) or more")
        self.runtime = runtime
        self.signals = signals
        self.checkpoint = checkpoint
        self.commit_every = commit_every
        self.backend = backend
        self.state: LoopState | None = None
        self.model: ElasticDDP | None = None
        self.loader: PortLoader | None = None
        self.bridge: Bridge | None = None
        self._parts: dict[str, Any] = {}
        self._step: Step | None = None
        self._weight = 1.0
        self._reduced = False
        self._ended = False
        self._failure: BaseException | None = None
        self._trained = False
        atexit.register(self._at_exit)

    # ----------------------------------------------------------------------------------------------- the script's five

    def wrap(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        schedulers: Sequence[LRScheduler] = (),
        scaler: torch.amp.GradScaler | None = None,
    ) -> ElasticDDP:
        """In place of ``DistributedDataParallel(model)``: the model with what must travel and roll back with it.

        Load the script's own checkpoint into them *before* this call (as the script did): that is the state the
        job starts from when no disk checkpoint of the runtime's is there to resume.

        Args:
            model: the plain model (not wrapped in DDP).
            optimizer: its optimizer.
            schedulers: its LR schedulers (stepped by the script as before).
            scaler: its ``GradScaler``, if it has one.

        Returns:
            The wrapped model (``.module`` is ``model``); call it as the script called the DDP model.

        Raises:
            RuntimeConfigError: called twice, or after the loop started.
        """
        if self.model is not None or self.bridge is not None:
            raise RuntimeConfigError("job.wrap() was already called: an elastic job trains one model")
        self._parts = {"model": model, "optimizer": optimizer, "schedulers": list(schedulers), "scaler": scaler}
        self.model = ElasticDDP(model, self)
        return self.model

    def data_loader(self, dataset: Dataset[Any], sampler: ElasticSampler, **loader_kwargs: Any) -> PortLoader:
        """In place of ``DataLoader(dataset, batch_size=..., sampler=DistributedSampler(...))``.

        Args:
            dataset: a map-style dataset of ``sampler.dataset_size`` samples.
            sampler: the elastic sampler (its ``global_batch`` is the step's samples over all workers).
            **loader_kwargs: ``DataLoader`` arguments other than those that choose samples (``num_workers``,
                ``pin_memory``, ``collate_fn``, ``persistent_workers``, ...).

        Returns:
            The loader: iterate it once per epoch; each item is this worker's batch of one step.

        Raises:
            RuntimeConfigError: a second loader, an argument that chooses samples, or a sampler whose memory cap
                (``max_local_batch``, ``AMOEBA_MAX_LOCAL_BATCH``) would cut a step into several batches.
        """
        if self.loader is not None or self.bridge is not None:
            raise RuntimeConfigError("job.data_loader() was already called: the job's sampler is part of its state")
        if sampler.planner.max_local_batch:
            raise RuntimeConfigError(
                f"the sampler caps a forward at max_local_batch={sampler.planner.max_local_batch} samples, which "
                "cuts a step into several batches; a ported loop takes one batch per step: build the ElasticSampler "
                "with max_local_batch=0, or use the train(state) API (docs/runtime.md section 1) for accumulation"
            )
        self.loader = PortLoader(self, dataset, sampler, loader_kwargs)
        return self.loader

    def remaining_epochs(self, epochs: int, *, start_epoch: int = 0, step_in_epoch: int = 0) -> Iterator[int]:
        """In place of ``range(start_epoch, epochs)``: the epochs left, from the training state's position.

        The first call joins the job (waits for admission). ``start_epoch`` and ``step_in_epoch`` seed the position
        from the script's own checkpoint; a worker that joins a running job, and a job that resumes from the
        runtime's disk checkpoint, take the position from that state instead.

        Args:
            epochs: the total number of epochs.
            start_epoch: the epoch to start at (the script's checkpoint's).
            step_in_epoch: steps of ``start_epoch`` already done.

        Yields:
            The current epoch, until the state reaches ``epochs``.

        Raises:
            RuntimeConfigError: ``wrap`` or ``data_loader`` was not called first.
        """
        state = self._admit(start_epoch, step_in_epoch)
        while state.epoch < epochs:
            yield state.epoch
        self._trained = True

    def commit(self) -> None:
        """Keep an in-memory copy of the state to roll back to (written to disk when the policy says so).

        **A collective**, at the same step on every worker (e.g. ``if step % 100 == 0: job.commit()`` after the
        optimizer step). The loop also commits every ``commit_every`` steps on its own.
        """
        state = self._member_state()
        self._end_step()
        if self._failure is not None:
            return
        try:
            state.commit()
        except WorkerFailure as exc:
            self._failure = exc

    def finish(self) -> RunResult[None]:
        """End the run for this worker (done at interpreter exit when the script does not call it).

        Returns:
            How the run ended (``result.timeline``: the generations this worker was a member of).
        """
        bridge = self.bridge
        if bridge is None:
            raise RuntimeConfigError("job.finish() before the job started: loop over job.remaining_epochs() first")
        if bridge.result is None:
            self._over(bridge.hand_over(Turn.DONE))
        assert bridge.result is not None
        bridge.join(timeout_s=60)
        return bridge.result

    @property
    def result(self) -> RunResult[None] | None:
        """How the run ended for this worker, once it has."""
        return None if self.bridge is None else self.bridge.result

    # ----------------------------------------------------------------------------------------------- runtime side

    def _admit(self, start_epoch: int, step_in_epoch: int) -> LoopState:
        if self.state is not None:
            return self.state
        if self.loader is None or not self._parts:
            raise RuntimeConfigError(
                "call job.wrap(model, optimizer, ...) and job.data_loader(dataset, sampler) before the loop"
            )
        sampler = self.loader.sampler
        sampler.load_state_dict(seeded_position(sampler, start_epoch, step_in_epoch))
        parts = self._parts
        state = LoopState(
            parts["model"], parts["optimizer"], sampler, schedulers=parts["schedulers"], scaler=parts["scaler"]
        )
        self.state = state
        checkpoint = self.checkpoint

        def run(train: Any, run_state: TorchState) -> RunResult[None]:
            return self.runtime.run(train, run_state, checkpoint=checkpoint)

        self.bridge = Bridge(run, state)
        self.signals.adopt()
        self._over(self.bridge.admit())
        return state

    def _member_state(self) -> LoopState:
        if self.state is None or self.bridge is None or self.bridge.over:
            raise RuntimeConfigError("the elastic job is not running here: call it inside the loop")
        return self.state

    def _over(self, result: RunResult[None] | None) -> None:
        """The run is over for this worker: a worker that left (or was not needed) exits with status 0 here."""
        if result is None or result.status is RunStatus.FINISHED:
            return
        log.info("%s the run is over for this worker (%s): exiting", self.runtime.prefix, result.status.value)
        raise SystemExit(0)

    def step_open(self) -> bool:
        """Whether a training forward now belongs to a step whose gradients are not reduced yet."""
        return self._step is not None and not self._reduced

    def after_backward(self) -> None:
        """Weight this worker's gradients by its share of the step's samples, then sum them over the workers."""
        self._reduced = True
        if self._failure is not None:
            return  # the generation failed already: the boundary hands it over
        if self._weight != 1.0:
            with torch.no_grad():
                for param in self._parts["model"].parameters():
                    if param.grad is not None:
                        param.grad.mul_(self._weight)
        try:
            self.runtime.reduce_gradients()
        except (WorkerFailure, StateRefused) as exc:
            self._failure = exc

    def begin_step(self, step: Step, weight: float) -> None:
        """The loader yields ``step``'s batch, whose loss counts ``weight`` of the step's."""
        self._step, self._weight, self._reduced, self._ended = step, weight, False, False

    def _end_step(self) -> None:
        """Count the step in flight (after the script's optimizer step): advance the sampler, zero the gradients."""
        step = self._step
        if step is None or self._ended or self._failure is not None:
            return
        if not self._reduced:
            raise RuntimeConfigError(
                f"step {step.index} ended without a backward through the wrapped model: every worker runs forward "
                "and backward once per batch (the gradients are summed over the workers when backward ends)"
            )
        state = self._member_state()
        self.runtime.end_step(state)
        state.after_step()
        self._ended = True

    def close_step(self) -> None:
        """The script left the loader's iteration after a step: count that step (its optimizer step was taken)."""
        if self._step is not None and self._reduced:
            self._end_step()
        self._step = None

    def boundary(self) -> None:
        """Between two steps: count the last one, hand a failure over, commit when due.

        Raises:
            _RolledBack: a failure was handed over; the state is the last commit's, in a new generation.
        """
        self._end_step()
        self.signals.adopt()
        failure, self._failure = self._failure, None
        self._step = None
        if failure is not None:
            assert self.bridge is not None
            self._over(self.bridge.hand_over(Turn.FAILED, failure))
            raise _RolledBack(str(failure))
        state = self._member_state()
        if self.commit_every and state.step_index % self.commit_every == 0:
            self.commit()

    def switch(self) -> None:
        """The members agreed to switch here: leave (exits the process) or go on in the next generation."""
        assert self.bridge is not None
        self.signals.leaving()
        self._over(self.bridge.hand_over(Turn.SWITCH))

    def _at_exit(self) -> None:
        bridge = self.bridge
        if bridge is None or bridge.over:
            return
        try:
            if self._trained:
                bridge.hand_over(Turn.DONE)
            else:
                error = RuntimeConfigError("the script exited before its loop over job.remaining_epochs() ended")
                bridge.hand_over(Turn.ERROR, error)
        except BaseException as exc:  # at interpreter exit: say it, do not raise
            log.debug("%s at exit: %s", self.runtime.prefix, exc)
        bridge.join(timeout_s=30)


class PortLoader:
    """The loader of a ported loop: this worker's batch of each step of the current epoch (made by
    ``ElasticLoop.data_loader``).

    Iterate it once per epoch. Between two steps it counts the last one and, when the members agreed, switches to the
    next generation (or leaves); the next batch is then planned at the new size. :attr:`step` is the step whose
    batch was yielded last: ``step.indices`` (its samples here), ``step.index`` (the global step), ``step.epoch``.
    """

    def __init__(
        self, loop: ElasticLoop, dataset: Dataset[Any], sampler: ElasticSampler, loader_kwargs: dict[str, Any]
    ) -> None:
        self._loop = loop
        self._dataset = dataset
        self._collate = loader_kwargs.get("collate_fn") or default_collate
        self.sampler = sampler
        self.step: Step | None = None
        self._inner = ElasticDataLoader(dataset, sampler, overlap=False, **loader_kwargs)

    def __len__(self) -> int:
        """Steps in one epoch (what ``len(DataLoader)`` is for a script's schedule)."""
        return self.sampler.steps_per_epoch

    def __iter__(self) -> Iterator[Any]:
        loop = self._loop
        loop._admit(0, 0)  # a loop over the loader alone joins here
        epoch = self.sampler.progress.epoch
        while self.sampler.progress.epoch == epoch:
            try:
                for step in self._inner:
                    try:
                        yield self._begin(step)
                    except GeneratorExit:  # the script left the loop early (``break``): its last step counts
                        loop.close_step()
                        raise
                    loop.boundary()
            except MembershipChanged:
                loop.switch()
            except _RolledBack:
                continue
            else:
                return

    def _begin(self, step: Step) -> Any:
        self.step = step
        micro = step.assignment.micro_indices
        if not micro:
            # A short last step with fewer samples than workers: this worker computes on one of the step's samples
            # with weight 0, so that it joins the step's reduce like the others.
            first = self.sampler.permutation(step.epoch)[step.assignment.cursor]
            self._loop.begin_step(step, 0.0)
            return self._collate([self._dataset[first]])
        ((batch, weight),) = list(step)
        self._loop.begin_step(step, weight)
        return batch
