"""Disk checkpoints of the in-memory commit: written in the background, sharded, atomic, the newest N kept.

The runtime's commit (:meth:`~slurm_amoeba.runtime.state.TorchState.commit`) is an in-memory copy; it is lost when
every worker holding it dies at once. With a :class:`CheckpointPolicy` (``run(train, state, checkpoint=...)`` or
the ``AMOEBA_CHECKPOINT_*`` variables), a commit that falls due is also written to disk (DESIGN.md, layer
``runtime/``; the worker side calls this module, the coordinator knows nothing of it):

* **Due**: every ``every_steps`` steps, or once ``every_s`` seconds have passed since the last checkpoint; the
  members agree on it inside the commit's own all-reduce, so they all write the same step.
* **Background**: the commit hands its snapshot (already a private copy) to a writer thread; training does not
  wait. While a write runs, a newer due commit replaces a waiting one (at most one waits).
* **Sharded**: the state's tensors are split over the members by size (:func:`shard_assignment`); each member
  writes its share with ``torch.distributed.checkpoint`` (``no_dist``: no collective runs on the training
  thread's process group, which a resize may destroy at any time). Rank 0 writes the JSON skeleton of the state
  (``manifest.json``; nothing is pickled but DCP's own metadata).
* **Atomic**: each member marks its shard done; rank 0 waits for every mark and writes ``COMPLETE`` last. A
  directory without it (a member died mid-write) is ignored and pruned later.
* **Resume**: :func:`load_newest` finds the newest complete checkpoint; ``run()`` puts it in place before the worker
  reports ready, so a restarted job continues at the saved step with the sampler's cursor (exactly-once data).
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from slurm_amoeba.runtime.errors import RuntimeConfigError, StateError
from slurm_amoeba.runtime.state import decode_tree, encode_tree

if TYPE_CHECKING:
    from torch._C._distributed_c10d import TCPStore

    from slurm_amoeba.runtime.state import TorchState

log = logging.getLogger(__name__)


def silence_single_process_warning() -> None:
    """Drop DCP's warning on every call without a process group (done at import).

    ``no_dist=True`` asks for exactly that, yet DCP warns "torch.distributed is disabled, unavailable or
    uninitialized, assuming the intent is to save in a single process." on every call: every checkpoint write and
    every joiner's read printed it to the worker's log. The filter names the message and DCP's module (the warning
    names DCP's own wrapper as its place, not the caller); ``warnings.catch_warnings`` around the calls is not
    thread-safe, and the writer runs in a thread of its own.
    """
    warnings.filterwarnings(
        "ignore",
        message=r"torch\.distributed is disabled, unavailable or uninitialized",
        module=r"torch\.distributed\.checkpoint",
    )


silence_single_process_warning()

ENV_CHECKPOINT_DIR = "AMOEBA_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY = "AMOEBA_CHECKPOINT_EVERY"
ENV_CHECKPOINT_KEEP = "AMOEBA_CHECKPOINT_KEEP"

CHECKPOINTS_OFF = "none"
"""``AMOEBA_CHECKPOINT_DIR=none``: no disk checkpoints (on Slurm the agent otherwise gives its workers a default)."""
DEFAULT_EVERY_S = 300.0
DEFAULT_KEEP = 2
COMPLETE = "COMPLETE"
MANIFEST = "manifest.json"
_NAME = re.compile(r"^step-(\d+)-([0-9a-z]+)-g(\d+)$")


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where and how often the runtime writes disk checkpoints.

    Attributes:
        directory: where checkpoints go (shared by every node of the job); resumed from on start.
        every_steps: write at commits whose step is a multiple of this (0: not by steps).
        every_s: write at the first commit once this many seconds passed since the last (0: not by time).
        keep: complete checkpoints kept; older ones are deleted.
        shard_timeout_s: how long rank 0 waits for the other members' shards before abandoning a checkpoint.
    """

    directory: Path
    every_steps: int = 0
    every_s: float = DEFAULT_EVERY_S
    keep: int = DEFAULT_KEEP
    shard_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.every_steps < 0 or self.every_s < 0 or (self.every_steps == 0 and self.every_s == 0):
            raise RuntimeConfigError(
                f"checkpoint interval every_steps={self.every_steps}, every_s={self.every_s}: give a positive "
                "number of steps or of seconds"
            )
        if self.keep < 1:
            raise RuntimeConfigError(f"checkpoint keep={self.keep}: keep at least 1 checkpoint")

    def due(self, step: int, since_last_s: float) -> bool:
        """Whether a commit at ``step``, ``since_last_s`` seconds after the last checkpoint, is written."""
        by_steps = self.every_steps > 0 and step > 0 and step % self.every_steps == 0
        return by_steps or (self.every_s > 0 and since_last_s >= self.every_s)

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> CheckpointPolicy | None:
        """The policy from ``AMOEBA_CHECKPOINT_DIR`` (unset or ``none``: ``None``), ``_EVERY`` and ``_KEEP``.

        Raises:
            RuntimeConfigError: a variable is malformed.
        """
        directory = env.get(ENV_CHECKPOINT_DIR, "")
        if not directory or directory == CHECKPOINTS_OFF:
            return None
        steps, seconds = parse_every(env.get(ENV_CHECKPOINT_EVERY, ""))
        keep_text = env.get(ENV_CHECKPOINT_KEEP, "") or str(DEFAULT_KEEP)
        if not keep_text.isdigit():
            raise RuntimeConfigError(f"{ENV_CHECKPOINT_KEEP}={keep_text!r}: give a whole number, e.g. 2")
        return cls(Path(directory), every_steps=steps, every_s=seconds, keep=int(keep_text))


