"""Sending the training state to the joiners of a new generation: a JSON manifest, a check, then the tensors.

Worker side of a switch (DESIGN.md, layer ``runtime/``), right after the process group formed: the plan's source
publishes its state's manifest (structure, dtypes, shapes, model entries) in the store; every other member checks
it against its own model, the members agree on the verdict with one tiny all-reduce (waited for before anything is
sent, or, where the joiners idle in the first step, only before the members' first optimizer step), and
the source sends the tensors to each joiner, point to point (the other members hold the same state already and take
no part in it): the large parameter and optimizer-state tensors as they are, everything else (the model's buffers,
which a forward may change, and small tensors) as one flat copy per dtype. Nothing is pickled. Every wait has the
collective deadline and gives up at once when the coordinator aborts the generation.

The source does not wait for its sends: it goes on to its first step of the new generation while the joiners
receive, and waits for them (:class:`PendingSend`) before its optimizer next changes what they read, which is after
its first gradient reduce. The joiners take no samples in that step (:func:`slurm_amoeba.runtime.topology.idle_ranks`):
the members split it as before the switch and, on gloo, sum its gradients among themselves, point to point, and send
the sum to the joiners (:meth:`slurm_amoeba.runtime.gradients.GradientBuckets.reduce_without`), so that no member
waits for a joiner in that step; the first collective with the joiners in it is the next step's all-reduce. A
scale-out costs the members the joiners' receive and load *minus* a step's computation, not their sum.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Store

from slurm_amoeba.runtime.errors import StateError, WorkerFailure
from slurm_amoeba.runtime.gradients import Sends, wait_all
from slurm_amoeba.runtime.group import GroupSettings, aborted, await_keys, teardown_group
from slurm_amoeba.runtime.protocol import GenerationPlan, manifest_key
from slurm_amoeba.runtime.state import TorchState, decode_tree

log = logging.getLogger(__name__)

#: Tensors of at least this size that only the optimizer's step changes are sent as they are, without a copy.
DIRECT_BYTES = 1 << 16
#: Tags of those tensors' messages: this plus the tensor's index (the copied messages are tagged 0, 1, ... by dtype).
DIRECT_TAG = 1 << 16


class Verdict:
    """Every member's verdict on the manifest (1: it fits, 0: it does not), its all-reduce started, not waited for."""

    def __init__(self, work: Any, value: torch.Tensor) -> None:
        self._work = work
        self._value = value

    def refused(self) -> bool:
        """Whether a member refused the state (waits for the all-reduce).

        Raises:
            RuntimeError: the all-reduce failed (a peer died); the caller tears the group down.
        """
        self._work.wait()
        return bool(self._value.item() < 1.0)


class PendingSend:
    """The source's broadcasts of a switch, still in flight (the buffers stay referenced until they are done), and
    with a late verdict (see :func:`sync_state`) the members' and joiners' verdict on the state, still to be read."""

    def __init__(self, works: Sends, verdict: Verdict | None = None) -> None:
        self._works = works
        self._verdict = verdict

    def refused(self) -> bool:
        """Whether a member refused the state (reads the verdict once; False without one, or once read).

        Raises:
            RuntimeError: the verdict's all-reduce failed (a peer died); the caller tears the group down.
        """
        verdict, self._verdict = self._verdict, None
        return verdict is not None and verdict.refused()

    def wait(self) -> None:
        """Block until every broadcast is done.

        Raises:
            RuntimeError: a broadcast failed (a joiner died while receiving); the caller tears the group down.
        """
        works, self._works = self._works, []
        for work, _buffer in works:
            work.wait()


class StateRefused(Exception):
    """Another member refused the state; the generation is dropped without touching this worker's state."""


def _failed(plan: GenerationPlan, what: str, exc: BaseException) -> WorkerFailure:
    teardown_group()  # closing our connections makes peers blocked in the same collective fail at once
    return WorkerFailure(f"{what} failed in generation {plan.generation}: {exc}", generation=plan.generation)


