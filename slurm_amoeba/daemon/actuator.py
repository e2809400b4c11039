"""The daemon's actuators: resize directives to job agents, off the daemon's main loop; Slurm's queue order.

Last step of DESIGN.md's control flow. Each directive is an authenticated ``resize`` request to the job's agent
(:func:`slurm_amoeba.transport.channel.request`: a deadline per attempt, retries, and the reply must be signed by the
job owner's uid). Directives run on a small thread pool so that a slow or dead agent never stalls the loop that
answers everyone else; their outcomes come back through :meth:`Actuator.completed`, which the loop drains (ZeroMQ
sockets are used by one thread each: the pool's sockets never meet the loop's).

:class:`QueueOrderer` is the other actuator (docs/admin.md, "Ordering Slurm's queue by attained service"): where the
site enables it and the daemon has Slurm operator rights (:func:`operator_rights`), it applies the queue-order
layer's :class:`~slurm_amoeba.policy.actions.SetPriority` actions (``scontrol update JobId=N Priority=P``, as the
daemon's own user; the order is :class:`~slurm_amoeba.policy.queue_order.QueueOrderLayer`'s), at most a bound per
round (:meth:`QueueOrderer.bounded`), and gives the jobs it changed their own priority back when the daemon stops.
An update Slurm refuses backs off per job (:mod:`.refusals`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import queue
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from slurm_amoeba.core.messages import Message
from slurm_amoeba.daemon.agents import Beside
from slurm_amoeba.daemon.config import ConfigError, QueueOrder
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.daemon.refusals import Refusals
from slurm_amoeba.policy.actions import SetPriority
from slurm_amoeba.policy.common import las_queue
from slurm_amoeba.policy.queue_order import orders
from slurm_amoeba.policy.types import JobInfo, JobPhase
from slurm_amoeba.slurm import SlurmCommandError
from slurm_amoeba.transport.channel import ChannelError, request

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Directive:
    """One resize order for an agent.

    Attributes:
        job_id: the job.
        endpoint: the agent's endpoint.
        uid: the job owner's uid (the agent's reply must be signed by it).
        target: the ordered size.
        reason: why (the agent logs it).
        ordered_at: when the daemon decided it (its clock).
        token: anything the caller wants back with the outcome (a deferred ``amoebactl`` request).
        batch: the global batch the policy chose for ``target`` workers (an adaptive job), or None.
        vacate: a node whose satellites the job moves elsewhere, the size kept (whole-node moves), or "".
        place_beside: where the growth goes beside another job (GPU sharing), or None.
    """

    job_id: str
    endpoint: str
    uid: int
    target: int
    reason: str
    ordered_at: float
    token: Any = None
    batch: int | None = None
    vacate: str = ""
    place_beside: Beside | None = None


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What became of a directive.

    Attributes:
        directive: the directive.
        ok: the agent accepted it.
        error: why not (the agent's reason, or the transport's), "" when accepted.
        data: the agent's reply data (``size``, ``target``) when accepted.
        unreachable: no trustworthy reply came at all (as opposed to a refusal).
    """

    directive: Directive
    ok: bool
    error: str
    data: dict[str, Any]
    unreachable: bool = False


