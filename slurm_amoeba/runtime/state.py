"""Training state: commit, restore, and the tensor encoding used to send it to joining workers.

:class:`TorchState` holds what a worker must agree on with the others: the model's parameters and buffers, the
optimizer's state, the sampler's position (epoch, cursor, step), the torch RNG state and the user's extras
(counters, best loss, ...). ``commit()`` keeps an in-memory copy; after a failure the survivors ``restore()`` it.
When workers join, one member sends its state to the others as tensors over ``torch.distributed.broadcast``; the
structure around the tensors travels as JSON (:func:`encode_tree`) — never pickle (DESIGN.md, layer ``runtime/``).

The state reaches no module global: :func:`slurm_amoeba.runtime.run` binds it to the worker's runtime (a
:class:`StepDriver`, what the state needs of the runtime) before it calls ``train(state)``, and the state binds its
sampler to the same topology for the loader.
"""

from __future__ import annotations

import collections.abc
import contextlib
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, ClassVar, Protocol

import torch
from torch.optim.lr_scheduler import LRScheduler

from slurm_amoeba.runtime.adaptive import AdaptiveBatch
from slurm_amoeba.runtime.errors import MembershipChanged, RuntimeConfigError, StateError
from slurm_amoeba.runtime.gradients import GradientBuckets
from slurm_amoeba.runtime.sampler import ElasticSampler
from slurm_amoeba.runtime.shared_device import SharedDevice
from slurm_amoeba.runtime.topology import GradientReducer, Topology

log = logging.getLogger(__name__)

_TENSOR = "__tensor__"
_DICT = "__dict__"
_TUPLE = "__tuple__"


