"""The runtime inside one training process: generations, gradient reduction, state sync, leave and failure.

``init()`` connects the process to its job's coordinator (through the environment contract of
:mod:`slurm_amoeba.core.runtime_env`), starts a heartbeat thread and turns SIGTERM into a graceful leave. The user
then builds the model, optimizer and data loader — this is the background warm-up, while the current members keep
training — and calls :func:`run`, which reports *ready*, waits for admission and runs the training function in each
generation it is a member of (DESIGN.md, layer ``runtime/``):

* **Step:** :meth:`WorkerRuntime.apply_step` all-reduces every gradient in one flat buffer whose last element is
  the *control word*: each rank adds 1 when it knows of a pending change (its poll thread saw the coordinator ask
  for one, or it got SIGTERM). All ranks read the same sum, so all agree to switch after the same step; each
  worker keeps where it stands in one :class:`Switch` (running, wanted, agreed in the step, agreed).
* **Switch:** at the next step boundary every member reports to the coordinator, leavers exit, the rest receive
  the next generation's plan, meet and build a new process group (:mod:`slurm_amoeba.runtime.group`), and the
  plan's source sends the state to the joiners (:mod:`slurm_amoeba.runtime.transfer`).
* **Failure:** a failed collective (gloo raises at once when a peer's connection resets; a hung peer hits the
  collective timeout) or a generation that cannot form (the coordinator aborts it when a member dies) becomes
  :class:`~slurm_amoeba.runtime.errors.WorkerFailure`: survivors report, restore their last commit, and go on in
  the next generation.

:func:`run` binds the training state (and through it the sampler the loader reads) to this runtime before it calls
``train(state)``: nothing else reaches the process's runtime through a global. :func:`get_runtime` stays as a
convenience for user code (``amoeba.get_runtime().rank`` inside ``train``); the runtime's own modules never call it.
The coordinator side (:mod:`slurm_amoeba.runtime.coordinator`) shares only the protocol with this module.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import datetime
import enum
import gc
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore

from slurm_amoeba.core.runtime_env import WorkerEnv
from slurm_amoeba.runtime.auth import COORDINATOR, AuthError, JobAuth, JobKey, join_job
from slurm_amoeba.runtime.caught import error_fields
from slurm_amoeba.runtime.checkpoint import Checkpointer, CheckpointJob, CheckpointPolicy, open_checkpoints
from slurm_amoeba.runtime.errors import (
    BatchPlanError,
    JobLostError,
    MembershipChanged,
    RuntimeConfigError,
    RuntimeTimeout,
    StateError,
    WorkerFailure,
)
from slurm_amoeba.runtime.gradients import GradientBuckets
from slurm_amoeba.runtime.group import (
    FormationFailed,
    GroupSettings,
    await_keys,
    clear_torchrun_env,
    drain_released_groups,
    export_torchrun_env,
    form_group,
    teardown_group,
)
from slurm_amoeba.runtime.protocol import (
    EVENTS_KEY,
    PROGRESS_KEY,
    AssignAction,
    Assignment,
    EventKind,
    GenerationPlan,
    WorkerEvent,
    assignment_key,
    heartbeat_key,
)
from slurm_amoeba.runtime.result import GenerationTiming, RunResult, RunStatus, generation_table
from slurm_amoeba.runtime.state import TorchState, clone_tree, encode_tree
from slurm_amoeba.runtime.topology import Generation, GradientReducer
from slurm_amoeba.runtime.transfer import PendingSend, StateRefused, sync_state

log = logging.getLogger(__name__)

T = TypeVar("T")

# The process's runtime, for get_runtime() only (user code); the runtime's own modules are handed what they need.
_runtime: WorkerRuntime | None = None


def init(environ: Mapping[str, str] | None = None) -> WorkerRuntime:
    """Connect this process to its elastic job (call once, first thing in the training script).

    Args:
        environ: the environment to read the contract from; ``os.environ`` by default.

    Returns:
        The process's runtime (also available later through :func:`get_runtime`).

    Raises:
        SpecError: the environment contract is missing or malformed.
        RuntimeConfigError: ``init`` was already called, or the store belongs to another job.
        RuntimeTimeout: the coordinator's store cannot be reached.
    """
    global _runtime
    if _runtime is not None:
        raise RuntimeConfigError("slurm_amoeba.runtime.init() was already called in this process")
    env = WorkerEnv.from_environ(os.environ if environ is None else environ)
    key = JobKey.from_environ(os.environ if environ is None else environ)
    runtime = WorkerRuntime(join_job(env, key), key)  # the coordinator issues the worker's id (runtime/auth)
    runtime.start()
    _runtime = runtime
    return runtime


def get_runtime() -> WorkerRuntime:
    """The process's runtime (a convenience for user code, e.g. ``get_runtime().rank`` inside ``train``).

    Raises:
        RuntimeConfigError: :func:`init` was not called.
    """
    if _runtime is None:
        raise RuntimeConfigError(
            "the elastic runtime is not initialised in this process; call slurm_amoeba.runtime.init() first"
        )
    return _runtime


def run(
    train: Callable[[TorchState], T], state: TorchState, *, checkpoint: CheckpointPolicy | None = None
) -> RunResult[T]:
    """The elastic entry point: run ``train(state)`` in every generation this worker is a member of.

    ``train`` is called again after each membership change (state as it was at the switch) and after each failure
    (state rolled back to the last commit); it must therefore continue from ``state`` rather than restart, e.g.
    ``while state.epoch < epochs: for step in loader: ...``.

    Args:
        train: the training function.
        state: the worker's state.
        checkpoint: write due commits to disk and resume from the newest complete checkpoint there
            (:mod:`slurm_amoeba.runtime.checkpoint`); default: ``AMOEBA_CHECKPOINT_*``, else no disk checkpoints.

    Returns:
        How it ended for this worker.

    Raises:
        StateError: the state cannot be sent, or does not fit the running workers' state (this worker leaves; the
            others are untouched).
        JobLostError: the coordinator declared the job lost.
        RuntimeTimeout: a deadline passed (coordinator unreachable, admission never came).
    """
    return get_runtime().run(train, state, checkpoint=checkpoint)


class SwitchStage(str, enum.Enum):
    """Where the current generation stands on ending at a step boundary, as one worker sees it (:class:`Switch`).

    Transitions: ``running -> wanted`` (the heartbeat thread saw the coordinator want a change in this generation);
    ``running | wanted -> agreed_in_step`` (a step's gradient reduce summed a non-zero control word: some member wants
    the switch); ``agreed_in_step -> agreed`` (that step ended: the next step boundary raises
    :class:`~slurm_amoeba.runtime.errors.MembershipChanged`); any stage -> ``running`` when the worker enters a new
    generation. An agreement is not taken back within a generation (the member that asked goes on asking).
    """

    RUNNING = "running"
    WANTED = "wanted"
    AGREED_IN_STEP = "agreed_in_step"
    AGREED = "agreed"


class Switch:
    """One worker's stage on the current generation's switch (:class:`SwitchStage`); thread-safe, since the heartbeat
    thread reports the coordinator's wish while the training thread reduces and ends steps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = 0
        self._stage = SwitchStage.RUNNING

    @property
    def stage(self) -> SwitchStage:
        """The current stage."""
        return self._stage

    def begin(self, generation: int) -> None:
        """Enter ``generation``: nothing wanted or agreed yet."""
        with self._lock:
            self._generation, self._stage = generation, SwitchStage.RUNNING

    def knows_want(self, generation: int) -> bool:
        """Whether a change of ``generation`` is already known here (wanted or agreed): no need to look again."""
        return self._generation == generation and self._stage is not SwitchStage.RUNNING

    def see_want(self, generation: int) -> None:
        """The coordinator wants ``generation`` to end (read by the heartbeat thread); ignored once the worker has
        entered another generation, or once the switch is agreed."""
        with self._lock:
            if self._generation == generation and self._stage is SwitchStage.RUNNING:
                self._stage = SwitchStage.WANTED

    def asks(self) -> bool:
        """Whether this worker's control word asks for the switch (it saw the wish, or agreed to it)."""
        return self._stage is not SwitchStage.RUNNING

    def reduced(self, agreed: bool) -> None:
        """A step's reduce summed the members' control words: ``agreed`` when some member asks for the switch."""
        with self._lock:
            if agreed and self._stage in (SwitchStage.RUNNING, SwitchStage.WANTED):
                self._stage = SwitchStage.AGREED_IN_STEP

    def end_step(self) -> None:
        """The step ended: an agreement made in it holds from the next step boundary on."""
        with self._lock:
            if self._stage is SwitchStage.AGREED_IN_STEP:
                self._stage = SwitchStage.AGREED

    def agreed(self) -> bool:
        """Whether the members agreed to end the generation at this step boundary."""
        return self._stage is SwitchStage.AGREED


