"""The lease that makes one of two ``amoebad`` the active one (docs/admin.md, "A standby daemon on a second host").

DESIGN.md, control flow: only the daemon that holds the lease runs rounds and sends directives; the other, the
standby, watches the lease and takes it over when its holder stops renewing it. The lease lives in a directory both
hosts mount (``ha.lease_dir``, usually beside ``state_file``) as two kinds of files:

- ``claim.<N>``: created with ``O_CREAT | O_EXCL`` by the daemon that takes **generation** ``N``. Exclusive creation
  lets exactly one daemon ever hold a generation; the generation is the fencing token every directive carries.
- ``lease.json``: the holder's renewal (owner, endpoint, generation, a serial it increments, the expiry it promises),
  replaced atomically (write, fsync, rename) every ``renew_s`` and read back to confirm.

Time is never compared across hosts: each side measures durations with its own monotonic clock (injected, so tests
run on fake clocks). The holder acts only while ``now < (start of its last confirmed renewal) + expiry_s``; a renewal
confirms only when no ``claim.<N+1>`` exists after it was written. The standby takes over only after the record it
reads has not changed for ``expiry_s + margin_s`` of its own clock, then claims ``N+1`` and reads ``lease.json``
again: if a renewal slipped in between its last read and its claim, the old holder may still believe itself active
until that renewal expires, so the new holder waits ``expiry_s + margin_s`` more before it acts. ``margin_s`` covers
the difference in rate between the two hosts' monotonic clocks and the latency of a read; wall-clock skew does not
matter at all.

What the storage must guarantee (local file systems, NFSv3 and later, Lustre, GPFS and CephFS do, NFS with
``lookupcache=none`` and ``actimeo=0`` on the lease directory): exclusive creation is atomic across hosts; a rename
within the directory is atomic; a read by name after another host's create or rename returned sees it (no stale
cached lookup or data). An ``fcntl`` lock is not used: NFS's lock manager loses locks across client restarts and
partitions.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

LEASE_FILE = "lease.json"
CLAIM_PREFIX = "claim."
_MAX_RECORD = 4096


class LeaseError(OSError):
    """The lease directory cannot be used (unreadable, not writable); the message names the path and the fix."""


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """One renewal of the lease, as ``lease.json`` holds it.

    Attributes:
        owner: the holder's id (host, pid and a random part: unique per process).
        endpoint: where agents and ``amoebactl`` reach the holder (``ha.advertise``).
        generation: the fencing token: 1 for the first holder, one more at every takeover.
        serial: incremented at every renewal, so that a reader sees a renewal without reading any clock.
        expiry_s: the holder's promise: it stops acting this long after a renewal it could not repeat.
    """

    owner: str
    endpoint: str
    generation: int
    serial: int
    expiry_s: float

    def to_json(self) -> str:
        """The record as one JSON line."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LeaseRecord:
        """Read a record.

        Raises:
            ValueError: not a lease record (a field missing or of the wrong type).
        """
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("a lease record is a JSON object")
        owner, endpoint, generation = doc.get("owner"), doc.get("endpoint"), doc.get("generation")
        serial, expiry = doc.get("serial"), doc.get("expiry_s")
        ints = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (generation, serial))
        if not (isinstance(owner, str) and isinstance(endpoint, str) and ints):
            raise ValueError(f"lease record {text[:200]!r} lacks owner, endpoint, generation or serial")
        if isinstance(expiry, bool) or not isinstance(expiry, (int, float)) or not 0 < expiry < 3600:
            raise ValueError(f"lease record expiry_s {expiry!r} is not a number of seconds")
        return cls(owner, endpoint, int(generation), int(serial), float(expiry))  # type: ignore[arg-type]