def _check_json_scalar(value: object, path: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        return  # JSON as written by Python round-trips inf and nan
    if value is None or isinstance(value, bool | int | float | str):
        return
    raise StateError(
        f"{path} holds a {type(value).__name__} ({value!r:.60}), which cannot be sent to a joining worker: "
        "state is sent as tensors plus JSON numbers, strings, lists and dicts; keep it out of the state or store it "
        "as one of those"
    )


def encode_tree(obj: object, path: str, tensors: list[torch.Tensor]) -> Any:
    """Turn nested state into a JSON-able skeleton, moving every tensor into ``tensors``.

    Dicts keep the type of their keys (``int`` or ``str``), tuples stay tuples; a tensor becomes a reference to its
    position in ``tensors``.

    Args:
        obj: the state (dicts, lists, tuples, tensors, JSON scalars).
        path: where ``obj`` is, for error messages (e.g. ``"optimizer.state"``).
        tensors: receives the tensors, in order.

    Returns:
        The skeleton.

    Raises:
        StateError: something in ``obj`` cannot be sent; the message names its path and type.
    """
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.is_quantized:
            raise StateError(f"{path} is a {obj.layout} tensor, which cannot be sent; convert it to a dense tensor")
        tensors.append(obj.detach())
        return {_TENSOR: len(tensors) - 1}
    if isinstance(obj, dict):
        items = []
        for key, value in obj.items():
            if not isinstance(key, str | int) or isinstance(key, bool):
                raise StateError(f"{path} has a key {key!r} of type {type(key).__name__}; keys must be str or int")
            items.append([key, encode_tree(value, f"{path}[{key!r}]", tensors)])
        return {_DICT: items}
    if isinstance(obj, tuple):
        return {_TUPLE: [encode_tree(v, f"{path}[{i}]", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode_tree(v, f"{path}[{i}]", tensors) for i, v in enumerate(obj)]
    _check_json_scalar(obj, path)
    return obj


def decode_tree(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """Inverse of :func:`encode_tree`.

    Args:
        skeleton: the skeleton.
        tensors: the tensors it refers to.

    Returns:
        The rebuilt state.

    Raises:
        StateError: the skeleton refers to a tensor that is not there.
    """
    if isinstance(skeleton, dict):
        if _TENSOR in skeleton:
            index = int(skeleton[_TENSOR])
            if not 0 <= index < len(tensors):
                raise StateError(f"state skeleton refers to tensor {index} but only {len(tensors)} arrived")
            return tensors[index]
        if _DICT in skeleton:
            return {key: decode_tree(value, tensors) for key, value in skeleton[_DICT]}
        if _TUPLE in skeleton:
            return tuple(decode_tree(v, tensors) for v in skeleton[_TUPLE])
        raise StateError(f"state skeleton has an unknown object {sorted(skeleton)!r}")
    if isinstance(skeleton, list):
        return [decode_tree(v, tensors) for v in skeleton]
    return skeleton


def clone_tree(obj: Any) -> Any:
    """Deep copy of nested state, cloning tensors (the in-memory commit)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: clone_tree(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(clone_tree(v) for v in obj)
    if isinstance(obj, list):
        return [clone_tree(v) for v in obj]
    return obj


def _model_problem(model: torch.nn.Module, entries: list[Any]) -> str | None:
    """How a sender's model entries (``[name, dtype, shape]``) differ from ``model``'s, or ``None``."""
    mine = model.state_dict()
    theirs = {str(name): (dtype, list(shape)) for name, dtype, shape in entries}
    missing = sorted(set(theirs) - set(mine))
    extra = sorted(set(mine) - set(theirs))
    if missing or extra:
        return (
            f"the model here has entries {extra[:3]} that the running workers lack and lacks {missing[:3]}; "
            "build the same model in every worker"
        )
    for name, tensor in mine.items():
        dtype, shape = theirs[name]
        if list(tensor.shape) != shape or str(tensor.dtype) != dtype:
            return (
                f"model entry {name!r} has shape {list(tensor.shape)} and {tensor.dtype} here but {shape} and "
                f"{dtype} on the running workers; build the same model in every worker"
            )
    return None


class _CommitCopy:
    """The part of a commit that is copied in a thread of its own: the model's parameters and the optimizer's state.

    Nothing changes those tensors until the next optimizer step (a forward and backward read parameters and write
    only gradients), so a joiner and a sender can start their first step of a new generation while the copy runs;
    :meth:`TorchState.settle` waits for it before the optimizer steps, before a restore and before the next commit.
    Buffers (which a forward may update in place: batch-norm statistics), the RNG, the sampler's position, extras and
    the small parts are copied before the thread starts.
    """

    def __init__(self, eager: dict[str, Any], deferred: dict[str, Any], order: list[str]) -> None:
        self._eager = eager
        self._deferred = deferred
        self._order = order
        self._copied: dict[str, Any] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._copy, name="amoeba-commit", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        try:
            self._copied = clone_tree(self._deferred)
        except BaseException as exc:  # re-raised in the training thread by result()
            self._error = exc

    def result(self) -> dict[str, Any]:
        """The whole commit, once the copy is done.

        Raises:
            BaseException: what the copy raised (e.g. out of memory).
        """
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._copied is not None
        tree = dict(self._eager)
        params = self._copied["params"]
        tree["model"] = {name: params[name] if name in params else self._eager["model"][name] for name in self._order}
        tree["optimizer"] = self._copied["optimizer"]
        return tree


class StateExtras(MutableMapping[str, Any]):
    """The user's extra state (``epoch``-like counters, best loss, small tensors), checked on every assignment.

    Values must be tensors or JSON data (numbers, strings, booleans, ``None``, lists and dicts of them). A value
    that cannot be sent is refused at once, and the previous value is kept.
    """

    def __init__(self, initial: Mapping[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = {}
        for key, value in (initial or {}).items():
            self[key] = value

    def __setitem__(self, key: str, value: Any) -> None:
        if not isinstance(key, str):
            raise StateError(f"state extra key {key!r} must be a str")
        encode_tree(value, f"state extra {key!r}", [])
        self._data[key] = value

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __delitem__(self, key: str) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def replace_all(self, values: Mapping[str, Any]) -> None:
        """Replace every extra at once (after a restore or a receive)."""
        self._data = dict(values)


ResetCallback = Callable[[], None]


class StepDriver(Topology, Protocol):
    """What the state needs from the runtime: the collectives behind ``state.step()``/``sync()``/``commit()``."""

    def apply_step(self, state: TorchState) -> None:
        """Reduce gradients over the members, step the optimizer, advance the sampler."""

    def reduce_gradients(self) -> None:
        """Reduce gradients over the members (the first half of a step whose optimizer step the user calls)."""

    def end_step(self, state: TorchState) -> None:
        """Zero gradients and advance the sampler (the second half)."""

    def agree_on_commit(self, step: int, snapshot: Mapping[str, Any] | None = None) -> None:
        """Check that every member commits at ``step`` (and write ``snapshot`` to disk when a checkpoint is due)."""

    def before_last_micro_batch(self) -> None:
        """Start reducing gradient buckets during the step's last backward."""


def refuse_wrapped(model: torch.nn.Module) -> None:
    """Refuse a model wrapped in ``DistributedDataParallel`` (or FSDP1), saying what to do instead.

    Such a wrapper is bound to one process group, and each generation has its own; the runtime reduces the
    gradients itself (or, for a sharded model, re-shards it per generation: ``slurm_amoeba.runtime.fsdp``).

    Raises:
        RuntimeConfigError: the model is wrapped.
    """
    name = type(model).__name__
    if name in ("DistributedDataParallel", "FullyShardedDataParallel") or hasattr(model, "_fsdp_wrapped_module"):
        inner = "model.module" if name == "DistributedDataParallel" else "the unwrapped module"
        raise RuntimeConfigError(
            f"TorchState got a model wrapped in {name}, which is bound to one process group while every generation "
            f"of an elastic job has its own: pass {inner} instead and do not wrap it (the runtime all-reduces the "
            "gradients like DDP); for a sharded model use slurm_amoeba.runtime.fsdp.ShardedState with fully_shard"
        )


class TorchState:
    """The training state of one worker (the Horovod-shaped user API).

    Args:
        model: the model (a plain ``nn.Module``; no DDP wrapper needed: the runtime reduces gradients).
        optimizer: its optimizer.
        sampler: the elastic sampler; its position is part of the state.
        extras: user values that must survive resizes and rollbacks (see :class:`StateExtras`).
        schedulers: LR schedulers (``torch.optim.lr_scheduler``) whose state travels and rolls back with the rest.
        scaler: a ``torch.amp.GradScaler`` whose scale and growth tracker travel and roll back with the rest.
        adaptive: the adaptive-batch controller (:mod:`~slurm_amoeba.runtime.adaptive`); a default one when the
            sampler has ``max_global_batch`` and this is ``None``.
        warm_up: one forward and backward of the model on a batch of your data's shape (e.g.
            ``lambda m: loss_fn(m(x0), y0).backward()``), which a joining worker runs while the others still train, so
            that its first real step does not pay the first-call costs of your model's kernels (docs/runtime.md
            section 2). The runtime zeroes the gradients and restores the model, the optimizer and the RNG after it.
        sharing: how this worker shares its device (:class:`~slurm_amoeba.runtime.shared_device.SharedDevice`:
            memory cap, pacing; docs/runtime.md "Sharing a GPU"); a default one when the job opted in to sharing
            (``AMOEBA_SHARE`` set to a sharing mode, or ``1``).

    Raises:
        StateError: an extra cannot be sent.
        RuntimeConfigError: the model is wrapped in ``DistributedDataParallel`` (pass ``model.module``).
    """

    #: Joiners may spend their first step receiving the state, without samples (the members split that step as
    #: before the switch); a model that needs every rank in each forward (FSDP) turns it off.
    joiners_may_idle: ClassVar[bool] = True
    #: :meth:`load_received` makes the received state the commit (the runtime then makes no commit of its own).
    received_is_commit: ClassVar[bool] = True

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        sampler: ElasticSampler,
        extras: Mapping[str, Any] | None = None,
        *,
        schedulers: Sequence[LRScheduler] = (),
        scaler: torch.amp.GradScaler | None = None,
        adaptive: AdaptiveBatch | None = None,
        warm_up: Callable[[torch.nn.Module], object] | None = None,
        sharing: SharedDevice | None = None,
    ) -> None:
        refuse_wrapped(model)
        self.warm_up = warm_up
        self.model = model
        self.optimizer = optimizer
        self.sampler = sampler
        self.extras = StateExtras(extras)
        self.schedulers = list(schedulers)
        self.scaler = scaler
        self._reset_callbacks: list[ResetCallback] = []
        self._committed: dict[str, Any] | None = None
        self._copying: _CommitCopy | None = None
        self._driver: StepDriver | None = None
        self.adaptive = self._adaptive_controller(adaptive)
        self.sharing = sharing if sharing is not None else SharedDevice.for_job(os.environ)

    def _adaptive_controller(self, adaptive: AdaptiveBatch | None) -> AdaptiveBatch | None:
        """The state's adaptive-batch controller: ``adaptive``, a default one for an adaptive sampler, or ``None``
        (a fixed batch).

        Raises:
            RuntimeConfigError: see :meth:`~slurm_amoeba.runtime.adaptive.AdaptiveBatch.attach`.
        """
        if adaptive is None and not self.sampler.adaptive:
            return None
        controller = adaptive if adaptive is not None else AdaptiveBatch()
        own_reduction = type(self).gradient_reducer is TorchState.gradient_reducer
        controller.attach(self, own_reduction=own_reduction)
        return controller

    def bind(self, driver: StepDriver | None) -> None:
        """Hand the state the runtime that applies its steps (``run()`` does it; ``None`` detaches).

        The sampler is bound to the same topology, so that an ``ElasticDataLoader`` over it knows the generation.

        Args:
            driver: the worker's runtime, or anything with the same methods (tests).
        """
        self._driver = driver
        self.sampler.bind(driver)
        if driver is not None and self.sharing is not None:
            self.sharing.attach(self)

    @property
    def driver(self) -> StepDriver:
        """The runtime this state is bound to.

        Raises:
            RuntimeConfigError: the state is not bound (used outside ``slurm_amoeba.runtime.run()``).
        """
        if self._driver is None:
            raise RuntimeConfigError(
                "this TorchState is not bound to a runtime: call state.step() and state.commit() inside "
                "slurm_amoeba.runtime.run(train, state)"
            )
        return self._driver

    # ----------------------------------------------------------------------------------------------- user API

    @property
    def epoch(self) -> int:
        """The current epoch (advanced by :meth:`step` at the end of each epoch)."""
        return self.sampler.progress.epoch

    @property
    def step_index(self) -> int:
        """Optimizer steps applied since the start of training."""
        return self.sampler.progress.step

    @property
    def committed_step(self) -> int:
        """The step of the last commit, or -1 before the first."""
        self.settle()
        return -1 if self._committed is None else int(self._committed["progress"]["step"])

    def register_reset_callbacks(self, callbacks: collections.abc.Iterable[ResetCallback]) -> None:
        """Add functions called after every membership change or rollback, once the state is in place.

        Use them for what depends on the world size, e.g. rescaling a learning rate (the global batch itself does
        not change). They run on every member, with the new generation already formed.

        Args:
            callbacks: functions taking no arguments.
        """
        self._reset_callbacks.extend(callbacks)

    def step(self) -> None:
        """Apply one optimizer step: reduce gradients over the workers, step the optimizer, advance the sampler.

        **A collective**: every member calls it once per step (after the step's micro-batches). The membership
        control word rides on the same all-reduce, so a pending resize costs nothing here.

        Raises:
            RuntimeConfigError: the state is used outside ``slurm_amoeba.runtime.run()``.
            WorkerFailure: the all-reduce failed (a peer died); the elastic entry point rolls back.
        """
        self.driver.apply_step(self)
        self.after_step()

    @contextlib.contextmanager
    def sync(self) -> Iterator[None]:
        """Your own optimizer step, on gradients reduced over the workers: ``with state.sync(): optimizer.step()``.

        On entry the gradients are all-reduced (with the control word), so inside the block they are the global
        batch's: ``scaler.unscale_(optimizer)``, ``clip_grad_norm_``, ``scaler.step(optimizer)``,
        ``scaler.update()``, ``scheduler.step()`` all see the same values on every worker. On a normal exit the
        gradients are zeroed and the sampler advances (the step counts); if the block raises, neither happens.
        **A collective**, like :meth:`step`, which is ``with state.sync(): state.optimizer.step()``.

        Raises:
            RuntimeConfigError: the state is used outside ``slurm_amoeba.runtime.run()``.
            WorkerFailure: the all-reduce failed (a peer died); the elastic entry point rolls back.
        """
        driver = self.driver
        driver.reduce_gradients()
        self.settle()
        yield
        driver.end_step(self)
        self.after_step()

    def after_step(self) -> None:
        """Called after each step's end (a hook for states that must act before a switch; the adaptive batch's)."""
        if self.adaptive is not None:
            self.adaptive.after_step()
        if self.sharing is not None:
            self.sharing.after_step(self)

    def progress_report(self) -> dict[str, Any]:
        """The position (and the adaptive batch's measurements) for the coordinator's progress report."""
        report: dict[str, Any] = dict(self.sampler.state_dict())
        if self.adaptive is not None:
            report["adaptive"] = self.adaptive.report
        if self.sharing is not None:
            report["share"] = self.sharing.report
        return report

    def switch_pending(self) -> bool:
        """Whether the members agreed to end the generation at this step boundary."""
        try:
            self.driver.check_boundary()
        except MembershipChanged:
            return True
        return False

    def commit(self) -> None:
        """Keep an in-memory copy of the state to roll back to after a failure.

        **A collective**: every member must call it at the same step (it checks that with a tiny all-reduce).
        The runtime also commits on its own after every membership change.

        Raises:
            StateError: the state cannot be sent (the previous commit is kept).
            RuntimeConfigError: the members called it at different steps, or the state is used outside
                ``slurm_amoeba.runtime.run()``.
            WorkerFailure: the check failed because a peer died.
        """
        self.settle()
        snapshot = self.capture()
        self.driver.agree_on_commit(self.step_index, snapshot)
        self._committed = snapshot

    # ----------------------------------------------------------------------------------------------- runtime API

    def capture(self) -> dict[str, Any]:
        """A deep copy of the whole state, after checking that it can be sent.

        Raises:
            StateError: something in the state cannot be sent.
        """
        tree = self.as_tree()
        encode_tree(tree, "state", [])
        copied: dict[str, Any] = clone_tree(tree)
        return copied

    def unchanging_storage(self) -> frozenset[int]:
        """Data pointers of what only the optimizer's step changes (parameters, optimizer state): a switch's source
        sends those uncopied and waits for the sends before its next step (runtime/transfer.py)."""
        pointers = {p.data_ptr() for p in self.model.parameters()}
        for per_param in self.optimizer.state.values():
            pointers.update(v.data_ptr() for v in per_param.values() if isinstance(v, torch.Tensor))
        return frozenset(pointers)

    def save(self, *, background: bool = False) -> None:
        """Commit without the collective check (the runtime calls it where all members are known to agree).

        Args:
            background: copy the parameters and the optimizer's state in a thread (see :class:`_CommitCopy`); the
                runtime does so at a switch, so that the first step of the new generation does not wait for the
                copy. :meth:`settle` waits for it.

        Raises:
            StateError: the state cannot be sent (the previous commit is kept).
        """
        self.settle()
        if not background:
            self._committed = self.capture()
            return
        tree = self.as_tree()
        encode_tree(tree, "state", [])
        parameters = {name for name, _ in self.model.named_parameters()}
        model = tree["model"]
        deferred = {
            "params": {name: value for name, value in model.items() if name in parameters},
            "optimizer": tree.pop("optimizer"),
        }
        tree["model"] = {name: value for name, value in model.items() if name not in parameters}
        self._copying = _CommitCopy(clone_tree(tree), deferred, list(model))

    def settle(self) -> None:
        """Wait until a commit being copied in the background is complete (before anything may change the state).

        Raises:
            BaseException: what the background copy raised; the commit is then the previous one.
        """
        copying, self._copying = self._copying, None
        if copying is not None:
            self._committed = copying.result()

    def restore(self) -> None:
        """Go back to the last commit (local; every survivor does it after a failure).

        Raises:
            StateError: there is no commit to go back to.
        """
        self.settle()
        if self._committed is None:
            raise StateError("restore() found no commit: the runtime commits at the start of every generation")
        self.load_tree(clone_tree(self._committed))

    def as_tree(self) -> dict[str, Any]:
        """The state as nested dicts of tensors and JSON values (not copied)."""
        rng: dict[str, Any] = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            rng["cuda"] = torch.cuda.get_rng_state()
        return {
            "model": dict(self.model.state_dict()),
            "optimizer": self.optimizer.state_dict(),
            "progress": self.sampler.state_dict(),
            "rng": rng,
            "extras": dict(self.extras),
            "schedulers": [scheduler.state_dict() for scheduler in self.schedulers],
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
            "adaptive": None if self.adaptive is None else self.adaptive.state_dict(),
        }

    def _parts_problem(self, manifest: Mapping[str, Any]) -> str | None:
        schedulers = int(manifest.get("schedulers", 0))
        if schedulers != len(self.schedulers) or bool(manifest.get("scaler")) != (self.scaler is not None):
            return (
                f"this worker's state has {len(self.schedulers)} LR schedulers and "
                f"{'a' if self.scaler is not None else 'no'} GradScaler but the running workers' has {schedulers} "
                f"and {'a' if manifest.get('scaler') else 'no'} GradScaler; pass the same schedulers= and scaler= "
                "to TorchState in every worker"
            )
        if bool(manifest.get("adaptive")) != (self.adaptive is not None):
            return (
                f"this worker's batch is {'adaptive' if self.adaptive is not None else 'fixed'} but the running "
                "workers' is not; build the ElasticSampler with the same max_global_batch in every worker"
            )
        return None

    def gradient_reducer(self, previous: GradientReducer | None) -> GradientReducer:
        """What reduces this state's gradients in a new generation (the runtime calls it once the state is in place).

        Args:
            previous: the last generation's reducer; kept if it still fits the model.

        Returns:
            The flat-bucket all-reduce of :mod:`~slurm_amoeba.runtime.gradients` for this model.
        """
        if isinstance(previous, GradientBuckets) and previous.model is self.model:
            previous.zero()
            return previous
        if previous is not None:
            previous.close()
        return GradientBuckets(self.model, probe=None if self.adaptive is None else self.adaptive.probe)

    def check_compatible(self, manifest: Mapping[str, Any]) -> str | None:
        """Compare a sender's manifest with this worker's model and optimizer before receiving anything.

        Args:
            manifest: the sender's manifest (see :meth:`encode`).

        Returns:
            ``None`` if the state fits, else a sentence naming the first mismatch.
        """
        parts = self._parts_problem(manifest)
        if parts is not None:
            return parts
        model = _model_problem(self.model, manifest["model"])
        if model is not None:
            return model
        own_groups = [len(g["params"]) for g in self.optimizer.param_groups]
        if own_groups != list(manifest["param_groups"]):
            return (
                f"the optimizer here has parameter groups of sizes {own_groups} but {manifest['param_groups']} on "
                "the running workers; build the same optimizer in every worker"
            )
        return None

    def encode(self) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """The state as a JSON manifest and the list of its tensors, for sending.

        Returns:
            ``(manifest, tensors)``; the manifest holds the skeleton, each tensor's dtype and shape, the model's
            entries and the optimizer's group sizes (for :meth:`check_compatible`).

        Raises:
            StateError: something cannot be sent.
        """
        tensors: list[torch.Tensor] = []
        skeleton = encode_tree(self.as_tree(), "state", tensors)
        model = [[name, str(t.dtype), list(t.shape)] for name, t in self.model.state_dict().items()]
        manifest = {
            "skeleton": skeleton,
            "tensors": [[str(t.dtype), list(t.shape), t.device.type] for t in tensors],
            "model": model,
            "param_groups": [len(g["params"]) for g in self.optimizer.param_groups],
            "schedulers": len(self.schedulers),
            "scaler": self.scaler is not None,
            "adaptive": self.adaptive is not None,
        }
        json.dumps(manifest)  # fails loudly here rather than on the receivers
        return manifest, tensors

    def load_tree(self, tree: Mapping[str, Any]) -> None:
        """Put a whole state in place (after a restore or a receive).

        Args:
            tree: a tree from :meth:`as_tree` (or decoded from a sender).

        Raises:
            StateError: the tree does not fit the model or optimizer.
        """
        self.settle()
        try:
            with torch.no_grad():
                self.model.load_state_dict(tree["model"], strict=True)
            self.optimizer.load_state_dict(tree["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:
            raise StateError(f"the received state does not fit this worker's model or optimizer: {exc}") from None
        self.sampler.load_state_dict(tree["progress"])
        torch.set_rng_state(tree["rng"]["cpu"].cpu())
        if "cuda" in tree["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state(tree["rng"]["cuda"].cpu())
        self.extras.replace_all(tree["extras"])
        self._load_parts(tree)

    def load_received(self, tree: Mapping[str, Any]) -> None:
        """Put a state received at a switch in place, keeping the received tensors (this worker's alone) as the
        commit: the live state takes the copies, so no commit copy is left to wait for (:attr:`received_is_commit`).
        Raises :class:`StateError` when the tree does not fit the model or optimizer."""
        self.load_tree({key: value if key == "model" else clone_tree(value) for key, value in tree.items()})
        self._committed = dict(tree)

    def _load_parts(self, tree: Mapping[str, Any]) -> None:
        for scheduler, scheduler_state in zip(self.schedulers, tree["schedulers"], strict=True):
            scheduler.load_state_dict(clone_tree(scheduler_state))
        if self.scaler is not None and tree["scaler"] is not None:
            self.scaler.load_state_dict(dict(tree["scaler"]))
            # A joiner takes no samples in its first step (runtime/topology.py, idle_ranks), so it may call
            # unscale_() before any scale() in this process: give the scaler its scale tensor now, from the loaded
            # value (scale() makes it on first use; the product is thrown away).
            parameter = next(self.model.parameters(), None)
            if self.scaler.is_enabled() and parameter is not None:
                self.scaler.scale(torch.zeros((), device=parameter.device))
        if self.adaptive is not None:
            self.adaptive.load_state_dict(tree.get("adaptive"))

    def run_reset_callbacks(self) -> None:
        """Call the registered reset callbacks in order."""
        for callback in self._reset_callbacks:
            callback()
