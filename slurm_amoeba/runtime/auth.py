"""The job's secret, and the authenticated values the coordinator and its workers put into the job's TCPStore.

torch's ``TCPStore`` has no credential: anyone who reaches its port can read and write any key. So the runtime's own
exchanges (docs/runtime.md, "Who may talk to the store") carry an HMAC-SHA256 made with a per-job secret that the
coordinator draws (:func:`secrets.token_bytes`) and hands to the workers it launches, in their environment
(``AMOEBA_JOB_SECRET``, hex; local mode) or in a 0600 file (``AMOEBA_JOB_SECRET_FILE``; the Slurm agent writes
``<state_dir>/job.secret`` so that the secret never sits in a job's submitted environment or on a command line).

A sealed value is a one-line JSON header ``{"e": epoch, "h": tag, "n": counter, "s": sender}``, a newline, and the
text itself (not escaped into the header: a state manifest of a few hundred kB is sealed and opened at the cost of
its HMAC, not of JSON-quoting it twice). The tag covers the store key it was written to, the sender, the sender's
epoch (random per process) and counter, and the text: a value copied to another key, claimed by another sender, or
altered fails; an :class:`Opener` that checks freshness also refuses a counter it has seen from that sender, epoch
and key (a replayed value). A client without the secret can connect, but what it writes is refused, and it cannot
impersonate a worker or the coordinator.

:class:`JobAuth` is one process's view of that: it seals what the process writes, opens what it reads (a refused
value is logged once, counted, and read as absent), and derives the per-generation token that hides a generation's
keys (:func:`~slurm_amoeba.runtime.protocol.generation_space`). :func:`join_job` is a starting worker's handshake:
it proves that it holds the secret with a sealed join request carrying a fresh nonce, and receives the worker id the
coordinator issues (sealed, at a key named by the nonce).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import itertools
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from torch._C._distributed_c10d import Store, TCPStore

from slurm_amoeba.core.errors import ParseError, SpecError
from slurm_amoeba.core.messages import quote
from slurm_amoeba.core.runtime_env import ENV_WORKER_ID, WorkerEnv
from slurm_amoeba.runtime.errors import RuntimeConfigError, RuntimeTimeout
from slurm_amoeba.runtime.protocol import JOIN_KEY, WANT_KEY, JoinAnswer, JoinRequest, join_answer_key

log = logging.getLogger(__name__)

ENV_JOB_SECRET = "AMOEBA_JOB_SECRET"  # noqa: S105 - the variable's name, not a secret
ENV_JOB_SECRET_FILE = "AMOEBA_JOB_SECRET_FILE"  # noqa: S105 - the variable's name
#: The agent's secret file in the job's state directory.
JOB_SECRET_FILE = "job.secret"  # noqa: S105 - a file name
SECRET_BYTES = 32
#: The coordinator's name as a sender.
COORDINATOR = "coordinator"
_MAX_SEALED = 1 << 22  # 4 MiB: no runtime value comes near; a bigger one is refused before parsing


class AuthError(ParseError):
    """A store value that is not sealed with the job's secret, or was sealed for another key or sender, or replayed."""


class JobKey:
    """The job's secret.

    Args:
        secret: at least 16 random bytes (:meth:`new` draws 32).
    """

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise SpecError(f"the job's secret has {len(secret)} bytes; it needs at least 16 (use JobKey.new())")
        self._secret = secret

    @classmethod
    def new(cls) -> JobKey:
        """A fresh random secret."""
        return cls(secrets.token_bytes(SECRET_BYTES))

    def hex(self) -> str:
        """The secret as hex text (for ``AMOEBA_JOB_SECRET``)."""
        return self._secret.hex()

    def write(self, path: Path) -> Path:
        """Write the secret to ``path`` (hex, mode 0600, replacing a file there, never through a symlink).

        Raises:
            OSError: the file cannot be written.
        """
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, self.hex().encode())
        finally:
            os.close(fd)
        os.replace(tmp, path)
        return path

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> JobKey:
        """The secret a launcher handed a worker: ``AMOEBA_JOB_SECRET`` or the file ``AMOEBA_JOB_SECRET_FILE``.

        Raises:
            SpecError: neither is set, the file is unreadable or readable by others, or the text is not hex.
        """
        text = env.get(ENV_JOB_SECRET, "")
        where = ENV_JOB_SECRET
        if not text and env.get(ENV_JOB_SECRET_FILE):
            path = Path(env[ENV_JOB_SECRET_FILE])
            where = str(path)
            try:
                if path.stat().st_mode & 0o077:
                    raise SpecError(f"the job's secret file {path} is readable by others; it must be mode 0600")
                text = path.read_text(encoding="ascii", errors="replace").strip()
            except OSError as exc:
                raise SpecError(f"cannot read the job's secret file {path}: {exc.strerror}") from None
        if not text:
            raise SpecError(
                f"no job secret: the launcher sets {ENV_JOB_SECRET} or {ENV_JOB_SECRET_FILE} for every worker "
                "(Coordinator.worker_env does)"
            )
        try:
            return cls(bytes.fromhex(text))
        except ValueError:
            raise SpecError(f"the job's secret in {where} is not hex text") from None

    def derive(self, label: str) -> str:
        """A value only holders of the secret can compute (32 hex digits), e.g. a generation's token."""
        return hmac.new(self._secret, b"derive\0" + label.encode(), hashlib.sha256).hexdigest()[:32]

    def tag(self, key: str, sender: str, epoch: str, counter: int, text: str) -> str:
        """The HMAC-SHA256 of one sealed value (hex)."""
        data = "\0".join((key, sender, epoch, str(counter), text)).encode()
        return hmac.new(self._secret, data, hashlib.sha256).hexdigest()


