"""Two jobs on one device: the share directive, the status file a job writes about itself, and the memory fit.

The daemon (or a test, or ``benchmarks/share.py``) tells a job how it shares its devices through its coordinator
(:meth:`~slurm_amoeba.runtime.coordinator.Coordinator.set_share`, the sealed ``share`` key): a
:class:`ShareDirective` — the job's role (``guaranteed``: it owns the device; ``opportunistic``: it trains on a device
another job owns and yields to it), a per-worker device memory cap, and where the partner's status file is. The
workers apply it at a step boundary (:class:`~slurm_amoeba.runtime.shared_device.SharedDevice`, worker side).

Every worker of a sharing job writes a :class:`JobStatus` about itself to its own status file (atomically, mode
0644, owned by the job's user): its recent step times. A sharer reads its partner's file only after checking that
the file's owner is the uid the directive names (:func:`read_status`), and uses it only to slow itself down
(:mod:`~slurm_amoeba.runtime.pacing`): nothing in the file can steer the job that wrote it.

Beside its status file a guaranteed worker keeps an *activity file* (:func:`activity_path`: the same name ending in
``.busy``): a fixed 48-byte little-endian record (:data:`ACTIVITY_FORMAT`) that it maps into memory and rewrites at
each transition between computing and idling (:class:`ActivityFile`), guarded by a sequence number that is odd
while a write is under way (a seqlock). A sharer maps it read-only after the same owner check
(:class:`ActivityReader`) and looks at it between its micro-batches, a read of a few microseconds.

:func:`largest_micro_batch` is the memory side: the largest micro-batch whose predicted peak (the plans' replicated
estimate, :mod:`~slurm_amoeba.runtime.plans`) fits a cap; the rest of the worker's share of the fixed global batch
goes to gradient accumulation. This module imports no torch (DESIGN.md, layer ``runtime/``, shared by both sides).
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import stat
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.core.sharing import ShareRole
from slurm_amoeba.runtime.pacing import OwnerActivity, StepRecord
from slurm_amoeba.runtime.plans import Layout, Linear, ModelProfile, Plan, PlanSpace
from slurm_amoeba.runtime.protocol import load_object

#: The format of directives and status files; a reader refuses another.
SHARE_VERSION = 1
#: The most step records a status file holds.
MAX_STATUS_STEPS = 64
#: A status file larger than this is refused unread.
MAX_STATUS_BYTES = 16 << 10
#: The activity file's record: magic ``AMBA``, format version, sequence number (odd while written), busy (0 or 1),
#: writer's pid, then since, mean busy spell and short idle spell in seconds.
ACTIVITY_FORMAT = struct.Struct("<4sIQIiddd")
_ACTIVITY_MAGIC = b"AMBA"
_SEQ = struct.Struct("<Q")
_SEQ_AT = 8


@dataclasses.dataclass(frozen=True)
class ShareDirective:
    """How one job shares its devices (the coordinator's sealed ``share`` key; versioned JSON).

    Attributes:
        role: guaranteed or opportunistic.
        memory_cap_bytes: the most device bytes one worker may hold (0: no cap). An opportunistic worker that
            cannot train a micro-batch of 1 under it leaves; a guaranteed worker is never capped below its need
            (a cap under it is raised to the need, and the worker logs that).
        partner_status_path: the guaranteed partner's status file (opportunistic role; empty: unpaced).
        partner_uid: the uid that must own that file (-1: this process's own uid).
        status_path: where this job's workers write their own status (``{worker}`` is replaced by the worker id;
            empty: no status file).
        workers: the workers it applies to (empty: every worker of the job).
        seq: grows with every new directive (the coordinator's count).
        pace_bound: the share of its exclusive speed the partner may lose to this job (opportunistic role; 0: the
            pacer's configured target).
        sub_batch: the most samples of one micro-batch (the daemon's policy searched it; 0: the cap alone decides).
    """

    role: ShareRole
    memory_cap_bytes: int = 0
    partner_status_path: str = ""
    partner_uid: int = -1
    status_path: str = ""
    workers: tuple[str, ...] = ()
    seq: int = 0
    pace_bound: float = 0.0
    sub_batch: int = 0

    def __post_init__(self) -> None:
        counts = (("memory_cap_bytes", self.memory_cap_bytes), ("seq", self.seq), ("sub_batch", self.sub_batch))
        for name, value in counts:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 62:
                raise ParseError(f"a share directive's {name} is {value!r:.40}, not a count of 0 or more")
        if isinstance(self.partner_uid, bool) or not isinstance(self.partner_uid, int) or self.partner_uid < -1:
            raise ParseError(f"a share directive's partner_uid is {self.partner_uid!r:.40}, not a uid or -1")
        bound = self.pace_bound
        if isinstance(bound, bool) or not isinstance(bound, int | float) or not 0 <= bound < 1:
            raise ParseError(f"a share directive's pace_bound is {bound!r:.40}, not a fraction from 0 to under 1")

    def applies_to(self, worker_id: str) -> bool:
        """Whether this directive is meant for ``worker_id``."""
        return not self.workers or worker_id in self.workers

    def to_json(self) -> str:
        """Encode as JSON text (with the format's version)."""
        data: dict[str, Any] = dataclasses.asdict(self)
        data["role"] = self.role.value
        data["workers"] = list(self.workers)
        data["version"] = SHARE_VERSION
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> ShareDirective:
        """Decode JSON text from :meth:`to_json`.

        Raises:
            ParseError: not a directive, another version, or a value out of range.
        """
        data = load_object(text, "share directive")
        if data.pop("version", None) != SHARE_VERSION:
            raise ParseError(f"a share directive of another version (this runtime reads {SHARE_VERSION})")
        try:
            data["role"] = ShareRole(data["role"])
            data["workers"] = tuple(str(w) for w in data.get("workers", ()))
            for name in ("partner_status_path", "status_path"):
                if not isinstance(data.get(name, ""), str):
                    raise TypeError(f"{name} must be text")
            return cls(**data)
        except (KeyError, TypeError, ValueError) as exc:
            raise ParseError(f"not a share directive ({exc})", source="share directive", text=str(text)) from None


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """What one worker says about itself in its status file.

    Attributes:
        job_id: the job.
        worker: the worker.
        role: its role.
        steps: its latest steps (at most :data:`MAX_STATUS_STEPS`), oldest first.
    """

    job_id: str
    worker: str
    role: ShareRole
    steps: tuple[StepRecord, ...]

    def to_json(self) -> str:
        """Encode as JSON text (with the format's version)."""
        steps = [[s.end, s.seconds] for s in self.steps[-MAX_STATUS_STEPS:]]
        data = {"version": SHARE_VERSION, "job_id": self.job_id, "worker": self.worker, "role": self.role.value}
        return json.dumps({**data, "steps": steps}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> JobStatus:
        """Decode JSON text from :meth:`to_json`.

        Raises:
            ParseError: not a status, or another version.
        """
        data = load_object(text, "job status")
        if data.get("version") != SHARE_VERSION:
            raise ParseError(f"a job status of another version (this runtime reads {SHARE_VERSION})")
        try:
            steps = tuple(StepRecord(float(end), float(seconds)) for end, seconds in data["steps"])
            return cls(str(data["job_id"]), str(data["worker"]), ShareRole(data["role"]), steps)
        except (KeyError, TypeError, ValueError) as exc:
            raise ParseError(f"not a job status ({exc})", source="job status", text=str(text)) from None


def write_status(path: Path, status: JobStatus) -> None:
    """Write ``status`` to ``path`` atomically (a temporary file in the same directory, then a rename), mode 0644.

    Raises:
        OSError: the directory cannot be written.
    """
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w") as out:
            os.fchmod(out.fileno(), 0o644)
            out.write(status.to_json())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_status(path: Path, owner_uid: int) -> JobStatus:
    """Read a partner's status file, refusing one that another user owns or that is not a plain file.

    The file is opened without following a link, and its owner is checked on the open descriptor, so the check
    and the read see the same file.

    Args:
        path: the file.
        owner_uid: the uid that must own it (-1: this process's own uid).

    Returns:
        The status.

    Raises:
        OSError: it cannot be opened.
        ParseError: another owner, not a plain file, too large, or not a status.
    """
    handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(handle, "rb") as source:
        _check_partner_file(path, source.fileno(), owner_uid)
        raw = source.read(MAX_STATUS_BYTES + 1)
    if len(raw) > MAX_STATUS_BYTES:
        raise ParseError(f"the status file {path} is larger than {MAX_STATUS_BYTES} bytes: refused")
    return JobStatus.from_json(raw)


def largest_micro_batch(profile: ModelProfile, global_batch: int, world_size: int, cap_bytes: int) -> int:
    """The largest micro-batch whose predicted peak per worker, with the runtime's commit (:func:`commit_bytes`),
    fits ``cap_bytes`` (replicated state, no checkpointing: the runtime's own data parallelism), up to a worker's
    share of the global batch.

    Args:
        profile: the model's measured bytes (:func:`~slurm_amoeba.runtime.plan_probe.probe_model`, or
            :func:`profile_from_peak`).
        global_batch: samples per optimizer step.
        world_size: workers.
        cap_bytes: the cap (0: none).

    Returns:
        The micro-batch (the share cut evenly: a micro-batch of 10 in a share of 32 runs as 4 of 8, so 8); 0 when
        not even one sample fits.
    """
    space = PlanSpace(profile, global_batch)
    share = space.share(world_size)
    if cap_bytes == 0:
        return share
    fits = [
        micro
        for micro in {-(-share // accumulation) for accumulation in range(1, share + 1)}
        if space.estimate(Plan(Layout.REPLICATED, False, micro), world_size).peak_bytes + commit_bytes(profile)
        <= cap_bytes
    ]
    return max(fits, default=0)


def commit_bytes(profile: ModelProfile) -> int:
    """The runtime's own copy of the state on the device: its in-memory commit (``TorchState.save``) clones the
    parameters and the optimizer's state where they live, beside the training step's peak."""
    return profile.param_bytes + profile.optimizer_bytes


def need_bytes(profile: ModelProfile, global_batch: int, world_size: int) -> int:
    """The predicted peak of a worker that trains with micro-batches of 1, with the runtime's commit: the least it
    can train with."""
    space = PlanSpace(profile, global_batch)
    peak = space.estimate(Plan(Layout.REPLICATED, False, 1), world_size).peak_bytes
    return int(peak + commit_bytes(profile) + 0.999)


def profile_from_peak(param_bytes: int, optimizer_bytes: int, peak_bytes: int, micro_batch: int) -> ModelProfile:
    """A memory-only profile from one measured step: the peak beyond parameters, gradients and optimizer state is
    taken as proportional to the micro-batch (times are left at 0; only the memory fit reads this profile).

    Args:
        param_bytes: the parameters' bytes.
        optimizer_bytes: the optimizer state's bytes.
        peak_bytes: the measured peak of one step.
        micro_batch: the step's largest micro-batch.
    """
    per_sample = max(0.0, (peak_bytes - 2 * param_bytes - optimizer_bytes) / max(1, micro_batch))
    line = Linear(0.0, per_sample)
    flat = Linear(0.0, 0.0)
    return ModelProfile(param_bytes, optimizer_bytes, param_bytes, 1, line, line, flat, flat, 0.0)


def recent_steps(steps: Sequence[StepRecord], record: StepRecord) -> tuple[StepRecord, ...]:
    """``steps`` with ``record`` appended, keeping the latest :data:`MAX_STATUS_STEPS`."""
    return (*steps, record)[-MAX_STATUS_STEPS:]


def activity_path(status_path: str | Path) -> Path:
    """Where the worker whose status file is ``status_path`` publishes its activity: the same name ending in
    ``.busy`` (``/dev/shm/amoeba-share-42.json``: ``/dev/shm/amoeba-share-42.busy``)."""
    return Path(status_path).with_suffix(".busy")


class ActivityFile:
    """The guaranteed worker's side of the activity file: created atomically (mode 0644) and mapped into memory,
    then rewritten in place at each transition.

    Args:
        path: the file (:func:`activity_path` of the worker's status file).

    Raises:
        OSError: the directory cannot be written.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            os.fchmod(handle, 0o644)
            os.write(handle, bytes(ACTIVITY_FORMAT.size))
            self._map = mmap.mmap(handle, ACTIVITY_FORMAT.size)
            os.replace(temporary, path)
        except BaseException:
            os.close(handle)
            Path(temporary).unlink(missing_ok=True)
            raise
        os.close(handle)  # the mapping keeps the file
        self._seq = 0

    def publish(self, activity: OwnerActivity) -> None:
        """Write ``activity`` (the sequence number is odd while the record changes, even after)."""
        self._seq += 1
        _SEQ.pack_into(self._map, _SEQ_AT, self._seq)
        record = (_ACTIVITY_MAGIC, SHARE_VERSION, self._seq, int(activity.busy), activity.pid)
        times = (activity.since, activity.busy_s, activity.idle_s)
        ACTIVITY_FORMAT.pack_into(self._map, 0, *record, *times)
        self._seq += 1
        _SEQ.pack_into(self._map, _SEQ_AT, self._seq)

    def close(self) -> None:
        """Unmap the file (it stays for readers: its last record says idle when the worker marked itself so)."""
        self._map.close()


class ActivityReader:
    """A sharer's view of its partner's activity file, mapped read-only after the owner check of
    :func:`read_status`; reopened when the file is replaced (a restarted partner writes a new one).

    Args:
        path: the partner's activity file.
        owner_uid: the uid that must own it (-1: this process's own uid).
    """

    def __init__(self, path: Path, owner_uid: int) -> None:
        self.path, self.owner_uid = path, owner_uid
        self._map: mmap.mmap | None = None
        self._inode: tuple[int, int] | None = None

    def read(self) -> OwnerActivity:
        """The partner's activity now.

        Raises:
            OSError: the file cannot be opened.
            ParseError: another owner, not a plain file of the record's size, another format, or a record that
                kept changing while read.
        """
        mapped = self._map if self._map is not None else self._open()
        for _ in range(100):
            (before,) = _SEQ.unpack_from(mapped, _SEQ_AT)
            magic, version, seq, busy, pid, since, busy_s, idle_s = ACTIVITY_FORMAT.unpack_from(mapped, 0)
            (after,) = _SEQ.unpack_from(mapped, _SEQ_AT)
            if before == after == seq and seq % 2 == 0:
                break
        else:
            raise ParseError(f"the activity file {self.path} kept changing while read")
        if magic != _ACTIVITY_MAGIC or version != SHARE_VERSION or seq == 0:
            raise ParseError(f"the activity file {self.path} holds no activity record of version {SHARE_VERSION}")
        return OwnerActivity(bool(busy), since, busy_s, idle_s, pid)

    def refresh(self) -> None:
        """Reopen at the next read when the file at the path is no longer the one mapped (or is gone)."""
        try:
            info = os.stat(self.path, follow_symlinks=False)
        except OSError:
            self.close()
            return
        if (info.st_dev, info.st_ino) != self._inode:
            self.close()

    def close(self) -> None:
        """Unmap the file."""
        if self._map is not None:
            self._map.close()
        self._map, self._inode = None, None

    def _open(self) -> mmap.mmap:
        handle = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            info = _check_partner_file(self.path, handle, self.owner_uid)
            if info.st_size != ACTIVITY_FORMAT.size:
                raise ParseError(f"the activity file {self.path} is not of {ACTIVITY_FORMAT.size} bytes: refused")
            self._map = mmap.mmap(handle, ACTIVITY_FORMAT.size, prot=mmap.PROT_READ)
            self._inode = (info.st_dev, info.st_ino)
            return self._map
        finally:
            os.close(handle)


def _check_partner_file(path: Path, handle: int, owner_uid: int) -> os.stat_result:
    """Refuse an open partner file that is not a plain file or that ``owner_uid`` (-1: this process's uid) does not
    own (checked on the descriptor, so that the check and the read see the same file); its status.

    Raises:
        ParseError: not a plain file, or another owner.
    """
    expected = os.getuid() if owner_uid == -1 else owner_uid
    info = os.fstat(handle)
    if not stat.S_ISREG(info.st_mode):
        raise ParseError(f"the partner's file {path} is not a plain file; give the partner's own status file")
    if info.st_uid != expected:
        raise ParseError(
            f"the partner's file {path} is owned by uid {info.st_uid}, not by the partner's uid {expected}: "
            "refused (only the partner job may say how fast it runs and when it computes)"
        )
    return info