def _wait_manifest(store: Store, plan: GenerationPlan, settings: GroupSettings) -> dict[str, Any]:
    key = manifest_key(plan.generation, settings.auth.token(plan.generation))
    deadline = time.monotonic() + settings.timeout_s
    while (text := settings.auth.read(store, key, sender=plan.source)) is None:
        reason = aborted(store, plan.generation, settings.auth)
        if reason is not None:
            raise _failed(plan, "state manifest wait", RuntimeError(f"aborted by the coordinator: {reason}"))
        if time.monotonic() > deadline:
            raise _failed(plan, "state manifest wait", TimeoutError(f"no {key} from {plan.source}"))
        # Blocks until the source writes it; wakes every 50 ms to look at the abort key.
        await_keys(store, [key], min(deadline, time.monotonic() + 0.05))
    manifest: dict[str, Any] = json.loads(text)
    return manifest


def _launch_verdict(plan: GenerationPlan, settings: GroupSettings, problem: str | None) -> Verdict:
    """Start the all-reduce of every member's verdict on the manifest."""
    value = torch.tensor([0.0 if problem else 1.0], device=settings.device)
    try:
        work = dist.all_reduce(value, op=dist.ReduceOp.MIN, async_op=True)
    except RuntimeError as exc:
        raise _failed(plan, "state check", exc) from None
    return Verdict(work, value)


def _agree(plan: GenerationPlan, verdict: Verdict, problem: str | None) -> None:
    """Wait for the verdict; raise this worker's own problem, or :class:`StateRefused` if another member had one."""
    try:
        refused = verdict.refused()
    except RuntimeError as exc:
        raise _failed(plan, "state check", exc) from None
    if problem is not None:
        raise StateError(problem)
    if refused:
        raise StateRefused(f"a joiner of generation {plan.generation} refused the state")


def sync_state(
    store: Store,
    plan: GenerationPlan,
    settings: GroupSettings,
    state: TorchState,
    marks: dict[str, float] | None = None,
    *,
    late_verdict: bool = False,
) -> PendingSend | None:
    """The plan's source broadcasts its state; the others check it fits, then receive it.

    A collective: every member of ``plan`` calls it, right after forming the group. The verdict on the manifest is
    one tiny all-reduce. Without ``late_verdict`` every member waits for it before anything is sent. With it (a
    generation whose joiners take no samples in its first step) nobody waits: the source sends at once, a joiner
    that fits receives while the verdict comes, one that does not fit drains the sends, and the members read the
    verdict only before their first optimizer step (:meth:`PendingSend.refused`: they then restore their commit of
    the generation's start and drop the generation, as after a refusal at once).

    Returns:
        On the source, its broadcasts in flight: it must :meth:`~PendingSend.wait` before its next collective
        whose result depends on the receivers (the first all-reduce with the joiners). With ``late_verdict`` also
        on the other members that hold the state, with the verdict to read. ``None`` on the receivers.

    Raises:
        StateError: this worker's model or optimizer does not fit the source's (this worker must leave).
        StateRefused: another member refused the state (with ``late_verdict``, on a joiner: after it received).
        WorkerFailure: a wait or a collective failed, or the coordinator aborted the generation.
    """
    source = settings.worker_id == plan.source
    tensors: list[torch.Tensor] = []
    problem: str | None = None
    if source:
        manifest, tensors = state.encode()
        manifest["direct"] = _direct(tensors, state.unchanging_storage(), settings.device)
        key = manifest_key(plan.generation, settings.auth.token(plan.generation))
        settings.auth.put(store, key, json.dumps(manifest))
    else:
        manifest = _wait_manifest(store, plan, settings)
        problem = state.check_compatible(manifest)
    marks = {} if marks is None else marks
    marks["manifest"] = time.perf_counter()
    launched = _launch_verdict(plan, settings, problem)
    verdict: Verdict | None = launched  # until it is read
    joiner = settings.worker_id in plan.joiners
    if not late_verdict or (problem is not None and not joiner):
        _agree(plan, launched, problem)
        verdict = None
    marks["agreed"] = time.perf_counter()
    if source:
        pending = PendingSend(_send(plan, settings, manifest, tensors), verdict)
        marks["broadcast"] = time.perf_counter()
        return pending
    if not joiner:
        # A member that holds the state already (it checked the manifest too, for the verdict).
        return None if verdict is None else PendingSend([], verdict)
    received = _receive(plan, settings, manifest)  # with a late verdict and a problem: the sends drained
    marks["broadcast"] = time.perf_counter()
    if verdict is not None:
        _agree(plan, verdict, problem)
    state.load_received(decode_tree(manifest["skeleton"], received))
    return None


