"""The daemon's API: who may send which request, and what each request reads and changes (DESIGN.md, control flow).

Every request that reaches the daemon carries a munge credential the channel has checked (uids come from munge,
never from a message field). :meth:`RequestHandler.handle` is the one door: it looks the request's kind up in
:data:`ACCESS`, finds the job's owner where the kind is about a job, refuses whoever the table does not allow, and
only then runs the kind's handler. Refusals are logged with the sender's uid, counted by kind and reason, and
answered with the reason.

==============  ==================================  =================================================================
kind            who may send it                      reads -> changes
==============  ==================================  =================================================================
``register``    the job's owner (Slurm's uid)        Slurm's record of the job -> the job's agent record
``report``      the job's owner (registered uid)     the agent record -> its size, throughput, history, adaptive-batch
                                                     statistics (kept per job); settles resizes
``resize``      the job's owner or an operator       the agent record -> a resize in flight, a directive to the agent
``pin``         the job's owner or an operator       the agent record, else Slurm -> the pinned jobs (state file)
``share``       an operator                          the sharer's and the host's agent records -> a share the next round
                                                     applies (a directive to the sharer's agent, docs/admin.md 8e)
``drain``       an operator                          -> the drain switch (state file)
``resume``      an operator                          -> the drain switch (state file)
``status``      anyone authenticated                 counts; the sender's own pins, satellites, orders -> nothing
``jobs``        anyone authenticated                 a page of the sender's own jobs, counts of others' -> nothing
``policy_show`` anyone authenticated                 the policy and its knobs -> nothing
``admission``   the job's owner (Slurm's uid)        the admission verdict on the pending job -> (its guard holds or
                                                     releases the job by it)
==============  ==================================  =================================================================

Operators are the ``operators`` of the configuration (uids and ``@groups``) and the daemon's own uid; they see every
job in ``status`` and ``jobs``. Before the table, each uid but the daemon's is held to ``limits.requests_per_s``
(:mod:`.limits`); a registration's worker range is checked against the site's caps and Slurm's record of the job.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import pwd
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.core.messages import PROTOCOL_VERSION, RETRY_SOON, Message, quote
from slurm_amoeba.daemon.actuator import Outcome
from slurm_amoeba.daemon.agents import (
    AgentMessageError,
    AgentRecord,
    Registration,
    Report,
    check_job_id,
)
from slurm_amoeba.daemon.config import DaemonConfig
from slurm_amoeba.daemon.lease import Lease
from slurm_amoeba.daemon.ledger import Ledger
from slurm_amoeba.daemon.limits import LimitError, RateLimiter, vet_registration
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.daemon.rounds import RoundLoop
from slurm_amoeba.policy import policy_knobs, policy_names
from slurm_amoeba.transport.channel import Request, RequestServer
from slurm_amoeba.transport.munge import Credential

logger = logging.getLogger(__name__)

#: Jobs in one ``jobs`` reply at most (``amoebactl jobs`` follows the pages) ...
JOBS_PAGE = 200
#: ... and their summaries' size at most (a summary holds at most HISTORY_BYTES of history): far below the 1 MiB limit.
JOBS_REPLY_BYTES = 512 * 1024


class Who(str, enum.Enum):
    """Who may send a kind of request."""

    ANYONE = "anyone authenticated"
    JOB_OWNER = "the job's owner"
    OWNER_OR_OPERATOR = "the job's owner or an operator"
    OPERATOR = "an operator"


class OwnerFrom(str, enum.Enum):
    """Where the owner of the job a request names is read (``NO_JOB``: the request names no job)."""

    NO_JOB = "no job"
    SLURM = "the uid Slurm lists for the job"
    REGISTRATION = "the uid that registered the job's agent"
    REGISTRATION_OR_SLURM = "the registration, else Slurm"


@dataclasses.dataclass(frozen=True)
class Access:
    """One row of :data:`ACCESS`.

    Attributes:
        who: who may send the request.
        owner_from: where the job's owner is read.
        reads: what the request reads.
        changes: what it changes (``nothing`` for reads).
        verb: what the sender asked to do, for refusals ("uid 7 may not <verb> job 12").
        unknown_job: the refusal when the job's owner cannot be found (``{job}`` is the job id).
    """

    who: Who
    owner_from: OwnerFrom
    reads: str
    changes: str
    verb: str
    unknown_job: str = ""


#: The one who-may-do-what table: request kind -> its rule. Every request goes through it (see the module docstring).
ACCESS: Mapping[str, Access] = MappingProxyType(
    {
        "register": Access(
            Who.JOB_OWNER,
            OwnerFrom.SLURM,
            reads="Slurm's record of the job",
            changes="the job's agent record (endpoint, worker range)",
            verb="register the agent of",
            unknown_job="unknown job {job}: the daemon's last view of Slurm shows no such running job (an agent "
            "registers from inside its running job); Slurm is read again now, retry in a few seconds",
        ),
        "report": Access(
            Who.JOB_OWNER,
            OwnerFrom.REGISTRATION,
            reads="the job's agent record",
            changes="its size, throughput, satellites and history; settles its resize in flight",
            verb="report for",
            unknown_job="unknown job {job}: it is not registered with this daemon (it may have restarted); "
            "register again",
        ),
        "resize": Access(
            Who.OWNER_OR_OPERATOR,
            OwnerFrom.REGISTRATION,
            reads="the job's agent record",
            changes="a resize in flight and a directive to the job's agent",
            verb="resize",
            unknown_job="job {job} is not an elastic job registered with amoebad; `amoebactl jobs` lists them",
        ),
        "pin": Access(
            Who.OWNER_OR_OPERATOR,
            OwnerFrom.REGISTRATION_OR_SLURM,
            reads="the job's agent record, else Slurm's record of the job",
            changes="the pinned jobs (state file)",
            verb="pin or unpin",
            unknown_job="the daemon's last view of Slurm shows no job {job}; only running or pending jobs can be "
            "pinned (Slurm is read again now: retry in a few seconds)",
        ),
        "share": Access(
            Who.OPERATOR,
            OwnerFrom.REGISTRATION,
            reads="the sharer's and the host's agent records",
            changes="a share the next round applies (a directive to the sharer's agent)",
            verb="place workers beside another job's",
            unknown_job="job {job} is not an elastic job registered with amoebad; `amoebactl jobs` lists them",
        ),
        "drain": Access(Who.OPERATOR, OwnerFrom.NO_JOB, reads="nothing", changes="the drain switch", verb="drain"),
        "resume": Access(Who.OPERATOR, OwnerFrom.NO_JOB, reads="nothing", changes="the drain switch", verb="resume"),
        "status": Access(
            Who.ANYONE,
            OwnerFrom.NO_JOB,
            reads="counts; the sender's own pins, satellites and orders (an operator's: everyone's)",
            changes="nothing",
            verb="read the status",
        ),
        "jobs": Access(
            Who.ANYONE,
            OwnerFrom.NO_JOB,
            reads="a page of the sender's own jobs and counts of others' (an operator's: every job)",
            changes="nothing",
            verb="list jobs",
        ),
        "policy_show": Access(
            Who.ANYONE, OwnerFrom.NO_JOB, reads="the policy and its knobs", changes="nothing", verb="show the policy"
        ),
        "admission": Access(
            Who.JOB_OWNER,
            OwnerFrom.SLURM,
            reads="the admission verdict on the pending job (admission.holds_by: owner)",
            changes="the job's hold in Slurm, which its guard sets or lifts by the verdict",
            verb="ask the admission verdict on",
            unknown_job="the daemon's last view of Slurm shows no job {job}; Slurm is read again now, ask again in a "
            "few seconds",
        ),
    }
)


@dataclasses.dataclass(frozen=True)
class JobOwner:
    """The owner of the job a request names.

    Attributes:
        job_id: the job.
        uid: its owner's uid.
        user: its owner's user name.
    """

    job_id: str
    uid: int
    user: str


class Refused(Exception):
    """A request the daemon will not carry out; the message is the reason sent back.

    Attributes:
        reason: the refusal's label in the metrics (``invalid``, ``unauthorized``, ``unknown_job``, ``internal``).
        level: the log level of the refusal.
    """

    def __init__(self, why: str, reason: str = "invalid", level: int = logging.WARNING) -> None:
        super().__init__(why)
        self.reason = reason
        self.level = level


def is_operator(sender: Credential, config: DaemonConfig, daemon_uid: int) -> bool:
    """Whether ``sender`` may act on every job: a configured operator (or group member), or the daemon's own uid."""
    if sender.uid == daemon_uid or sender.uid in config.operator_uids:
        return True
    if not config.operator_gids:
        return False
    if sender.gid in config.operator_gids:
        return True
    try:
        entry = pwd.getpwuid(sender.uid)
    except KeyError:
        return False
    return bool(config.operator_gids.intersection(os.getgrouplist(entry.pw_name, entry.pw_gid)))


