"""The runtime inside one training process: generations, gradient reduction, state sync, leave and failure.

``init()`` connects the process to its job's coordinator (through the environment contract of
:mod:`slurm_amoeba.core.runtime_env`), starts a heartbeat thread and turns SIGTERM into a graceful leave. The user
then builds the model, optimizer and data loader — this is the background warm-up, while the current members keep
training — and calls :func:`run`, which reports *ready*, waits for admission and runs the training function in each
generation it is a member of (DESIGN.md, layer ``runtime/``):

* **Step:** :meth:`WorkerRuntime.apply_step` all-reduces every gradient in one flat buffer whose last element is
  the *control word*: each rank adds 1 when it knows of a pending change (its poll thread saw the coordinator ask
  for one, or it got SIGTERM). All ranks read the same sum, so all agree to switch after the same step.
* **Switch:** at the next step boundary every member reports to the coordinator, leavers exit, the rest receive
  the next generation's plan, build a new process group on ``PrefixStore("amoeba/gen<N>/pg", store)`` (gloo on CPU,
  NCCL on GPU), and the plan's source broadcasts the state to the joiners.
* **Failure:** a failed collective (gloo raises at once when a peer's connection resets; a hung peer hits the
  collective timeout) becomes :class:`~slurm_amoeba.runtime.errors.WorkerFailure`: survivors report, restore their
  last commit, and go on in the next generation.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, Generic, TypeVar

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

from slurm_amoeba.core.runtime_env import TORCHRUN_VARIABLES, WorkerEnv
from slurm_amoeba.runtime.errors import (
    JobLostError,
    MembershipChanged,
    RuntimeConfigError,
    RuntimeTimeout,
    StateError,
    WorkerFailure,
)
from slurm_amoeba.runtime.gradients import GradientBuckets
from slurm_amoeba.runtime.protocol import (
    EVENTS_KEY,
    JOB_KEY,
    PROGRESS_KEY,
    WANT_KEY,
    AssignAction,
    Assignment,
    EventKind,
    GenerationPlan,
    WorkerEvent,
    assignment_key,
    group_prefix,
    heartbeat_key,
    manifest_key,
)
from slurm_amoeba.runtime.state import TorchState, decode_tree, encode_tree

log = logging.getLogger(__name__)

T = TypeVar("T")

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
    runtime = WorkerRuntime(env)
    runtime.start()
    _runtime = runtime
    return runtime


def get_runtime() -> WorkerRuntime:
    """The process's runtime.

    Raises:
        RuntimeConfigError: :func:`init` was not called.
    """
    if _runtime is None:
        raise RuntimeConfigError(
            "the elastic runtime is not initialised in this process; call slurm_amoeba.runtime.init() first"
        )
    return _runtime


class RunStatus(str, enum.Enum):
    """How :func:`run` ended for this worker."""

    FINISHED = "finished"  # the training function returned in this worker
    LEFT = "left"  # the worker left gracefully (SIGTERM or a leave request) while the job goes on
    ENDED = "ended"  # the job ended (finished elsewhere or lost) while this worker waited for admission


@dataclasses.dataclass(frozen=True)
class RunResult(Generic[T]):
    """The outcome of :func:`run` in this worker.

    Attributes:
        status: how it ended.
        value: the training function's return value (``FINISHED`` only).
        generations: the generations this worker was a member of.
    """

    status: RunStatus
    value: T | None = None
    generations: tuple[int, ...] = ()


def run(train: Callable[[TorchState], T], state: TorchState) -> RunResult[T]:
    """The elastic entry point: run ``train(state)`` in every generation this worker is a member of.

    ``train`` is called again after each membership change (state as it was at the switch) and after each failure
    (state rolled back to the last commit); it must therefore continue from ``state`` rather than restart, e.g.
    ``while state.epoch < epochs: for step in loader: ...``.

    Args:
        train: the training function.
        state: the worker's state.

    Returns:
        How it ended for this worker.

    Raises:
        StateError: the state cannot be sent, or does not fit the running workers' state (this worker leaves; the
            others are untouched).
        JobLostError: the coordinator declared the job lost.
        RuntimeTimeout: a deadline passed (coordinator unreachable, admission never came).
    """
    return get_runtime().run(train, state)


class _GenerationAborted(Exception):
    """Another member refused the state sync; the generation is dropped without touching this worker's state."""