def _by_dtype(specs: list[Any]) -> list[tuple[str, list[int]]]:
    """The manifest's tensor indices grouped by dtype, in the order every member broadcasts them."""
    groups: dict[str, list[int]] = {}
    for index, (dtype, _shape, _device) in enumerate(specs):
        groups.setdefault(dtype, []).append(index)
    return sorted(groups.items())


def _direct(tensors: list[torch.Tensor], unchanging: frozenset[int], device: torch.device) -> list[int]:
    """The tensors sent as they are (see :func:`_send`): large, contiguous, on the device, and changed only by the
    optimizer's step (``TorchState.unchanging_storage``)."""
    return [
        index
        for index, t in enumerate(tensors)
        if t.data_ptr() in unchanging
        and t.is_contiguous()
        and t.device == device
        and t.numel() * t.element_size() >= DIRECT_BYTES
    ]


def _layout(manifest: dict[str, Any]) -> list[tuple[str, list[int], list[int]]]:
    """Per dtype, in the order every member sends them: the tensors copied into one message, and those sent alone."""
    direct = set(manifest.get("direct", []))
    return [
        (dtype, [i for i in indices if i not in direct], [i for i in indices if i in direct])
        for dtype, indices in _by_dtype(manifest["tensors"])
    ]


def _send(
    plan: GenerationPlan, settings: GroupSettings, manifest: dict[str, Any], tensors: list[torch.Tensor]
) -> Sends:
    """The source's sends to every joiner, started, not waited for: per dtype, one flat copy of the small tensors
    and the model's buffers (tagged by the dtype's place), and each large parameter or optimizer-state tensor as it
    is (tagged by its index): those change only in the optimizer's step, before which the source waits for them."""
    works: Sends = []
    joiners = [plan.rank_of(j) for j in plan.joiners if j != plan.source]
    for tag, (_dtype_name, copied, direct) in enumerate(_layout(manifest)):
        messages = [(tensors[i].reshape(-1), DIRECT_TAG + i) for i in direct]
        if copied:
            messages.insert(0, (torch.cat([tensors[i].reshape(-1).to(settings.device) for i in copied]), tag))
        for buffer, message_tag in messages:
            for rank in joiners:
                try:
                    work = dist.isend(buffer, dst=rank, tag=message_tag)
                except RuntimeError as exc:
                    raise _failed(plan, "state send", exc) from None
                if work is None:  # pragma: no cover - torch returns a work for isend
                    raise _failed(plan, "state send", RuntimeError("torch returned no work for an isend"))
                works.append((work, buffer))
    return works


def _receive(plan: GenerationPlan, settings: GroupSettings, manifest: dict[str, Any]) -> list[torch.Tensor]:
    """A joiner's side of :func:`_send`: the tensors in manifest order, views of one buffer per dtype."""
    specs: list[Any] = manifest["tensors"]
    received: list[torch.Tensor | None] = [None] * len(specs)
    device, source = settings.device, plan.rank_of(plan.source)
    for tag, (dtype_name, copied, direct) in enumerate(_layout(manifest)):
        order = copied + direct
        sizes = [_numel(specs[i][1]) for i in order]
        flat = torch.empty(sum(sizes), dtype=_dtype(dtype_name), device=device)
        parts = torch.split(flat, sizes)
        messages = [(parts[len(copied) + k], DIRECT_TAG + i) for k, i in enumerate(direct)]
        if copied:
            messages.insert(0, (flat[: sum(sizes[: len(copied)])], tag))
        try:
            wait_all([dist.irecv(buffer, src=source, tag=message_tag) for buffer, message_tag in messages])
        except RuntimeError as exc:
            raise _failed(plan, "state receive", exc) from None
        for index, part in zip(order, parts, strict=True):
            target = device if specs[index][2] == "cuda" else torch.device("cpu")
            received[index] = part.reshape(specs[index][1]).to(target)  # views of one buffer, no copy
    return [t for t in received if t is not None]


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