def check_access(rule: Access, sender: Credential, owner: JobOwner | None, operator: bool) -> None:
    """Refuse ``sender`` unless ``rule`` lets them send the request.

    Args:
        rule: the request kind's row of :data:`ACCESS`.
        sender: who sent it (from munge).
        owner: the job's owner, for kinds about a job.
        operator: whether the sender is an operator.

    Raises:
        Refused: with reason ``unauthorized``, naming the sender's uid and who may.
    """
    if rule.who is Who.ANYONE:
        return
    if rule.who is Who.OPERATOR:
        if not operator:
            raise Refused(f"uid {sender.uid} is not an operator; only operators may {rule.verb}", reason="unauthorized")
        return
    if owner is not None and (sender.uid == owner.uid or (rule.who is Who.OWNER_OR_OPERATOR and operator)):
        return
    who = "its owner" if owner is None else f"its owner ({owner.user or owner.uid})"
    who += " or an operator" if rule.who is Who.OWNER_OR_OPERATOR else ""
    job = "" if owner is None else f" job {owner.job_id}"
    raise Refused(f"uid {sender.uid} may not {rule.verb}{job}: only {who} may", reason="unauthorized")


@dataclasses.dataclass(frozen=True)
class _View:
    """What one sender of ``status`` or ``jobs`` may see: everything (``uid`` None, an operator), or their own jobs.

    Attributes:
        uid: the sender's uid, or None for an operator.
        user: the sender's user name (satellites are listed by name), or "".
        agents: the registered jobs (whose owners are their registering uids).
    """

    uid: int | None
    user: str
    agents: Mapping[str, AgentRecord]

    @property
    def everything(self) -> bool:
        """Whether the sender sees every job."""
        return self.uid is None

    def job(self, job_id: str) -> bool:
        """Whether the sender may see ``job_id`` (an unregistered job only an operator)."""
        if self.uid is None:
            return True
        agent = self.agents.get(job_id)
        return agent is not None and agent.uid == self.uid

    def user_named(self, name: str) -> bool:
        """Whether the sender may see a job of the user ``name``."""
        return self.uid is None or (bool(self.user) and name == self.user)


