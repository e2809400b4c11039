"""A worker's side of sharing a device: it applies the share directive at step boundaries (AntMan's two mechanisms).

:class:`SharedDevice` belongs to a :class:`~slurm_amoeba.runtime.state.TorchState` (``TorchState(...,
sharing=SharedDevice())``, or by default when the job opted in to sharing: ``AMOEBA_SHARE`` set); the state calls
:meth:`SharedDevice.after_step` after every step. There it

* reads the coordinator's :class:`~slurm_amoeba.runtime.share.ShareDirective` (at most every ``read_every_s``);
* **memory**: applies the directive's per-worker cap: the sampler's micro-batch becomes the largest whose predicted
  peak fits the cap (:func:`~slurm_amoeba.runtime.share.largest_micro_batch`), the rest of the worker's share of the
  unchanged global batch becomes gradient accumulation; on a GPU the caching allocator is limited to the cap too
  (``torch.cuda.set_per_process_memory_fraction``) and its cache emptied, so the bytes return to the device. The
  bytes per micro-batch come from a profile given to it or, by default, from one step measured with
  :class:`~slurm_amoeba.runtime.plan_probe.PeakMeter` (on a CPU at the first step boundary, on a GPU when the
  first cap arrives). An opportunistic worker that cannot
  fit a micro-batch of 1 leaves at this boundary (the runtime's graceful leave); a guaranteed worker is never capped
  below its need;
* **what it holds**: keeps this worker's device memory peak for the progress report
  (:attr:`SharedDevice.memory_peak_bytes`, reported as ``share.memory_peak_bytes``; the agent sends it to the
  daemon as the report's ``memory_gib``): on a GPU the most the caching allocator held over the last window
  (:class:`ReservedPeak`), on a CPU one step measured with :class:`~slurm_amoeba.runtime.plan_probe.PeakMeter` at
  the first step boundary (the same measurement the cap's profile comes from when none was given; that step, slower
  under the meter, is left out of the status file's step times);
* writes this worker's status file (its recent step times) when the directive names one, at most every
  ``read_every_s``;
* **computation**: a guaranteed worker that iterates its steps through :meth:`SharedDevice.micro_batches`
  publishes whether it computes right now, and its recent busy and idle spells, in its activity file
  (:class:`~slurm_amoeba.runtime.share.ActivityFile`, beside its status file): busy from its step's first
  micro-batch to the end of the step, idle from there to the next step's first micro-batch (its input pipeline);
  or, when its loop marks its waits itself (:meth:`SharedDevice.idle`), idle only inside those.
  An opportunistic worker that iterates the same way waits, before each of its micro-batches and before its
  optimizer step, until the partner is idle with room for that chunk
  (:func:`~slurm_amoeba.runtime.pacing.may_compute`); after its step it reads the partner's status file (owner
  checked) and sleeps as its :class:`~slurm_amoeba.runtime.pacing.Pacer` decides, the safety net that cuts its
  duty when the partner's step times still say it is slowed. A new directive that arrives during a wait or a
  pause ends it: a wait finishes the step at once, a pause applies the directive at once (the worker is at its
  step boundary).

DESIGN.md, layer ``runtime/``, worker side; the directive's path from the daemon is ``Coordinator.set_share``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.core.jobenv import ENV_PARENT_JOB
from slurm_amoeba.core.sharing import STATUS_DIR, ShareRole, host_status_path
from slurm_amoeba.runtime.adaptive import AdaptedState
from slurm_amoeba.runtime.errors import BatchPlanError
from slurm_amoeba.runtime.pacing import (
    ActivityLog,
    OwnerActivity,
    Pacer,
    PacingConfig,
    StepRecord,
    exclusive_step_times,
    may_compute,
    owner_busy,
    wait_s,
)
from slurm_amoeba.runtime.plan_probe import PeakMeter
from slurm_amoeba.runtime.plans import ModelProfile
from slurm_amoeba.runtime.protocol import SHARE_KEY
from slurm_amoeba.runtime.share import (
    ActivityFile,
    ActivityReader,
    JobStatus,
    ShareDirective,
    activity_path,
    largest_micro_batch,
    need_bytes,
    profile_from_peak,
    read_status,
    recent_steps,
    write_status,
)

Batch = TypeVar("Batch")

log = logging.getLogger(__name__)

#: A worker whose environment has ``AMOEBA_SHARE`` (the job's sharing mode, or ``1``; not empty, not ``0``) gets a
#: default :class:`SharedDevice` in its ``TorchState``.
ENV_SHARE = "AMOEBA_SHARE"
#: Bytes a CUDA worker keeps out of its cap when it plans its micro-batch: torch's caching allocator rounds blocks
#: up and holds cuBLAS's workspace beside the tensors the profile counts (the device limit stays the whole cap).
CUDA_ALLOWANCE_BYTES = 64 << 20
#: The seconds a CUDA worker's reported memory peak looks back (:class:`ReservedPeak`).
MEMORY_WINDOW_S = 10.0
#: The recent chunk lengths (micro-batches; optimizer steps) a sharer keeps to predict the next one's.
_LENGTHS_KEPT = 16
#: The most quiet intervals (sharer pauses) kept to learn the partner's exclusive step time from.
_QUIET_KEPT = 64


class ReservedPeak:
    """The most bytes torch's CUDA caching allocator held on one device over the last window: what a neighbour on
    that device cannot use (the allocator keeps freed blocks cached).

    At a step boundary once ``window_s`` has passed since its last reading, it reads the allocator's peak
    (``torch.cuda.max_memory_reserved``: host-side counters, no synchronisation with the device) and resets it
    (``torch.cuda.reset_peak_memory_stats``), so that each window starts from what the allocator holds then. A
    lowered cap (whose emptied cache lowers what the allocator holds) therefore shows within one window:
    :meth:`restart` drops the peak from before it. The first reading is at the first boundary (the first step).
    Resetting the peak statistics also resets what ``torch.cuda.max_memory_allocated`` answers the training loop.

    Args:
        window_s: the seconds between two readings.
        read: the allocator's peak of a device index (``torch.cuda.max_memory_reserved``; tests pass a fake).
        reset: resets the peaks of a device index (``torch.cuda.reset_peak_memory_stats``).

    Attributes:
        peak_bytes: the last window's peak; ``None`` before the first reading.
    """

    def __init__(
        self,
        window_s: float = MEMORY_WINDOW_S,
        *,
        read: Callable[[int], int] = torch.cuda.max_memory_reserved,
        reset: Callable[[int], None] = torch.cuda.reset_peak_memory_stats,
    ) -> None:
        self.window_s = window_s
        self.peak_bytes: int | None = None
        self._read, self._reset = read, reset
        self._next = float("-inf")

    def at_boundary(self, device: int, now: float) -> None:
        """Read and reset the peak of device ``device`` when the window is over (a step boundary at ``now``)."""
        if now < self._next:
            return
        self.peak_bytes = int(self._read(device))
        self._reset(device)
        self._next = now + self.window_s

    def restart(self, device: int, now: float) -> None:
        """Start a new window at ``now``: what the allocator held before (a cap changed what it may hold) no longer
        counts; the last reading stays the peak until the new window is over (before the first reading, the first
        boundary still reads)."""
        self._reset(device)
        if self.peak_bytes is not None:
            self._next = now + self.window_s


#: What sharing uses of the training state it belongs to (:class:`~slurm_amoeba.runtime.state.TorchState`): the parts
#: the adaptive batch uses too (model, optimizer, sampler; the driver's rank and world size, and its
#: ``coordinator_value``, ``request_leave``, ``worker_id`` and ``job_id`` where it has them).
SharingState = AdaptedState


class SharedDevice:
    """Applies a job's share directive on one worker (see the module docstring).

    Args:
        profile: the model's measured bytes (:func:`~slurm_amoeba.runtime.plan_probe.probe_model`); ``None``: one
            step is measured when the first cap arrives.
        pacing: the pacing controller's settings.
        read_every_s: the least time between two reads of the directive, two reads of the partner's status file, and
            two writes of this worker's own.
        memory_window_s: the seconds a GPU worker's memory peak looks back (:class:`ReservedPeak`).
        directive: a directive to start with (tests, and jobs told before they start); the coordinator's replaces it.
        clock: the wall clock (status files hold wall-clock times).
        sleep: how to pause (tests pass a fake).

    Attributes:
        directive: the directive in force (``None``: the job does not share).
        micro_batch: the micro-batch the cap allows (0: no cap applied).
        memory_peak_bytes: the device memory this worker peaked at (``None``: not measured yet). On a GPU the most
            torch's caching allocator held on the model's device over the last ``memory_window_s``
            (:class:`ReservedPeak`: what the allocator holds, cached blocks included; the CUDA context and NCCL's
            buffers are not counted); on a CPU the peak of the one step measured with
            :class:`~slurm_amoeba.runtime.plan_probe.PeakMeter` from the first step boundary to the next, plus the
            runtime's in-memory commit (:func:`~slurm_amoeba.runtime.share.commit_bytes`), as a cap counts them:
            measured once, it does not follow a later cap.
        leaving: the worker asked to leave because it cannot fit under the cap.
        pacer: the opportunistic role's controller.
        paused_s: the seconds slept so far after steps (the duty's pauses).
        waited_s: the seconds an opportunistic worker waited so far for its partner to idle (the gate).
        gated_chunks: the chunks (micro-batches, optimizer steps) it started through the gate.
        layer_yields: the times an opportunistic worker stopped between two layers because its partner became busy.
    """

    def __init__(
        self,
        profile: ModelProfile | None = None,
        *,
        pacing: PacingConfig | None = None,
        read_every_s: float = 0.1,
        memory_window_s: float = MEMORY_WINDOW_S,
        directive: ShareDirective | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.profile = profile
        self.read_every_s = read_every_s
        self.directive = directive
        self.micro_batch = 0
        self.memory_peak_bytes: int | None = None
        self._reserved = ReservedPeak(memory_window_s)
        self.leaving = False
        self._pacing = pacing or PacingConfig()
        self.pacer = Pacer(self._pacing)
        self.paused_s = 0.0
        self.waited_s = 0.0
        self.gated_chunks = 0
        self._clock, self._sleep = clock, sleep
        self._state: SharingState | None = None
        # the guaranteed side of the gate: its transitions and the file it publishes them in
        self._activity = ActivityLog(os.getpid())
        self._activity_file: ActivityFile | None = None
        # the opportunistic side: the partner's activity file, and the lengths of its own chunks
        self._partner: ActivityReader | None = None
        self._partner_source: tuple[str, int] | None = None  # the status path and uid it was opened for
        self._next_refresh = 0.0
        self._chunks: deque[float] = deque(maxlen=_LENGTHS_KEPT)  # its micro-batches' compute
        self._tails: deque[float] = deque(maxlen=_LENGTHS_KEPT)  # from its last micro-batch to the step's end
        self._tail_from: float | None = None
        self._computed_s = 0.0  # this step's compute, waits left out
        self._ungated = False  # a new directive came during a wait: the rest of the step runs at once
        self._hooked: tuple[torch.nn.Module, list[Any]] | None = None  # the model whose layers yield, the handles
        self.layer_yields = 0
        self._marks_idle = False  # the loop marks its idle time itself (idle()); the step's end does not
        self._applied: int | None = None  # the seq of the directive whose cap is in force
        self._meter: PeakMeter | None = None
        self._steps: tuple[StepRecord, ...] = ()
        self._quiet: list[tuple[float, float]] = []
        self._first_compute = clock()
        self._busy_from = clock()
        self._next_read = 0.0
        self._next_partner = 0.0
        self._next_status = 0.0
        self._warned: set[str] = set()

    @classmethod
    def for_job(cls, env: Mapping[str, str], status_dir: Path = STATUS_DIR) -> SharedDevice | None:
        """The default of a worker whose job opted in to sharing (``AMOEBA_SHARE`` not empty, not ``0``), else None.

        A guaranteed job (``AMOEBA_SHARE`` ``guaranteed`` or ``1``) starts with a directive naming its status file,
        :func:`~slurm_amoeba.core.sharing.host_status_path` of its job id (``AMOEBA_PARENT_JOB``, set by its agent)
        in ``status_dir``: the place a sharer's workers beside it read its step times from. Its coordinator's
        directive, if one comes, replaces it. An opportunistic job waits for the directive its agent publishes for
        the workers it places beside a host.
        """
        mode = env.get(ENV_SHARE, "")
        if mode in ("", "0"):
            return None
        job = env.get(ENV_PARENT_JOB, "")
        if mode not in ("1", ShareRole.GUARANTEED.value) or not job:
            return cls()
        try:
            path = host_status_path(job, status_dir)
        except ValueError as exc:
            log.warning("no status file for sharers to pace against: %s", exc)
            return cls()
        return cls(directive=ShareDirective(ShareRole.GUARANTEED, status_path=str(path)))

    # ----------------------------------------------------------------------------------------------- the hooks

    def attach(self, state: SharingState) -> None:
        """Read the directive and apply its cap before the first step (the state calls it when ``run()`` binds it),
        so that a sharer's first step already fits; without a profile the cap waits for one measured step."""
        self._state = state
        self._next_read = 0.0
        self._read_directive(state.driver)
        directive, worker = self.directive, str(getattr(state.driver, "worker_id", ""))
        if self.profile is not None and directive is not None and directive.applies_to(worker):
            self._apply_cap(state, directive)
        self._busy_from = self._clock()

    def after_step(self, state: SharingState) -> None:
        """Everything sharing does at a step boundary (the state calls it after each step)."""
        now = self._clock()
        busy = max(0.0, now - self._busy_from)
        if self._tail_from is not None:  # the gate let this step's optimizer step run: its length, for the next
            self._tails.append(now - self._tail_from)
            self._computed_s += now - self._tail_from
            self._tail_from = None
        computed, self._computed_s = self._computed_s, 0.0
        self._between_layers()  # a gated sharer's bookkeeping below waits while its partner computes
        self._ungated = False  # a directive that ended a wait is applied below; the next step is gated again
        if self._meter is None:  # a measured step runs slower (PeakMeter's dispatch): not a time to pace against
            self._steps = recent_steps(self._steps, StepRecord(now, busy))
        driver = state.driver
        self._read_directive(driver)
        directive = self.directive
        worker = str(getattr(driver, "worker_id", ""))
        applies = directive is not None and directive.applies_to(worker)
        self._hold_memory(state, capped=applies and directive is not None and directive.memory_cap_bytes > 0)
        if directive is None or not applies:
            self._busy_from = self._clock()
            return
        if not self.leaving:
            self._apply_cap(state, directive)
        if directive.status_path and now >= self._next_status:
            self._next_status = now + self.read_every_s  # the partner reads no more often; the steps accumulate
            self._write_status(Path(directive.status_path.replace("{worker}", worker)), state, worker, directive)
        if directive.role is ShareRole.OPPORTUNISTIC and directive.partner_status_path and not self.leaving:
            self._pace(state, directive, computed if self.pacer.gated else busy)
        if not self._marks_idle:
            self._mark(busy=False)  # the owner's input pipeline, until its next step's first micro-batch
        self._busy_from = self._clock()

    @contextlib.contextmanager
    def idle(self) -> Iterator[None]:
        """Mark a guaranteed worker idle for the block: ``with sharing.idle(): batch = next(source)``, around the
        waits in which its device has nothing to do (its input pipeline, a communication wait), so that sharers
        beside it compute then; busy again after. Once a loop marks its idle time this way, the step's end no
        longer marks the worker idle by itself (everything outside these blocks counts as busy). Nothing for other
        workers."""
        self._marks_idle = True
        self._mark(busy=False)
        try:
            yield
        finally:
            self._mark(busy=True)

    def micro_batches(self, step: Iterable[Batch]) -> Iterator[Batch]:
        """Iterate one step's micro-batches the sharing way: ``for batch, weight in sharing.micro_batches(step)``.

        A guaranteed worker marks itself busy once it holds the step's first micro-batch (:meth:`after_step` marks
        it idle at the step's end). An opportunistic worker whose partner publishes its activity waits before each
        micro-batch, and once more before giving control back for the optimizer step, until the partner is idle
        with room for that chunk; a new directive ends the waiting for the rest of the step, so that it applies
        at the step's end. Any other worker iterates the step as it is.
        """
        for index, item in enumerate(step):  # fetching is host work: the gate guards the device's part
            if index == 0:
                self._mark(busy=True)
            if self._gating():
                self._wait_for_room(self._expected(self._chunks))
            started = self._clock()
            yield item
            if self._gating():
                spent = self._clock() - started
                self._chunks.append(spent)
                self._computed_s += spent
        if self._gating():
            self._wait_for_room(self._expected(self._tails))
            self._tail_from = self._clock()

    @property
    def report(self) -> dict[str, Any]:
        """What sharing did, for the progress report (role, cap, micro-batch, the memory peak, duty, the partner's
        ratio)."""
        directive = self.directive
        return {
            "role": None if directive is None else directive.role.value,
            "memory_cap_bytes": 0 if directive is None else directive.memory_cap_bytes,
            "micro_batch": self.micro_batch,
            "memory_peak_bytes": self.memory_peak_bytes,
            "duty": round(self.pacer.duty, 4),
            "partner_ratio": self.pacer.ratio,
            "partner_ratio_mean": self.pacer.ratio_mean,
            "decisions": self.pacer.decisions,
            "partner_baseline_s": self.pacer.baseline_s,
            "violations": self.pacer.violations,
            "paused_s": round(self.paused_s, 3),
            "gated": self.pacer.gated,
            "waited_s": round(self.waited_s, 3),
            "gated_chunks": self.gated_chunks,
            "layer_yields": self.layer_yields,
            "chunk_s": round(self._expected(self._chunks), 6),
            "tail_s": round(self._expected(self._tails), 6),
            "leaving": self.leaving,
        }

    # ----------------------------------------------------------------------------------------------- directive

    def _read_directive(self, driver: object) -> None:
        read = getattr(driver, "coordinator_value", None)
        now = self._clock()
        if read is None or now < self._next_read:
            return
        self._next_read = now + self.read_every_s
        try:
            text = read(SHARE_KEY)
            if text is not None:
                directive = ShareDirective.from_json(text)
                if self.directive is None or directive.seq != self.directive.seq:
                    log.info("share directive %d: %s", directive.seq, directive)
                    self.directive = directive
                    self.pacer.bound(directive.pace_bound, self._pacing)
        except (ParseError, RuntimeError, OSError) as exc:  # a malformed value, a store error: keep the last one
            self._warn_once("directive", "the share directive could not be read (%s); the last one stays", exc)

    # ----------------------------------------------------------------------------------------------- memory

    def _apply_cap(self, state: SharingState, directive: ShareDirective) -> None:
        """Apply a new directive's cap: the micro-batch that fits (the same at every world size: only the share a
        worker cuts into micro-batches changes with it), the device limit, or a leave."""
        if self._applied == directive.seq:
            return
        if directive.memory_cap_bytes == 0:
            self._applied = directive.seq
            self.micro_batch = state.sampler.cap_local_batch(directive.sub_batch)
            self._limit_device(state, 0)
            return
        if self.profile is None:
            return  # one step is measured (_hold_memory); applied at the boundary that ends it
        cap = directive.memory_cap_bytes
        global_batch = state.sampler.global_batch
        need = need_bytes(self.profile, global_batch, 1)
        if directive.role is ShareRole.GUARANTEED and cap < need:
            log.warning("a cap of %d bytes is below this guaranteed worker's need of %d: it keeps %d", cap, need, need)
            cap = need
        micro = largest_micro_batch(self.profile, global_batch, 1, max(1, cap - self._allowance(state)))
        if directive.sub_batch:
            micro = min(micro, directive.sub_batch)  # the policy's sub-batch, when it searched a smaller one
        self._applied = directive.seq
        if micro and not self._plannable(state, micro):
            micro = 0  # fits the bytes, but needs more accumulation than the sampler's max_accumulation allows
        if micro == 0:
            log.warning("a cap of %d bytes does not fit a micro-batch of 1 (%d bytes): this worker leaves", cap, need)
            self.leaving = True
            leave = getattr(state.driver, "request_leave", None)
            if leave is not None:
                leave()
            return
        self.micro_batch = state.sampler.cap_local_batch(micro)
        self._limit_device(state, cap)
        log.info("memory cap %d bytes: micro-batch %d (global batch %d stays)", cap, micro, global_batch)

    @staticmethod
    def _plannable(state: SharingState, micro: int) -> bool:
        planner = state.sampler.planner
        try:
            dataclasses.replace(planner, max_local_batch=micro).check_world_size(max(1, state.driver.world_size))
        except BatchPlanError:
            return False
        return True

    def _hold_memory(self, state: SharingState, *, capped: bool) -> None:
        """Keep :attr:`memory_peak_bytes` up to date at a step boundary, and measure the one step a CPU worker's
        peak, or a cap without a profile, needs (started at one boundary, read at the next)."""
        device = self._device(state)
        if device.type == "cuda":
            self._reserved.at_boundary(self._index(device), self._clock())
            self.memory_peak_bytes = self._reserved.peak_bytes
        wanted = (device.type != "cuda" and self.memory_peak_bytes is None) or (capped and self.profile is None)
        if wanted or self._meter is not None:
            self._measure(state, device)

    def _measure(self, state: SharingState, device: torch.device) -> None:
        """Measure one step's peak (from this boundary to the next): a CPU worker's memory peak, and the profile
        when none was given."""
        if self._meter is None:
            self._meter = PeakMeter(state.model, state.optimizer)
            self._meter.start()
            return
        peak = self._meter.stop()
        self._meter = None
        params = sum(p.numel() * p.element_size() for p in state.model.parameters())
        moments = sum(
            v.numel() * v.element_size()
            for per_param in state.optimizer.state.values()
            for v in per_param.values()
            if isinstance(v, torch.Tensor)
        )
        topology = state.driver
        plan = state.sampler.planner.plan(state.sampler.global_batch, topology.world_size)
        micro = max(plan.micro_batches[topology.rank], default=1)
        log.info("measured one step: peak %d bytes at micro-batch %d", peak, micro)
        if device.type != "cuda":
            self.memory_peak_bytes = peak + params + moments  # the step's peak and the runtime's commit
        if self.profile is None:
            self.profile = profile_from_peak(params, moments, peak, micro)

    @staticmethod
    def _device(state: SharingState) -> torch.device:
        """The device of the model's parameters (the CPU for a model without any)."""
        return next(iter(state.model.parameters()), torch.empty(0)).device

    @staticmethod
    def _index(device: torch.device) -> int:
        """The index of a CUDA device (the current one when ``device`` names none)."""
        return device.index if device.index is not None else torch.cuda.current_device()

    @staticmethod
    def _allowance(state: SharingState) -> int:
        """:data:`CUDA_ALLOWANCE_BYTES` for a model on a GPU; 0 on a CPU."""
        return CUDA_ALLOWANCE_BYTES if SharedDevice._device(state).type == "cuda" else 0

    def _limit_device(self, state: SharingState, cap: int) -> None:
        """Limit the CUDA caching allocator to ``cap`` bytes of the model's device (0: the whole device) and return
        what it caches beyond; nothing on a CPU, where the cap bounds only the micro-batch the runtime plans."""
        device = self._device(state)
        if device.type != "cuda":
            return
        index = self._index(device)
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(1.0 if cap == 0 else min(1.0, cap / total), index)
        torch.cuda.empty_cache()
        self._reserved.restart(index, self._clock())  # the memory peak reported next is the new cap's

    # ----------------------------------------------------------------------------------------------- status, pacing

    def _write_status(self, path: Path, state: SharingState, worker: str, directive: ShareDirective) -> None:
        job = str(getattr(state.driver, "job_id", ""))
        try:
            write_status(path, JobStatus(job, worker, directive.role, self._steps))
        except OSError as exc:
            self._warn_once("status", "the status file %s cannot be written (%s)", path, exc)

    def _pace(self, state: SharingState, directive: ShareDirective, busy: float) -> None:
        now = self._clock()
        if now >= self._next_partner:
            self._next_partner = now + self.read_every_s
            try:
                partner = read_status(Path(directive.partner_status_path), directive.partner_uid)
            except (OSError, ParseError) as exc:
                self._warn_once("partner", "the partner's status cannot be read (%s); the duty stays", exc)
            else:
                steps = partner.steps
                self.pacer.learn_baseline(exclusive_step_times(steps, self._first_compute, self._quiet))
                self.pacer.decide([s for s in steps if s.end > self._first_compute])  # only what it may have slowed
                if self.pacer.gated and self.pacer.baseline_s is None:
                    self._quiet = []  # a probe follows: the steps of earlier pauses taught a stale baseline
        pause = self.pacer.pause_s(busy)
        if pause <= 0:
            return
        start = self._clock()
        seq = directive.seq
        while (left := start + pause - self._clock()) > 0:
            self._sleep(min(left, max(self.read_every_s, 0.01)))
            self._read_directive(state.driver)
            if self.directive is not None and self.directive.seq != seq:
                if self.directive.applies_to(str(getattr(state.driver, "worker_id", ""))):
                    self._apply_cap(state, self.directive)  # still at the step boundary: a new cap or a leave now
                break
            if self.pacer.gated and self.pacer.baseline_s is None and self._probed(directive, start):
                break  # the probe gave the partner's exclusive step time
            if not self.pacer.gated and self._partner_activity(directive) is not None:
                break  # the partner publishes its activity now: the gate takes over from the duty
        end = self._clock()
        self.paused_s += end - start
        self._quiet = [*self._quiet, (start, end)][-_QUIET_KEPT:]

    def _probed(self, directive: ShareDirective, start: float) -> bool:
        """Learn the partner's exclusive step time from its steps inside the pause that began at ``start``;
        whether it is known now (at least ``window`` such steps)."""
        try:
            steps = read_status(Path(directive.partner_status_path), directive.partner_uid).steps
        except (OSError, ParseError):
            return False
        exclusive = exclusive_step_times(steps, self._first_compute, [(start, self._clock())])
        if len(exclusive) >= self.pacer.config.window:
            self.pacer.learn_baseline(exclusive)
        return self.pacer.baseline_s is not None

    # ----------------------------------------------------------------------------------------------- the gate

    def _mark(self, *, busy: bool) -> None:
        """A guaranteed worker with a status file publishes that it computes (or idles) from now on."""
        directive, state = self.directive, self._state
        if directive is None or directive.role is not ShareRole.GUARANTEED or not directive.status_path:
            return
        if state is None or not directive.applies_to(str(getattr(state.driver, "worker_id", ""))):
            return
        activity = self._activity.mark(busy, self._clock())
        if activity is None:
            return
        worker = str(getattr(state.driver, "worker_id", ""))
        path = activity_path(directive.status_path.replace("{worker}", worker))
        try:
            if self._activity_file is None or self._activity_file.path != path:
                if self._activity_file is not None:
                    self._activity_file.close()
                self._activity_file = ActivityFile(path)
            self._activity_file.publish(activity)
        except OSError as exc:
            self._warn_once("activity", "the activity file %s cannot be written (%s)", path, exc)

    def _gating(self) -> bool:
        """Whether this worker is an opportunistic one told a partner (it then looks at the partner's activity)."""
        directive, state = self.directive, self._state
        return (
            directive is not None
            and state is not None
            and not self._ungated
            and directive.role is ShareRole.OPPORTUNISTIC
            and bool(directive.partner_status_path)
            and not self.leaving
            and directive.applies_to(str(getattr(state.driver, "worker_id", "")))
        )

    def _partner_activity(self, directive: ShareDirective) -> OwnerActivity | None:
        """The partner's activity now; ``None`` when it publishes none (or not readably: the duty alone paces)."""
        now = self._clock()
        reader = self._partner
        source = (directive.partner_status_path, directive.partner_uid)
        if reader is None or self._partner_source != source:
            if reader is not None:
                reader.close()
            reader = self._partner = ActivityReader(activity_path(source[0]), source[1])
            self._partner_source = source
        elif now >= self._next_refresh:
            reader.refresh()
        if now >= self._next_refresh:
            self._next_refresh = now + self.read_every_s
        try:
            activity = reader.read()
        except (OSError, ParseError) as exc:
            reader.close()
            self._warn_once("activity", "the partner's activity cannot be read (%s); only the duty paces", exc)
            return None
        self.pacer.engage_gate()
        if self._state is not None:
            self._hook_layers(self._state.model)  # only a gated sharer's layers pay for a hook
        return activity

    def _hook_layers(self, model: torch.nn.Module) -> None:
        """Have every leaf layer of ``model`` call :meth:`_between_layers` before its forward (ahead of the user's
        own hooks), and every parameter when its gradient is computed (the backward's layers). Done when the gate
        first engages, once per model (a new model moves the hooks): a guaranteed worker's layers carry none."""
        if self._hooked is not None:
            if self._hooked[0] is model:
                return
            for handle in self._hooked[1]:
                handle.remove()
        handles: list[Any] = []
        for module in model.modules():
            if next(module.children(), None) is None:
                handles.append(
                    module.register_forward_pre_hook(lambda module, args: self._between_layers(), prepend=True)
                )
        for parameter in model.parameters():
            if parameter.requires_grad:
                handles.append(parameter.register_hook(lambda grad: self._between_layers()))  # type: ignore[no-untyped-call]
        self._hooked = (model, handles)

    def _between_layers(self) -> None:
        """AntMan's yield at operator granularity: a gated sharer inside a chunk stops before a layer while its
        partner's fresh flag says busy, so that a chunk the gate started in the partner's idle time overlaps the
        partner's next busy spell by one layer at most. Nothing for other workers. (On a GPU the layers are
        launched ahead of the device, so there it bounds what is queued, not what runs.)"""
        if not self.pacer.gated or not self._gating():
            return
        directive = self.directive
        if directive is None:
            return
        activity = self._partner_activity(directive)
        if not owner_busy(activity, self._clock(), self.pacer.config):
            return
        self.layer_yields += 1
        start = self._clock()
        while owner_busy(activity, now := self._clock(), self.pacer.config) and not self._ungated:
            self._sleep(wait_s(activity, now, self.pacer.config))
            activity = self._partner_activity(directive)
            self._check_directive(directive)
        self.waited_s += self._clock() - start

    def _check_directive(self, directive: ShareDirective) -> None:
        """Read the directive during a wait; a new one ends the waiting for the rest of the step (it applies at the
        step's end)."""
        if self._state is not None:
            self._read_directive(self._state.driver)
        if self.directive is not directive:
            self._ungated = True

    def _wait_for_room(self, chunk_s: float) -> None:
        """Wait until the partner is idle with room for a chunk of ``chunk_s`` (:func:`may_compute`), reading the
        directive meanwhile; a new one ends the waiting for the rest of this step (:meth:`micro_batches`)."""
        directive, state = self.directive, self._state
        if directive is None or state is None:
            return
        start = self._clock()
        while True:
            activity = self._partner_activity(directive)
            now = self._clock()
            if may_compute(activity, now, chunk_s, self.pacer.config):
                break
            self._sleep(wait_s(activity, now, self.pacer.config))
            self._check_directive(directive)
            if self._ungated:
                break  # finish this step now: the new directive applies at its end
        self.waited_s += self._clock() - start
        self.gated_chunks += 1

    @staticmethod
    def _expected(lengths: deque[float]) -> float:
        """The length a chunk is expected to take: the upper quartile of recent ones (0 before the first), so that
        most chunks end within it (the owner's side) while one long chunk (a status read, a directive read) does
        not make the next ones look long."""
        if len(lengths) < 2:
            return max(lengths, default=0.0)
        return statistics.quantiles(lengths, n=4)[2]

    def _warn_once(self, what: str, message: str, *args: object) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning(message, *args)