def parse_every(text: str) -> tuple[int, float]:
    """Parse an interval: ``"500"`` (steps), ``"90s"`` or ``"15m"`` (time); empty: the default time.

    Returns:
        ``(every_steps, every_s)``, one of them 0.

    Raises:
        RuntimeConfigError: the text is neither.
    """
    text = text.strip()
    if not text:
        return 0, DEFAULT_EVERY_S
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smh]?)", text)
    if match is None or (not match.group(2) and "." in match.group(1)) or float(match.group(1)) <= 0:
        raise RuntimeConfigError(
            f"{ENV_CHECKPOINT_EVERY}={text!r}: give a whole number of steps (500) or a time (90s, 15m, 1h)"
        )
    if not match.group(2):
        return int(match.group(1)), 0.0
    return 0, float(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]


def shard_assignment(sizes: Sequence[int], world_size: int) -> list[list[int]]:
    """Split tensors over members, largest first to the least loaded member (deterministic on every member).

    Args:
        sizes: each tensor's size in bytes, in state order.
        world_size: number of members.

    Returns:
        For each rank, the indices of the tensors it writes, ascending.
    """
    loads = [0] * world_size
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        loads[rank] += sizes[index]
        shards[rank].append(index)
    return [sorted(shard) for shard in shards]


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint directory: its step, generation and whether it is complete."""

    path: Path
    step: int
    generation: int
    complete: bool


def list_checkpoints(directory: Path) -> list[CheckpointInfo]:
    """The checkpoints under ``directory``, oldest first (by step, then completion time)."""
    found = []
    if directory.is_dir():
        for path in directory.iterdir():
            match = _NAME.match(path.name)
            if match is not None and path.is_dir():
                complete = (path / COMPLETE).is_file()
                found.append(CheckpointInfo(path, int(match.group(1)), int(match.group(3)), complete))
    return sorted(found, key=lambda c: (c.step, _mtime(c.path / COMPLETE), c.path.name))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def newest_complete(directory: Path) -> CheckpointInfo | None:
    """The newest complete checkpoint under ``directory``, or ``None``."""
    complete = [c for c in list_checkpoints(directory) if c.complete]
    return complete[-1] if complete else None


def prune(directory: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest complete checkpoints, and incomplete ones older than the newest kept.

    Returns:
        The deleted directories.
    """
    checkpoints = list_checkpoints(directory)
    complete = [c for c in checkpoints if c.complete]
    if not complete:
        return []
    kept = complete[-keep:]
    oldest_kept = checkpoints.index(kept[0])
    doomed = [c.path for c in checkpoints[:oldest_kept] if c not in kept]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


@dataclass(frozen=True)
class CheckpointJob:
    """One member's part of one checkpoint: the committed snapshot and where the member stands."""

    snapshot: Mapping[str, Any]
    step: int
    generation: int
    rank: int
    world_size: int