class WorkerRuntime:
    """The elastic runtime of one worker process (see the module docstring); create it with :func:`init`.

    Args:
        env: the worker's environment contract.
    """

    def __init__(self, env: WorkerEnv, key: JobKey) -> None:
        self.env = env
        self.worker_id = env.worker_id
        self._auth = JobAuth(key, env.worker_id)  # seals what it writes, opens what it reads (runtime/auth)
        self._sealer, self._opener = self._auth.sealer, self._auth.opener
        self.prefix = f"[{env.job_id}/{env.worker_id}]"
        self.device = pick_device(env, self.prefix)
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.plan: GenerationPlan | None = None
        self.generation = 0
        self.current: Generation | None = None
        self._store: TCPStore | None = None
        self._seq = 0
        self._leave = threading.Event()
        self._switch = Switch()  # where the current generation stands on ending at a step boundary
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._grad: GradientReducer | None = None
        self._step_time_s = 0.0
        self._samples_per_s = 0.0
        self._last_step_end = 0.0
        self._progress: dict[str, Any] = {}
        self._timeline: list[GenerationTiming] = []
        self._checkpoints: Checkpointer | None = None
        self._sending: PendingSend | None = None  # the source's state sends at a switch, until its first reduce
        self._idle: frozenset[int] = frozenset()  # the joiners' ranks, without samples in step _idle_step
        self._idle_step = -1
        self._state: TorchState | None = None  # the state of the current generation (its step picks the reduce)
        # Where each switch's time went, as perf_counter marks (see switch_marks).
        self._marks: dict[str, float] = {}
        self.switch_marks: list[dict[str, float]] = []

    # ----------------------------------------------------------------------------------------------- setup

    @property
    def store(self) -> TCPStore:
        """The main thread's connection to the job's store.

        Raises:
            RuntimeConfigError: the runtime is not started.
        """
        if self._store is None:
            raise RuntimeConfigError(f"{self.prefix} the runtime is not started")
        return self._store

    def start(self) -> None:
        """Connect to the store, register, start the heartbeat thread, catch SIGTERM, initialise CUDA.

        Raises:
            RuntimeTimeout: the store cannot be reached within the collective timeout.
            RuntimeConfigError: the store belongs to another job.
        """
        try:
            self._store = self._connect()
        except (RuntimeError, OSError) as exc:
            raise RuntimeTimeout(
                f"{self.prefix} cannot reach the coordinator's store at {self.env.store_addr}:"
                f"{self.env.store_port} within {self.env.collective_timeout_s} s: {exc}"
            ) from None
        self._beat(self.store, time.time())
        self._push(EventKind.REGISTERED, pid=os.getpid(), host=socket.gethostname())
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.device.type == "cuda":
            _warm_up_cuda(self.device)
        self._thread = threading.Thread(target=self._background, name="amoeba-heartbeat", daemon=True)
        self._thread.start()
        log.info("%s registered (pid %s, device %s)", self.prefix, os.getpid(), self.device)

    def coordinator_value(self, key: str) -> str | None:
        """The text the coordinator sealed at ``key`` in the job's store (``None``: none, or not the coordinator's)."""
        return self._auth.read(self.store, key, sender=COORDINATOR)

    def _connect(self) -> TCPStore:
        timeout = datetime.timedelta(seconds=self.env.collective_timeout_s)
        return TCPStore(self.env.store_addr, self.env.store_port, is_master=False, timeout=timeout, use_libuv=True)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._leave.set()

    def request_leave(self) -> None:
        """Leave gracefully at the next step boundary (what SIGTERM does)."""
        self._leave.set()

    def _push(self, kind: EventKind, **fields: Any) -> None:
        event = WorkerEvent(kind=kind, worker=self.worker_id, time=time.time(), **fields)
        self.store.queue_push(EVENTS_KEY, self._sealer.seal(EVENTS_KEY, event.to_json()))

    def _beat(self, store: TCPStore, now: float) -> None:
        key = heartbeat_key(self.worker_id)
        store.set(key, self._sealer.seal(key, repr(now)))

    def _background(self) -> None:
        """Heartbeats, progress reports (rank 0) and the cheap look for a pending change, off the training thread."""
        store = self._connect()
        next_beat = 0.0
        warned = False
        while not self._stop.wait(self.env.poll_s):
            try:
                now = time.time()
                if now >= next_beat:
                    self._beat(store, now)
                    next_beat = now + self.env.heartbeat_s
                    if self.rank == 0 and self.generation and self._step_time_s > 0:
                        report = json.dumps(self._progress_report(now))
                        store.set(PROGRESS_KEY, self._sealer.seal(PROGRESS_KEY, report))
                generation = self.generation
                if generation and not self._switch.knows_want(generation) and self._auth.want(store) == generation:
                    self._switch.see_want(generation)
                warned = False
            except (RuntimeError, ValueError) as exc:
                if not warned:
                    log.warning("%s store unreachable from the heartbeat thread: %s", self.prefix, exc)
                    warned = True

    def _progress_report(self, now: float) -> dict[str, Any]:
        return {
            "worker": self.worker_id,
            "generation": self.generation,
            "world_size": self.world_size,
            "step_time_s": self._step_time_s,
            "samples_per_s": self._samples_per_s,
            "time": now,
            **self._progress,
        }

    # ----------------------------------------------------------------------------------------------- topology

    @property
    def rank(self) -> int:
        """This worker's rank in the current generation (-1 outside one, e.g. after it left)."""
        current = self.current
        return -1 if current is None else current.rank

    @property
    def world_size(self) -> int:
        """Members of the current generation (0 outside one)."""
        current = self.current
        return 0 if current is None else current.world_size

    def idle_ranks(self, step: int) -> frozenset[int]:
        """Ranks without samples in step ``step``: the joiners in the first step of the generation they joined, which
        they spend receiving the state (see :func:`~slurm_amoeba.runtime.topology.idle_ranks`)."""
        return self._idle if step == self._idle_step else frozenset()

    def check_boundary(self) -> None:
        """At a step boundary: raise :class:`MembershipChanged` when the members agreed to switch.

        Raises:
            MembershipChanged: the members agreed to end this generation here.
        """
        if self._switch.agreed():
            raise MembershipChanged(f"generation {self.generation} ends at step boundary")

    # ----------------------------------------------------------------------------------------------- collectives

    def _failure(self, what: str, exc: BaseException) -> WorkerFailure:
        log.warning("%s %s failed in generation %s: %s", self.prefix, what, self.generation, exc)
        # Closing our connections at once makes peers still blocked in the collective fail too, instead of
        # waiting for their timeout (gloo only notices a peer's death on the connections to that peer). Pending
        # works keep the group alive, so they are dropped first.
        if self._grad is not None:
            self._grad.abandon()
        teardown_group()
        return WorkerFailure(f"{what} failed in generation {self.generation}: {exc}", generation=self.generation)

    def _control_word(self) -> float:
        return 1.0 if self._switch.asks() or self._leave.is_set() else 0.0

    def before_last_micro_batch(self) -> None:
        """Called by the loader before a step's last micro-batch: reduce gradient buckets as backward fills them."""
        self._mark("batch")
        if self._grad is not None and self.generation and self._idle_reducer() is None:
            self._grad.arm(self._control_word())

    def _mark(self, name: str) -> None:
        """Note when the first step after a switch reached ``name`` (see switch_marks); nothing otherwise."""
        if self._marks and "first_step" not in self._marks:
            self._marks.setdefault(name, time.perf_counter())

    def apply_step(self, state: TorchState) -> None:
        """Reduce gradients (+ control word), step the optimizer, zero gradients, advance the sampler.

        Raises:
            RuntimeConfigError: called outside a generation.
            WorkerFailure: the all-reduce failed.
        """
        self.reduce_gradients()
        state.settle()  # a commit still being copied (the switch's) must not see this step's update
        self._mark("settled")
        state.optimizer.step()
        self.end_step(state)

    def reduce_gradients(self) -> None:
        """All-reduce the gradients and the control word (the first half of :meth:`apply_step`).

        Raises:
            RuntimeConfigError: called outside a generation.
            WorkerFailure: the all-reduce failed.
        """
        grad = self._grad
        if grad is None or self.generation == 0:
            raise RuntimeConfigError(f"{self.prefix} state.step() was called outside slurm_amoeba.runtime.run()")
        buckets = self._idle_reducer()
        if buckets is not None:
            self._reduce_without_idle(buckets)
            return
        self._finish_send()
        self._mark("sent")
        try:
            self._switch.reduced(grad.finish(self._control_word()) > 0)
        except RuntimeError as exc:
            raise self._failure("gradient all-reduce", exc) from None
        self._mark("reduced")

    def _idle_reducer(self) -> GradientBuckets | None:
        """The flat buckets, when this step's reduce leaves the idle joiners out (``reduce_without``), else None.

        In the first step of a generation whose joiners take no samples, the members sum their gradients point to
        point and send the sum to the joiners, without waiting for them in a collective (the same decision on every
        member: the step, the idle set, the backend and the reducer's kind are the same everywhere). Not with the
        adaptive batch's norm probe, whose slots need every rank's part; and on gloo only: with NCCL the state
        arrives over the GPUs' links in well under a step, and each new pair of ranks in point-to-point messages
        would cost NCCL a communicator of its own in every generation.
        """
        grad, state = self._grad, self._state
        if state is None or state.step_index != self._idle_step or not self._members_sum_idle_step(state):
            return None
        return grad if isinstance(grad, GradientBuckets) else None

    def _members_sum_idle_step(self, state: TorchState) -> bool:
        """Whether this generation's members sum the joiners' idle first step among themselves (see
        :meth:`_idle_reducer`): joiners idle, gloo, and no adaptive batch (its norm probe rides the reduce)."""
        return bool(self._idle) and self.backend == "gloo" and state.adaptive is None

    def _reduce_without_idle(self, buckets: GradientBuckets) -> None:
        plan, current = self.plan, self.current
        if plan is None or current is None:  # pragma: no cover - only called inside a generation
            raise RuntimeConfigError(f"{self.prefix} a gradient reduce outside a generation")
        idle = sorted(self._idle)
        members = [rank for rank in range(plan.world_size) if rank not in self._idle]
        self._mark("sent")
        try:
            word, sends = buckets.reduce_without(
                current.rank, plan.rank_of(plan.source), members, idle, self._control_word()
            )
        except RuntimeError as exc:
            raise self._failure("gradient reduce", exc) from None
        self._switch.reduced(word > 0)
        # The state's sends read the parameters and the optimizer's state as they are: done before the optimizer
        # steps (the joiners have received it by now, as a rule). The summed gradient went to them as a copy: it is
        # waited for before the next collective, which they are in.
        self._finish_send()
        if sends:
            self._sending = PendingSend(sends)
        self._mark("reduced")

    def end_step(self, state: TorchState) -> None:
        """Zero the gradients, advance the sampler, time the step (the second half of :meth:`apply_step`)."""
        if self._grad is not None:
            self._grad.zero()
        consumed = state.sampler.advance()
        now = time.perf_counter()
        if self._last_step_end:
            elapsed = now - self._last_step_end
            rate = consumed / elapsed if elapsed > 0 else 0.0
            first = not self._step_time_s
            self._step_time_s = elapsed if first else 0.8 * self._step_time_s + 0.2 * elapsed
            self._samples_per_s = rate if first else 0.8 * self._samples_per_s + 0.2 * rate
        self._last_step_end = now
        if self._marks and "first_step" not in self._marks:
            self._marks["first_step"] = now
            self.switch_marks.append(self._marks)
        self._progress = state.progress_report()
        self._switch.end_step()

    def agree_on_commit(self, step: int, snapshot: Mapping[str, Any] | None = None) -> None:
        """Check that every member commits at the same step; write ``snapshot`` to disk when a checkpoint is due.

        Raises:
            RuntimeConfigError: members commit at different steps.
            WorkerFailure: the check failed because a peer died.
        """
        if self.generation == 0:
            return
        self._finish_send()
        due = float(self._checkpoints is not None and self._checkpoints.due(step))
        probe = torch.tensor([float(step), -float(step), due], dtype=torch.float64, device=self.device)
        try:
            dist.all_reduce(probe, op=dist.ReduceOp.MAX)
        except RuntimeError as exc:
            raise self._failure("commit check", exc) from None
        high, low = int(probe[0].item()), int(-probe[1].item())
        if high != step or low != step:
            raise RuntimeConfigError(
                f"{self.prefix} commit() at step {step} while other members are at steps {low}..{high}: "
                "commit() is a collective; call it at the same step on every worker"
            )
        if probe[2].item() > 0 and self._checkpoints is not None and snapshot is not None:
            self._checkpoints.submit(CheckpointJob(snapshot, step, self.generation, self.rank, self.world_size))

    def _finish_send(self) -> None:
        """Wait for this member's state broadcast of the switch, if it is still in flight, and read the joiners'
        verdict on the state if it is still to be read (see runtime/transfer.py, ``late_verdict``).

        Raises:
            WorkerFailure: the broadcast or the verdict's all-reduce failed (a receiver died).
            StateRefused: a joiner refused the state; this worker is back at the generation's start.
        """
        sending, self._sending = self._sending, None
        if sending is None:
            return
        try:
            refused = sending.refused()
        except RuntimeError as exc:
            raise self._failure("state check", exc) from None
        if refused:
            # A joiner refused the manifest (transfer.sync_state, late verdict) and drained the sends: this step's
            # forward and backward changed no state but the RNG; go back to the generation's start exactly, and
            # drop the generation.
            with contextlib.suppress(RuntimeError):
                sending.wait()
            if self._grad is not None:
                self._grad.abandon()
            if self._state is not None:
                self._state.restore()
            raise StateRefused(
                f"a joiner of generation {self.generation} refused the state; back at the generation's start"
            )
        try:
            sending.wait()
        except RuntimeError as exc:
            raise self._failure("state broadcast", exc) from None

    # ----------------------------------------------------------------------------------------------- lifecycle

    def _wait_assignment(self, timeout_s: float, *, member: bool) -> Assignment:
        key = assignment_key(self.worker_id, self._seq)
        deadline = time.monotonic() + timeout_s
        store = self.store
        # Both block in the store until the key exists, so that the assignment is seen the moment the coordinator
        # writes it (a joiner that polled every few ms delayed the members' next generation by as much). A joiner
        # may wait long: it wakes every quarter second to see whether SIGTERM asked it to leave.
        while (assignment := self._read_assignment(store, key)) is None:
            if not member and self._leave.is_set():
                self._push(EventKind.LEFT, message="SIGTERM while waiting for admission")
                return Assignment(AssignAction.LEAVE, reason="SIGTERM while waiting for admission")
            if time.monotonic() > deadline:
                raise RuntimeTimeout(
                    f"{self.prefix} waited {timeout_s:.0f} s for the coordinator's assignment {self._seq} "
                    f"(key {key}); is the coordinator alive at {self.env.store_addr}:{self.env.store_port}?"
                )
            await_keys(store, [key], deadline if member else min(deadline, time.monotonic() + 0.25))
        self._seq += 1
        if member and self._marks:
            self._marks["assigned"] = time.perf_counter()
        elif not member and assignment.action is AssignAction.JOIN:
            self._marks = {"assigned": time.perf_counter()}  # a joiner's switch: its marks from its admission on
        return assignment

    def _read_assignment(self, store: TCPStore, key: str) -> Assignment | None:
        """The coordinator's assignment at ``key``; None while there is none, or only one not sealed by it (anyone
        can write to the store; the coordinator's own write replaces it)."""
        if not store.check([key]):
            return None
        try:
            return Assignment.from_json(self._opener.open(key, store.get(key), sender=COORDINATOR))
        except AuthError as exc:
            log.warning("%s ignored a forged assignment at %s: %s", self.prefix, key, exc)
            return None

    def _settings(self) -> GroupSettings:
        return GroupSettings(
            worker_id=self.worker_id,
            device=self.device,
            backend=self.backend,
            timeout_s=self.env.collective_timeout_s,
            auth=self._auth,
        )

    def _enter(self, plan: GenerationPlan, state: TorchState) -> GenerationTiming:
        """Become a member of ``plan``'s generation: meet, new process group, rollback, state sync, auto-commit.

        Raises:
            FormationFailed: the group did not form (a member missing, or the coordinator aborted).
            WorkerFailure: the state transfer failed.
            StateError: this worker's state does not fit the running workers' (it must leave).
            StateRefused: another member refused the state.
        """
        self._switch.begin(plan.generation)  # before the generation number the heartbeat thread reads
        self.plan = plan
        self.generation = plan.generation
        self.current = None
        self._state = state
        state.sampler.planner.check_world_size(plan.world_size)
        started = time.perf_counter()
        self.current = form_group(self.store, plan, self._settings(), self._marks)
        export_torchrun_env(self.current, self.env.store_addr, self.env.store_port)
        formed = time.perf_counter()
        if plan.rollback and self.worker_id not in plan.joiners:
            state.restore()
        # From the plan alone (the same on every member): which ranks idle, and in which step.
        self._idle = _idle_joiners(plan, state)
        self._idle_step = -1 if plan.start_step is None else plan.start_step
        if plan.sync:
            # While the members sum the joiners' idle first step among themselves, nobody waits for the verdict on
            # the manifest before the sends: the members read it before their first optimizer step.
            late = self._members_sum_idle_step(state)
            try:
                self._sending = sync_state(self.store, plan, self._settings(), state, self._marks, late_verdict=late)
            except StateError as exc:
                raise StateError(f"{self.prefix} cannot join job {self.env.job_id!r}: {exc}") from None
        if plan.start_step is not None and state.step_index != plan.start_step:
            log.warning(
                "%s generation %s starts at step %s but this worker's state is at step %s",
                self.prefix,
                plan.generation,
                plan.start_step,
                state.step_index,
            )
        if self._idle:
            log.info(
                "%s ranks %s take no samples in step %s (joiners)", self.prefix, sorted(self._idle), self._idle_step
            )
        self._marks.update(generation=float(plan.generation), world_size=float(plan.world_size))
        self._marks["synced"] = time.perf_counter()
        if not (plan.sync and self.worker_id in plan.joiners and state.received_is_commit):
            state.save(background=True)  # a joiner's received state is its commit already
        self._marks["saved"] = time.perf_counter()
        self._grad = state.gradient_reducer(self._grad)
        self._last_step_end = 0.0
        timing = GenerationTiming(
            generation=plan.generation,
            rank=self.current.rank,
            world_size=plan.world_size,
            start_step=state.step_index,
            group_s=formed - started,
            state_s=time.perf_counter() - formed,
            reason=plan.reason,
        )
        log.info("%s generation %s", self.prefix, timing)
        state.run_reset_callbacks()
        return timing

    def _report(self, state: TorchState, *, failed: bool, missing: tuple[str, ...] = ()) -> None:
        self._sending = None  # a send still in flight here failed with the generation: nothing waits for it
        self._marks = {"last_step": self._last_step_end, "report": time.perf_counter()}
        self._push(
            EventKind.REPORT,
            generation=self.generation,
            step=state.step_index,
            committed_step=state.committed_step,
            leaving=self._leave.is_set(),
            failed=failed,
            missing=missing,
        )

    def _member(self, plan: GenerationPlan, train: Callable[[TorchState], T], state: TorchState) -> RunResult[T] | None:
        """Run one generation: ``train(state)`` until it returns (a result) or the generation ends (``None``)."""
        try:
            self._timeline.append(self._enter(plan, state))
            value = train(state)
        except MembershipChanged:
            self._complete_sends()  # a joiner still receiving the summed gradient of its first step needs it
            self._report(state, failed=False)
        except StateRefused as exc:
            log.info("%s %s", self.prefix, exc)
            self._report(state, failed=False)
        except FormationFailed as exc:
            log.warning("%s %s", self.prefix, exc)
            self._report(state, failed=True, missing=exc.missing)
        except WorkerFailure:
            self._report(state, failed=True)
        else:
            self._complete_sends()  # train() may return before any step of a generation a joiner still receives
            self._push(EventKind.DONE)
            return self._result(RunStatus.FINISHED, value)
        return None

    def _complete_sends(self) -> None:
        """Wait for sends still in flight at the end of a generation that ends well (a failed one is reported)."""
        try:
            self._finish_send()
        except (WorkerFailure, StateRefused) as exc:
            log.warning("%s %s", self.prefix, exc)

    def _result(self, status: RunStatus, value: T | None = None) -> RunResult[T]:
        finished = status is RunStatus.FINISHED and self.current is not None
        if not finished:  # a leaver holds no rank any more: neither here nor in RANK/WORLD_SIZE
            self.current = None
            self.generation = 0
            clear_torchrun_env()
        return RunResult(
            status,
            value=value,
            generations=tuple(t.generation for t in self._timeline),
            rank=self.current.rank if self.current is not None else None,
            world_size=self.current.world_size if self.current is not None else 0,
            timeline=tuple(self._timeline),
        )

    def _follow(self, assignment: Assignment, train: Callable[[TorchState], T], state: TorchState) -> RunResult[T]:
        """Act on assignments until the run ends for this worker."""
        after_report_s = 2 * self.env.collective_timeout_s + 30
        while True:
            if assignment.action is AssignAction.STANDBY:
                log.info("%s on standby: %s", self.prefix, assignment.reason)
                teardown_group()
                self.generation, self.current = 0, None
                assignment = self._wait_assignment(self.env.join_timeout_s, member=False)
                continue
            if assignment.action is AssignAction.LEAVE:
                log.info("%s leaving: %s", self.prefix, assignment.reason)
                self._final_checkpoint(assignment, state)
                return self._result(RunStatus.LEFT)
            if assignment.action is AssignAction.FINISH:
                if "lost" in assignment.reason:
                    raise JobLostError(f"{self.prefix} {assignment.reason}")
                return self._result(RunStatus.ENDED)
            if assignment.plan is None:
                raise RuntimeConfigError(f"{self.prefix} the coordinator sent a join without a plan: {assignment}")
            result = self._member(assignment.plan, train, state)
            if result is not None:
                return result
            if self._leave.is_set():
                # The coordinator answers at once (leave), or keeps this worker one generation more to hand the
                # state to warm joiners when no staying member holds it; a silent coordinator does not keep it.
                try:
                    assignment = self._wait_assignment(self.env.collective_timeout_s, member=True)
                except RuntimeTimeout:
                    assignment = Assignment(AssignAction.LEAVE, reason="no answer from the coordinator")
                if assignment.action is AssignAction.LEAVE:
                    log.info("%s left at step %s", self.prefix, state.step_index)
                    self._final_checkpoint(assignment, state)
                    return self._result(RunStatus.LEFT)
                continue
            assignment = self._wait_assignment(after_report_s, member=True)

    def _final_checkpoint(self, assignment: Assignment, state: TorchState) -> None:
        """Every member leaves at this boundary (the coordinator said so): write this member's shard of the state
        to disk before leaving, so that a restarted job resumes here (``runtime/checkpoint.py``)."""
        current = self.current
        if assignment.checkpoint and self._checkpoints is not None and current is not None:
            job = CheckpointJob(state.capture(), state.step_index, self.generation, current.rank, current.world_size)
            self._checkpoints.write_final(job)

    def run(
        self, train: Callable[[TorchState], T], state: TorchState, *, checkpoint: CheckpointPolicy | None = None
    ) -> RunResult[T]:
        """See :func:`run`."""
        encode_tree(state.as_tree(), "state", [])  # refuse unsendable state before joining anything
        self._checkpoints = open_checkpoints(checkpoint, self.store, state, self.prefix)
        sizes = tuple(state.sampler.planner.allowed_world_sizes(1024))
        state.bind(self)
        self._prewarm(state)
        self._push(EventKind.READY, allowed_sizes=sizes)
        log.info("%s warm and ready", self.prefix)
        status = RunStatus.ENDED
        try:
            assignment = self._wait_assignment(self.env.join_timeout_s, member=False)
            result = self._follow(assignment, train, state)
            status = result.status
            return result
        except BaseException as exc:
            self._push(EventKind.ERROR, step=state.step_index, generation=self.generation, **error_fields(exc))
            raise
        finally:
            if self._checkpoints is not None:
                self._checkpoints.close()
            self.shutdown()
            state.bind(None)
            _announce(generation_table(self.prefix, status, tuple(self._timeline)))

    def _prewarm(self, state: TorchState) -> None:
        """Warm-up for the switch, while the members still train: build the gradient buckets now (kept at the
        switch) and make the process hold memory of the state's sizes (:func:`_retain_freed_memory`), so that
        receiving and committing the state and the first step at the switch take no fresh pages from the kernel."""
        self._grad = state.gradient_reducer(self._grad)
        # Receiving the state, loading it and committing it allocate about three copies of it; a process that
        # just started gets those as fresh pages from the kernel (zeroed on first touch: tens of ms on a loaded
        # machine, which the members waiting in the first collective would see). Allocate and touch them now and
        # keep the memory in the process after they are freed. On the CPU the state counted is the one the joiner
        # will hold: its optimizer has no state yet (momentum, moments), so the warmed optimizer's own stands in for
        # it. (A GPU's caching allocator keeps what it freed anyway: there the model alone, not a multiple of the
        # optimizer's state on top.)
        _retain_freed_memory()
        optimizer_state = _warm_optimizer(state.optimizer, self.prefix)
        if self.device.type != "cpu":
            optimizer_state = []
        copies = [clone_tree([state.as_tree(), optimizer_state]) for _ in range(_WARM_COPIES)]
        del copies, optimizer_state
        # The first matrix product and the first backward of a process initialise the BLAS library and the autograd
        # engine (tens of ms on a loaded machine): do it here, not in the first step that the members wait for.
        # A product large enough to run in parallel starts the intra-op thread pool, which a 16 x 16 one does not.
        probe = torch.ones(256, 256, device=self.device, requires_grad=True)
        torch.autograd.grad((probe @ probe).relu().sum(), probe)
        # A process's first batch through a DataLoader costs ~2 ms more than later ones (first calls on torch's fetch
        # and collate path): pay it here on two synthetic samples, without touching the user's dataset or RNG.
        samples = torch.utils.data.TensorDataset(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long))
        next(iter(torch.utils.data.DataLoader(samples, batch_size=2)))
        if state.warm_up is not None:
            rehearse(state, self.device)
            self._grad.zero()
        # The objects of the warm-up and of the imports it made survive in the younger generations of the garbage
        # collector until a collection of those, which came in a joiner's first steps (~1 ms each, members waiting):
        # collect them now.
        gc.collect()

    def shutdown(self) -> None:
        """Stop the heartbeat thread and leave the process group (the store connection stays for the process)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        teardown_group()
        drain_released_groups()


def _idle_joiners(plan: GenerationPlan, state: TorchState) -> frozenset[int]:
    """The ranks of ``plan``'s joiners when they may spend the generation's first step receiving the state: the
    members then split that step among themselves as before the switch. Not in a job's first generation (no step
    at an old pace to keep), not after a failure (``plan.rollback``: the one chaos run that broke exactly-once with
    idle joiners was such a generation, cause unknown; docs/runtime.md section 6), when the model needs every rank
    in each forward (``state.joiners_may_idle``: FSDP), or when the members alone cannot take the step (their count
    breaks ``even`` or ``max_accumulation``)."""
    if not plan.sync or not plan.joiners or plan.start_step is None or plan.rollback or not state.joiners_may_idle:
        return frozenset()
    idle = frozenset(plan.rank_of(joiner) for joiner in plan.joiners)
    if len(idle) >= plan.world_size:
        return frozenset()
    try:
        state.sampler.planner.check_world_size(plan.world_size - len(idle))
    except BatchPlanError:
        return frozenset()
    return idle


def pick_device(env: WorkerEnv, prefix: str) -> torch.device:
    """The device a worker trains on, from ``AMOEBA_DEVICE``/``AMOEBA_CUDA_DEVICE`` (else ``LOCAL_RANK``).

    Raises:
        RuntimeConfigError: CUDA was asked for but torch sees no GPU.
    """
    wanted = env.device
    if wanted == "cpu" or (wanted == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeConfigError(f"{prefix} AMOEBA_DEVICE=cuda but torch sees no GPU; use AMOEBA_DEVICE=cpu or auto")
    index = env.cuda_device
    if index < 0:
        index = int(os.environ.get("LOCAL_RANK", "0") or 0)
    return torch.device("cuda", index % max(torch.cuda.device_count(), 1))


#: Copies of the state, its optimizer part as it will be, that the warm-up allocates and frees (the received state,
#: the loaded copy of its optimizer part, a step's gradients and temporaries). Sized by the model alone (the
#: optimizer holds no state yet in a joiner) they left the joiner's first backward ~700 fresh pages short here.
_WARM_COPIES = 4
#: glibc's mallopt parameters: free memory above this much at the heap's top goes back to the kernel, and
#: allocations from this size up are mapped (and unmapped when freed) on their own.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_RETAIN_BYTES, _MMAP_FROM_BYTES = 1 << 30, 32 << 20


def rehearse(state: TorchState, device: torch.device) -> None:
    """Run the state's ``warm_up`` (a forward and backward of the user's model), then put back what it may have
    changed: the model's parameters and buffers (e.g. batch-norm statistics), the RNG streams, and no gradient is
    left behind (the caller zeroes the flat gradient buckets; other gradients are dropped here)."""
    assert state.warm_up is not None
    saved = {name: tensor.detach().clone() for name, tensor in state.model.state_dict().items()}
    cpu_rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        state.warm_up(state.model)
    finally:
        with torch.no_grad():
            for name, tensor in state.model.state_dict().items():
                tensor.copy_(saved[name])
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)


def _warm_optimizer(optimizer: torch.optim.Optimizer, prefix: str) -> list[Any]:
    """Run one step of a copy of ``optimizer`` (its own copies of the parameters, zero gradients), so that the first
    real step at the switch does not pay the optimizer's first-call costs (tens of ms on a loaded machine). The
    real parameters and optimizer state are not touched; an optimizer that cannot be copied or stepped so (one that
    needs a closure, a wrapped ``step``) is left cold.

    Returns:
        The copy's per-parameter state after its step (tensors of the sizes the real optimizer's state will have:
        the warm-up's memory is sized by it), or an empty list when the optimizer was left cold.
    """
    try:
        twin = copy.deepcopy(optimizer)
        for group in twin.param_groups:
            for param in group["params"]:
                param.grad = torch.zeros_like(param)
        type(twin).step(twin)  # the class's step: an instance's wrapper (an LR scheduler's) may call the original
    except Exception as exc:  # a warm-up only: whatever fails here, the real step will say too
        log.debug("%s optimizer warm-up skipped: %s", prefix, exc)
        return []
    return list(twin.state.values())


def _retain_freed_memory() -> None:
    """Make glibc keep freed memory for reuse: tensors up to 32 MiB come from the heap (not each from a mapping of
    its own that is unmapped when freed), and up to 1 GiB of free heap stays in the process. Without it, memory
    allocated during the warm-up goes back to the kernel and the switch pays page faults again. Other C libraries
    are left alone."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mallopt(_M_MMAP_THRESHOLD, _MMAP_FROM_BYTES)
    mallopt(_M_TRIM_THRESHOLD, _RETAIN_BYTES)


def _warm_up_cuda(device: torch.device) -> None:
    # A failed NCCL collective must raise in this process (to be survived), not tear the process down
    # (torch's default, 3): abort the communicator only, and make wait() raise on errors and timeouts.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
    # Warm-up: create the CUDA context now, while the current members keep training.
    torch.cuda.set_device(device)
    torch.cuda.init()  # type: ignore[no-untyped-call]
    torch.zeros(1, device=device).add_(1)
    torch.cuda.synchronize(device)


def _announce(text: str) -> None:
    """Log ``text`` at INFO where logging shows it, else write it to stderr: the end-of-run table is always seen."""
    if log.isEnabledFor(logging.INFO) and log.hasHandlers():
        log.info("%s", text)
    else:
        print(text, file=sys.stderr, flush=True)
