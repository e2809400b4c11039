"""The ``DistributedDataParallel`` stand-in of a ported loop: gradients summed over the workers when backward ends.

:class:`ElasticDDP` wraps the user's model like DDP (``model.module`` is the model) and, like DDP, makes the
gradients after ``loss.backward()`` the global batch's on every worker, so that the user's own clipping,
``GradScaler``, ``optimizer.step()`` and ``scheduler.step()`` run unchanged after it. At the end of a training
backward (an autograd callback queued by the first gradient) it hands over to the loop
(:class:`~slurm_amoeba.runtime.port.ElasticLoop`), which weights this worker's gradients by its share of the step's
samples and all-reduces them with the runtime's control word (DESIGN.md, layer ``runtime/``, worker side).

When a memory cap cuts a worker's share of a step into several micro-batches (gradient accumulation), the loop holds
the weighted partial sums between them and :class:`HeldSteps` makes the script's ``optimizer.step()``, schedulers'
``step()`` and ``GradScaler``'s ``unscale_``/``step``/``update`` take effect only in the step's last micro-batch.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch.autograd.variable import Variable
from torch.optim.lr_scheduler import LRScheduler


class BackwardOwner(Protocol):
    """What :class:`ElasticDDP` asks of the loop that owns the step."""

    def step_open(self) -> bool:
        """Whether a training forward now belongs to a step of the loader whose gradients are not reduced yet."""

    def after_backward(self) -> None:
        """Weight and reduce this step's gradients (called once when the step's backward ends)."""


class ElasticDDP(torch.nn.Module):
    """The user's model, with DDP's contract on gradients (made by ``ElasticLoop.wrap``).

    Args:
        module: the model.
        owner: the loop that reduces the gradients when a step's backward ends.
    """

    def __init__(self, module: torch.nn.Module, owner: BackwardOwner) -> None:
        super().__init__()
        self.module = module
        self._owner = owner
        self._armed = False
        self._queued = False
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._on_gradient)  # type: ignore[no-untyped-call]
            for p in module.parameters()
            if p.requires_grad
        ]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's forward; in a training step of the loader it arms the reduce at the end of backward."""
        if self.training and torch.is_grad_enabled() and self._owner.step_open():
            self._armed = True
        return self.module(*args, **kwargs)

    def _on_gradient(self, param: torch.Tensor) -> None:
        if self._armed and not self._queued:
            self._queued = True
            Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self) -> None:
        self._armed = self._queued = False
        self._owner.after_backward()


class HeldSteps:
    """Holds the script's optimizer, scheduler and scaler steps back in a step's micro-batches but the last.

    The script's loop runs once per micro-batch; its ``optimizer.step()``, ``scheduler.step()``,
    ``scaler.unscale_()``, ``scaler.step()`` and ``scaler.update()`` return ``None`` without effect while
    ``holding()`` says a micro-batch of the step is still to come, and act as written in the last one (the scale
    thus stays the same over a step's micro-batches); outside the loader's steps they act as always. The optimizer's
    and the scaler's methods are replaced on the objects (their ``state_dict()`` does not read the instance's
    attributes; the optimizer's ``step`` is often an instance attribute already: the LR scheduler's counting
    wrapper, which stays inside). A scheduler's ``state_dict()`` is its instance's attributes, so a scheduler instead
    becomes an instance of a subclass of its own class, of the same name, whose ``step`` asks first.

    Args:
        holding: whether the micro-batch in flight is not its step's last.
        optimizer: the script's optimizer.
        schedulers: its LR schedulers.
        scaler: its ``GradScaler``, if any.
    """

    def __init__(
        self,
        holding: Callable[[], bool],
        optimizer: torch.optim.Optimizer,
        schedulers: Sequence[LRScheduler],
        scaler: torch.amp.GradScaler | None,
    ) -> None:
        self._holding = holding
        self._hold_method(optimizer, "step")
        for name in ("unscale_", "step", "update") if scaler is not None else ():
            self._hold_method(scaler, name)
        for scheduler in schedulers:
            self._hold_class_step(scheduler)

    def _hold_method(self, owner: object, name: str) -> None:
        original = getattr(owner, name)
        holding = self._holding

        # functools.wraps keeps the attributes torch's LR scheduler marks its own wrapper of optimizer.step with.
        @functools.wraps(original)
        def held(bound: object, *args: Any, **kwargs: Any) -> Any:
            return None if holding() else original(*args, **kwargs)

        setattr(owner, name, types.MethodType(held, owner))

    def _hold_class_step(self, scheduler: LRScheduler) -> None:
        own = type(scheduler)
        holding = self._holding

        @functools.wraps(own.step)
        def step(self: LRScheduler, *args: Any, **kwargs: Any) -> None:
            if not holding():
                own.step(self, *args, **kwargs)

        names = {"step": step, "__module__": own.__module__, "__qualname__": own.__qualname__}
        scheduler.__class__ = type(own.__name__, (own,), names)
