"""Forming and tearing down one generation's process group, with a deadline and an abort on every wait.

Worker side of a switch (DESIGN.md, layer ``runtime/``): every member of a new generation first marks its arrival
in the job's store and waits until every other member has arrived — polling, so that it also sees the
coordinator's abort key (set when a member died or failed) and its own deadline — and only then calls
``init_process_group`` on ``PrefixStore("amoeba/gen<N>.<token>/pg", store)``, which then finds everybody there. A member
killed right after its admission therefore costs the others the time the coordinator needs to learn of the death,
not the collective timeout, and the failure names the members that did not show up.

:func:`teardown_group` leaves the default group whether or not forming it succeeded: torch numbers default groups
with a process-wide counter that a failed ``init_process_group`` advances and only ``destroy_process_group``
resets, so a worker whose formation once failed would otherwise look for other store keys than a fresh joiner in
every later generation, and never meet it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import queue
import threading
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, Store
from torch.distributed import distributed_c10d

from slurm_amoeba.core.runtime_env import TORCHRUN_VARIABLES
from slurm_amoeba.runtime.auth import COORDINATOR, AuthError, JobAuth
from slurm_amoeba.runtime.errors import WorkerFailure
from slurm_amoeba.runtime.protocol import GenerationPlan, abort_key, arrival_key, group_prefix
from slurm_amoeba.runtime.topology import Generation

log = logging.getLogger(__name__)

#: How often a member waiting for the others looks at the store.
POLL_S = 0.002


class FormationFailed(WorkerFailure):
    """The generation's process group could not form.

    Attributes:
        missing: members that had not arrived when this worker gave up (empty when every member arrived and
            ``init_process_group`` itself failed).
    """

    def __init__(self, message: str, *, generation: int, missing: tuple[str, ...]) -> None:
        super().__init__(message, generation=generation)
        self.missing = missing


@dataclasses.dataclass(frozen=True)
class GroupSettings:
    """How one worker forms its groups.

    Attributes:
        worker_id: this worker's id.
        device: its torch device.
        backend: ``gloo`` or ``nccl``.
        timeout_s: deadline of the arrival wait and of every collective of the group.
        auth: its seals: what it writes and reads in the store is sealed, under the generation's token.
    """

    worker_id: str
    device: torch.device
    backend: str
    timeout_s: float
    auth: JobAuth


def describe(plan: GenerationPlan, settings: GroupSettings) -> Generation:
    """The generation of ``plan`` as ``settings.worker_id`` sees it."""
    local_rank, local_world = plan.local_rank_of(settings.worker_id)
    return Generation(
        number=plan.generation,
        rank=plan.rank_of(settings.worker_id),
        world_size=plan.world_size,
        local_rank=local_rank,
        local_world_size=local_world,
        members=plan.members,
        device=settings.device,
        backend=settings.backend,
    )


def aborted(store: Store, generation: int, auth: JobAuth) -> str | None:
    """The coordinator's reason to abort ``generation``, or ``None``."""
    return auth.read(store, abort_key(generation, auth.token(generation)), sender=COORDINATOR)


def wait_for_members(store: Store, plan: GenerationPlan, settings: GroupSettings) -> None:
    """Mark this worker's arrival and wait until every member of ``plan`` has arrived.

    The wait blocks in the store until the arrival keys exist (it wakes the moment the last member arrives); the
    coordinator's abort writes its own mark into the keys of the members that had not arrived, which wakes it too.

    Raises:
        FormationFailed: the coordinator aborted the generation, or the deadline passed; it names who was missing.
    """
    auth, token = settings.auth, settings.auth.token(plan.generation)
    auth.put(store, arrival_key(plan.generation, token, settings.worker_id), "1")
    keys = [arrival_key(plan.generation, token, m) for m in plan.members]
    deadline = time.monotonic() + settings.timeout_s
    while True:
        reason = aborted(store, plan.generation, auth)
        if reason is not None or time.monotonic() > deadline:
            missing = not_arrived(store, keys, plan.members, auth)
            why = reason or f"not every member arrived within {settings.timeout_s:.0f} s"
            raise FormationFailed(
                f"generation {plan.generation} did not form ({why}); missing: {', '.join(missing) or 'none'}",
                generation=plan.generation,
                missing=missing,
            )
        if auth.all_sealed(store, keys, plan.members):
            return
        await_keys(store, keys, deadline)


def not_arrived(store: Store, keys: list[str], members: tuple[str, ...], auth: JobAuth) -> tuple[str, ...]:
    """The members whose arrival key holds nothing they sealed (absent, the coordinator's abort mark, forged)."""
    missing: list[str] = []
    for member, key in zip(members, keys, strict=True):
        try:
            if store.check([key]):
                auth.opener.open(key, store.get(key), sender=member)
                continue
        except AuthError:
            pass
        missing.append(member)
    return tuple(missing)


def await_keys(store: Store, keys: list[str], deadline: float) -> None:
    """Block until every key of ``keys`` exists or ``deadline`` (``time.monotonic``) passes.

    When they all exist already (but the caller did not accept a value: forged, or being replaced), it only waits
    :data:`POLL_S`, so that the caller's loop polls until the real value replaces it.
    """
    if store.check(keys):
        time.sleep(POLL_S)
        return
    left = deadline - time.monotonic()
    if left <= 0:
        return
    # RuntimeError: the deadline passed, or the store is gone: the caller's own checks say which.
    with contextlib.suppress(RuntimeError):
        store.wait(keys, datetime.timedelta(seconds=left))


