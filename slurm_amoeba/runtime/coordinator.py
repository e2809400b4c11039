"""The coordinator: hosts a job's TCPStore and runs its membership, for local mode and the Slurm agent alike.

One :class:`Coordinator` per job, in a process that never leaves (the job's agent on Slurm, DESIGN.md flow 1; the
``amoeba-local`` process in local mode). It hosts the torch ``TCPStore`` that workers reach over TCP, reads their
events and heartbeats, feeds them to the pure :class:`~slurm_amoeba.runtime.membership.Membership`, writes the
resulting assignments back, and keeps the history of generations and the measured throughput per world size.

The launcher side needs only this::

    coordinator = Coordinator(CoordinatorConfig(job_id="job42", initial_workers=2, max_workers=8,
                                                advertise_addr="node07"))
    coordinator.start()
    env = {**os.environ, **coordinator.worker_env(coordinator.new_worker_id())}
    subprocess.Popen([sys.executable, "train.py"], env=env)   # or an srun step with these variables
    ...
    coordinator.request_leave("w3")      # graceful: leaves at the next step boundary
    coordinator.mark_dead("w5", "step ended with signal 9")   # launcher saw the process die
    coordinator.set_policy_batch(96, world_size=4)   # a scheduler's batch for an adaptive job at 4 workers
    coordinator.set_share(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=2 << 30, ...))  # runtime/share.py
    coordinator.view()                   # generation, members, workers, history, throughput

It never talks to Slurm (DESIGN.md, layer ``runtime/``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import ipaddress
import itertools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch._C._distributed_c10d import TCPStore

from slurm_amoeba.core.errors import ParseError, SpecError
from slurm_amoeba.core.runtime_env import WorkerEnv
from slurm_amoeba.runtime.auth import (
    COORDINATOR,
    ENV_JOB_SECRET,
    ENV_JOB_SECRET_FILE,
    AuthError,
    JobAuth,
    JobKey,
)
from slurm_amoeba.runtime.errors import RuntimeConfigError, RuntimeTimeout
from slurm_amoeba.runtime.membership import (
    AbortGeneration,
    Action,
    Membership,
    MembershipConfig,
    SetWant,
)
from slurm_amoeba.runtime.protocol import (
    BATCH_KEY,
    EVENTS_KEY,
    JOB_KEY,
    JOIN_KEY,
    PROGRESS_KEY,
    SHARE_KEY,
    WANT_KEY,
    GenerationPlan,
    JoinAnswer,
    JoinRequest,
    PolicyBatch,
    WorkerEvent,
    abort_key,
    arrival_key,
    assignment_key,
    heartbeat_key,
    join_answer_key,
)
from slurm_amoeba.runtime.share import ShareDirective
from slurm_amoeba.runtime.view import CoordinatorView, ThroughputStats, WorkerView

log = logging.getLogger(__name__)

#: How long the event pump waits in one ``queue_pop`` (an idle job: it just waits again).
_PUMP_TIMEOUT = datetime.timedelta(hours=1)


@dataclasses.dataclass(frozen=True)
class CoordinatorConfig:
    """Settings of one job's coordinator.

    Attributes:
        job_id: the job's name (letters, digits, ``-``, ``_``, ``.``).
        initial_workers: ready workers needed before the first generation starts.
        max_workers: the most members a generation may have.
        advertise_addr: the address workers use to reach the store (a host name or IP reachable from every
            worker's node); ``127.0.0.1`` is only right when all workers run on this host.
        port: TCP port of the store; 0 picks a free one.
        bind_addr: the address the store listens on; empty: ``advertise_addr`` when it is an IP address (the
            node's address Slurm gave the agent; ``127.0.0.1`` in local mode), else every address.
        report_timeout_s: after a generation's first end report, how long to wait for the other members.
        heartbeat_timeout_s: a worker silent for longer is declared dead.
        admit_batch_window_s: how long ready joiners wait for joiners still warming up, to join in one switch.
        formation_attempts: a worker missing from this many failed generation formations in a row is evicted.
        collective_timeout_s: passed to workers: deadline of one collective.
        join_timeout_s: passed to workers: how long a warm joiner waits for admission.
        heartbeat_s: passed to workers: heartbeat interval.
        poll_s: passed to workers: how often they look for a pending change.
        loop_interval_s: the coordinator's own polling interval.
        secret_file: where to write the job's secret (mode 0600) for the workers; empty: hand it to them in their
            environment instead (``AMOEBA_JOB_SECRET``; local mode). See :mod:`slurm_amoeba.runtime.auth`.
    """

    job_id: str
    initial_workers: int = 1
    max_workers: int = 64
    advertise_addr: str = "127.0.0.1"
    port: int = 0
    bind_addr: str = ""
    report_timeout_s: float = 10.0
    heartbeat_timeout_s: float = 10.0
    admit_batch_window_s: float = 30.0
    formation_attempts: int = 3
    collective_timeout_s: float = 30.0
    join_timeout_s: float = 3600.0
    heartbeat_s: float = 0.5
    poll_s: float = 0.05
    loop_interval_s: float = 0.005
    secret_file: str = ""


class JoinDesk:
    """Issues worker ids to the processes that prove they hold the job's secret (:func:`~slurm_amoeba.runtime.auth.
    join_job`): a sealed join request with a nonce never seen before gets an id, sealed at the nonce's key.

    Args:
        auth: the coordinator's seals.
        template: a valid worker environment of this job (ids are checked against its rules; names the job).
        known: whether the membership already knows an id (a worker that registered, or that its launcher declared
            dead before it joined).
    """

    def __init__(self, auth: JobAuth, template: WorkerEnv, known: Callable[[str], bool]) -> None:
        self._auth, self._template, self._known = auth, template, known
        self._issued: set[str] = set()
        self._nonces: set[str] = set()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.refused = 0  # refusals beyond the opener's own count

    def issued(self, worker: str) -> bool:
        """Whether ``worker`` is an id this desk issued."""
        with self._lock:
            return worker in self._issued

    def fresh_id(self) -> str:
        """An id nobody has or asked for yet (``w0``, ``w1``, ...)."""
        with self._lock:
            return self._fresh_locked()

    def _fresh_locked(self) -> str:
        while True:
            candidate = f"w{next(self._ids)}"
            if candidate not in self._issued and not self._known(candidate):
                return candidate

    def issue(self, hint: str) -> str:
        """The id for a joiner: its launcher's hint when that is a valid id no other worker had, else a fresh one."""
        try:
            dataclasses.replace(self._template, worker_id=hint)
            valid = True
        except SpecError:
            valid = False
        with self._lock:
            worker = hint if valid and hint not in self._issued and not self._known(hint) else self._fresh_locked()
            self._issued.add(worker)
            return worker

    def answer(self, store: TCPStore) -> None:
        """Answer the join requests waiting in the store; refuse (log, count) what is not sealed or was seen."""
        for _ in range(int(store.queue_len(JOIN_KEY))):
            raw = store.queue_pop(JOIN_KEY, block=False)
            try:
                sender, text = self._auth.opener.sender_of(JOIN_KEY, raw)
                request = JoinRequest.from_json(text)
                if request.hint != sender or request.nonce in self._nonces:
                    raise ParseError(f"a join request of {sender!r} that it did not make or was answered before")
            except ParseError as exc:  # AuthError too (the opener counts those): only holders of the secret join
                if not isinstance(exc, AuthError):
                    self.refused += 1
                log.warning("[%s/coordinator] ignored a join request: %s", self._template.job_id, exc)
                continue
            self._nonces.add(request.nonce)
            worker = self.issue(request.hint)
            answer = JoinAnswer(worker=worker, job_id=self._template.job_id)
            self._auth.put(store, join_answer_key(request.nonce), answer.to_json())
            log.debug("[%s/coordinator] issued worker id %s (hint %s)", self._template.job_id, worker, request.hint)


class EventPump:
    """Hands the workers' events to the membership loop as they arrive, so that the loop wakes at once.

    A thread of its own, on a store connection of its own, blocks in ``queue_pop`` of the events queue and wakes the
    loop (``wake``) with each event: a member's report at a switch is taken in within a store round trip, not at the
    loop's next poll (``loop_interval_s``), which was most of the report -> assignment time of a switch.

    Args:
        host: an address of the store's host (the one the coordinator's own client uses).
        port: the store's port.
        wake: set with every event.
    """

    def __init__(self, host: str, port: int, wake: threading.Event) -> None:
        self._client = TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=_PUMP_TIMEOUT)
        self._wake = wake
        self._events: collections.deque[bytes] = collections.deque()
        self._stop = threading.Event()
        self._seen = threading.Condition()
        self._markers_sent = 0
        self._markers_seen = 0
        self._thread = threading.Thread(target=self._run, name="amoeba-coordinator-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                raw = self._client.queue_pop(EVENTS_KEY, block=True)
            except RuntimeError:  # the timeout passed (an idle job), or the store is gone (stopping)
                self._stop.wait(0.05)
                continue
            with self._seen:
                if raw:
                    self._events.append(raw)
                else:  # a marker of flush() or close(): every event pushed before it is in _events now
                    self._markers_seen += 1
                    self._seen.notify_all()
            self._wake.set()

    def take(self) -> list[bytes]:
        """The events that arrived since the last call, oldest first."""
        taken: list[bytes] = []
        while self._events:
            taken.append(self._events.popleft())
        return taken

    def flush(self, store: TCPStore, timeout_s: float = 1.0) -> None:
        """Wait until every event pushed before this call is in hand (e.g. before a death is taken in: what the
        worker said before it died comes first). ``store``: the coordinator's own client."""
        with self._seen:
            self._markers_sent += 1
            target = self._markers_sent
        try:
            store.queue_push(EVENTS_KEY, b"")
        except RuntimeError:
            return
        with self._seen:
            self._seen.wait_for(lambda: self._markers_seen >= target or not self._thread.is_alive(), timeout_s)

    def close(self, store: TCPStore) -> None:
        """Stop the thread: ``store`` (the coordinator's own client) pushes an empty value that ends its wait."""
        self._stop.set()
        with contextlib.suppress(RuntimeError):
            store.queue_push(EVENTS_KEY, b"")
        self._thread.join(timeout=2)


class Coordinator:
    """Hosts a job's store and membership (see the module docstring).

    Args:
        config: the settings.
    """

    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        # Validates the job id and the worker settings early, with the contract's own messages.
        self._env_template = WorkerEnv(
            job_id=config.job_id,
            worker_id="w0",
            store_addr=config.advertise_addr,
            store_port=config.port or 1,
            collective_timeout_s=config.collective_timeout_s,
            join_timeout_s=config.join_timeout_s,
            heartbeat_s=config.heartbeat_s,
            poll_s=config.poll_s,
        )
        self.membership = Membership(
            MembershipConfig(
                initial_workers=config.initial_workers,
                max_workers=config.max_workers,
                report_timeout_s=config.report_timeout_s,
                heartbeat_timeout_s=config.heartbeat_timeout_s,
                admit_batch_window_s=config.admit_batch_window_s,
                formation_attempts=config.formation_attempts,
            )
        )
        self._lock = threading.Condition()
        self._store: TCPStore | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by the event pump, a death, a leave request, close()
        self._pump: EventPump | None = None
        self._heartbeats: dict[str, bytes] = {}
        self._progress: dict[str, Any] = {}
        self._progress_raw = b""
        self._throughput: dict[int, ThroughputStats] = {}
        self._loop_error: BaseException | None = None
        self._deaths: list[tuple[str, str]] = []
        self._prefix = f"[{config.job_id}/coordinator]"
        # The job's secret: what the coordinator and its workers put into the store is sealed with it (runtime/auth).
        self.job_key = JobKey.new()
        self._auth = JobAuth(self.job_key, COORDINATOR)
        self._sealer, self._opener = self._auth.sealer, self._auth.opener
        self._desk = JoinDesk(self._auth, self._env_template, lambda w: w in self.membership.workers)
        self._refused = 0  # refusals beyond the opener's and the desk's own counts
        self._batch_seq = 0  # policy batches published (set_policy_batch)
        self._share_seq = 0  # share directives published (set_share)

    # ----------------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Host the store and start the membership thread.

        Raises:
            RuntimeConfigError: the coordinator was already started, or the port cannot be bound.
        """
        if self._store is not None:
            raise RuntimeConfigError(f"the coordinator of job {self.config.job_id!r} is already started")
        bind = self.config.bind_addr or store_bind_address(self.config.advertise_addr)
        try:
            store = host_store(bind, self.config.port)
        except (RuntimeError, OSError) as exc:
            raise RuntimeConfigError(
                f"cannot host the store of job {self.config.job_id!r} at {bind} port {self.config.port}: {exc}; "
                "choose a free port or 0, and an address of this host (bind_addr)"
            ) from None
        if self.config.secret_file:
            self.job_key.write(Path(self.config.secret_file))
        self._auth.put(store, JOB_KEY, json.dumps({"job_id": self.config.job_id}))
        self._auth.put(store, WANT_KEY, "0")
        self._store = store
        self._pump = EventPump(client_host(bind), self.port, self._wake)
        self._thread = threading.Thread(target=self._loop, name=f"amoeba-coordinator-{self.config.job_id}", daemon=True)
        self._thread.start()
        log.info(
            "%s store on %s port %s, workers reach it at %s", self._prefix, bind, self.port, self.config.advertise_addr
        )

    def close(self) -> None:
        """Stop the membership thread and the store (workers still connected lose it)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._pump is not None and self._store is not None:
            self._pump.close(self._store)
        self._thread = self._pump = self._store = None

    def __enter__(self) -> Coordinator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The store's TCP port.

        Raises:
            RuntimeConfigError: the coordinator is not started.
        """
        if self._store is None:
            raise RuntimeConfigError("the coordinator is not started; call start() first")
        return int(self._store.port)

    # ----------------------------------------------------------------------------------------------- launcher API

    def new_worker_id(self) -> str:
        """A fresh worker id, unique within this coordinator (``w0``, ``w1``, ...): a hint for a launcher to pass
        (the coordinator issues it to the worker that asks with it first, see :meth:`_issue`)."""
        with self._lock:
            return self._desk.fresh_id()

    @property
    def refused(self) -> int:
        """Store values and events refused so far (see :attr:`CoordinatorView.refused`)."""
        return self._opener.refused + self._desk.refused + self._refused

    def worker_env(self, worker_id: str) -> dict[str, str]:
        """The environment contract for a worker to launch (see :mod:`slurm_amoeba.core.runtime_env`).

        Args:
            worker_id: the worker's id (e.g. from :meth:`new_worker_id`).

        Returns:
            Variables to add to the worker's environment.

        Raises:
            SpecError: the worker id is malformed.
            RuntimeConfigError: the coordinator is not started.
        """
        env = dataclasses.replace(self._env_template, worker_id=worker_id, store_port=self.port).to_environ()
        if self.config.secret_file:
            env[ENV_JOB_SECRET_FILE] = self.config.secret_file
        else:
            env[ENV_JOB_SECRET] = self.job_key.hex()
        return env

    def request_leave(self, worker_id: str, *, unstarted: bool = False) -> None:
        """Ask a worker to leave gracefully at the next step boundary.

        Args:
            worker_id: the worker.
            unstarted: its launcher started it and it may not have registered yet: then it leaves once ready.

        Raises:
            RuntimeConfigError: the worker is not live, or it is the last member (the state would be lost).
        """
        with self._lock:
            plan = self.membership.plan
            live = self.membership.live_members()
            leaving = [w for w in live if self.membership.workers[w].leave_requested]
            if plan is not None and worker_id in live and len(live) - len(leaving) <= 1:
                raise RuntimeConfigError(
                    f"worker {worker_id!r} is the last member of job {self.config.job_id!r}: it cannot leave "
                    "gracefully without losing the training state; add a worker first or stop the job"
                )
            try:
                self.membership.request_leave(worker_id, unstarted=unstarted)
            except KeyError as exc:
                raise RuntimeConfigError(str(exc.args[0])) from None
            self._lock.notify_all()
        log.info("%s leave requested for %s", self._prefix, worker_id)
        self._wake.set()

    def mark_dead(self, worker_id: str, reason: str) -> None:
        """Tell the coordinator that a worker's process is gone (so survivors need not wait for its heartbeat).

        Args:
            worker_id: the worker.
            reason: e.g. ``"exited with signal 9"``.
        """
        # Applied by the loop right after it reads the events, so that anything the worker said before it died
        # (a leave report, an error) is taken in first.
        with self._lock:
            self._deaths.append((worker_id, reason))
        self._wake.set()

    def set_policy_batch(self, batch: int, world_size: int) -> PolicyBatch:
        """Publish the global batch a scheduling policy chose for ``world_size`` workers (sealed, at ``batch``).

        Workers of an adaptive job apply it at a step boundary where the batch may change while they are
        ``world_size`` members, instead of their own choice (docs/runtime.md section 12); a fixed-batch job ignores it.

        Raises:
            ParseError: ``batch`` or ``world_size`` out of range (:class:`~slurm_amoeba.runtime.protocol.PolicyBatch`).
            RuntimeConfigError: the coordinator is not started.
        """
        with self._lock:
            self._batch_seq += 1
            choice = PolicyBatch(batch=batch, world_size=world_size, seq=self._batch_seq)
        self._auth.put(self.store, BATCH_KEY, choice.to_json())
        log.info("%s policy batch %d for %d workers (choice %d)", self._prefix, batch, world_size, choice.seq)
        return choice

    def set_share(self, directive: ShareDirective) -> ShareDirective:
        """Publish how the job shares its devices (sealed, at ``share``); workers apply it at their next step
        boundary (:class:`~slurm_amoeba.runtime.shared_device.SharedDevice`: memory cap, pacing, status file).

        Args:
            directive: the directive; its ``seq`` is replaced by the coordinator's count.

        Returns:
            The directive as published.

        Raises:
            RuntimeConfigError: the coordinator is not started.
        """
        with self._lock:
            self._share_seq += 1
            published = dataclasses.replace(directive, seq=self._share_seq)
        self._auth.put(self.store, SHARE_KEY, published.to_json())
        log.info("%s share directive %d: %s", self._prefix, published.seq, published.to_json())
        return published

    def view(self) -> CoordinatorView:
        """A consistent snapshot of the job's state.

        Raises:
            RuntimeConfigError: the membership thread crashed (the message carries its error).
        """
        with self._lock:
            return self._view_locked()

    def _view_locked(self) -> CoordinatorView:
        if self._loop_error is not None:
            raise RuntimeConfigError(f"the coordinator's thread crashed: {self._loop_error!r}")
        now = time.monotonic()
        m = self.membership
        return CoordinatorView(
            phase=m.phase,
            generation=m.generation,
            plan=m.plan,
            workers={w: WorkerView.of(i, now) for w, i in m.workers.items()},
            history=tuple(m.history),
            throughput=dict(self._throughput),
            progress=dict(self._progress),
            lost_reason=m.lost_reason,
            errors=tuple(m.errors),
            failure=m.failure,
            refused=self.refused,
        )

    def wait_until(self, predicate: Callable[[CoordinatorView], bool], timeout_s: float, what: str) -> CoordinatorView:
        """Block until ``predicate(view)`` holds.

        Args:
            predicate: the condition on a snapshot.
            timeout_s: the deadline.
            what: a description for the timeout message, e.g. ``"a generation of 3 workers"``.

        Returns:
            The first snapshot that satisfied the predicate.

        Raises:
            RuntimeTimeout: the deadline passed; the message names ``what`` and the last state seen.
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                view = self._view_locked()
                if predicate(view):
                    return view
                left = deadline - time.monotonic()
                if left <= 0:
                    statuses = {w: v.status.value for w, v in view.workers.items()}
                    raise RuntimeTimeout(
                        f"job {self.config.job_id!r}: waited {timeout_s:.0f} s for {what}; the job is "
                        f"{view.phase.value} in generation {view.generation} with members "
                        f"{list(view.plan.members) if view.plan else []}, workers {statuses}"
                    )
                self._lock.wait(timeout=min(left, 0.1))

    # ----------------------------------------------------------------------------------------------- the loop

    def _loop(self) -> None:
        try:
            next_slow = 0.0
            while not self._stop.is_set():
                now = time.monotonic()
                with self._lock:
                    deaths, self._deaths = self._deaths, []
                if deaths and self._pump is not None:
                    self._pump.flush(self.store)
                self._desk.answer(self.store)
                self._read_events(now)
                with self._lock:
                    for worker_id, reason in deaths:
                        self.membership.mark_dead(worker_id, reason)
                if now >= next_slow:
                    self._read_heartbeats(now)
                    self._read_progress()
                    next_slow = now + 0.1
                with self._lock:
                    actions = self.membership.decide(now)
                    self._lock.notify_all()
                self._apply(actions)
                self._wake.wait(self.config.loop_interval_s)
                self._wake.clear()
        except BaseException as exc:
            log.exception("%s membership thread crashed", self._prefix)
            with self._lock:
                self._loop_error = exc
                self._lock.notify_all()

    @property
    def store(self) -> TCPStore:
        """The hosted store (the runtime's keys live under ``amoeba/``; tools may add their own elsewhere).

        Raises:
            RuntimeConfigError: the coordinator is not started.
        """
        if self._store is None:
            raise RuntimeConfigError("the coordinator is not started; call start() first")
        return self._store

    def _refuse(self, what: str, exc: Exception) -> None:
        if not isinstance(exc, AuthError):  # the opener counted its own refusals
            self._refused += 1
        log.warning("%s ignored %s: %s", self._prefix, what, exc)

    def _read_events(self, now: float) -> None:
        for raw in self._pump.take() if self._pump is not None else ():
            try:
                sender, event = self._open_event(raw)
            except ParseError as exc:  # AuthError too: only holders of the job's secret are heard
                self._refuse("an event", exc)
                continue
            log.debug("%s event %s", self._prefix, event)
            if event.kind.value in ("error", "left"):
                log.info("%s worker %s %s: %s", self._prefix, event.worker, event.kind.value, event.message)
            with self._lock:
                if not self.membership.handle(event, now):
                    self._refuse("an event", ParseError(f"{sender!r} may not change what it claimed: {event}"))

    def _open_event(self, raw: bytes) -> tuple[str, WorkerEvent]:
        """The sender and the event of a raw value of the events queue.

        Raises:
            ParseError: not sealed with the job's secret (:class:`AuthError`), not an event, sealed by another worker
                than the one it names, or by a worker id this coordinator never issued.
        """
        sender, text = self._opener.sender_of(EVENTS_KEY, raw)
        event = WorkerEvent.from_json(text)
        if event.worker != sender:
            raise AuthError(f"worker {event.worker!r}'s event was sealed by {sender!r}")
        if not self._desk.issued(sender):
            raise ParseError(f"{sender!r} is no worker id this coordinator issued")
        return sender, event

    def _read_heartbeats(self, now: float) -> None:
        with self._lock:
            live = [w for w, i in self.membership.workers.items() if not i.status.is_gone()]
        if not live:
            return
        store = self.store
        keys = [heartbeat_key(w) for w in live]
        present = [k for k in keys if store.check([k])]
        if not present:
            return
        values = store.multi_get(present)
        with self._lock:
            for key, value in zip(present, values, strict=True):
                worker = key.rsplit("/", 1)[1]
                if self._heartbeats.get(worker) != value:
                    self._heartbeats[worker] = value
                    try:
                        self._opener.open(key, value, sender=worker, fresh=True)
                    except AuthError as exc:
                        log.debug("%s ignored a heartbeat of %s: %s", self._prefix, worker, exc)
                        continue
                    self.membership.heartbeat(worker, now)

    def _read_progress(self) -> None:
        store = self.store
        if not store.check([PROGRESS_KEY]):
            return
        raw = store.get(PROGRESS_KEY)
        if raw == self._progress_raw:
            return
        self._progress_raw = raw
        try:
            sender, text = self._opener.sender_of(PROGRESS_KEY, raw)
            progress = json.loads(text)
            size = int(progress["world_size"])
            rate = float(progress["samples_per_s"])
            step_time = float(progress["step_time_s"])
        except (ValueError, KeyError, TypeError) as exc:  # AuthError too
            self._refuse("a progress report", exc)
            return
        if sender not in self.membership.live_members():  # e.g. the last report of a member that just left
            log.debug("%s ignored a progress report of %s: no member of the current generation", self._prefix, sender)
            return
        with self._lock:
            self._progress = progress
            old = self._throughput.get(size)
            self._throughput[size] = ThroughputStats(
                world_size=size,
                samples_per_s=rate,
                step_time_s=step_time,
                reports=1 if old is None else old.reports + 1,
            )

    def _apply(self, actions: list[Action]) -> None:
        store = self.store
        for action in actions:
            if isinstance(action, SetWant):
                log.info("%s asking generation %s to end at its next step boundary", self._prefix, action.generation)
                self._auth.put(store, WANT_KEY, str(action.generation))
            elif isinstance(action, AbortGeneration):
                log.info("%s generation %s cannot form: %s", self._prefix, action.generation, action.reason)
                self._auth.put(store, abort_key(action.generation, self._auth.token(action.generation)), action.reason)
                with self._lock:
                    plan = self.membership.plan
                if plan is not None and plan.generation == action.generation:
                    self._mark_missing_arrivals(store, plan)
            else:
                assignment = action.assignment
                if assignment.plan is not None and assignment.plan.source == action.worker:
                    plan = assignment.plan
                    log.info(
                        "%s generation %s: %s members %s (joiners %s, rollback %s, start step %s)",
                        self._prefix,
                        plan.generation,
                        plan.reason,
                        list(plan.members),
                        list(plan.joiners),
                        plan.rollback,
                        plan.start_step,
                    )
                self._auth.put(store, assignment_key(action.worker, action.seq), assignment.to_json())

    def _mark_missing_arrivals(self, store: TCPStore, plan: GenerationPlan) -> None:
        """After an abort of ``plan``'s generation: members waiting for the others to arrive block in the store until
        every arrival key exists, so the coordinator's own mark in the keys still missing wakes them, and they find
        the abort (runtime/group.py)."""
        token = self._auth.token(plan.generation)
        for member in plan.members:
            key = arrival_key(plan.generation, token, member)
            if not store.check([key]):
                self._auth.put(store, key, "aborted")


def store_bind_address(advertise_addr: str) -> str:
    """Where the store listens when the configuration does not say: the address workers use when it is an IP
    address (the node's address Slurm gave the agent), else every address (a host name may resolve to a loopback
    address here, e.g. ``127.0.1.1``, which other nodes cannot reach)."""
    try:
        return str(ipaddress.ip_address(advertise_addr))
    except ValueError:
        return "0.0.0.0"  # noqa: S104 - a host name: every address; the HMAC still guards the job's keys


def client_host(bind: str) -> str:
    """The address a client on the store's own host connects to, for a store listening on ``bind``."""
    return "127.0.0.1" if bind == "0.0.0.0" else "::1" if bind == "::" else bind  # noqa: S104 - compared, not bound


def host_store(bind: str, port: int) -> TCPStore:
    """The job's store, listening on ``bind`` only.

    torch's TCPStore server listens on every address whatever host it is given; a socket bound here and handed to
    it (``master_listen_fd``, libuv backend) is the way to listen on one address (docs/runtime.md, section 10).

    Raises:
        OSError: the address cannot be bound (not this host's, or the port is taken).
        RuntimeError: torch refused the socket.
    """
    family = socket.AF_INET6 if ipaddress.ip_address(bind).version == 6 else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((bind, port))
        listener.listen(128)
        bound_port = int(listener.getsockname()[1])
    except OSError:
        listener.close()
        raise
    own = client_host(bind)
    fd = listener.detach()  # torch owns (and closes) the socket once it took it
    try:
        return TCPStore(
            own,
            bound_port,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=30),
            master_listen_fd=fd,
            use_libuv=True,
        )
    except (RuntimeError, OSError):
        os.close(fd)
        raise
