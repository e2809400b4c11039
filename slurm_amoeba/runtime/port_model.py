"""The ``DistributedDataParallel`` stand-in of a ported loop: gradients summed over the workers when backward ends.

:class:`ElasticDDP` wraps the user's model like DDP (``model.module`` is the model) and, like DDP, makes the
gradients after ``loss.backward()`` the global batch's on every worker, so that the user's own clipping,
``GradScaler``, ``optimizer.step()`` and ``scheduler.step()`` run unchanged after it. At the end of a training
backward (an autograd callback queued by the first gradient) it hands over to the loop
(:class:`~slurm_amoeba.runtime.port.ElasticLoop`), which weights this worker's gradients by its share of the step's
samples and all-reduces them with the runtime's control word (DESIGN.md, layer ``runtime/``, worker side).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch.autograd.variable import Variable


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