class Actuator:
    """A pool that delivers directives and collects their outcomes.

    Args:
        parallel: directives in flight at once.
        timeout_s: deadline of one attempt.
        retries: further attempts after a timeout.
    """

    def __init__(self, parallel: int, timeout_s: float, retries: int) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="amoebad-act")
        self._timeout_s = timeout_s
        self._retries = retries
        self._done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()

    def send(self, directive: Directive) -> None:
        """Queue ``directive``; its outcome shows up in :meth:`completed`."""
        self._pool.submit(self._deliver, directive)

    def _deliver(self, directive: Directive) -> None:
        order: dict[str, Any] = {"job_id": directive.job_id, "target": directive.target, "reason": directive.reason}
        if directive.batch is not None:
            order["batch"] = directive.batch
        if directive.vacate:
            order["vacate"] = directive.vacate
        if directive.place_beside is not None:
            order["place_beside"] = directive.place_beside.to_body()
        message = Message("resize", order)
        try:
            reply = request(
                directive.endpoint,
                message,
                timeout_s=self._timeout_s,
                retries=self._retries,
                expect_uid=directive.uid,
            )
        except ChannelError as exc:
            self._done.put(Outcome(directive, False, str(exc), {}, unreachable=True))
            return
        except Exception as exc:  # a bug or an exotic transport failure must still come back as an outcome
            logger.exception("[daemon/actuator] sending resize of job %s failed unexpectedly", directive.job_id)
            self._done.put(Outcome(directive, False, f"internal error: {exc}", {}, unreachable=True))
            return
        body = reply.body
        data = body.get("data")
        self._done.put(Outcome(directive, bool(body.get("ok")), str(body.get("error", "")), dict(data or {})))

    def completed(self) -> list[Outcome]:
        """Outcomes that arrived since the last call."""
        outcomes: list[Outcome] = []
        while True:
            try:
                outcomes.append(self._done.get_nowait())
            except queue.Empty:
                return outcomes

    def close(self) -> None:
        """Stop taking directives and wait for those under way (each is bounded by its deadline)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


@runtime_checkable
class QueueControl(Protocol):
    """What queue ordering needs of Slurm: a part of :class:`~slurm_amoeba.slurm.SlurmClient`."""

    def set_priority(self, job_id: int, priority: int) -> None:
        """``scontrol update JobId=N Priority=P``."""
        ...

    def hold(self, job_id: int) -> None:
        """``scontrol hold N``."""
        ...

    def release(self, job_id: int) -> None:
        """``scontrol release N``."""
        ...

    def config_values(self) -> dict[str, str]:
        """``scontrol show config``."""
        ...

    def admin_level(self, user: str) -> str:
        """The user's AdminLevel (sacctmgr)."""
        ...

    def past_service(self, job_ids: Collection[int]) -> dict[int, float]:
        """GPU-seconds the jobs' runs attained so far, from accounting (sacct)."""
        ...


#: What Slurm answers for a job that finished, started or left between the round's read and its update.
VANISHED = ("Invalid job id", "already finished", "no longer pending", "Job is pending execution")


#: The AdminLevels that may set job priorities, hold and release jobs (queue ordering).
OPERATOR_LEVELS = ("Operator", "Administrator")
#: The AdminLevel that may also set a job's ``AdminComment`` (admission's hold marks): Slurm refuses an Operator
#: (``Access/permission denied``; measured on the replay cluster, and scontrol(1): "Can only be set by a Slurm
#: administrator").
ADMIN_LEVELS = ("Administrator",)


def operator_rights(
    control: QueueControl,
    uid: int,
    user: str,
    switch: str = "queue_order.enabled",
    levels: Collection[str] = OPERATOR_LEVELS,
) -> tuple[str, str]:
    """Whether the daemon's user may set job priorities and hold jobs: root, Slurm's ``SlurmUser``, or one of
    ``levels`` (AdminLevel Operator/Administrator; :data:`ADMIN_LEVELS` where it must also write ``AdminComment``);
    ``switch`` is the setting the refusal tells the admin to turn off instead.

    Returns:
        (why it may, "") or ("", why not: a sentence for the admin).
    """
    if uid == 0:
        return "root", ""
    try:
        slurm_user = control.config_values().get("SlurmUser", "").split("(", 1)[0]
        if slurm_user and slurm_user == user:
            return f"SlurmUser ({user})", ""
        level = control.admin_level(user)
    except SlurmCommandError as exc:
        return "", f"could not read {user}'s AdminLevel from Slurm's accounting ({exc})"
    if level in levels:
        return f"AdminLevel {level}", ""
    return "", (
        f"amoebad runs as {user} (uid {uid}), which is not root, not SlurmUser ({slurm_user or '?'}), and has "
        f"AdminLevel {level}; {grant_fix('it', user, levels, switch)}"
    )


def grant_fix(who: str, user: str, levels: Collection[str], switch: str) -> str:
    """The sentence that tells the admin to give ``user`` (called ``who``) the lowest of ``levels``, or to turn
    ``switch`` off."""
    wanted = min(levels, key=OPERATOR_LEVELS.index)
    why = "" if wanted == "Operator" else " (Slurm lets only administrators set the AdminComment of a job)"
    return (
        f"give {who} {wanted.lower()} rights with `sacctmgr modify user {user} set adminlevel={wanted}`{why} "
        f"or set {switch}: false"
    )


