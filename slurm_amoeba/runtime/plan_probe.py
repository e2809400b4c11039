"""The probe behind the plans: a model's bytes and seconds measured on one process, and a peak-memory meter.

:func:`probe_model` runs a few forward, backward and optimizer steps of the user's model on one process (no
process group), with and without activation checkpointing, at two micro-batch sizes, and returns the
:class:`~slurm_amoeba.runtime.plans.ModelProfile` that :class:`~slurm_amoeba.runtime.plans.PlanSpace` predicts from.
Bytes come from torch's own ``MemTracker`` (``torch.distributed._tools.mem_tracker``: it follows every tensor
storage that parameters, gradients, optimizer state, activations and temporaries hold, through the dispatcher, so
it counts the same on a CPU as on a GPU, whatever the allocator caches); seconds from timed passes (the median of a
few). :class:`PeakMeter` measures a live generation's peak the same way, so predicted and measured bytes count the
same things (DESIGN.md, layer ``runtime/``, worker side).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from slurm_amoeba.runtime.plans import Linear, ModelProfile

#: ``loss(model, samples)``: the loss of ``model`` on a micro-batch of ``samples`` samples of the job's data shape.
ProbeLoss = Callable[[torch.nn.Module, int], torch.Tensor]
#: ``blocks(model)``: the model's repeated blocks (what is sharded and checkpointed one at a time).
Blocks = Callable[[torch.nn.Module], Iterable[torch.nn.Module]]
#: Makes the unsharded model and its optimizer, seeded (the probe builds a few).
MakeModel = Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer]]


def checkpoint_blocks(blocks: Iterable[torch.nn.Module]) -> None:
    """Make each block recompute its activations in backward (``torch.utils.checkpoint``, non-reentrant).

    The block's own ``forward`` is wrapped on the instance, so its parameters, state-dict keys and FSDP2 hooks
    (which run around the module's call) stay as they are.
    """
    for block in blocks:
        inner = block.forward

        def forward(*args: Any, _inner: Callable[..., Any] = inner, **kwargs: Any) -> Any:
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        block.forward = forward


@functools.cache
def _step_tracker() -> type[Any]:
    """torch's ``MemTracker`` over several forwards of the root module (gradient accumulation): its per-module
    statistics (which this project does not read) start again at each root forward, which ``MemTracker`` would
    refuse as "multiple iterative calls"; the device totals and the peak go on.

    Built at the first meter: importing ``MemTracker`` costs about a second, which a worker that never measures
    (every worker imports this module through its shared device) does not pay.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    class StepTracker(MemTracker):  # type: ignore[no-untyped-call]
        def _pre_fw_hook(self, module: torch.nn.Module, inputs: Any) -> None:
            name = self._mod_tracker.get_known_fqn(module)  # type: ignore[no-untyped-call]
            again = module in self.memory_tracking and not self._mod_tracker.is_bw
            if again and set(self._mod_tracker.parents) - {name} == {"Global"}:
                self.reset_mod_stats()
            super()._pre_fw_hook(module, inputs)

    return StepTracker


class PeakMeter:
    """The peak bytes of tensors held while it runs: parameters, buffers, gradients and optimizer state that exist
    on entry, and every tensor made inside (torch's ``MemTracker``; counted per storage, as the device would).

    Enter and leave it in the same thread (a dispatch mode is per thread); tensors made in other threads are not
    counted.

    Args:
        model: the model whose parameters, buffers and gradients count from the start.
        optimizer: the optimizer whose state counts from the start.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self._tracker = _step_tracker()()
        self._tracker.track_external(model, optimizer, *(p.grad for p in model.parameters() if p.grad is not None))
        self._active = False
        self.peak_bytes = 0

    def start(self) -> None:
        """Begin counting."""
        self._tracker.__enter__()
        self._active = True

    def stop(self) -> int:
        """Stop counting (once; later calls only answer) and return the peak in bytes."""
        if self._active:
            self._active = False
            self._tracker.__exit__(None, None, None)
            peaks = self._tracker.get_tracker_snapshot("peak")
            self.peak_bytes = max((int(snap["Total"]) for snap in peaks.values()), default=0)
        return self.peak_bytes

    @property
    def active(self) -> bool:
        """Whether it is counting."""
        return self._active


def _state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, int]:
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = sum(
        v.numel() * v.element_size()
        for per_param in optimizer.state.values()
        for v in per_param.values()
        if isinstance(v, torch.Tensor)
    )
    return params, moments


def _one_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: ProbeLoss, samples: int) -> None:
    torch.autograd.backward(loss(model, samples))
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)


def _pass(model: torch.nn.Module, loss: ProbeLoss, samples: int) -> Callable[[], None]:
    return lambda: torch.autograd.backward(loss(model, samples))


def _timed(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def probe_model(
    make: MakeModel,
    loss: ProbeLoss,
    blocks: Blocks,
    sizes: tuple[int, int] = (2, 8),
    repeats: int = 3,
) -> ModelProfile:
    """Measure a model's bytes and seconds on this process (a second or so for a small model).

    For checkpointing off and on, and for each of ``sizes``: one step under :class:`PeakMeter` (its peak, less
    parameters, gradients and optimizer state, is the micro-batch's activations and temporaries), then
    ``repeats`` timed forwards and backwards; and ``repeats`` timed optimizer steps. The model's RNG use is
    undone (the torch RNG state is restored), so probing changes nothing a fixed-size run would see.

    Args:
        make: builds the unsharded model and its optimizer (seeded; called three times).
        loss: the loss of a model on a micro-batch of a given number of samples.
        blocks: the model's blocks (FSDP units and checkpointed regions).
        sizes: two micro-batch sizes, smaller first.
        repeats: timed passes per point (the median is kept).

    Returns:
        The profile.
    """
    rng = torch.get_rng_state()
    try:
        memory: dict[bool, Linear] = {}
        compute: dict[bool, Linear] = {}
        for checkpointing in (False, True):
            model, optimizer = make()
            if checkpointing:
                checkpoint_blocks(blocks(model))
            _one_step(model, optimizer, loss, sizes[0])  # the optimizer's state and the gradients exist from here
            params, moments = _state_bytes(model, optimizer)
            peaks, seconds = [], []
            for samples in sizes:
                meter = PeakMeter(model, optimizer)
                meter.start()
                try:
                    _one_step(model, optimizer, loss, samples)
                finally:
                    peak = meter.stop()
                peaks.append((samples, float(peak - 2 * params - moments)))
                seconds.append((samples, _timed(_pass(model, loss, samples), repeats)))
            memory[checkpointing] = Linear.through(peaks[0], peaks[1])
            compute[checkpointing] = Linear.through(seconds[0], seconds[1])
        model, optimizer = make()
        _one_step(model, optimizer, loss, sizes[0])
        params, moments = _state_bytes(model, optimizer)
        optimizer_s = _timed(optimizer.step, repeats)
        units = [sum(p.numel() * p.element_size() for p in b.parameters()) for b in blocks(model)]
        root = params - sum(units)
    finally:
        torch.set_rng_state(rng)
    return ModelProfile(
        param_bytes=params,
        optimizer_bytes=moments,
        largest_unit_bytes=max([root, *units]),
        units=len(units) + 1,
        memory=memory[False],
        memory_checkpointed=memory[True],
        compute=compute[False],
        compute_checkpointed=compute[True],
        optimizer_s=optimizer_s,
    )
