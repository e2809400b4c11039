"""What the state and the loader are handed: the current generation, and who applies a step.

The runtime's user-facing objects (:class:`~slurm_amoeba.runtime.state.TorchState`, the sampler and the
:class:`~slurm_amoeba.runtime.loader.ElasticDataLoader`) reach no module global: :func:`slurm_amoeba.runtime.run`
binds the state to the worker's runtime before it calls ``train(state)`` (the state binds its sampler, which the
loader reads), and a test or a tool can bind them to anything that has the same few methods. This module holds
those interfaces and :class:`Generation`, the description of one generation as one worker sees it (DESIGN.md,
layer ``runtime/``, worker side); it imports neither the worker nor the coordinator.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from slurm_amoeba.runtime.state import TorchState


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


class StepDriver(Topology, Protocol):
    """What the state needs from the runtime: the two collectives behind ``state.step()`` and ``state.commit()``."""

    def apply_step(self, state: TorchState) -> None:
        """Reduce gradients over the members, step the optimizer, advance the sampler."""

    def agree_on_commit(self, step: int) -> None:
        """Check that every member commits at ``step``."""

    def before_last_micro_batch(self) -> None:
        """Start reducing gradient buckets during the step's last backward."""
