"""Munge credentials for the daemon/agent/amoebactl messages (libmunge through ctypes; no commands).

munged runs on every Slurm node already; a credential it encodes names the uid and gid of the process that asked
for it, and only a munged with the same key can decode it. :func:`seal` makes a credential whose payload is the
SHA-256 of a message's bytes; :func:`unseal` checks it against the bytes received and returns the sender's uid. A
credential can be decoded once (munge refuses replays) and expires after its TTL.

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

from slurm_amoeba.core.errors import AmoebaError


class MungeError(AmoebaError):
    """A credential could not be made or was refused (bad, expired, replayed, or munged unreachable)."""


@dataclasses.dataclass(frozen=True)
class Credential:
    """Who sent a message, as munge vouches for it."""

    uid: int
    gid: int


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
    return MungeError(f"munge could not {what}: {reason} (is munged running? `munge -n | unmunge` tells)")


def seal(message: bytes) -> bytes:
    """A munge credential vouching for this process's uid and for ``message`` (by its SHA-256).

    Raises:
        MungeError: munged is unreachable or refused.
    """
    lib = _munge()
    digest = hashlib.sha256(message).digest()
    cred = ctypes.c_void_p()
    code = lib.munge_encode(ctypes.byref(cred), None, digest, len(digest))
    try:
        if code != 0:
            raise _error(lib, code, "encode a credential")
        return ctypes.string_at(cred.value) if cred.value else b""
    finally:
        if cred.value:
            _libc.free(cred)


def unseal(credential: bytes, message: bytes) -> Credential:
    """Check a credential made by :func:`seal` for ``message``; return who made it.

    Raises:
        MungeError: the credential is malformed, expired, replayed, from another munge key, or does not match
            ``message``.
    """
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
    if not hmac.compare_digest(data, hashlib.sha256(message).digest()):
        raise MungeError("the munge credential was made for another message (tampered or mixed up)")
    return Credential(uid=uid.value, gid=gid.value)