def checked_rights(
    control: QueueControl, uid: int, user: str, switch: str, levels: Collection[str] = OPERATOR_LEVELS
) -> tuple[str, str]:
    """The daemon's operator rights for the feature ``switch`` turns on, and Slurm's ``PriorityType``.

    Returns:
        (why the daemon may, the priority plugin).

    Raises:
        ConfigError: it may not (the sentence names the fix), or Slurm's configuration cannot be read.
    """
    why, refusal = operator_rights(control, uid, user, switch, levels)
    if refusal:
        raise ConfigError(f"{switch} refused: {refusal}")
    try:
        priority_type = control.config_values().get("PriorityType", "priority/basic")
    except SlurmCommandError as exc:
        raise ConfigError(f"{switch}: cannot read Slurm's configuration ({exc})") from None
    return why, priority_type


def make_queue_orderer(
    settings: QueueOrder,
    partitions: Collection[str],
    source: object,
    metrics: DaemonMetrics,
    *,
    uid: int,
    user: str,
) -> QueueOrderer | None:
    """The queue orderer for an enabled ``queue_order``, after checking the daemon's rights; None when disabled.

    Raises:
        ConfigError: it is enabled but the daemon may not set priorities, or its Slurm source cannot.
    """
    if not settings.enabled:
        return None
    if not isinstance(source, QueueControl):
        raise ConfigError("queue_order.enabled: the daemon's Slurm source cannot update jobs (scontrol)")
    why, priority_type = checked_rights(source, uid, user, "queue_order.enabled")
    logger.info(
        "[daemon/queue] ordering Slurm's queue by attained service in %s (rights: %s; %s; thresholds %s GPU-s)",
        ", ".join(partitions),
        why,
        priority_type,
        ", ".join(f"{t:g}" for t in settings.thresholds_gpu_s),
    )
    return QueueOrderer(
        settings, partitions, source, metrics, release_to_restore=priority_type != "priority/basic", user=user
    )


@dataclasses.dataclass(frozen=True)
class QueueRound:
    """What one round of queue ordering did.

    Attributes:
        pending: the pending jobs it ordered.
        changed: (job id, priority) set this round.
        deferred: changes left for later rounds (the bound).
        vanished: jobs that finished, started or left before their update.
        failed: jobs Slurm refused to update for another reason.
        backing_off: jobs whose change waits because Slurm refused an earlier one (:mod:`.refusals`).
    """

    pending: int
    changed: tuple[tuple[str, int], ...]
    deferred: int
    vanished: tuple[str, ...]
    failed: tuple[str, ...]
    backing_off: tuple[str, ...] = ()