def new_owner_id() -> str:
    """A holder id unique to this process: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseStore:
    """The lease directory's files (see the module docstring); no clock, no decision.

    Args:
        directory: the shared directory; created when missing.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / LEASE_FILE

    def prepare(self) -> None:
        """Create the directory when missing and check it is writable.

        Raises:
            LeaseError: it cannot be created or written (the message names the fix).
        """
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LeaseError(f"ha.lease_dir {str(self.directory)!r} cannot be created: {exc.strerror}") from None
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise LeaseError(
                f"ha.lease_dir {str(self.directory)!r} is not writable by uid {os.getuid()}; give both daemons' user "
                f"write access to it on the shared file system"
            )

    def read(self) -> LeaseRecord | None:
        """The last renewal, or None when there is none (or it cannot be read: logged, and counted as none)."""
        try:
            with self.path.open("rb") as handle:
                data = handle.read(_MAX_RECORD)
        except FileNotFoundError:
            return None
        except OSError as exc:
            logger.warning("[daemon/lease] cannot read %s: %s", self.path, exc)
            return None
        try:
            return LeaseRecord.from_json(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            logger.warning("[daemon/lease] %s is not a lease record (%s); treating the lease as free", self.path, exc)
            return None

    def write(self, record: LeaseRecord) -> None:
        """Replace ``lease.json`` atomically (write a temporary file, fsync, rename, fsync the directory).

        Raises:
            OSError: the write failed (the caller keeps its previous renewal and tries again).
        """
        tmp = self.directory / f".{LEASE_FILE}.{record.owner.replace('/', '_')}.tmp"
        try:
            with tmp.open("w", encoding="utf-8") as handle:
                handle.write(record.to_json())
                handle.flush()
                os.fsync(handle.fileno())
            tmp.replace(self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        except OSError:  # some file systems cannot fsync a directory; the rename is still atomic
            pass
        finally:
            os.close(fd)

    def claimed(self, generation: int) -> bool:
        """Whether ``claim.<generation>`` exists."""
        return (self.directory / f"{CLAIM_PREFIX}{generation}").exists()

    def claim(self, generation: int, owner: str) -> bool:
        """Create ``claim.<generation>`` exclusively.

        Returns:
            Whether this call created it (False: another daemon holds that generation).

        Raises:
            OSError: the file system refused for another reason.
        """
        try:
            fd = os.open(self.directory / f"{CLAIM_PREFIX}{generation}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, owner.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def highest_claim(self, start: int) -> int:
        """The highest generation claimed, probing upwards from ``start`` (claims are never removed)."""
        generation = max(start, 0)
        while self.claimed(generation + 1):
            generation += 1
        return generation


class Role(str, enum.Enum):
    """What this daemon is. ``STANDBY`` -> ``ACTIVE`` on a takeover (perhaps through ``WAITING``: a renewal of the
    old holder slipped in, so it acts only once that renewal expired); ``ACTIVE`` -> ``DEPOSED`` when it could not
    renew before its expiry or saw a newer claim, and never back: the process ends and starts again as a standby."""

    STANDBY = "standby"
    WAITING = "waiting"
    ACTIVE = "active"
    DEPOSED = "deposed"


class Lease:
    """This daemon's side of the lease: watching it as a standby, holding and renewing it as the active one.

    Args:
        store: the lease directory.
        endpoint: where agents reach this daemon (``ha.advertise``).
        renew_s: how often the holder renews and the standby reads.
        expiry_s: how long after a renewal's start the holder stops acting unless it renewed again.
        margin_s: how much longer than ``expiry_s`` the standby waits before it takes over.
        clock: a monotonic clock (seconds); never a wall clock.
        owner: this process's id.

    Attributes:
        role: standby, waiting, active or deposed.
        generation: the generation held (active, waiting), or the one last seen (standby).
        holder: the record last read (standby: the active daemon's).
    """

    def __init__(
        self,
        store: LeaseStore,
        endpoint: str,
        *,
        renew_s: float,
        expiry_s: float,
        margin_s: float,
        clock: Callable[[], float],
        owner: str | None = None,
    ) -> None:
        if not 0 < renew_s < expiry_s:
            raise ValueError(f"renew_s={renew_s} must be above 0 and below expiry_s={expiry_s}")
        self.store = store
        self.endpoint = endpoint
        self.renew_s = renew_s
        self.expiry_s = expiry_s
        self.margin_s = margin_s
        self.clock = clock
        self.owner = owner or new_owner_id()
        self.role = Role.STANDBY
        self.generation = 0
        self.holder: LeaseRecord | None = None
        self._seen_at = clock()  # when the standby first read the record it holds in ``holder`` (its own clock)
        self._serial = 0
        self._valid_until = float("-inf")  # the holder acts while now < this
        self._act_from = float("inf")  # a waiting holder acts from this
        self._renewed_at = float("-inf")  # start of the last renewal attempt

    # ------------------------------------------------------------------ what the rest of the daemon asks

    def acting(self) -> bool:
        """Whether this daemon may act now (send a directive, change Slurm): no I/O, only its own clock."""
        now = self.clock()
        return self.role is Role.ACTIVE and now < self._valid_until

    def describe(self) -> dict[str, Any]:
        """What ``status`` shows: the role, the generation, the active daemon's endpoint and the lease directory."""
        holding = self.role in (Role.ACTIVE, Role.WAITING)
        active = self.endpoint if holding else self.holder.endpoint if self.holder is not None else ""
        return {
            "role": self.role.value,
            "generation": self.generation,
            "active": active,
            "lease_dir": str(self.store.directory),
        }

    # ------------------------------------------------------------------ the standby

    def watch(self) -> bool:
        """The standby's step (call it every ``renew_s``): read the lease, and take it over when its holder has not
        renewed it for ``expiry_s + margin_s`` of this daemon's clock.

        Returns:
            Whether this daemon now holds the lease (active, or waiting out a renewal that slipped in).
        """
        if self.role is not Role.STANDBY:
            return self.role in (Role.ACTIVE, Role.WAITING)
        now = self.clock()
        record = self.store.read()
        if record != self.holder:
            self.holder, self._seen_at = record, now
            if record is not None:
                self.generation = record.generation
            return False
        promised = max(record.expiry_s, self.expiry_s) if record is not None else 0.0
        if record is not None and now - self._seen_at < promised + self.margin_s:
            return False
        return self._take_over(record, now)

    def _take_over(self, judged: LeaseRecord | None, now: float) -> bool:
        start = self.store.highest_claim(judged.generation if judged is not None else 0)
        generation = start + 1
        if not self.store.claim(generation, self.owner):
            self.holder, self._seen_at = None, now  # another standby was faster: watch the new holder from now
            return False
        after = self.store.read()
        self.generation = generation
        raced = after != judged
        self._act_from = now + self.expiry_s + self.margin_s if raced else now
        self.role = Role.WAITING if raced else Role.ACTIVE
        logger.warning(
            "[daemon/lease] took over the lease in %s as generation %d (the holder %s stopped renewing it)%s",
            self.store.directory,
            generation,
            judged.owner if judged is not None else "(none)",
            f"; a renewal slipped in, so acting only after {self.expiry_s + self.margin_s:g} s" if raced else "",
        )
        self._renew(now)
        if self.role is Role.ACTIVE and not self.acting():
            self.role = Role.WAITING  # the first write failed: renew before acting
        return True

    # ------------------------------------------------------------------ the holder

    def keep(self) -> bool:
        """The holder's step (call it often, before acting): renew when due, confirm, and say whether it may act.

        Returns:
            Whether it may act now; False for a waiting holder, and from the moment a holder is deposed on.
        """
        if self.role in (Role.STANDBY, Role.DEPOSED):
            return False
        now = self.clock()
        if self.role is Role.ACTIVE and now >= self._valid_until:
            return self._depose("it could not renew the lease before it expired")
        if now - self._renewed_at >= self.renew_s and not self._renew(now):
            return False
        if self.role is Role.WAITING and now >= self._act_from and now < self._valid_until:
            self.role = Role.ACTIVE
            logger.warning("[daemon/lease] generation %d now acts", self.generation)
        return self.acting()

    def _renew(self, start: float) -> bool:
        """Renew (write, read back, no newer claim): the lease then holds until ``start + expiry_s``.

        Returns:
            False when deposed (a newer generation was claimed); a renewal that merely failed returns True and keeps
            the previous expiry.
        """
        self._renewed_at = start
        newer = f"generation {self.generation + 1} was claimed by another daemon"
        if self.store.claimed(self.generation + 1):
            return self._depose(newer)
        record = LeaseRecord(self.owner, self.endpoint, self.generation, self._serial + 1, self.expiry_s)
        try:
            self.store.write(record)
        except OSError as exc:
            logger.error("[daemon/lease] cannot renew the lease in %s: %s", self.store.directory, exc)
            return True
        if self.store.claimed(self.generation + 1):
            return self._depose(newer)
        if self.store.read() != record:
            logger.error("[daemon/lease] %s does not read back as written; renewing again soon", self.store.path)
            return True
        self._serial = record.serial
        self._valid_until = start + self.expiry_s
        return True

    def _depose(self, why: str) -> bool:
        if self.role is not Role.DEPOSED:
            logger.error("[daemon/lease] generation %d stops acting: %s", self.generation, why)
        self.role = Role.DEPOSED
        self._valid_until = float("-inf")
        return False
