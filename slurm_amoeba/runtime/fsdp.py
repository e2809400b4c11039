"""FSDP2 (``fully_shard``) models in the elastic runtime: re-sharded over each generation's mesh, in memory.

A sharded model is bound to the device mesh of one process group, and every generation has its own. So the
state keeps the model's and optimizer's **full** state dicts (``torch.distributed.checkpoint.state_dict`` with
``full_state_dict=True``), gathered from the live members where a generation may end — at a commit and at the step
where the members agreed to switch — and builds the model again in each generation: the user's ``build(mesh)``
makes a fresh model, applies ``fully_shard`` on the new mesh and makes the optimizer and schedulers; the full
state is then loaded into it (each member holds the same full copy, so loading shards it locally). The full state
goes to the joiners like any other state (JSON manifest, one broadcast per dtype); nothing touches a disk
(DESIGN.md, layer ``runtime/``, worker side).

FSDP reduces the gradients itself (reduce-scatter during backward): :class:`ShardedReducer` turns that sync off
for every micro-batch but a step's last (the loader says which) and multiplies the averaged gradient shards by
the world size, so that the loader's weights make it the global batch's mean, exactly as with the flat buckets
(``set_gradient_divide_factor(1.0)`` would say the same more cheaply but makes FSDP reduce with ``PREMUL_SUM``,
which gloo refuses in torch 2.13); the control word travels in a one-element all-reduce at the step's end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.optim.lr_scheduler import LRScheduler

from slurm_amoeba.runtime.errors import RuntimeConfigError, StateError
from slurm_amoeba.runtime.sampler import ElasticSampler
from slurm_amoeba.runtime.state import TorchState, clone_tree

if TYPE_CHECKING:
    from slurm_amoeba.runtime.topology import GradientReducer

_FULL = StateDictOptions(full_state_dict=True)


@dataclasses.dataclass
class Built:
    """What ``build(mesh)`` returns: a model (sharded with ``fully_shard`` when a mesh is given), its optimizer, and
    the LR schedulers over that optimizer."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedulers: Sequence[LRScheduler] = ()


Build = Callable[[DeviceMesh | None], Built]


class ShardedReducer:
    """The gradient reducer of an FSDP2 model: FSDP reduce-scatters in the step's last backward; this adds the
    control word.

    Args:
        model: the root module, sharded with ``fully_shard``.
        device: where the control word lives (the process group's device).

    Raises:
        RuntimeConfigError: the model's root is not an ``FSDPModule``.
    """

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        if not isinstance(model, FSDPModule):
            raise RuntimeConfigError(
                f"build(mesh) returned a {type(model).__name__} that is not sharded: apply "
                "torch.distributed.fsdp.fully_shard(model, mesh=mesh) to the root module (and to its blocks) in build"
            )
        self.model = model
        self.control = torch.zeros(1, device=device)
        self.world_size = dist.get_world_size()
        model.set_requires_gradient_sync(False)
        self._armed = False

    def arm(self, control: float) -> None:
        """Let FSDP reduce-scatter during the step's last backward."""
        self.control.fill_(control)
        self.model.set_requires_gradient_sync(True)
        self._armed = True

    def finish(self, control: float) -> float:
        """Undo FSDP's average (the loader's weights already make the sum the mean); all-reduce the control word.

        Raises:
            RuntimeConfigError: the step's last micro-batch was not announced (the loop does not use the loader).
            RuntimeError: the all-reduce failed.
        """
        if not self._armed:
            raise RuntimeConfigError(
                "a sharded model's gradients are reduced during the step's last backward, which the "
                "ElasticDataLoader announces: iterate each step's micro-batches from the loader (for batch, weight in "
                "step) before state.step() or state.sync()"
            )
        self.model.set_requires_gradient_sync(False)
        self._armed = False
        if self.world_size > 1:
            with torch.no_grad():
                for param in self.model.parameters():
                    if param.grad is not None:
                        param.grad.mul_(self.world_size)
        dist.all_reduce(self.control)
        return float(self.control.item())

    def abandon(self) -> None:
        """Forget the step (after a failure)."""
        self._armed = False

    def zero(self) -> None:
        """Drop the gradients and zero the control word."""
        self.model.zero_grad(set_to_none=True)
        self.control.zero_()

    def close(self) -> None:
        """Nothing to release (no hooks of our own)."""


class _BeforeFirstGeneration:
    """The reducer asked for before any process group exists (the runtime's warm-up): the model is only sharded
    when a generation forms, so there is nothing to prepare yet."""

    def arm(self, control: float) -> None:
        """Nothing to arm."""

    def finish(self, control: float) -> float:
        """Refuse: no generation.

        Raises:
            RuntimeConfigError: always.
        """
        raise RuntimeConfigError("a sharded model is reduced only inside a generation of slurm_amoeba.runtime.run()")

    def abandon(self) -> None:
        """Nothing pending."""

    def zero(self) -> None:
        """Nothing to zero."""

    def close(self) -> None:
        """Nothing to release."""


