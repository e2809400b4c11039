"""Adaptive batch (opt-in): the runtime picks the global batch that maximises goodput, and scales the learning rate.

A user who allows it builds the sampler with ``max_global_batch=``
(:class:`~slurm_amoeba.runtime.sampler.ElasticSampler`); the :class:`~slurm_amoeba.runtime.state.TorchState` then
holds an :class:`AdaptiveBatch` (a default one, or the one passed as ``adaptive=``), which:

* measures the gradient noise scale ``phi`` every step from the gradients the runtime reduces anyway
  (:mod:`slurm_amoeba.runtime.gns`; its numbers ride on the gradient all-reduce, so every worker holds the same
  estimate), and the mean step time per (world size, global batch), also summed over the workers in that
  all-reduce;
* every ``adapt_every`` steps and at the end of each epoch, picks the batch ``B`` in
  ``[global_batch, max_global_batch]`` that maximises *goodput* = throughput x statistical efficiency,
  ``B / t(B) * (phi + B0) / (phi + B)`` (Pollux, OSDI 2021), with ``t(B) = a + b B`` fitted to the measured step
  times at the current world size (with one measured size, ``a`` is ``overhead_prior`` of it), growing at most
  ``max_growth`` times per decision. Every worker computes the same choice from the same numbers: nothing is sent;
* scales the learning rate while the optimizer steps, by a documented rule: ``adascale`` (AdaScale's gain
  ``r = B/B0 * (phi + B0) / (phi + B)``, for SGD), ``sqrt`` (``sqrt(B/B0)``, for Adam-like optimizers),
  ``linear`` (``B/B0``) or ``none``. The factor is applied inside ``optimizer.step()`` only (a step pre-hook sets
  it, a post-hook puts the learning rate back), so schedulers keep computing the learning rate of the initial batch
  and their state never sees the factor;
* counts AdaScale's scale-invariant steps (``scaled_steps``: the sum of the gains, i.e. steps at the initial batch
  that the training is worth), for schedules that should follow statistical progress.

A scheduling policy may choose the batch instead (the daemon's ``goodput`` policy, docs/runtime.md section 12): its
choice for a world size reaches the coordinator (:meth:`~slurm_amoeba.runtime.coordinator.Coordinator.
set_policy_batch`, the sealed ``batch`` key); rank 0 reads that key at most once a second
(:class:`PolicyBatchReader`) and puts the batch on the gradient all-reduce beside the probe's numbers, so every
worker reads the same value at the same step; at each decision point a policy batch for the current world size
replaces the runtime's own choice (clipped to ``[global_batch, max_global_batch]``, not limited by
``max_growth``). At any other world size, or with ``choose=False``, the policy's batch is ignored.

Its state (the smoothed estimates, the step-time table, the scaled steps) is part of the training state:
committed, rolled back and sent to joiners with the rest; the current global batch is in the sampler's position.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import torch

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.core.messages import MAX_NOISE_SCALE
from slurm_amoeba.runtime.errors import RuntimeConfigError, StateError
from slurm_amoeba.runtime.gns import (
    GradientNoiseScale,
    NormProbe,
    ProbeReading,
    accumulation_pair,
    efficiency,
    workers_pair,
)
from slurm_amoeba.runtime.protocol import BATCH_KEY, MAX_POLICY_BATCH, PolicyBatch
from slurm_amoeba.runtime.sampler import ElasticSampler
from slurm_amoeba.runtime.topology import Topology, idle_ranks

LR_RULES = ("adascale", "sqrt", "linear", "none")
_SQRT_OPTIMIZERS = ("Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop", "Adafactor")
_TIME_SMOOTHING = 0.8  # weight of the past in the step-time table
#: Step-time entries in :attr:`AdaptiveBatch.report` (the most measured ones; the daemon takes at most 32).
REPORT_TIMES = 32

log = logging.getLogger(__name__)


def default_rule(optimizer: torch.optim.Optimizer) -> str:
    """The learning-rate rule for ``optimizer``: ``adascale`` for SGD, ``sqrt`` for Adam-like ones.

    Raises:
        RuntimeConfigError: the optimizer is neither; the message asks for an explicit ``lr_rule``.
    """
    name = type(optimizer).__name__
    if name == "SGD":
        return "adascale"
    if name in _SQRT_OPTIMIZERS:
        return "sqrt"
    raise RuntimeConfigError(
        f"the adaptive batch has no default learning-rate rule for a {name} optimizer: pass "
        f"AdaptiveBatch(lr_rule=...) with one of {', '.join(LR_RULES)} to TorchState(adaptive=...)"
    )


def fit_step_time(points: Sequence[tuple[int, float]], overhead_prior: float) -> tuple[float, float] | None:
    """Fit ``t(B) = a + b B`` (``a >= 0``, ``b > 0``) to measured ``(B, seconds)`` points at one world size.

    Args:
        points: measured step times.
        overhead_prior: the share of a lone point's time taken as the fixed part ``a``.

    Returns:
        ``(a, b)``, or ``None`` without points.
    """
    usable = [(b, t) for b, t in points if b > 0 and t > 0 and math.isfinite(t)]
    if not usable:
        return None
    sizes = {b for b, _ in usable}
    if len(sizes) == 1:
        batch, seconds = usable[0]
        return overhead_prior * seconds, (1 - overhead_prior) * seconds / batch
    n = len(usable)
    mean_b = sum(b for b, _ in usable) / n
    mean_t = sum(t for _, t in usable) / n
    spread = sum((b - mean_b) ** 2 for b, _ in usable)
    slope = sum((b - mean_b) * (t - mean_t) for b, t in usable) / spread
    intercept = mean_t - slope * mean_b
    if slope <= 0 or intercept < 0:  # noise: keep a non-negative fixed part and a positive per-sample cost
        intercept = max(intercept, 0.0) if slope > 0 else min(t for _, t in usable) * overhead_prior
        slope = max(sum((t - intercept) / b for b, t in usable) / n, 1e-12)
    return intercept, slope


def goodput(batch: int, base: int, scale: float | None, model: tuple[float, float]) -> float:
    """Samples per second times statistical efficiency, in initial-batch samples per second."""
    seconds = model[0] + model[1] * batch
    return batch / seconds * efficiency(scale, batch, base) if seconds > 0 else 0.0


def best_batch(
    scale: float | None,
    *,
    base: int,
    current: int,
    limit: int,
    points: Sequence[tuple[int, float]],
    max_growth: float = 2.0,
    overhead_prior: float = 0.1,
) -> int:
    """The global batch of highest goodput (see the module docstring); ``current`` without the numbers for it.

    Args:
        scale: the gradient noise scale ``phi`` (``None``: not measured yet).
        base: the initial (smallest allowed) global batch ``B0``.
        current: the batch now.
        limit: ``max_global_batch``.
        points: measured ``(batch, seconds per step)`` at the current world size.
        max_growth: the largest factor by which one decision may grow the batch.
        overhead_prior: see :func:`fit_step_time`.

    Returns:
        The chosen batch in ``[base, min(limit, current * max_growth)]``; ties go to the smaller batch.
    """
    model = fit_step_time(points, overhead_prior)
    if scale is None or model is None:
        return current
    top = min(limit, max(current, math.floor(current * max_growth)))
    candidates = {current, top}
    step = 0
    while (size := round(base * 2 ** (step / 4))) <= top:
        candidates.add(size)
        step += 1
    return max((c for c in candidates if base <= c <= top), key=lambda c: (goodput(c, base, scale, model), -c))


class PolicyBatchReader:
    """Rank 0's look at the policy's batch: the coordinator's sealed ``batch`` key, read at most every ``every_s``.

    It asks the worker runtime (the driver's ``coordinator_value``: its own store connection and the job's key) on
    the training thread; a driver without it (a test's) reads as no policy batch, and so does a value the
    coordinator did not seal (the runtime's seals log that once).

    Args:
        every_s: the least time between two reads of the store.
        clock: a monotonic clock.
    """

    def __init__(self, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._next = 0.0
        self._warned = False
        self.value: PolicyBatch | None = None

    def __call__(self, driver: object) -> PolicyBatch | None:
        """The latest policy batch (``None``: none yet), reading the store when ``every_s`` has passed."""
        now = self._clock()
        read = getattr(driver, "coordinator_value", None)
        if read is None or now < self._next:
            return self.value
        self._next = now + self.every_s
        try:
            text = read(BATCH_KEY)
            if text is not None:
                self.value = PolicyBatch.from_json(text)
        except (ParseError, RuntimeError, OSError) as exc:  # a malformed value, store errors: keep the last value
            if not self._warned:
                self._warned = True
                log.warning("the policy's batch could not be read (%s); the runtime keeps choosing its own", exc)
        return self.value


class AdaptedState(Protocol):
    """What the controller uses of the training state it belongs to
    (:class:`~slurm_amoeba.runtime.state.TorchState`, which makes and owns it)."""

    @property
    def model(self) -> torch.nn.Module:
        """The model (its device picks the measuring rate)."""

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer whose learning rate is scaled inside each step."""

    @property
    def sampler(self) -> ElasticSampler:
        """The adaptive sampler: the global batch and the position."""

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The loss scaler, if any (its scale is divided out of the measured gradient norms)."""

    @property
    def driver(self) -> Topology:
        """The current generation (rank, world size, idle joiners)."""

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Call ``callbacks`` at every new generation."""


class AdaptiveBatch:
    """The adaptive-batch controller of one worker (see the module docstring); give it to ``TorchState(adaptive=)``.

    Args:
        lr_rule: ``adascale``, ``sqrt``, ``linear``, ``none``, or ``auto`` (``adascale`` for SGD, ``sqrt`` for
            Adam-like optimizers).
        smoothing: the noise-scale averages' weight of the past, per step (see
            :class:`~slurm_amoeba.runtime.gns.GradientNoiseScale`).
        choose: pick the batch itself; ``False`` measures and reports only (the batch then changes only through
            :meth:`set_global_batch`, e.g. from your own rule).
        max_growth: the largest factor by which one decision grows the batch.
        overhead_prior: the share of a step's time assumed fixed while only one batch size was measured.
        measure_every: measure the noise scale in one step of this many (the step time is summed in every step);
            by default 1 when the model is on a GPU and 4 on CPU, where the two or three extra reads of the
            gradient are not negligible next to a step (docs/runtime.md, "Adaptive batch", cost).

    Raises:
        RuntimeConfigError: an unknown rule, or a setting out of range.
    """

    def __init__(
        self,
        *,
        lr_rule: str = "auto",
        smoothing: float = 0.99,
        choose: bool = True,
        max_growth: float = 2.0,
        overhead_prior: float = 0.1,
        measure_every: int | None = None,
    ) -> None:
        if lr_rule not in (*LR_RULES, "auto"):
            raise RuntimeConfigError(f"lr_rule={lr_rule!r} is unknown: use auto or one of {', '.join(LR_RULES)}")
        if max_growth < 1 or not 0 <= overhead_prior < 1 or (measure_every is not None and measure_every < 1):
            raise RuntimeConfigError(
                f"max_growth={max_growth} and measure_every={measure_every} must be at least 1 and "
                f"overhead_prior={overhead_prior} in [0, 1)"
            )
        try:
            self.gns = GradientNoiseScale(smoothing)
        except ValueError as exc:
            raise RuntimeConfigError(str(exc)) from None
        self.lr_rule = lr_rule
        self.choose = choose
        self.max_growth = max_growth
        self.overhead_prior = overhead_prior
        self.measure_every = measure_every
        self.probe = NormProbe(self._on_reading)
        self.scaled_steps = 0.0
        self.times: dict[tuple[int, int], tuple[float, int]] = {}
        self.report: dict[str, Any] = {}
        self._state: AdaptedState | None = None
        self._saved_lrs: list[Any] | None = None
        self._last_end: float | None = None
        self._elapsed: float | None = None
        self._timed: tuple[int, int] | None = None  # (world size, batch) of the step whose time the next step sums
        self._world = 0
        self._step_samples = 0
        self._pre_samples = 0
        #: Where rank 0 looks for the policy's batch (replace it to feed one in without a coordinator).
        self.policy_source: Callable[[], PolicyBatch | None] = lambda: self._reader(self.state.driver)
        self._reader = PolicyBatchReader()
        self._policy_now = 0  # the policy's batch on the latest all-reduce (0: none)
        # Who chose the current batch: initial, runtime, policy, or user (always with choose=False: the daemon then
        # knows not to send batches this job would ignore).
        self.batch_source = "initial" if choose else "user"

    # ----------------------------------------------------------------------------------------------- wiring

    def attach(self, state: AdaptedState, *, own_reduction: bool = True) -> None:
        """Bind to ``state`` (its constructor does it): learning-rate hooks, reset callback, rule.

        Args:
            state: the training state.
            own_reduction: the state reduces its gradients the way :class:`~slurm_amoeba.runtime.state.TorchState`
                does (a sharded state does not: the controller's norm probe rides on that reduction).

        Raises:
            RuntimeConfigError: already attached, the state's sampler is not adaptive, or the state is sharded.
        """
        if self._state is not None:
            raise RuntimeConfigError("this AdaptiveBatch is already attached to a TorchState; make one per state")
        if not state.sampler.adaptive:
            raise RuntimeConfigError(
                "TorchState(adaptive=...) needs an ElasticSampler built with max_global_batch= (the largest global "
                "batch the runtime may use)"
            )
        if not own_reduction:  # ShardedState's
            raise RuntimeConfigError(
                f"the adaptive batch works with TorchState's own gradient reduction, not with {type(state).__name__}; "
                "leave max_global_batch out of the sampler"
            )
        if self.lr_rule == "auto":
            self.lr_rule = default_rule(state.optimizer)
        if self.measure_every is None:
            on_gpu = any(p.is_cuda for p in state.model.parameters())
            self.measure_every = 1 if on_gpu else 4
        self._state = state
        state.optimizer.register_step_pre_hook(self._scale_lr)
        state.optimizer.register_step_post_hook(self._restore_lr)
        state.register_reset_callbacks([self.on_generation])
        self._refresh_report()

    @property
    def state(self) -> AdaptedState:
        """The training state this controller is attached to."""
        if self._state is None:
            raise RuntimeConfigError("this AdaptiveBatch is not attached: pass it to TorchState(adaptive=...)")
        return self._state

    # ----------------------------------------------------------------------------------------------- learning rate

    def lr_factor(self) -> float:
        """The factor applied to the learning rate of the step being applied (1 at the initial batch).

        It follows the step's own samples, so the short last step of an epoch is not scaled like a full one
        (nor below the initial batch's learning rate, as a fixed-batch run would not be).
        """
        batch, base = self._step_batch()
        if self.lr_rule == "adascale":
            return self.gns.gain(batch, base)
        if self.lr_rule == "sqrt":
            return math.sqrt(batch / base)
        if self.lr_rule == "linear":
            return batch / base
        return 1.0

    def _step_batch(self) -> tuple[int, int]:
        """The batch the step being applied counts as (its samples, between the initial and the current batch)."""
        sampler = self.state.sampler
        base = sampler.min_global_batch
        return max(min(self._step_samples or sampler.global_batch, sampler.global_batch), base), base

    def _scale_lr(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        factor = self.lr_factor()
        self._saved_lrs = None
        if factor != 1.0:
            self._saved_lrs = [group["lr"] for group in optimizer.param_groups]
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * factor

    def _restore_lr(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if self._saved_lrs is not None:
            for group, lr in zip(optimizer.param_groups, self._saved_lrs, strict=True):
                group["lr"] = lr
            self._saved_lrs = None
        self.scaled_steps += self.gns.gain(*self._step_batch())

    # ----------------------------------------------------------------------------------------------- steps

    def on_generation(self) -> None:
        """A generation starts (reset callback): its first step is not timed; prepare its measurement."""
        self._last_end = None
        self._timed = None
        self._policy_now = 0  # a policy batch read in the previous generation was for its world size
        self._prepare(None)

    def after_step(self) -> None:
        """After each applied step: time it, decide the batch at a decision point, prepare the next measurement."""
        state = self.state
        now = time.perf_counter()
        elapsed = None if self._last_end is None else now - self._last_end
        self._last_end = now
        sampler = state.sampler
        self._timed = (self._world, self._step_samples) if self._step_samples == sampler.global_batch else None
        progress = sampler.progress
        if progress.step % sampler.adapt_every == 0 or progress.cursor == 0:
            if self.choose:
                sampler.set_global_batch(self.decide_batch())
            self._last_end = None  # the next step restarts the loader: not a representative time
        self._elapsed = elapsed
        self._prepare(elapsed)

    def set_global_batch(self, batch: int) -> None:
        """Change the global batch from the next step on, by your own rule (with ``choose=False``).

        Call it after ``state.step()`` where the sampler allows a change (``state.step_index`` a multiple of
        ``adapt_every``, or the start of an epoch); every worker must make the same call.

        Raises:
            BatchPlanError: see :meth:`~slurm_amoeba.runtime.sampler.ElasticSampler.set_global_batch`.
        """
        self.state.sampler.set_global_batch(batch)
        self.batch_source = "user"
        self._prepare(self._elapsed)  # the next step's shares changed with the batch

    def decide_batch(self) -> int:
        """The batch from the next step on: the policy's for this world size when the all-reduce carried one
        (clipped to the sampler's range), else :meth:`choose_batch`; :attr:`batch_source` says which."""
        sampler = self.state.sampler
        if self._policy_now:
            assert sampler.max_global_batch is not None  # attach() checked it
            self.batch_source = "policy"
            return min(max(self._policy_now, sampler.min_global_batch), sampler.max_global_batch)
        self.batch_source = "runtime"
        return self.choose_batch()

    def _policy_batch(self, rank: int, world: int) -> int:
        """What this worker puts on the all-reduce as the policy's batch: rank 0's latest for this world size."""
        if rank != 0 or not self.choose:
            return 0
        choice = self.policy_source()
        if choice is None or choice.world_size != world or not 1 <= choice.batch <= MAX_POLICY_BATCH:
            return 0
        return choice.batch

    def choose_batch(self) -> int:
        """The batch of highest goodput at the current world size (every worker computes the same)."""
        sampler = self.state.sampler
        assert sampler.max_global_batch is not None  # attach() checked it
        points = [(b, t) for (w, b), (t, _) in self.times.items() if w == self._world]
        return best_batch(
            self.gns.scale,
            base=sampler.min_global_batch,
            current=sampler.global_batch,
            limit=sampler.max_global_batch,
            points=points,
            max_growth=self.max_growth,
            overhead_prior=self.overhead_prior,
        )

    def _prepare(self, elapsed: float | None) -> None:
        """Tell the probe this worker's share of the next step (from the sampler's plan of it)."""
        state = self.state
        driver = state.driver
        rank, world = driver.rank, driver.world_size
        self._world = world
        sampler = state.sampler
        policy = self._policy_batch(rank, world)
        if world < 1 or sampler.progress.cursor >= sampler.dataset_size:
            self.probe.prepare(0.0, step_time_s=None, want_pre=False, policy_batch=policy)
            return
        idle = idle_ranks(driver, sampler.progress.step)
        plan = sampler.planner.plan(sampler.step_samples(sampler.progress.cursor), world, idle)
        local = plan.local_size(rank)
        micro = plan.micro_batches[rank]
        self._step_samples = plan.step_samples
        self._pre_samples = local - micro[-1] if world == 1 and len(micro) > 1 else 0
        weight = plan.step_samples / local if local else 0.0
        measure = sampler.progress.step % (self.measure_every or 1) == 0
        self.probe.prepare(
            weight, step_time_s=elapsed, want_pre=self._pre_samples > 0, measure=measure, policy_batch=policy
        )

    def _on_reading(self, reading: ProbeReading) -> None:
        """One step's reduced numbers (the same on every worker): update the estimate and the step-time table."""
        state = self.state
        norm = 1.0
        if state.scaler is not None and state.scaler.is_enabled():
            norm = float(state.scaler.get_scale()) ** 2  # the gradients are still scaled by the loss scale
        batch = self._step_samples
        if self._world > 1:
            pair = workers_pair(reading.weighted_local / norm, reading.pieces, reading.global_sq / norm, batch)
        else:
            pair = accumulation_pair(reading.pre_sq / norm, self._pre_samples, reading.global_sq / norm, batch)
        self.gns.update(pair)
        self._policy_now = reading.policy_batch
        if self._timed is not None and reading.timed == self._world and reading.timed > 0:
            seconds = reading.step_time_s / reading.timed
            old = self.times.get(self._timed)
            if old is None:
                self.times[self._timed] = (seconds, 1)
            else:
                self.times[self._timed] = (_TIME_SMOOTHING * old[0] + (1 - _TIME_SMOOTHING) * seconds, old[1] + 1)
        self._timed = None
        self._refresh_report()

    # ----------------------------------------------------------------------------------------------- state, report

    def _refresh_report(self) -> None:
        sampler = self.state.sampler
        batch, base = sampler.global_batch, sampler.min_global_batch
        self.report = {
            "global_batch": batch,
            "base_batch": base,
            "max_batch": sampler.max_global_batch,
            "noise_scale": _reported_scale(self.gns.scale),
            "grad_variance": _finite(self.gns.noise),
            "grad_sq": _finite(self.gns.signal),
            "efficiency": self.gns.efficiency(batch, base),
            "gain": self.gns.gain(batch, base),
            "lr_rule": self.lr_rule,
            "lr_factor": self.lr_factor(),
            "scaled_steps": self.scaled_steps,
            "measured_steps": self.gns.updates,
            "batch_source": self.batch_source,
            "policy_batch": self._policy_now or None,
            "step_time_s": report_times(self.times),
        }

    def state_dict(self) -> dict[str, Any]:
        """The controller's state as JSON data (the estimate, the step-time table, the scaled steps)."""
        return {
            "gns": self.gns.state_dict(),
            "times": [[w, b, t, n] for (w, b), (t, n) in sorted(self.times.items())],
            "scaled_steps": self.scaled_steps,
        }

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore :meth:`state_dict` (after a rollback or a receive; ``None``: a state without one, kept as is).

        Raises:
            StateError: the state is malformed.
        """
        if state is None:
            return
        try:
            self.gns.load_state_dict(state["gns"])
            self.times = {(int(w), int(b)): (float(t), int(n)) for w, b, t, n in state["times"]}
            self.scaled_steps = float(state["scaled_steps"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"the adaptive-batch state {dict(state)!r:.200} is malformed: {exc}") from None
        self._refresh_report()


def report_times(times: Mapping[tuple[int, int], tuple[float, int]]) -> list[list[Any]]:
    """The step-time table as ``[[world size, batch, seconds, steps], ...]``: the :data:`REPORT_TIMES` most measured
    entries, in (world size, batch) order."""
    kept = sorted(times.items(), key=lambda item: (-item[1][1], item[0]))[:REPORT_TIMES]
    return [[w, b, t, n] for (w, b), (t, n) in sorted(kept)]


def _reported_scale(scale: float | None) -> float | None:
    """The noise scale as reported: ``None`` before a measurement, an infinite one (no signal measured: every batch
    is as efficient) as :data:`~slurm_amoeba.core.messages.MAX_NOISE_SCALE`, which JSON and the daemon take."""
    if scale is None or math.isnan(scale):
        return None
    return min(scale, MAX_NOISE_SCALE)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


__all__ = [
    "LR_RULES",
    "REPORT_TIMES",
    "AdaptedState",
    "AdaptiveBatch",
    "PolicyBatchReader",
    "best_batch",
    "default_rule",
    "fit_step_time",
    "goodput",
    "report_times",
]