class RequestHandler:
    """Answers the requests of agents and ``amoebactl`` (see the module docstring).

    It holds no reference back to the daemon (and the daemon's parts none to it), so a daemon that is dropped without
    :meth:`~slurm_amoeba.daemon.daemon.Daemon.close` is freed at once, its socket before its ZeroMQ context.

    Args:
        config: the daemon's configuration.
        ledger: the registered jobs and the persistent state.
        round_loop: the rounds (the last observation and round, for ``status``; Slurm's records of a job).
        metrics: where requests and refusals are counted.
        daemon_uid: the daemon's own uid (an operator).
        clock: the daemon's wall clock.
        order: orders a resize of a registered job (agent, target, reason, source, token).

    Attributes:
        server: where replies go (set when the daemon binds its socket).
        lease: the lease of a daemon of a standby pair (registrations learn its generation; ``status`` shows it).
        metrics_port: the Prometheus endpoint's port, 0 when off (for ``status``).
    """

    def __init__(
        self,
        config: DaemonConfig,
        ledger: Ledger,
        round_loop: RoundLoop,
        metrics: DaemonMetrics,
        *,
        daemon_uid: int,
        clock: Callable[[], float],
        order: Callable[[AgentRecord, int, str, str, Any], None],
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.round_loop = round_loop
        self.policy = round_loop.policy
        self.metrics = metrics
        self.daemon_uid = daemon_uid
        self.clock = clock
        self.order = order
        self.started_at = clock()
        self.server: RequestServer | None = None
        self.lease: Lease | None = None
        self.metrics_port = 0
        self.limiter = RateLimiter(config.limits.requests_per_s, config.limits.burst)
        self._flood_logged: dict[int, float] = {}

    def handle(self, req: Request) -> None:
        """Answer one authenticated request; nothing a sender does can raise out of here."""
        kind = req.message.kind
        rule = ACCESS.get(kind)
        try:
            self._check_rate(req.sender.uid)
            if rule is None:
                raise Refused(f"the daemon does not take {kind!r} messages; it takes {', '.join(ACCESS)}")
            owner = self._owner(req, rule)
            # Operators are looked up only where the rule names them (with @groups it reads the user database).
            operator = rule.who in (Who.OPERATOR, Who.OWNER_OR_OPERATOR) and self.is_operator(req.sender)
            check_access(rule, req.sender, owner, operator)
            reply = _HANDLERS[kind](self, req) if owner is None else _JOB_HANDLERS[kind](self, req, owner)
        except Refused as exc:
            self.refuse(req, str(exc), exc.reason, exc.level)
            return
        except LimitError as exc:
            self.refuse(req, str(exc), reason="limit")
            return
        except (AgentMessageError, ParseError) as exc:
            self.refuse(req, str(exc))
            return
        except Exception:
            logger.exception("[daemon/api] %s from uid %d failed", kind, req.sender.uid)
            self.refuse(req, f"the daemon failed on this {kind}; its log has the details", reason="internal")
            return
        self.metrics.requests.inc(labels={"kind": kind})
        if reply is not None:
            self.answer(req, reply)

    def answer(self, req: Request, reply: Message) -> None:
        """Send ``reply`` (nowhere before the daemon has bound its socket); a reply that cannot be sent is logged and
        counted, never raised (the transport turns one too large into a short refusal itself)."""
        if self.server is None:
            return
        try:
            self.server.answer(req, reply)
        except Exception:
            logger.exception(
                "[daemon/api] the answer to %s from uid %d could not be sent", req.message.kind, req.sender.uid
            )
            self.metrics.loop_errors.inc()

    def refuse(self, req: Request, why: str, reason: str = "invalid", level: int = logging.WARNING) -> None:
        """Log, count and answer a refusal."""
        logger.log(level, "[daemon/api] refused %s from uid %d: %s", req.message.kind, req.sender.uid, why)
        self.metrics.refusals.inc(labels={"kind": req.message.kind, "reason": reason})
        self.answer(req, req.message.reply(ok=False, error=why))

    def _check_rate(self, uid: int) -> None:
        """Refuse a uid over ``limits.requests_per_s`` (the daemon's own uid is never limited).

        A flood is logged at WARNING once a minute per uid (DEBUG otherwise), so that it cannot flood the log too.
        """
        now = time.monotonic()
        if uid == self.daemon_uid or self.limiter.allow(uid, now):
            return
        level = logging.DEBUG
        if now - self._flood_logged.get(uid, -60.0) >= 60.0:
            level = logging.WARNING
            self._flood_logged[uid] = now
            if len(self._flood_logged) > 4096:
                self._flood_logged = {uid: now}
        limits = self.config.limits
        raise Refused(
            f"uid {uid} sends more than {limits.requests_per_s:g} requests per second (limits.requests_per_s, "
            f"burst {limits.burst}); slow down",
            reason="rate_limited",
            level=level,
        )

    def is_operator(self, sender: Credential) -> bool:
        """Whether ``sender`` may act on every job (see :func:`is_operator`)."""
        return is_operator(sender, self.config, self.daemon_uid)

    def answer_resize(self, req: Request, outcome: Outcome) -> None:
        """Answer an ``amoebactl resize`` once the job's agent has answered its directive."""
        if outcome.ok:
            self.answer(req, req.message.reply(data=outcome.data))
        else:
            self.answer(req, req.message.reply(ok=False, error=f"the job's agent did not resize: {outcome.error}"))

    def _owner(self, req: Request, rule: Access) -> JobOwner | None:
        """The owner of the job the request names, from where ``rule`` says; None for kinds without a job."""
        if rule.owner_from is OwnerFrom.NO_JOB:
            return None
        job_id = check_job_id(str(req.message.body["job_id"]))
        agent = self.ledger.agents.get(job_id)
        if agent is not None and rule.owner_from is not OwnerFrom.SLURM:
            return JobOwner(job_id, agent.uid, agent.user)
        if rule.owner_from is not OwnerFrom.REGISTRATION:
            if req.message.kind == "register":
                self.round_loop.submissions.get(job_id)  # a registration: read its submission in the same round
            records = self.round_loop.job_records(job_id)
            if records:
                first = min(records, key=lambda r: r.het_job_offset)
                return JobOwner(job_id, first.uid, first.user)
        # INFO: every agent meets this once after a restart of the daemon, and a stale job id is no attack.
        raise Refused(rule.unknown_job.format(job=job_id), reason="unknown_job", level=logging.INFO)

    def _on_admission(self, req: Request, owner: JobOwner) -> Message:
        """The verdict a pending job's admission guard applies (``none`` when the jobs' owners do not hold for the
        daemon: admission off, or held by the daemon itself)."""
        admitter = self.round_loop.admission
        verdict = admitter.verdict(owner.job_id) if admitter is not None and admitter.owners_hold else "none"
        return req.message.reply(data={"verdict": verdict, "interval_s": self.config.interval_s})

    def _on_register(self, req: Request, owner: JobOwner) -> Message:
        reg = Registration.from_body(req.message.body)
        if reg.elastic_partition != self.config.elastic_partition:
            # Extras outside the preemptible partition could hold GPUs that regular jobs need: never grow such a job.
            raise Refused(
                f"job {reg.job_id} would grow in partition {reg.elastic_partition!r}, but this site's preemptible "
                f"partition for elastic extras is {self.config.elastic_partition!r}; submit with "
                f"--elastic-partition {self.config.elastic_partition}"
            )
        submissions = self.round_loop.submissions
        submitted = submissions.get(reg.job_id)
        if submissions.available and submitted is None:
            self.round_loop.refresh_wanted = True  # the next round reads it, on the Slurm thread
            raise Refused(
                f"job {reg.job_id}: the daemon is reading Slurm's record of its submission; {RETRY_SOON}",
                reason="unknown_job",
                level=logging.INFO,
            )
        vetted = vet_registration(reg, self.round_loop.job_records(reg.job_id), self.config.limits, submitted)
        reg = vetted.registration
        most = self.config.limits.agents_per_uid
        held = self.ledger.registered_by(owner.uid, besides=reg.job_id)
        if held >= most:
            raise LimitError(
                f"uid {owner.uid} has {held} elastic jobs registered already, this site's limit "
                f"(limits.agents_per_uid = {most}); job {reg.job_id} runs at its fixed size"
            )
        again = self.ledger.register(reg, owner.uid, owner.user)
        logger.info(
            "[daemon/api] job %s (user %s) registered: %d..%d workers of %d GPU(s), directives to %s%s",
            reg.job_id,
            owner.user,
            reg.min_workers,
            reg.max_workers,
            reg.gpus_per_worker,
            quote(reg.endpoint, 80),
            " (again)" if again else "",
        )
        for note in vetted.notes:
            logger.warning("[daemon/api] job %s (user %s): %s", reg.job_id, owner.user, note)
        data = {
            "interval_s": self.config.interval_s,
            "daemon_uid": self.daemon_uid,
            "min_workers": reg.min_workers,
            "max_workers": reg.max_workers,
            "clamped": list(vetted.notes),
        }
        if self.lease is not None:
            data["fence"] = self.lease.generation  # the agent refuses directives of older generations from now on
        return req.message.reply(data=data)

    def _on_report(self, req: Request, owner: JobOwner) -> Message:
        report = Report.from_body(req.message.body, self.clock())
        self.ledger.take_report(self.ledger.agents[owner.job_id], report)
        return req.message.reply(data={"interval_s": self.config.interval_s})

    def _on_resize(self, req: Request, owner: JobOwner) -> Message | None:
        job_id, body = owner.job_id, req.message.body
        target = int(body["target"])
        if "batch" in body:
            raise Refused(
                "a resize request cannot set the global batch: the policy chooses it for adaptive jobs (the job's "
                "owner sets it in the training script: AdaptiveBatch(choose=False) and set_global_batch)"
            )
        agent = self.ledger.agents[job_id]
        reg = agent.registration
        if not reg.min_workers <= target <= reg.max_workers:
            raise Refused(
                f"job {job_id} runs with {reg.min_workers}..{reg.max_workers} workers; {target} is outside that"
            )
        if self.ledger.state.draining and target > reg.min_workers:
            raise Refused(
                f"every elastic job is drained to its minimum ({reg.min_workers} for job {job_id}) until an "
                f"operator runs `amoebactl resume`"
            )
        report = agent.report
        if agent.in_flight is not None or (report is not None and report.resizing):
            moving_to = agent.in_flight.target if agent.in_flight is not None else report.target if report else target
            raise Refused(f"job {job_id} is still resizing to {moving_to} workers; try again when it is done")
        if report is not None and report.size == target:
            return req.message.reply(data={"size": report.size, "target": target, "note": "already at that size"})
        user_reason = str(body.get("reason") or "")
        reason = f"amoebactl resize by uid {req.sender.uid}" + (f": {user_reason}" if user_reason else "")
        self.order(agent, target, reason, "ctl", req)
        return None  # answered when the agent answers (see answer_resize)

    def _on_share(self, req: Request, owner: JobOwner) -> Message:
        body = req.message.body
        host = check_job_id(str(body["host"]))
        if not self.config.sharing.enabled:
            raise Refused("GPU sharing is off at this site: set sharing.enabled in the daemon's configuration")
        if host not in self.ledger.agents:
            raise Refused(f"host job {host} is not an elastic job registered with amoebad; `amoebactl jobs` lists them")
        nodes = {str(node): int(count) for node, count in body["nodes"].items()}
        share = self.ledger.request_share(owner.job_id, host, nodes, f"amoebactl share by uid {req.sender.uid}")
        logger.info("[daemon/api] %s", share.reason)
        return req.message.reply(data={"job_id": owner.job_id, "host": host, "nodes": nodes, "at": "next round"})

    def _on_pin(self, req: Request, owner: JobOwner) -> Message:
        pinned = bool(req.message.body["pinned"])
        self.ledger.set_pinned(owner.job_id, pinned)
        logger.info(
            "[daemon/api] job %s %s by uid %d", owner.job_id, "pinned" if pinned else "unpinned", req.sender.uid
        )
        return req.message.reply(data={"job_id": owner.job_id, "pinned": pinned})

    def _on_drain(self, req: Request) -> Message:
        return self._set_draining(req, True)

    def _on_resume(self, req: Request) -> Message:
        return self._set_draining(req, False)

    def _set_draining(self, req: Request, draining: bool) -> Message:
        self.ledger.set_draining(draining)
        logger.warning(
            "[daemon/api] %s by uid %d",
            "drain: every elastic job goes to its minimum" if draining else "resume: the policy decides again",
            req.sender.uid,
        )
        return req.message.reply(data={"draining": draining})

    def status(self, viewer: Credential | None = None) -> dict[str, Any]:
        """What ``amoebactl status`` shows (JSON-ready).

        Args:
            viewer: who asks; an operator (or None: the daemon itself) sees every job, anyone else their own jobs
                (in flight, pinned, satellites, the last round's orders) and counts of the rest.
        """
        obs = self.round_loop.last_observation
        snapshot = obs.snapshot if obs is not None else None
        last = self.round_loop.last_round
        agents = self.ledger.agents
        sees = self._sees(viewer)
        orphans = [s for s in obs.orphans if sees.user_named(s.user)] if obs else []
        unclaimed = [s for s in obs.unclaimed if sees.user_named(s.user)] if obs else []
        admitter = self.round_loop.admission
        held = admitter.waiting if admitter is not None else ()
        last_round = dataclasses.asdict(last) if last else None
        if last_round is not None:
            last_round["ordered"] = {job: n for job, n in last_round["ordered"].items() if sees.job(job)}
        return {
            "protocol": PROTOCOL_VERSION,
            "pid": os.getpid(),
            "uid": self.daemon_uid,
            "listen": self.server.endpoint if self.server is not None else self.config.listen,
            "metrics_port": self.metrics_port,
            "uptime_s": round(self.clock() - self.started_at, 3),
            "policy": self.policy.name,
            "interval_s": self.config.interval_s,
            "config": {"source": self.config.source, "digest": self.config.digest},
            "draining": self.ledger.state.draining,
            "agents": len(agents),
            "jobs": {
                "elastic": len(obs.managed) if obs else 0,
                "regular_running": obs.regular_running if obs else 0,
                "regular_pending": obs.regular_pending if obs else 0,
            },
            "workers": sum(job.workers for job in obs.managed.values()) if obs else 0,
            "gpus": {
                "total": snapshot.total_gpus if snapshot else 0,
                "free": snapshot.free_gpus if snapshot else 0,
            },
            "in_flight": {
                job: agent.in_flight.target for job, agent in agents.items() if agent.in_flight and sees.job(job)
            },
            "pinned": sorted(job for job in self.ledger.state.pinned if sees.job(job)),
            "pinned_count": len(self.ledger.state.pinned),
            "orphans": [s.as_dict() for s in orphans],
            "orphans_count": len(obs.orphans) if obs else 0,
            "unclaimed": [s.as_dict() for s in unclaimed],
            "unclaimed_count": len(obs.unclaimed) if obs else 0,
            "admission": {
                "enabled": self.config.admission.enabled,
                "max_hold_s": self.config.admission.max_hold_s,
                "held": [
                    {**job.as_dict(), "held_s": round(max(0.0, self.clock() - job.since), 1)}
                    for job in held
                    if sees.user_named(job.user)
                ],
                "held_count": len(held),
            },
            "last_round": last_round,
            "refusals": (self.server.refusals if self.server else 0) + int(self.metrics.refusals.total()),
            "limited_to_own_jobs": not sees.everything,
            "ha": self.lease.describe() if self.lease is not None else {"role": "single"},
        }

    def _sees(self, viewer: Credential | None) -> _View:
        if viewer is None or self.is_operator(viewer):
            return _View(None, "", {})
        try:
            name = pwd.getpwuid(viewer.uid).pw_name
        except KeyError:
            name = ""
        return _View(viewer.uid, name, self.ledger.agents)

    def _on_status(self, req: Request) -> Message:
        return req.message.reply(data=self.status(req.sender))

    def _on_jobs(self, req: Request) -> Message:
        """A page of the jobs the sender may see (every job for operators, their own for others) and a count of
        the rest; ``next`` is the offset of the next page (None on the last)."""
        body = req.message.body
        offset, limit = int(body.get("offset", 0)), int(body.get("limit", JOBS_PAGE))
        if offset < 0 or not 1 <= limit <= JOBS_PAGE:
            raise Refused(f"jobs: offset={offset}, limit={limit}: give an offset >= 0 and a limit of 1..{JOBS_PAGE}")
        now = self.clock()
        sees = self._sees(req.sender)
        pinned = self.ledger.state.pinned
        visible = sorted((job_id, agent) for job_id, agent in self.ledger.agents.items() if sees.job(job_id))
        page: list[dict[str, Any]] = []
        size = 0
        for job_id, agent in visible[offset : offset + limit]:
            summary = agent.summary(now, job_id in pinned)
            summary["failing_nodes"] = self.ledger.failing_nodes.get(job_id, {})
            size += len(json.dumps(summary, separators=(",", ":")))
            if page and size > JOBS_REPLY_BYTES:
                break
            page.append(summary)
        end = offset + len(page)
        data = {
            "jobs": page,
            "total": len(visible),
            "others": len(self.ledger.agents) - len(visible),
            "next": end if end < len(visible) else None,
        }
        return req.message.reply(data=data)

    def _on_policy_show(self, req: Request) -> Message:
        return req.message.reply(
            data={
                "name": self.policy.name,
                "knobs": {**policy_knobs(self.config.policy), **self.config.effective_knobs()},
                "decides_on_events_only": self.policy.decides_on_events_only,
                "available": policy_names(),
                "interval_s": self.config.interval_s,
            }
        )


#: The handlers of the kinds about one job (their rule in :data:`ACCESS` says where its owner is read) ...
_JOB_HANDLERS: Mapping[str, Callable[[RequestHandler, Request, JobOwner], Message | None]] = {
    "register": RequestHandler._on_register,
    "report": RequestHandler._on_report,
    "resize": RequestHandler._on_resize,
    "pin": RequestHandler._on_pin,
    "admission": RequestHandler._on_admission,
    "share": RequestHandler._on_share,
}
#: ... and of the others (functions, not bound methods: see :class:`RequestHandler`).
_HANDLERS: Mapping[str, Callable[[RequestHandler, Request], Message | None]] = {
    "drain": RequestHandler._on_drain,
    "resume": RequestHandler._on_resume,
    "status": RequestHandler._on_status,
    "jobs": RequestHandler._on_jobs,
    "policy_show": RequestHandler._on_policy_show,
}