class ShardedState(TorchState):
    """The training state of an FSDP2 model that is re-sharded over each generation's members.

    Inside ``train(state)`` use ``state.model``, ``state.optimizer`` and ``state.schedulers``: they are built again
    in every generation. Everything else is :class:`~slurm_amoeba.runtime.state.TorchState`'s (``step``, ``sync``,
    ``commit``, extras, the scaler). A commit and a switch each gather the full state on every member (a
    collective, and one full copy of model and optimizer in each member's CPU/GPU memory).

    Args:
        build: ``build(mesh)`` makes the model, applies ``fully_shard(..., mesh=mesh)`` when ``mesh`` is not
            ``None``, and makes its optimizer and schedulers; it is called once with ``None`` here (the initial
            state, unsharded) and once per generation. Seed it: every worker must build the same initial model.
        sampler: the elastic sampler.
        extras: user values that survive resizes and rollbacks.
        scaler: a ``torch.amp.GradScaler``, if any.
    """

    joiners_may_idle = False  # every rank of the mesh takes part in each forward's all-gathers
    received_is_commit = False  # the received full state is kept for the next build (load_tree), not committed

    def __init__(
        self,
        build: Build,
        sampler: ElasticSampler,
        extras: Mapping[str, Any] | None = None,
        *,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        built = build(None)
        super().__init__(built.model, built.optimizer, sampler, extras, schedulers=built.schedulers, scaler=scaler)
        self._build = build
        self._full: dict[str, Any] = self._gather()
        self.mesh: DeviceMesh | None = None
        self._builds = 0

    def _gather(self) -> dict[str, Any]:
        """The full model and optimizer state dicts (a collective once the model is sharded).

        An optimizer that has not stepped yet is recorded as ``None`` and left fresh in the next build: torch's
        full state dict of it would first initialise its state with a step (Adam's step count would then differ
        from an unsharded run's).
        """
        optimizer = None
        if self.optimizer.state:
            optimizer = dict(get_optimizer_state_dict(self.model, self.optimizer, options=_FULL))
        return {"model": dict(get_model_state_dict(self.model, options=_FULL)), "optimizer": optimizer}

    def after_step(self) -> None:
        """Gather the full state at the step where the members agreed to switch, while the old group lives."""
        if self.switch_pending():
            self._full = self._gather()

    def commit(self) -> None:
        """Gather the full state, then commit it (see :meth:`TorchState.commit`; **a collective**)."""
        self._full = self._gather()
        super().commit()

    def unchanging_storage(self) -> frozenset[int]:
        """None: the state sent is the last gather's full state dicts, not the (sharded) parameters; it is copied
        like everything else (see :meth:`TorchState.unchanging_storage`)."""
        return frozenset()

    def as_tree(self) -> dict[str, Any]:
        """The state with the full model and optimizer state dicts of the last gather (not copied)."""
        tree = super().as_tree()
        tree["model"] = self._full["model"]
        tree["optimizer"] = self._full["optimizer"]
        return tree

    def load_received(self, tree: Mapping[str, Any]) -> None:
        """Like :meth:`load_tree` (the runtime commits afterwards: :attr:`received_is_commit` is off)."""
        self.load_tree(tree)

    def load_tree(self, tree: Mapping[str, Any]) -> None:
        """Keep the full state for the next build; put the rest (sampler, RNG, extras, schedulers) in place.

        Raises:
            StateError: the tree's model entries are not this model's.
        """
        own = set(self.model.state_dict())
        if set(tree["model"]) != own:
            raise StateError(
                f"the received model entries {sorted(set(tree['model']) ^ own)[:3]} differ from this worker's model; "
                "build the same model in every worker"
            )
        optimizer = tree["optimizer"]
        self._full = {"model": dict(tree["model"]), "optimizer": None if optimizer is None else dict(optimizer)}
        self.sampler.load_state_dict(tree["progress"])
        torch.set_rng_state(tree["rng"]["cpu"].cpu())
        if "cuda" in tree["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state(tree["rng"]["cuda"].cpu())
        self.extras.replace_all(tree["extras"])
        self._load_parts(tree)  # into the current schedulers; the next build takes their state over

    def gradient_reducer(self, previous: GradientReducer | None) -> GradientReducer:
        """Build the model on this generation's mesh, load the full state into it, and return its reducer.

        A collective (every member calls it as the generation starts).

        Raises:
            RuntimeConfigError: ``build`` returned a model that is not sharded.
            StateError: the full state does not fit the new model.
        """
        if previous is not None:
            previous.close()
        if not dist.is_initialized():
            return _BeforeFirstGeneration()
        parts = self.capture_parts()
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        # A new dimension name per build: torch compares meshes (and caches shard offsets by mesh) without this
        # process's rank, so a generation of the same size in which this worker has another rank would otherwise
        # be handed the offsets of an earlier generation (the wrong shard).
        self._builds += 1
        device_type = "cuda" if device is not None else "cpu"
        self.mesh = init_device_mesh(device_type, (dist.get_world_size(),), mesh_dim_names=(f"amoeba{self._builds}",))
        built = self._build(self.mesh)
        self.take_built(built, parts)
        return ShardedReducer(self.model, device or torch.device("cpu"))

    def take_built(self, built: Built, parts: Mapping[str, Any]) -> None:
        """Make a freshly built model, optimizer and schedulers the live ones and load the full state into them.

        Args:
            built: what ``build`` returned for this generation.
            parts: the schedulers' and the scaler's state (:meth:`capture_parts`).

        Raises:
            StateError: the full state does not fit the new model.
        """
        self.model, self.optimizer, self.schedulers = built.model, built.optimizer, list(built.schedulers)
        full = clone_tree(self._full)
        try:
            set_model_state_dict(self.model, full["model"], options=_FULL)
            if full["optimizer"] is not None:
                set_optimizer_state_dict(self.model, self.optimizer, full["optimizer"], options=_FULL)
        except (RuntimeError, ValueError, KeyError) as exc:
            raise StateError(f"the full state does not fit the model that build(mesh) made: {exc}") from None
        self._load_parts(parts)

    def capture_parts(self) -> dict[str, Any]:
        """A copy of the schedulers' and the scaler's current state (what a rebuilt generation starts from)."""
        return {
            "schedulers": [clone_tree(s.state_dict()) for s in self.schedulers],
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
        }