class QueueOrderer:
    """Applies the queue-order layer's priorities (see the module docstring).

    Args:
        settings: the ``queue_order`` section.
        partitions: the partitions whose pending jobs it reorders.
        control: Slurm.
        metrics: the daemon's metrics.
        release_to_restore: give a job its own priority back by holding and releasing it (``priority/multifactor``
            computes it again); False: set the priority Slurm had given it (``priority/basic``, whose release would
            put the job at the end of the queue: measured).
        user: the daemon's user (named in the fix of a refused update).

    Attributes:
        touched: job id -> the priority Slurm had given it before the daemon's first change (pending jobs only;
            the queue-order layer's ``own_priorities``, changed in place).
        last: what the last round did (the bound's count, then each update's outcome as the Slurm thread
            applies it).
        refusals: the per-job backoff of updates Slurm refused (one warning per job, then debug).
    """

    def __init__(
        self,
        settings: QueueOrder,
        partitions: Collection[str],
        control: QueueControl,
        metrics: DaemonMetrics,
        *,
        release_to_restore: bool = False,
        user: str = "amoebad",
    ) -> None:
        self.settings = settings
        self.partitions = tuple(partitions)
        self.control = control
        self.metrics = metrics
        self.release_to_restore = release_to_restore
        self.touched: dict[str, int] = {}
        self.last: QueueRound | None = None
        self.refusals = Refusals("[daemon/queue]", grant_fix(user, user, OPERATOR_LEVELS, "queue_order.enabled"))

    def bounded(self, actions: Sequence[SetPriority], now: float) -> list[SetPriority]:
        """The round's priorities to apply: those of jobs not backing off after a refusal, at most
        ``max_updates_per_round`` (the first in LAS order first; the rest come again in later rounds).

        Args:
            actions: the queue-order layer's priorities, in LAS order.
            now: the daemon's clock.
        """
        self.refusals.keep({action.job_id for action in actions} | set(self.touched))
        ready = [action for action in actions if self.refusals.ready(action.job_id, now)]
        limit = self.settings.max_updates_per_round
        deferred = max(0, len(ready) - limit)
        if deferred:
            self.metrics.queue_deferred.inc(deferred)
        backing_off = tuple(sorted({a.job_id for a in actions} - {a.job_id for a in ready}))
        self.last = QueueRound(len(actions), (), deferred, (), (), backing_off)
        return ready[:limit]

    def sync(self, jobs: Iterable[JobInfo]) -> None:
        """Bring the record up to a round's snapshot (before the round's actions): forget the own priorities of
        jobs no longer pending (in place: the layer reads the mapping), count the jobs ordered by LAS queue."""
        pending = {job.job_id for job in jobs if job.state is JobPhase.PENDING}
        for job_id in [job_id for job_id in self.touched if job_id not in pending]:
            del self.touched[job_id]
        queues: dict[str, int] = {}
        for job in jobs:
            if orders(job, self.partitions, self.settings.users):
                key = str(las_queue(job.attained_service, self.settings.thresholds_gpu_s))
                queues[key] = queues.get(key, 0) + 1
        self.metrics.queue_jobs.replace(({"queue": key}, count) for key, count in queues.items())

    def set_priority(self, job_id: str, priority: int, current: int, attained_gpu_s: float, now: float) -> str:
        """Set one pending job's priority (``current`` is the one it has, remembered for :meth:`revert`).

        Returns:
            ``ok``, ``vanished`` (the job left the queue) or ``failed`` (Slurm refused: the job backs off).
        """
        outcome = self._call(
            "priority", job_id, functools.partial(self.control.set_priority, int(job_id), priority), now
        )
        last = self.last or QueueRound(0, (), 0, (), ())
        if outcome == "ok":
            self.last = dataclasses.replace(last, changed=(*last.changed, (job_id, priority)))
        elif outcome == "vanished":
            self.last = dataclasses.replace(last, vanished=(*last.vanished, job_id))
        else:
            self.last = dataclasses.replace(last, failed=(*last.failed, job_id))
        if outcome == "ok":
            self.refusals.succeeded(job_id)
            self.touched.setdefault(job_id, current)
            logger.info(
                "[daemon/queue] job %s priority %d -> %d (attained %.0f GPU-s)",
                job_id,
                current,
                priority,
                attained_gpu_s,
            )
        return outcome

    def revert(self) -> int:
        """Give every job the daemon reordered that may still be pending its own priority back; returns how many.

        Under ``priority/basic`` the priority Slurm had given the job is set again; otherwise the job is held and
        released, after which Slurm's priority plugin computes its priority again.
        """
        restored = 0
        for job_id, original in sorted(self.touched.items()):
            if self.release_to_restore:
                outcome = self._call("revert", job_id, functools.partial(self.control.hold, int(job_id)))
                if outcome == "ok":
                    outcome = self._call("revert", job_id, functools.partial(self.control.release, int(job_id)))
            else:
                outcome = self._call(
                    "revert", job_id, functools.partial(self.control.set_priority, int(job_id), original)
                )
            restored += outcome == "ok"
        logger.info(
            "[daemon/queue] gave %d of %d reordered pending jobs their own priority back", restored, len(self.touched)
        )
        self.touched.clear()
        return restored

    def _call(self, action: str, job_id: str, call: Callable[[], None], now: float | None = None) -> str:
        """Run one update; a refusal during a round (``now`` given) goes to :attr:`refusals`, one at the stop
        (``now`` None) is a warning."""
        try:
            call()
        except SlurmCommandError as exc:
            outcome = "vanished" if any(text in exc.stderr for text in VANISHED) else "failed"
            if outcome == "failed" and now is not None:
                self.refusals.refused(job_id, action, exc, now)
            else:
                log = logger.debug if outcome == "vanished" else logger.warning
                log("[daemon/queue] %s of job %s: %s", action, job_id, exc)
        else:
            outcome = "ok"
        self.metrics.queue_updates.inc(labels={"action": action, "outcome": outcome})
        return outcome