class Sealer:
    """Seals what one process (a worker, or the coordinator) writes; thread-safe.

    Args:
        key: the job's secret.
        sender: this process's name (a worker id, or :data:`COORDINATOR`).
    """

    def __init__(self, key: JobKey, sender: str) -> None:
        self.key, self.sender = key, sender
        self.epoch = secrets.token_hex(8)
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def seal(self, store_key: str, text: str) -> str:
        """``text`` sealed for ``store_key``."""
        with self._lock:
            counter = next(self._counter)
        tag = self.key.tag(store_key, self.sender, self.epoch, counter, text)
        header = json.dumps({"s": self.sender, "e": self.epoch, "n": counter, "h": tag}, sort_keys=True)
        return f"{header}\n{text}"


class Opener:
    """Checks sealed values read from the store; with ``fresh`` it refuses a counter seen before (replays).

    Args:
        key: the job's secret.
    """

    def __init__(self, key: JobKey) -> None:
        self.key = key
        self.refused = 0
        self._last: dict[tuple[str, str, str], int] = {}
        self._lock = threading.Lock()

    def open(self, store_key: str, raw: str | bytes, *, sender: str | None = None, fresh: bool = False) -> str:
        """The text sealed in ``raw`` for ``store_key``; the sealed sender must be ``sender`` when given.

        Raises:
            AuthError: not sealed with the job's secret for this key and sender, or (``fresh``) replayed.
        """
        return self._open(store_key, raw, sender, fresh)[1]

    def sender_of(self, store_key: str, raw: str | bytes) -> tuple[str, str]:
        """``(sender, text)`` of a sealed value, checked and fresh (for the events queue, shared by all workers).

        Raises:
            AuthError: see :meth:`open`.
        """
        return self._open(store_key, raw, None, True)

    def _open(self, store_key: str, raw: str | bytes, sender: str | None, fresh: bool) -> tuple[str, str]:
        try:
            who, epoch, counter, text, tag = _parse(raw)
            if sender is not None and who != sender:
                raise AuthError(f"sealed by {quote(who)}, not by {sender!r}", source=store_key)
            expected = self.key.tag(store_key, who, epoch, counter, text)
            if not hmac.compare_digest(expected, tag):
                raise AuthError("its HMAC does not match (not made with the job's secret, or for another key)")
            if fresh:
                self._check_fresh((who, epoch, store_key), counter)
        except AuthError:
            with self._lock:
                self.refused += 1
            raise
        return who, text

    def _check_fresh(self, stream: tuple[str, str, str], counter: int) -> None:
        with self._lock:
            if counter <= self._last.get(stream, 0):
                raise AuthError(f"counter {counter} of {quote(stream[0])} was seen before (a replayed value)")
            self._last[stream] = counter


def _parse(raw: str | bytes) -> tuple[str, str, int, str, str]:
    """``(sender, epoch, counter, text, tag)`` of a sealed value: its JSON header line, then the text.

    Raises:
        AuthError: too large, not UTF-8, or not a header with the four fields and their types.
    """
    if len(raw) > _MAX_SEALED:
        raise AuthError(f"a value of {len(raw)} bytes is over the {_MAX_SEALED} limit")
    try:
        value = raw.decode() if isinstance(raw, bytes) else raw
        header, sep, text = value.partition("\n")
        data = json.loads(header) if sep else None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AuthError(f"not a sealed value ({type(exc).__name__})") from None
    if not isinstance(data, dict):
        raise AuthError("not a sealed value (a JSON header line, then the text)")
    who, epoch, counter, tag = (data.get(k) for k in ("s", "e", "n", "h"))
    if isinstance(who, str) and isinstance(epoch, str) and type(counter) is int and isinstance(tag, str):
        return who, epoch, counter, text, tag
    raise AuthError("not a sealed value (header fields s, e, n, h)")