def write_checkpoint(policy: CheckpointPolicy, run_id: str, job: CheckpointJob, prefix: str = "") -> Path | None:
    """Write this member's shard of ``job`` (rank 0 also the manifest and, once every shard is done, ``COMPLETE``).

    Args:
        policy: where, and how long rank 0 waits for the others.
        run_id: the same on every member of this run of the job (tells runs apart after a restart).
        job: the snapshot and this member's rank.
        prefix: log prefix.

    Returns:
        The checkpoint's directory when this member completed it (rank 0), else ``None``.

    Raises:
        StateError: the snapshot cannot be encoded.
        OSError: the disk refused a write.
    """
    path = policy.directory / f"step-{job.step:09d}-{run_id}-g{job.generation}"
    path.mkdir(parents=True, exist_ok=True)
    tensors: list[torch.Tensor] = []
    skeleton = encode_tree(dict(job.snapshot), "state", tensors)
    shards = shard_assignment([t.numel() * t.element_size() for t in tensors], job.world_size)
    own = {f"t{index}": tensors[index].detach().cpu() for index in shards[job.rank]}
    if own:
        # DCP is imported where it is used: it pulls in DTensor and sympy, about as long to import as torch itself,
        # which every worker would otherwise pay at its start (the writer thread pays it at the first checkpoint).
        from torch.distributed.checkpoint.filesystem import FileSystemWriter
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        dcp_save(own, storage_writer=FileSystemWriter(path / f"shard-{job.rank}"), no_dist=True)
    _write_atomically(path / f"shard-{job.rank}.done", str(len(own)))
    if job.rank != 0:
        return None
    manifest = {
        "step": job.step,
        "generation": job.generation,
        "world_size": job.world_size,
        "skeleton": skeleton,
        "tensors": [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in tensors],
        "shards": shards,
    }
    _write_atomically(path / MANIFEST, json.dumps(manifest))
    deadline = time.monotonic() + policy.shard_timeout_s
    while not all((path / f"shard-{rank}.done").is_file() for rank in range(job.world_size)):
        if time.monotonic() > deadline:
            log.warning(
                "%s checkpoint %s abandoned: not every shard was written within %.0f s",
                prefix,
                path,
                policy.shard_timeout_s,
            )
            return None
        time.sleep(0.01)
    _write_atomically(path / COMPLETE, str(job.step))
    prune(policy.directory, policy.keep)
    return path


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Read a complete checkpoint back as a state tree (CPU tensors), for :meth:`TorchState.load_tree`.

    Raises:
        StateError: the directory is not a complete checkpoint, or its files disagree.
    """
    if not (path / COMPLETE).is_file():
        raise StateError(f"{path} is not a complete checkpoint (no {COMPLETE} marker); pick another one")
    manifest = json.loads((path / MANIFEST).read_text())
    tensors = [torch.empty(shape, dtype=getattr(torch, dtype)) for dtype, shape in manifest["tensors"]]
    from torch.distributed.checkpoint.filesystem import (
        FileSystemReader,
    )  # imported when used (write_checkpoint says why)
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    for rank, shard in enumerate(manifest["shards"]):
        if shard:
            part = {f"t{index}": tensors[index] for index in shard}
            dcp_load(part, storage_reader=FileSystemReader(path / f"shard-{rank}"), no_dist=True)
    tree: dict[str, Any] = decode_tree(manifest["skeleton"], tensors)
    return tree


class Checkpointer:
    """The background writer of one worker: :meth:`submit` returns at once, a thread writes.

    Args:
        policy: the checkpoint policy.
        run_id: the same on every member of this run of the job.
        prefix: log prefix (``[job/worker]``).
    """

    def __init__(self, policy: CheckpointPolicy, run_id: str, prefix: str) -> None:
        self.policy = policy
        self.run_id = run_id
        self.prefix = prefix
        self.written: list[Path] = []
        self._last = time.monotonic()
        self._waiting: CheckpointJob | None = None
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="amoeba-checkpoint", daemon=True)
        self._thread.start()

    def due(self, step: int) -> bool:
        """Whether this member finds a commit at ``step`` due (the members then agree: any one suffices)."""
        return self.policy.due(step, time.monotonic() - self._last)

    def submit(self, job: CheckpointJob) -> None:
        """Queue a checkpoint (replacing one still waiting); returns at once."""
        with self._cond:
            self._last = time.monotonic()
            if self._waiting is not None:
                log.warning(
                    "%s checkpoint of step %s skipped: the disk is slower than the interval",
                    self.prefix,
                    self._waiting.step,
                )
            self._waiting = job
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._waiting is None and not self._closed:
                    self._cond.wait()
                job, self._waiting = self._waiting, None
                if job is None:
                    return
                self._busy = True
            try:
                started = time.perf_counter()
                path = write_checkpoint(self.policy, self.run_id, job, self.prefix)
                if path is not None:
                    self.written.append(path)
                    log.info(
                        "%s checkpoint of step %s written in %.2f s: %s",
                        self.prefix,
                        job.step,
                        time.perf_counter() - started,
                        path,
                    )
            except (OSError, RuntimeError, StateError) as exc:
                log.warning("%s checkpoint of step %s failed: %s", self.prefix, job.step, exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Wait until nothing is waiting or being written; ``False`` if it took longer than ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._waiting is not None or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def write_final(self, job: CheckpointJob) -> Path | None:
        """Write ``job`` now, on the calling thread, after the writes under way: the last checkpoint before every
        member leaves (a stop, a time limit; the coordinator asks each member for its shard). Never raises: a
        checkpoint that cannot be written is logged and left incomplete (ignored on resume).

        Returns:
            The checkpoint's directory when this member completed it (rank 0), else ``None``.
        """
        self.flush()
        newest = newest_complete(self.policy.directory)
        if newest is not None and newest.step == job.step:
            log.info("%s the checkpoint of step %s is already on disk: %s", self.prefix, job.step, newest.path)
            return None
        started = time.perf_counter()
        try:
            path = write_checkpoint(self.policy, self.run_id, job, self.prefix)
        except (OSError, RuntimeError, StateError) as exc:
            log.warning("%s final checkpoint of step %s failed: %s", self.prefix, job.step, exc)
            return None
        log.info(
            "%s final checkpoint of step %s: shard %s written in %.2f s%s",
            self.prefix,
            job.step,
            job.rank,
            time.perf_counter() - started,
            f", complete: {path}" if path is not None else "",
        )
        if path is not None:
            self.written.append(path)
        return path

    def close(self, timeout_s: float = 60.0) -> None:
        """Finish the writes under way (up to ``timeout_s``) and stop the thread."""
        self.flush(timeout_s)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=1)


def load_newest(directory: Path, prefix: str = "") -> tuple[dict[str, Any], int] | None:
    """The state tree and step of the newest complete checkpoint under ``directory``, or ``None`` if there is none.

    Raises:
        StateError: the newest complete checkpoint cannot be read.
    """
    newest = newest_complete(directory)
    if newest is None:
        return None
    log.info("%s resuming from checkpoint %s (step %s)", prefix, newest.path, newest.step)
    return read_checkpoint(newest.path), newest.step


RUN_ID_KEY = "amoeba/checkpoint/run"


def open_checkpoints(
    policy: CheckpointPolicy | None, store: TCPStore, state: TorchState, prefix: str
) -> Checkpointer | None:
    """Start a worker's checkpointing: resume ``state`` from the newest complete checkpoint, start the writer.

    Every worker of the job does this before it reports ready; joiners of a running job then receive the running
    members' state, which replaces what they read here.

    Args:
        policy: the policy given to ``run()``; ``None``: from ``AMOEBA_CHECKPOINT_*``, and none if unset.
        store: the job's store (the members agree there on this run's id, which names its checkpoints).
        state: the worker's state, loaded in place.
        prefix: log prefix.

    Returns:
        The writer, or ``None`` without a policy.

    Raises:
        RuntimeConfigError: an ``AMOEBA_CHECKPOINT_*`` variable is malformed, or the store's run id is not one a
            worker wrote (8 hex digits).
        StateError: the newest complete checkpoint does not fit the state.
    """
    policy = policy if policy is not None else CheckpointPolicy.from_environ(os.environ)
    if policy is None:
        return None
    run_id = store.compare_set(RUN_ID_KEY, "", secrets.token_hex(4)).decode(errors="replace")
    if not re.fullmatch(r"[0-9a-f]{8}", run_id):  # it names directories: never a path another store client chose
        raise RuntimeConfigError(f"{prefix} the store's checkpoint run id {run_id[:40]!r} is not 8 hex digits")
    found = load_newest(policy.directory, prefix)
    if found is not None:
        tree, step = found
        try:
            state.load_tree(tree)
        except StateError as exc:
            raise StateError(f"{prefix} cannot resume from the checkpoint of step {step}: {exc}") from None
    return Checkpointer(policy, run_id, prefix)
