"""Sending the training state to the joiners of a new generation: a JSON manifest, a check, one broadcast per dtype.

Worker side of a switch (DESIGN.md, layer ``runtime/``), right after the process group formed: the plan's source
publishes its state's manifest (structure, dtypes, shapes, model entries) in the store; every other member checks
it against its own model *before* anything is sent, the members agree on the verdict with one tiny all-reduce, and
the source broadcasts the tensors, one flat buffer per dtype. Nothing is pickled. Every wait has the collective
deadline and gives up at once when the coordinator aborts the generation.
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
from slurm_amoeba.runtime.group import GroupSettings, aborted, teardown_group
from slurm_amoeba.runtime.protocol import GenerationPlan, manifest_key
from slurm_amoeba.runtime.state import TorchState, decode_tree

log = logging.getLogger(__name__)


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
        time.sleep(0.001)
    manifest: dict[str, Any] = json.loads(text)
    return manifest


def _agree(plan: GenerationPlan, settings: GroupSettings, problem: str | None) -> None:
    verdict = torch.tensor([0.0 if problem else 1.0], device=settings.device)
    try:
        dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
    except RuntimeError as exc:
        raise _failed(plan, "state check", exc) from None
    if problem is not None:
        raise StateError(problem)
    if verdict.item() < 1.0:
        raise StateRefused(f"a joiner of generation {plan.generation} refused the state")


def sync_state(
    store: Store,
    plan: GenerationPlan,
    settings: GroupSettings,
    state: TorchState,
    marks: dict[str, float] | None = None,
) -> None:
    """The plan's source broadcasts its state; the others check it fits, then receive it.

    A collective: every member of ``plan`` calls it, right after forming the group.

    Raises:
        StateError: this worker's model or optimizer does not fit the source's (this worker must leave).
        StateRefused: another member refused the state (nothing was received).
        WorkerFailure: a wait or a collective failed, or the coordinator aborted the generation.
    """
    source = settings.worker_id == plan.source
    tensors: list[torch.Tensor] = []
    problem: str | None = None
    if source:
        manifest, tensors = state.encode()
        key = manifest_key(plan.generation, settings.auth.token(plan.generation))
        settings.auth.put(store, key, json.dumps(manifest))
    else:
        manifest = _wait_manifest(store, plan, settings)
        problem = state.check_compatible(manifest)
    marks = {} if marks is None else marks
    marks["manifest"] = time.perf_counter()
    _agree(plan, settings, problem)
    marks["agreed"] = time.perf_counter()
    received = _broadcast(plan, settings, manifest["tensors"], tensors if source else None)
    marks["broadcast"] = time.perf_counter()
    if not source:
        state.load_tree(decode_tree(manifest["skeleton"], received))


def _broadcast(
    plan: GenerationPlan, settings: GroupSettings, specs: list[Any], tensors: list[torch.Tensor] | None
) -> list[torch.Tensor]:
    """One broadcast per dtype from the source; returns the received tensors in manifest order (receivers)."""
    by_dtype: dict[str, list[int]] = {}
    for index, (dtype, _shape, _device) in enumerate(specs):
        by_dtype.setdefault(dtype, []).append(index)
    received: list[torch.Tensor | None] = [None] * len(specs)
    device = settings.device
    for dtype_name, indices in sorted(by_dtype.items()):
        sizes = [_numel(specs[i][1]) for i in indices]
        if tensors is not None:
            flat = torch.cat([tensors[i].reshape(-1).to(device) for i in indices])
        else:
            flat = torch.empty(sum(sizes), dtype=_dtype(dtype_name), device=device)
        try:
            dist.broadcast(flat, src=plan.rank_of(plan.source))
        except RuntimeError as exc:
            raise _failed(plan, "state broadcast", exc) from None
        if tensors is None:
            for index, part in zip(indices, torch.split(flat, sizes), strict=True):
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