def form_group(
    store: Store, plan: GenerationPlan, settings: GroupSettings, marks: dict[str, float] | None = None
) -> Generation:
    """Leave the old group, meet the other members, and form the default process group of ``plan``.

    A collective: every member of ``plan`` calls it.

    Returns:
        The generation as this worker sees it.

    Raises:
        FormationFailed: a member did not arrive (aborted or timed out), or forming the group failed.
    """
    marks = {} if marks is None else marks
    release_group(settings.backend)
    marks["teardown"] = time.perf_counter()
    wait_for_members(store, plan, settings)
    marks["arrived"] = time.perf_counter()
    generation = describe(plan, settings)
    try:
        dist.init_process_group(
            settings.backend,
            store=PrefixStore(group_prefix(plan.generation, settings.auth.token(plan.generation)), store),
            rank=generation.rank,
            world_size=plan.world_size,
            timeout=datetime.timedelta(seconds=settings.timeout_s),
            device_id=settings.device if settings.device.type == "cuda" else None,
        )
    except RuntimeError as exc:
        teardown_group()
        raise FormationFailed(
            f"process group formation failed in generation {plan.generation}: {exc}",
            generation=plan.generation,
            missing=(),
        ) from None
    marks["formed"] = time.perf_counter()
    return generation


def teardown_group() -> None:
    """Leave the default process group, and make the next one get the same name in every process (see above)."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except RuntimeError as exc:
            log.debug("destroying the old process group: %s", exc)
    # destroy_process_group() resets torch's group counter; after a failed init_process_group there is nothing to
    # destroy but the counter has moved on. The counter is private to torch (tests/unit/runtime/test_formation.py
    # fails if that changes).
    distributed_c10d._world.group_count = 0


class _Reaper:
    """Shuts process groups down in a thread of its own: closing a gloo group's connections takes tens of
    milliseconds (its threads and its device's event loop stop on a timeout), which a member switching generations
    should not wait for. Started on first use; :meth:`drain` waits until every group handed over is shut down."""

    def __init__(self) -> None:
        self._groups: queue.Queue[list[dist.ProcessGroup]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, groups: list[dist.ProcessGroup]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="amoeba-group-reaper", daemon=True)
                self._thread.start()
        self._groups.put(groups)

    def _run(self) -> None:
        while True:
            groups = self._groups.get()
            for group in groups:
                try:
                    group.shutdown()
                except RuntimeError as exc:
                    log.debug("shutting an old process group down: %s", exc)
            del groups, group  # the last references: the groups are destroyed here, not in the training thread
            self._groups.task_done()

    def drain(self) -> None:
        self._groups.join()


_reaper = _Reaper()


def release_group(backend: str) -> None:
    """Leave the default process group at a graceful switch, without waiting for its connections to close.

    torch's ``destroy_process_group`` shuts every group down in the calling thread (about 20 ms for a gloo group,
    mostly its threads stopping on a timeout); here the groups are unregistered at once, as that function does, and
    shut down by a background thread, so that the next generation's group forms meanwhile. Only gloo groups are
    handed over (NCCL's communicator abort stays where torch puts it), and a torch whose bookkeeping differs from
    what this expects (tests/unit/runtime/test_group_release.py) gets ``destroy_process_group`` unchanged.
    """
    world = distributed_c10d._world
    if backend != "gloo" or not dist.is_initialized() or not _bookkeeping_known(world):
        teardown_group()
        return
    groups = list(world.pg_names)
    distributed_c10d._update_default_pg(None)
    for table in _BOOKKEEPING:
        getattr(world, table).clear()
    getattr(distributed_c10d, "_unregister_all_process_groups")()  # noqa: B009 - private, checked above
    world.group_count = 0
    _reaper.submit(groups)


#: The tables of torch's ``_World`` that ``destroy_process_group`` clears when it destroys the default group.
_BOOKKEEPING = (
    "pg_map",
    "pg_names",
    "pg_group_ranks",
    "pg_backend_config",
    "pg_to_tag",
    "tags_to_pg",
    "pg_coalesce_state",
)


def _bookkeeping_known(world: object) -> bool:
    """Whether torch's group bookkeeping looks as :func:`release_group` expects (and holds no torchcomm)."""
    if getattr(world, "comms", None):
        return False
    known = all(isinstance(getattr(world, table, None), dict) for table in _BOOKKEEPING)
    return (
        known
        and hasattr(distributed_c10d, "_update_default_pg")
        and hasattr(distributed_c10d, "_unregister_all_process_groups")
    )


def drain_released_groups() -> None:
    """Wait until every group left by :func:`release_group` is shut down (before the process exits)."""
    _reaper.drain()


def export_torchrun_env(generation: Generation, store_addr: str, store_port: int) -> None:
    """Set the torchrun contract (``RANK``, ``WORLD_SIZE``, ...) in this process's environment for ``generation``."""
    values = {
        "RANK": str(generation.rank),
        "WORLD_SIZE": str(generation.world_size),
        "LOCAL_RANK": str(generation.local_rank),
        "LOCAL_WORLD_SIZE": str(generation.local_world_size),
        "MASTER_ADDR": store_addr,
        "MASTER_PORT": str(store_port),
    }
    os.environ.update({name: values[name] for name in TORCHRUN_VARIABLES})


def clear_torchrun_env() -> None:
    """Remove the torchrun contract from this process's environment (the worker is no member any more)."""
    for name in TORCHRUN_VARIABLES:
        os.environ.pop(name, None)