class WorkerRuntime:
    """The elastic runtime of one worker process (see the module docstring); create it with :func:`init`.

    Args:
        env: the worker's environment contract.
    """

    def __init__(self, env: WorkerEnv) -> None:
        self.env = env
        self.worker_id = env.worker_id
        self.prefix = f"[{env.job_id}/{env.worker_id}]"
        self.device = self._pick_device()
        self.backend = "nccl" if self.device.type == "cuda" else "gloo"
        self.plan: GenerationPlan | None = None
        self.generation = 0
        self._rank = 0
        self._world_size = 0
        self._store: TCPStore | None = None
        self._seq = 0
        self._leave = threading.Event()
        self._change_seen_in = 0
        self._switch_agreed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._grad: GradientBuckets | None = None
        self._step_time_s = 0.0
        self._samples_per_s = 0.0
        self._last_step_end = 0.0
        self._progress: dict[str, int] = {}
        self._generations: list[int] = []

    # ----------------------------------------------------------------------------------------------- setup

    def _pick_device(self) -> torch.device:
        wanted = self.env.device
        if wanted == "cpu" or (wanted == "auto" and not torch.cuda.is_available()):
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise RuntimeConfigError(
                f"{self.prefix} AMOEBA_DEVICE=cuda but torch sees no GPU; use AMOEBA_DEVICE=cpu or auto"
            )
        index = self.env.cuda_device
        if index < 0:
            index = int(os.environ.get("LOCAL_RANK", "0") or 0)
        return torch.device("cuda", index % max(torch.cuda.device_count(), 1))

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
        job = json.loads(self.store.get(JOB_KEY))
        if job.get("job_id") != self.env.job_id:
            raise RuntimeConfigError(
                f"{self.prefix} the store at {self.env.store_addr}:{self.env.store_port} belongs to job "
                f"{job.get('job_id')!r}, not {self.env.job_id!r}; check AMOEBA_STORE_ADDR/PORT"
            )
        self.store.set(heartbeat_key(self.worker_id), repr(time.time()))
        self._push(EventKind.REGISTERED, pid=os.getpid(), host=socket.gethostname())
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.device.type == "cuda":
            # A failed NCCL collective must raise in this process (to be survived), not tear the process down
            # (torch's default, 3): abort the communicator only, and make wait() raise on errors and timeouts.
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
            # Warm-up: create the CUDA context now, while the current members keep training.
            torch.cuda.set_device(self.device)
            torch.cuda.init()  # type: ignore[no-untyped-call]
            torch.zeros(1, device=self.device).add_(1)
            torch.cuda.synchronize(self.device)
        self._thread = threading.Thread(target=self._background, name="amoeba-heartbeat", daemon=True)
        self._thread.start()
        log.info("%s registered (pid %s, device %s)", self.prefix, os.getpid(), self.device)

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
        self.store.queue_push(EVENTS_KEY, event.to_json())

    def _background(self) -> None:
        """Heartbeats, progress reports (rank 0) and the cheap look for a pending change, off the training thread."""
        store = self._connect()
        next_beat = 0.0
        warned = False
        while not self._stop.wait(self.env.poll_s):
            try:
                now = time.time()
                if now >= next_beat:
                    store.set(heartbeat_key(self.worker_id), repr(now))
                    next_beat = now + self.env.heartbeat_s
                    if self._rank == 0 and self.generation and self._step_time_s > 0:
                        store.set(PROGRESS_KEY, json.dumps(self._progress_report(now)))
                generation = self.generation
                if generation and self._change_seen_in != generation and int(store.get(WANT_KEY)) == generation:
                    self._change_seen_in = generation
                warned = False
            except (RuntimeError, ValueError) as exc:
                if not warned:
                    log.warning("%s store unreachable from the heartbeat thread: %s", self.prefix, exc)
                    warned = True

    def _progress_report(self, now: float) -> dict[str, Any]:
        return {
            "worker": self.worker_id,
            "generation": self.generation,
            "world_size": self._world_size,
            "step_time_s": self._step_time_s,
            "samples_per_s": self._samples_per_s,
            "time": now,
            **self._progress,
        }

    # ----------------------------------------------------------------------------------------------- topology

    @property
    def rank(self) -> int:
        """This worker's rank in the current generation."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Members of the current generation (0 outside one)."""
        return self._world_size

    def check_boundary(self) -> None:
        """At a step boundary: raise :class:`MembershipChanged` when the members agreed to switch.

        Raises:
            MembershipChanged: the members agreed to end this generation here.
        """
        if self._switch_agreed:
            raise MembershipChanged(f"generation {self.generation} ends at step boundary")

    # ----------------------------------------------------------------------------------------------- collectives

    def _failure(self, what: str, exc: BaseException) -> WorkerFailure:
        log.warning("%s %s failed in generation %s: %s", self.prefix, what, self.generation, exc)
        # Closing our connections at once makes peers still blocked in the collective fail too, instead of
        # waiting for their timeout (gloo only notices a peer's death on the connections to that peer). Pending
        # works keep the group alive, so they are dropped first.
        if self._grad is not None:
            self._grad.abandon()
        self._teardown_group()
        return WorkerFailure(f"{what} failed in generation {self.generation}: {exc}", generation=self.generation)

    def _control_word(self) -> float:
        return 1.0 if self._change_seen_in == self.generation or self._leave.is_set() else 0.0

    def before_last_micro_batch(self) -> None:
        """Called by the loader before a step's last micro-batch: reduce gradient buckets as backward fills them."""
        if self._grad is not None and self.generation:
            self._grad.arm(self._control_word())

    def apply_step(self, state: TorchState) -> None:
        """Reduce gradients (+ control word), step the optimizer, zero gradients, advance the sampler.

        Raises:
            RuntimeConfigError: called outside a generation.
            WorkerFailure: the all-reduce failed.
        """
        grad = self._grad
        if grad is None or self.generation == 0:
            raise RuntimeConfigError(f"{self.prefix} state.step() was called outside slurm_amoeba.runtime.run()")
        try:
            agreed = grad.finish(self._control_word()) > 0
        except RuntimeError as exc:
            raise self._failure("gradient all-reduce", exc) from None
        state.optimizer.step()
        grad.zero()
        consumed = state.sampler.advance()
        now = time.perf_counter()
        if self._last_step_end:
            elapsed = now - self._last_step_end
            rate = consumed / elapsed if elapsed > 0 else 0.0
            first = not self._step_time_s
            self._step_time_s = elapsed if first else 0.8 * self._step_time_s + 0.2 * elapsed
            self._samples_per_s = rate if first else 0.8 * self._samples_per_s + 0.2 * rate
        self._last_step_end = now
        self._progress = state.sampler.state_dict()
        if agreed:
            self._switch_agreed = True

    def agree_on_commit(self, step: int) -> None:
        """Check that every member commits at the same step.

        Raises:
            RuntimeConfigError: members commit at different steps.
            WorkerFailure: the check failed because a peer died.
        """
        if self.generation == 0:
            return
        probe = torch.tensor([float(step), -float(step)], dtype=torch.float64, device=self.device)
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

    # ----------------------------------------------------------------------------------------------- lifecycle

    def _wait_assignment(self, timeout_s: float, *, member: bool) -> Assignment:
        key = assignment_key(self.worker_id, self._seq)
        deadline = time.monotonic() + timeout_s
        store = self.store
        # A member that just reported expects its assignment within milliseconds: poll fast. A joiner may wait
        # long: it polls slowly until the coordinator asks the running generation to end, then fast, so that it
        # does not delay the next generation's formation.
        want = b"" if member else store.get(WANT_KEY)
        while not store.check([key]):
            if not member and self._leave.is_set():
                self._push(EventKind.LEFT, message="SIGTERM while waiting for admission")
                return Assignment(AssignAction.LEAVE, reason="SIGTERM while waiting for admission")
            if time.monotonic() > deadline:
                raise RuntimeTimeout(
                    f"{self.prefix} waited {timeout_s:.0f} s for the coordinator's assignment {self._seq} "
                    f"(key {key}); is the coordinator alive at {self.env.store_addr}:{self.env.store_port}?"
                )
            if member or store.get(WANT_KEY) != want:
                time.sleep(0.002)
            else:
                time.sleep(0.025)
        self._seq += 1
        return Assignment.from_json(store.get(key))

    def _teardown_group(self) -> None:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except RuntimeError as exc:
                log.debug("%s destroying the old process group: %s", self.prefix, exc)

    def _export_torchrun_env(self, plan: GenerationPlan) -> None:
        local_rank, local_world = plan.local_rank_of(self.worker_id)
        values = {
            "RANK": str(self._rank),
            "WORLD_SIZE": str(plan.world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world),
            "MASTER_ADDR": self.env.store_addr,
            "MASTER_PORT": str(self.env.store_port),
        }
        os.environ.update({name: values[name] for name in TORCHRUN_VARIABLES})

    def _enter(self, plan: GenerationPlan, state: TorchState) -> None:
        """Become a member of ``plan``'s generation: new process group, rollback, state sync, auto-commit."""
        self._teardown_group()
        self.plan = plan
        self.generation = plan.generation
        self._rank = plan.rank_of(self.worker_id)
        self._world_size = plan.world_size
        self._switch_agreed = False
        self._export_torchrun_env(plan)
        state.sampler.planner.check_world_size(plan.world_size)
        started = time.perf_counter()
        try:
            dist.init_process_group(
                self.backend,
                store=PrefixStore(group_prefix(plan.generation), self.store),
                rank=self._rank,
                world_size=plan.world_size,
                timeout=datetime.timedelta(seconds=self.env.collective_timeout_s),
                device_id=self.device if self.device.type == "cuda" else None,
            )
        except RuntimeError as exc:
            raise self._failure("process group formation", exc) from None
        formed = time.perf_counter()
        survivor = self.worker_id not in plan.joiners
        if plan.rollback and survivor:
            state.restore()
        if plan.sync:
            self._sync(plan, state)
        state.save()
        if self._grad is None or self._grad.model is not state.model:
            if self._grad is not None:
                self._grad.close()
            self._grad = GradientBuckets(state.model)
        else:
            self._grad.zero()
        self._last_step_end = 0.0
        self._generations.append(plan.generation)
        log.info(
            "%s generation %s: rank %s of %s at step %s (group %.3f s, state %.3f s, %s)",
            self.prefix,
            plan.generation,
            self._rank,
            plan.world_size,
            state.step_index,
            formed - started,
            time.perf_counter() - formed,
            plan.reason,
        )
        state.run_reset_callbacks()

    def _sync(self, plan: GenerationPlan, state: TorchState) -> None:
        """The plan's source broadcasts its state; the others check it fits, then receive it."""
        source_rank = plan.rank_of(plan.source)
        key = manifest_key(plan.generation)
        problem: str | None = None
        tensors: list[torch.Tensor] = []
        if self.worker_id == plan.source:
            manifest, tensors = state.encode()
            self.store.set(key, json.dumps(manifest))
        else:
            deadline = time.monotonic() + self.env.collective_timeout_s
            while not self.store.check([key]):
                if time.monotonic() > deadline:
                    raise self._failure("state manifest wait", TimeoutError(f"no {key} from {plan.source}"))
                time.sleep(0.001)
            manifest = json.loads(self.store.get(key))
            problem = state.check_compatible(manifest)
        verdict = torch.tensor([0.0 if problem else 1.0], device=self.device)
        try:
            dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
        except RuntimeError as exc:
            raise self._failure("state check", exc) from None
        if problem is not None:
            raise StateError(f"{self.prefix} cannot join job {self.env.job_id!r}: {problem}")
        if verdict.item() < 1.0:
            raise _GenerationAborted(f"a joiner of generation {plan.generation} refused the state")
        specs = manifest["tensors"]
        by_dtype: dict[str, list[int]] = {}
        for index, (dtype, _shape, _device) in enumerate(specs):
            by_dtype.setdefault(dtype, []).append(index)
        received: list[torch.Tensor | None] = [None] * len(specs)
        for dtype_name, indices in sorted(by_dtype.items()):
            dtype = _dtype(dtype_name)
            sizes = [_numel(specs[i][1]) for i in indices]
            if self.worker_id == plan.source:
                flat = torch.cat([tensors[i].reshape(-1).to(self.device) for i in indices])
            else:
                flat = torch.empty(sum(sizes), dtype=dtype, device=self.device)
            try:
                dist.broadcast(flat, src=source_rank)
            except RuntimeError as exc:
                raise self._failure("state broadcast", exc) from None
            if self.worker_id != plan.source:
                for index, part in zip(indices, torch.split(flat, sizes), strict=True):
                    device = self.device if specs[index][2] == "cuda" else torch.device("cpu")
                    received[index] = part.reshape(specs[index][1]).to(device).clone()
        if self.worker_id != plan.source:
            tree = decode_tree(manifest["skeleton"], [t for t in received if t is not None])
            state.load_tree(tree)

    def _report(self, state: TorchState, *, failed: bool) -> None:
        self._push(
            EventKind.REPORT,
            generation=self.generation,
            step=state.step_index,
            committed_step=state.committed_step,
            leaving=self._leave.is_set(),
            failed=failed,
        )

    def run(self, train: Callable[[TorchState], T], state: TorchState) -> RunResult[T]:
        """See :func:`run`."""
        encode_tree(state.as_tree(), "state", [])  # refuse unsendable state before joining anything
        sizes = tuple(state.sampler.planner.allowed_world_sizes(1024))
        self._push(EventKind.READY, allowed_sizes=sizes)
        log.info("%s warm and ready", self.prefix)
        after_report_s = 2 * self.env.collective_timeout_s + 30
        assignment = self._wait_assignment(self.env.join_timeout_s, member=False)
        try:
            while True:
                if assignment.action is AssignAction.STANDBY:
                    log.info("%s on standby: %s", self.prefix, assignment.reason)
                    self._teardown_group()
                    self.generation = 0
                    assignment = self._wait_assignment(self.env.join_timeout_s, member=False)
                    continue
                if assignment.action is AssignAction.LEAVE:
                    log.info("%s leaving: %s", self.prefix, assignment.reason)
                    return RunResult(RunStatus.LEFT, generations=tuple(self._generations))
                if assignment.action is AssignAction.FINISH:
                    if "lost" in assignment.reason:
                        raise JobLostError(f"{self.prefix} {assignment.reason}")
                    return RunResult(RunStatus.ENDED, generations=tuple(self._generations))
                assert assignment.plan is not None
                try:
                    self._enter(assignment.plan, state)
                    value = train(state)
                except MembershipChanged:
                    self._report(state, failed=False)
                except _GenerationAborted as exc:
                    log.info("%s %s", self.prefix, exc)
                    self._report(state, failed=False)
                except WorkerFailure:
                    self._report(state, failed=True)
                else:
                    self._push(EventKind.DONE)
                    return RunResult(RunStatus.FINISHED, value=value, generations=tuple(self._generations))
                if self._leave.is_set():
                    log.info("%s left at step %s", self.prefix, state.step_index)
                    return RunResult(RunStatus.LEFT, generations=tuple(self._generations))
                assignment = self._wait_assignment(after_report_s, member=True)
        except BaseException as exc:
            self._push(EventKind.ERROR, message=f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Stop the heartbeat thread and leave the process group (the store connection stays for the process)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._teardown_group()


def _dtype(name: str) -> torch.dtype:
    attr = name.removeprefix("torch.")
    value = getattr(torch, attr, None)
    if not isinstance(value, torch.dtype):
        raise StateError(f"the sender's state has a tensor of unknown dtype {name!r}")
    return value


def _numel(shape: list[int]) -> int:
    total = 1
    for dim in shape:
        total *= int(dim)
    return total
