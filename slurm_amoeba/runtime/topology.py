"""What the sampler, the loader and the state are handed: the current generation, and who reduces gradients.

The runtime's user-facing objects (:class:`~slurm_amoeba.runtime.state.TorchState`, the sampler and the
:class:`~slurm_amoeba.runtime.loader.ElasticDataLoader`) reach no module global: :func:`slurm_amoeba.runtime.run`
binds the state to the worker's runtime before it calls ``train(state)`` (the state binds its sampler, which the
loader reads), and a test or a tool can bind them to anything that has the same few methods. This module holds
the interfaces the sampler and the loader read (:class:`Topology`), the gradient reducer's, and
:class:`Generation`, the description of one generation as one worker sees it (DESIGN.md, layer ``runtime/``, worker
side); what the state needs of the runtime (:class:`~slurm_amoeba.runtime.state.StepDriver`) is with the state. It
imports neither the worker, the state nor the coordinator.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass(frozen=True)
class Generation:
    """One generation as one member sees it.

    Attributes:
        number: the generation number (1 for the first).
        rank: this worker's rank in it.
        world_size: its number of members.
        local_rank: this worker's rank among the members on its host.
        local_world_size: the number of members on its host.
        members: worker ids in rank order.
        device: the torch device this worker trains on.
        backend: the process group's backend (``gloo`` or ``nccl``).
    """

    number: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    members: tuple[str, ...]
    device: torch.device
    backend: str


class Topology(Protocol):
    """What the loader needs to know about the current generation."""

    @property
    def rank(self) -> int:
        """This worker's rank."""

    @property
    def world_size(self) -> int:
        """The number of members."""

    def check_boundary(self) -> None:
        """Raise :class:`~slurm_amoeba.runtime.errors.MembershipChanged` when the members agreed to switch here."""


def idle_ranks(topology: Topology, step: int) -> frozenset[int]:
    """Ranks of ``topology`` that take no samples in step ``step``: the joiners of a scale-out in the generation's
    first step, while they receive the state (the members split that step as before). A topology without an
    ``idle_ranks(step)`` method (a test's or a tool's) has none."""
    method = getattr(topology, "idle_ranks", None)
    return frozenset() if method is None else frozenset(method(step))


class GradientReducer(Protocol):
    """What reduces a state's gradients in one generation, with the control word (see ``gradients``)."""

    def arm(self, control: float) -> None:
        """Start reducing during the step's last backward."""

    def finish(self, control: float) -> float:
        """Reduce what is left, wait, and return the control word summed over the members."""

    def abandon(self) -> None:
        """Forget pending reductions after a failure."""

    def zero(self) -> None:
        """Zero the gradients and the control word."""

    def close(self) -> None:
        """Release hooks (the reducer is replaced)."""