class JobAuth:
    """One process's seals: what it writes as ``sender``, what it reads, and the tokens of generations.

    Args:
        key: the job's secret.
        sender: this process's name (its worker id, or :data:`COORDINATOR`).
    """

    def __init__(self, key: JobKey, sender: str) -> None:
        self.key = key
        self.sealer = Sealer(key, sender)
        self.opener = Opener(key)
        self._tokens: dict[int, str] = {}
        self._last_refused: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def token(self, generation: int) -> str:
        """The token of ``generation``'s keys (derived from the secret: the same in every member)."""
        with self._lock:
            if generation not in self._tokens:
                self._tokens[generation] = self.key.derive(f"generation {generation}")
            return self._tokens[generation]

    def put(self, store: Store, store_key: str, text: str) -> None:
        """Write ``text`` sealed at ``store_key``."""
        store.set(store_key, self.sealer.seal(store_key, text))

    def read(self, store: Store, store_key: str, *, sender: str) -> str | None:
        """The text ``sender`` sealed at ``store_key``; ``None`` while there is none, or only a refused value."""
        if not store.check([store_key]):
            return None
        return self.opened(store_key, store.get(store_key), sender)

    def opened(self, store_key: str, raw: bytes, sender: str) -> str | None:
        """The text ``sender`` sealed in ``raw`` for ``store_key``, or ``None`` (logged once per value, counted)."""
        with self._lock:
            if self._last_refused.get(store_key) == raw:
                return None
        try:
            return self.opener.open(store_key, raw, sender=sender)
        except AuthError as exc:
            with self._lock:
                self._last_refused[store_key] = raw
            log.warning("ignored the value at %s (it is not the job's): %s", store_key, exc)
            return None

    def all_sealed(self, store: Store, keys: Sequence[str], senders: Sequence[str]) -> bool:
        """Whether every key holds a value its sender sealed."""
        if not store.check(list(keys)):
            return False
        values = store.multi_get(list(keys))
        return all(self.opened(k, v, s) is not None for k, v, s in zip(keys, values, senders, strict=True))

    def want(self, store: Store) -> int:
        """The generation the coordinator asked to end (``want``); 0 when none, or only a refused value."""
        text = self.opened(WANT_KEY, store.get(WANT_KEY), COORDINATOR)
        return int(text) if text is not None and text.isdigit() else 0


#: How often a joining worker looks for the coordinator's answer.
_JOIN_POLL_S = 0.002


def join_job(env: WorkerEnv, key: JobKey) -> WorkerEnv:
    """A starting worker's handshake: the worker id the coordinator issues (the launcher's is only a hint).

    The request is sealed with the job's secret and carries a fresh nonce; the coordinator answers, sealed, at the
    key the nonce names. The answer also names the job, so a worker pointed at another job's store fails.

    Args:
        env: the worker's environment contract (``worker_id`` is the launcher's hint).
        key: the job's secret.

    Returns:
        ``env`` with the issued worker id.

    Raises:
        RuntimeTimeout: the store cannot be reached, or no answer came within the collective timeout (the secret is
            not the job's, or no coordinator runs there).
        RuntimeConfigError: the store belongs to another job.
    """
    where = f"{env.store_addr}:{env.store_port}"
    timeout = env.collective_timeout_s
    try:
        store = TCPStore(env.store_addr, env.store_port, is_master=False, timeout=datetime.timedelta(seconds=timeout))
    except (RuntimeError, OSError) as exc:
        raise RuntimeTimeout(f"cannot reach the coordinator's store at {where} within {timeout} s: {exc}") from None
    nonce = secrets.token_hex(16)
    store.queue_push(JOIN_KEY, Sealer(key, env.worker_id).seal(JOIN_KEY, JoinRequest(nonce, env.worker_id).to_json()))
    answer_key = join_answer_key(nonce)
    auth = JobAuth(key, env.worker_id)
    deadline = time.monotonic() + timeout
    while (text := auth.read(store, answer_key, sender=COORDINATOR)) is None:
        if time.monotonic() > deadline:
            raise RuntimeTimeout(
                f"[{env.job_id}/{env.worker_id}] the coordinator at {where} did not answer the join request within "
                f"{timeout:.0f} s: {ENV_JOB_SECRET} (or {ENV_JOB_SECRET_FILE}) is not this job's secret, or the "
                "job's coordinator is not running there"
            )
        time.sleep(_JOIN_POLL_S)
    try:
        answer = JoinAnswer.from_json(text)
    except ParseError as exc:
        raise RuntimeConfigError(f"the coordinator at {where} answered the join request with {exc}") from None
    if answer.job_id != env.job_id:
        raise RuntimeConfigError(
            f"[{env.job_id}/{env.worker_id}] the store at {where} belongs to job {answer.job_id!r}, not "
            f"{env.job_id!r}; check AMOEBA_STORE_ADDR/PORT"
        )
    if answer.worker != env.worker_id:
        log.info(
            "[%s] the coordinator issued worker id %s (%s was %s)",
            env.job_id,
            answer.worker,
            ENV_WORKER_ID,
            env.worker_id,
        )
    return dataclasses.replace(env, worker_id=answer.worker)
