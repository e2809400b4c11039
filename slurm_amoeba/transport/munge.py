"""Munge credentials for the daemon/agent/amoebactl messages (libmunge through ctypes; no commands).

munged runs on every Slurm node already; a credential it encodes names the uid and gid of the process that asked
for it, and only a munged with the same key can decode it. :func:`seal` makes a credential whose payload binds
three things: the SHA-256 of a message's bytes, its **destination** (a name of the receiver, see
:func:`slurm_amoeba.transport.channel.destination`) and its **send time**; :func:`unseal` checks all three against
the bytes received, the receiver's own names and its clock, and returns the sender's uid. So a credential made for
one receiver is refused by every other (no relaying a user's request, or the daemon's directive, to someone it was
not meant for), and one older than :data:`MAX_AGE_S` (allowing :data:`CLOCK_SKEW_S` between the clocks) is refused
however long munge's own TTL (300 s by default) would keep it. munged refuses a credential it decoded before
(``Replayed credential (17)``, :data:`EMUNGE_CRED_REPLAYED`); that cache lives in munged's memory, per node, so
receivers keep a small one of their own too (:class:`ReplayCache`), which also holds across a munged restart.

DESIGN.md places authentication with the daemon; it lives here, at the boundary to the Slurm installation, because
the job agent (a layer above the daemon) must check the daemon's directives with it too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import hashlib
import hmac
import threading
import time

from slurm_amoeba.core.errors import AmoebaError

# Codes of munge.h's munge_err_t this module tells apart.
EMUNGE_SNAFU = 1
EMUNGE_SOCKET = 6
EMUNGE_TIMEOUT = 7
EMUNGE_CRED_EXPIRED = 15
EMUNGE_CRED_REWOUND = 16
EMUNGE_CRED_REPLAYED = 17
_UNREACHABLE = frozenset({EMUNGE_SNAFU, EMUNGE_SOCKET, EMUNGE_TIMEOUT})

MAX_AGE_S = 30.0
"""A credential sent longer ago than this (by the sender's clock, as it signed it) is refused. Requests wait at
most a few seconds in a socket (their deadlines are 2-5 s), so 30 s leaves room for a loaded node."""

CLOCK_SKEW_S = 10.0
"""How far the sender's and the receiver's clocks may differ: a send time up to this far in the receiver's future
is taken, and the age bound is stretched by it. Nodes run NTP for Slurm and munge already (munge refuses a
credential "rewound" from the future too), so 10 s is generous."""

_TAG = b"amoeba-cred/2"
_MAX_DESTINATION = 256


class MungeError(AmoebaError):
    """A credential could not be made or was refused (bad, expired, replayed, or munged unreachable).

    Attributes:
        code: munge's error code (``munge_err_t``), or 0 when munge accepted the credential and this module refused
            it (wrong message, destination or age).
    """

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code

    @property
    def unreachable(self) -> bool:
        """Whether munged did not answer (a hiccup worth retrying), not a credential that was refused."""
        return self.code in _UNREACHABLE

    @property
    def replayed(self) -> bool:
        """Whether the credential was seen before (by munged or by a :class:`ReplayCache`)."""
        return self.code == EMUNGE_CRED_REPLAYED


@dataclasses.dataclass(frozen=True)
class Credential:
    """Who sent a message, as munge vouches for it."""

    uid: int
    gid: int
    sent_at: float = 0.0


_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()
_libc = ctypes.CDLL(None)
_libc.free.argtypes = [ctypes.c_void_p]
_libc.free.restype = None


def _munge() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is None:
            name = ctypes.util.find_library("munge") or "libmunge.so.2"
            try:
                lib = ctypes.CDLL(name)
            except OSError as exc:
                raise MungeError(f"cannot load libmunge ({exc}); install Debian's munge package") from None
            lib.munge_encode.argtypes = [
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_int,
            ]
            lib.munge_encode.restype = ctypes.c_int
            lib.munge_decode.argtypes = [
                ctypes.c_char_p,
                ctypes.c_void_p,
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(ctypes.c_int),
                ctypes.POINTER(ctypes.c_uint32),
                ctypes.POINTER(ctypes.c_uint32),
            ]
            lib.munge_decode.restype = ctypes.c_int
            lib.munge_strerror.argtypes = [ctypes.c_int]
            lib.munge_strerror.restype = ctypes.c_char_p
            _lib = lib
        return _lib


def _error(lib: ctypes.CDLL, code: int, what: str) -> MungeError:
    text = lib.munge_strerror(code)
    reason = text.decode(errors="replace") if text else f"error {code}"
    hint = " (is munged running? `munge -n | unmunge` tells)" if code in _UNREACHABLE else ""
    return MungeError(f"munge could not {what}: {reason} ({code}){hint}", code)


def binding(message: bytes, to: str, sent_at_ms: int) -> bytes:
    """The payload a credential carries: tag, destination, send time (ms) and the message's SHA-256, one a line."""
    return b"\n".join((_TAG, to.encode(), str(sent_at_ms).encode(), hashlib.sha256(message).hexdigest().encode()))


def _check_destination(to: str) -> bytes:
    data = to.encode()
    if not data or len(data) > _MAX_DESTINATION or b"\n" in data:
        raise MungeError(f"a credential's destination must be 1..{_MAX_DESTINATION} bytes on one line, not {to[:80]!r}")
    return data


def seal(message: bytes, *, to: str, sent_at: float | None = None) -> bytes:
    """A munge credential vouching for this process's uid, for ``message`` (by its SHA-256), for its destination
    ``to`` and for its send time.

    Args:
        message: the exact bytes that travel with the credential.
        to: the receiver's name (:func:`slurm_amoeba.transport.channel.destination` of its endpoint, or
            ``reply <request id>`` for an answer).
        sent_at: the send time (Unix seconds); now when None.

    Raises:
        MungeError: munged is unreachable or refused, or ``to`` is empty, too long or not one line.
    """
    _check_destination(to)
    lib = _munge()
    when = time.time() if sent_at is None else sent_at
    bound = binding(message, to, round(when * 1000))
    cred = ctypes.c_void_p()
    code = lib.munge_encode(ctypes.byref(cred), None, bound, len(bound))
    try:
        if code != 0:
            raise _error(lib, code, "encode a credential")
        return ctypes.string_at(cred.value) if cred.value else b""
    finally:
        if cred.value:
            _libc.free(cred)


def _decode(credential: bytes) -> tuple[bytes, Credential]:
    """munge's payload and the uid/gid it vouches for (munge's own checks: key, TTL, replay)."""
    if not credential or b"\0" in credential or len(credential) > 4096:
        raise MungeError("the message carries no valid munge credential")
    lib = _munge()
    payload = ctypes.c_void_p()
    length = ctypes.c_int(0)
    uid = ctypes.c_uint32(0)
    gid = ctypes.c_uint32(0)
    code = lib.munge_decode(
        credential, None, ctypes.byref(payload), ctypes.byref(length), ctypes.byref(uid), ctypes.byref(gid)
    )
    try:
        if code != 0:
            raise _error(lib, code, "decode the message's credential")
        data = ctypes.string_at(payload.value, length.value) if payload.value else b""
    finally:
        if payload.value:
            _libc.free(payload)
    return data, Credential(uid=uid.value, gid=gid.value)


def unseal(
    credential: bytes,
    message: bytes,
    *,
    to: str,
    now: float | None = None,
    max_age_s: float = MAX_AGE_S,
    skew_s: float = CLOCK_SKEW_S,
) -> Credential:
    """Check a credential made by :func:`seal` for ``message`` and destination ``to``; return who made it, and when.

    Args:
        credential: the credential frame.
        message: the bytes that came with it.
        to: this receiver's name, as senders name it.
        now: the receiver's clock (Unix seconds); now when None.
        max_age_s: refuse a credential sent longer ago than this (plus ``skew_s``).
        skew_s: the clock difference allowed between sender and receiver.

    Raises:
        MungeError: the credential is malformed, expired, replayed, from another munge key, does not match
            ``message``, was made for another destination, or was sent too long ago (or in the future).
    """
    expected = _check_destination(to)
    data, who = _decode(credential)
    parts = data.split(b"\n")
    if len(parts) != 4 or parts[0] != _TAG:
        raise MungeError("the munge credential is not one of slurm_amoeba's (or of an older version of it)")
    _, dest, sent, digest = parts
    if not hmac.compare_digest(digest, hashlib.sha256(message).hexdigest().encode()):
        raise MungeError("the munge credential was made for another message (tampered or mixed up)")
    if not hmac.compare_digest(dest, expected):
        shown = dest[:80].decode("ascii", errors="replace")
        raise MungeError(f"the munge credential was made for {shown!r}, not for {to!r} (relayed or misdirected)")
    if not sent.isdigit() or len(sent) > 16:
        raise MungeError("the munge credential carries no valid send time")
    sent_at = int(sent) / 1000
    age = (time.time() if now is None else now) - sent_at
    if age > max_age_s + skew_s:
        raise MungeError(
            f"the munge credential was sent {age:.0f} s ago, more than {max_age_s:g} s (+{skew_s:g} s clock skew): "
            "a replay, or clocks apart (check NTP)",
            EMUNGE_CRED_EXPIRED,
        )
    if age < -skew_s:
        raise MungeError(
            f"the munge credential was sent {-age:.0f} s in this host's future, more than the {skew_s:g} s clock "
            "skew allowed: check NTP on both hosts",
            EMUNGE_CRED_REWOUND,
        )
    return dataclasses.replace(who, sent_at=sent_at)


class ReplayCache:
    """Credentials a receiver has taken, kept as long as their age would still let them in.

    munged refuses a credential it decoded before, but that memory is per munged (a credential taken on one node
    is new to the next node's munged) and starts empty when munged restarts. Destination binding covers the first
    case; this cache covers a receiver's own munged restarting.

    Args:
        keep_s: how long an entry matters (the age bound plus the skew).
        size: at most this many entries; the oldest go first (a sender would need more than ``size`` fresh
            credentials within ``keep_s`` to push one out, and then munged's own cache still refuses it unless
            munged restarted in between).
    """

    def __init__(self, keep_s: float = MAX_AGE_S + 2 * CLOCK_SKEW_S, size: int = 65536) -> None:
        self._keep_s = keep_s
        self._size = size
        self._seen: dict[bytes, float] = {}

    def check(self, credential: bytes, now: float | None = None) -> None:
        """Remember ``credential``; raise :class:`MungeError` (``replayed``) when it was taken before."""
        when = time.monotonic() if now is None else now
        key = hashlib.sha256(credential).digest()
        if key in self._seen:
            raise MungeError("the munge credential was used before (replayed)", EMUNGE_CRED_REPLAYED)
        while self._seen:
            oldest, at = next(iter(self._seen.items()))
            if at >= when - self._keep_s and len(self._seen) < self._size:
                break
            del self._seen[oldest]
        self._seen[key] = when
