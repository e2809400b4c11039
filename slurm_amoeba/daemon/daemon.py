"""``amoebad``: the control daemon's loop, its ZeroMQ API and who may do what (DESIGN.md, control flow).

One thread runs everything that touches the daemon's state: every ``interval_s`` a **round** (observe Slurm ->
snapshot -> policy -> directives), and in between the **requests** of agents and ``amoebactl``. Directives go out on
the actuator's threads and come back as outcomes the loop applies, so a dead agent never stalls the loop.

Who may do what (every request carries a munge credential; the channel refuses what it cannot authenticate):

==================  ===========================================================================================
kind                accepted from
==================  ===========================================================================================
``register``        the Slurm job's owner (the uid Slurm lists for the job)
``report``          the uid the job was registered by (its owner)
``resize``, ``pin`` the job's owner or an operator (``operators`` in the configuration, or the daemon's own uid)
``drain``/``resume`` an operator
``status``, ``jobs``, ``policy_show``  anyone authenticated
==================  ===========================================================================================

Refusals are logged with the sender's uid and answered with the reason. A job whose resize is in flight is never
ordered again until it arrives (or is abandoned after ``resize_timeout_s``); after a restart the daemon waits for
each agent to re-register and report before deciding anything about its job, and the state file keeps the
resizes the previous daemon had ordered.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import pwd
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.core.messages import PROTOCOL_VERSION, Message
from slurm_amoeba.daemon.actuator import Actuator, Directive, Outcome
from slurm_amoeba.daemon.agents import (
    HISTORY_KEPT,
    AgentMessageError,
    AgentRecord,
    InFlight,
    Registration,
    Report,
    check_job_id,
)
from slurm_amoeba.daemon.config import DaemonConfig
from slurm_amoeba.daemon.metrics import DaemonMetrics, MetricsServer
from slurm_amoeba.daemon.observer import (
    ClusterSource,
    ClusterView,
    Observation,
    SatelliteInfo,
    build_snapshot,
    observe,
)
from slurm_amoeba.daemon.state import DaemonState, load_state, save_state
from slurm_amoeba.policy import JobInfo, PolicyError, check_decisions, make_policy, policy_knobs, policy_names
from slurm_amoeba.slurm import JobRecord, SlurmCommandError
from slurm_amoeba.transport.channel import ChannelServer, Request
from slurm_amoeba.transport.munge import Credential

logger = logging.getLogger(__name__)

#: A registration for a job the last view does not show reads Slurm again, at most this often.
REFRESH_MIN_S = 1.0
#: Requests handled before the loop looks at outcomes and the round clock again.
BATCH = 256
#: A report this long after the agent accepted a resize that shows it settled elsewhere means it changed course.
SETTLED_AFTER_S = 3.0
#: History events in one ``jobs`` reply, over all jobs (keeps the reply far below the 1 MiB message limit).
JOBS_REPLY_EVENTS = 2000
#: Recent rounds kept for ``status`` and benchmarks.
ROUNDS_KEPT = 1000


@dataclasses.dataclass(frozen=True)
class RoundSummary:
    """What one round did (for ``amoebactl status``, logs and tests).

    Attributes:
        at: when it started (the daemon's clock).
        duration_s: how long it took.
        policy_s: how long the policy took (0 when it did not run).
        ordered: job id -> ordered size.
        error: why the round was cut short, or "".
    """

    at: float
    duration_s: float
    policy_s: float
    ordered: dict[str, int]
    error: str = ""


class Daemon:
    """The control daemon (see the module docstring).

    Args:
        config: the validated configuration.
        slurm: where jobs and nodes are read from.
        clock: the wall clock (Unix seconds); tests pass their own.
    """

    def __init__(
        self,
        config: DaemonConfig,
        slurm: ClusterSource,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.slurm = slurm
        self.clock = clock
        self.policy = make_policy(config.policy, **config.effective_knobs())
        self.metrics = DaemonMetrics()
        self.agents: dict[str, AgentRecord] = {}
        self.state_path = Path(config.state_file) if config.state_file else None
        self.state: DaemonState = load_state(self.state_path)
        # Acknowledged resizes of the previous daemon, attached to their jobs when the agents register again.
        self._recovered: dict[str, InFlight] = dict(self.state.in_flight)
        self.view: ClusterView | None = None
        self.last_observation: Observation | None = None
        self.last_round: RoundSummary | None = None
        self.rounds: collections.deque[RoundSummary] = collections.deque(maxlen=ROUNDS_KEPT)
        self.started_at = clock()
        self.uid = os.getuid()
        self._orphans_seen: dict[str, float] = {}
        self._orphans_reported: set[str] = set()
        self._unclaimed_reported: set[str] = set()
        self._last_refresh = 0.0
        self._state_dirty = False
        self.server: ChannelServer | None = None
        self.metrics_server: MetricsServer | None = None
        self.actuator = Actuator(config.agents.parallel, config.agents.timeout_s, config.agents.retries)
        if self._recovered or self.state.pinned or self.state.draining:
            logger.info(
                "[daemon/recovery] from %s: %d pinned job(s), draining=%s, %d resize(s) in flight",
                self.state_path,
                len(self.state.pinned),
                self.state.draining,
                len(self._recovered),
            )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Bind the API socket and start the metrics endpoint.

        Raises:
            zmq.ZMQError: the API address is taken or cannot be bound.
            OSError: the metrics port is taken.
        """
        self.server = ChannelServer(self.config.listen)
        logger.info(
            "[daemon/api] listening on %s (policy %s, every %g s, uid %d)",
            self.server.endpoint,
            self.policy.name,
            self.config.interval_s,
            self.uid,
        )
        if self.config.metrics_port:
            self.metrics_server = MetricsServer(
                self.config.metrics_address, self.config.metrics_port, self.metrics.registry.render
            )
            self.metrics_server.start()

    def close(self) -> None:
        """Stop the actuator, the metrics endpoint and the socket, and save the state."""
        self.actuator.close()
        self.apply_outcomes()
        self._save()
        self.save_state()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.server is not None:
            self.server.close()
        logger.info("[daemon] stopped")

    def run(self, stop: threading.Event) -> None:
        """Run rounds and answer requests until ``stop`` is set.

        Args:
            stop: set it (e.g. from a signal handler) to leave the loop.
        """
        if self.server is None:
            self.start()
        next_round = time.monotonic()
        while not stop.is_set():
            if time.monotonic() >= next_round:
                self.run_round()
                next_round = max(next_round + self.config.interval_s, time.monotonic())
            self.apply_outcomes()
            self.serve(min(0.05, max(0.001, next_round - time.monotonic())))

    def serve(self, timeout_s: float) -> int:
        """Answer the requests that arrive within ``timeout_s`` (at most :data:`BATCH` of them).

        Returns:
            How many were handled.
        """
        server = self.server
        if server is None:
            raise RuntimeError("Daemon.serve() before Daemon.start(): the API socket is not bound yet")
        handled = 0
        req = server.receive(timeout_s)
        while req is not None:
            self.handle(req)
            handled += 1
            if handled >= BATCH:
                break
            req = server.receive(0.001)
        self.save_state()
        return handled

    # ------------------------------------------------------------------ requests

    def handle(self, req: Request) -> None:
        """Answer one authenticated request; nothing a sender does can raise out of here."""
        kind = req.message.kind
        handlers: dict[str, Callable[[Request], Message | None]] = {
            "register": self._on_register,
            "report": self._on_report,
            "resize": self._on_resize,
            "pin": self._on_pin,
            "drain": self._on_drain,
            "resume": self._on_resume,
            "status": self._on_status,
            "jobs": self._on_jobs,
            "policy_show": self._on_policy_show,
        }
        handler = handlers.get(kind)
        try:
            if handler is None:
                self._refuse(req, f"the daemon does not take {kind!r} messages; it takes {', '.join(handlers)}")
                return
            reply = handler(req)
        except (AgentMessageError, ParseError) as exc:
            self._refuse(req, str(exc))
            return
        except Exception:
            logger.exception("[daemon/api] %s from uid %d failed", kind, req.sender.uid)
            self._refuse(req, f"the daemon failed on this {kind}; its log has the details", reason="internal")
            return
        self.metrics.requests.inc(labels={"kind": kind})
        if reply is not None:
            self._answer(req, reply)

    def _answer(self, req: Request, reply: Message) -> None:
        if self.server is not None:
            self.server.answer(req, reply)

    def _refuse(self, req: Request, why: str, reason: str = "invalid", level: int = logging.WARNING) -> None:
        logger.log(level, "[daemon/api] refused %s from uid %d: %s", req.message.kind, req.sender.uid, why)
        self.metrics.refusals.inc(labels={"kind": req.message.kind, "reason": reason})
        self._answer(req, req.message.reply(ok=False, error=why))

    def _deny(self, req: Request, why: str) -> None:
        self._refuse(req, why, reason="unauthorized")

    def is_operator(self, sender: Credential) -> bool:
        """Whether ``sender`` may act on every job: a configured operator (or group), or the daemon's own uid."""
        if sender.uid == self.uid or sender.uid in self.config.operator_uids:
            return True
        if not self.config.operator_gids:
            return False
        if sender.gid in self.config.operator_gids:
            return True
        try:
            entry = pwd.getpwuid(sender.uid)
        except KeyError:
            return False
        return bool(self.config.operator_gids.intersection(os.getgrouplist(entry.pw_name, entry.pw_gid)))

    def _slurm_job(self, job_id: str) -> list[JobRecord]:
        """The active records of a job, reading Slurm again when the last view does not know it."""
        known = self.view.active_job(job_id) if self.view is not None else []
        if known:
            return known
        now = self.clock()
        if now - self._last_refresh >= REFRESH_MIN_S:
            self._last_refresh = now
            try:
                self.view = observe(self.slurm, now)
            except (SlurmCommandError, ParseError) as exc:
                logger.warning("[daemon/observer] could not read Slurm: %s", exc)
                return []
            return self.view.active_job(job_id)
        return []

    def _on_register(self, req: Request) -> Message | None:
        reg = Registration.from_body(req.message.body)
        if reg.elastic_partition != self.config.elastic_partition:
            # Extras outside the preemptible partition could hold GPUs that regular jobs need: never grow such a job.
            self._refuse(
                req,
                f"job {reg.job_id} would grow in partition {reg.elastic_partition!r}, but this site's preemptible "
                f"partition for elastic extras is {self.config.elastic_partition!r}; submit with "
                f"--elastic-partition {self.config.elastic_partition}",
            )
            return None
        records = self._slurm_job(reg.job_id)
        if not records:
            self._refuse(req, f"Slurm runs no job {reg.job_id}; an agent registers from inside its running job")
            return None
        owner = min(records, key=lambda r: r.het_job_offset)
        if owner.uid != req.sender.uid:
            self._deny(
                req, f"job {reg.job_id} belongs to uid {owner.uid}; uid {req.sender.uid} may not register its agent"
            )
            return None
        now = self.clock()
        previous = self.agents.get(reg.job_id)
        record = AgentRecord(registration=reg, uid=owner.uid, user=owner.user, registered_at=now)
        if previous is not None:
            record.in_flight, record.backoff_until = previous.in_flight, previous.backoff_until
            record.history = previous.history
        elif reg.job_id in self._recovered:
            record.in_flight = self._recovered.pop(reg.job_id)
        self.agents[reg.job_id] = record
        logger.info(
            "[daemon/api] job %s (user %s) registered: %d..%d workers of %d GPU(s), directives to %s%s",
            reg.job_id,
            owner.user,
            reg.min_workers,
            reg.max_workers,
            reg.gpus_per_worker,
            reg.endpoint,
            " (again)" if previous is not None else "",
        )
        return req.message.reply(data={"interval_s": self.config.interval_s, "daemon_uid": self.uid})

    def _on_report(self, req: Request) -> Message | None:
        body = req.message.body
        job_id = check_job_id(str(body["job_id"]))
        agent = self.agents.get(job_id)
        if agent is None:
            self._refuse(
                req,
                f"unknown job {job_id}: it is not registered with this daemon (it may have restarted); register again",
                reason="unknown_job",
                level=logging.INFO,  # every agent meets this once after a restart of the daemon
            )
            return None
        if req.sender.uid != agent.uid:
            self._deny(req, f"job {job_id} belongs to uid {agent.uid}; uid {req.sender.uid} may not report for it")
            return None
        now = self.clock()
        report = Report.from_body(body, now)
        agent.accept_report(report)
        flight = agent.in_flight
        if flight is not None and report.size == flight.target and report.target == flight.target:
            latency = max(0.0, now - flight.ordered_at)
            self.metrics.resize_latency.observe(latency)
            logger.info(
                "[daemon/actuator] job %s reached %d workers %.1f s after the order (%s)",
                job_id,
                report.size,
                latency,
                flight.source,
            )
            agent.in_flight = None
            self._save()
        elif (
            flight is not None
            and flight.acknowledged
            and not report.resizing
            and report.size != flight.target
            and now - flight.acknowledged_at >= SETTLED_AFTER_S
        ):
            pause = min(self.config.agents.backoff_s, 2 * self.config.interval_s)
            logger.info(
                "[daemon/actuator] job %s settled at %d workers instead of the ordered %d (its agent changed course: "
                "a satellite was preempted or failed, see `amoebactl jobs`); deciding for it again in %g s",
                job_id,
                report.size,
                flight.target,
                pause,
            )
            self.metrics.directive_failures.inc(labels={"reason": "abandoned"})
            agent.in_flight = None
            agent.backoff_until = now + pause
            self._save()
        return req.message.reply(data={"interval_s": self.config.interval_s})

    def _on_resize(self, req: Request) -> Message | None:
        body = req.message.body
        job_id = check_job_id(str(body["job_id"]))
        target = int(body["target"])
        agent = self.agents.get(job_id)
        if agent is None:
            self._refuse(
                req, f"job {job_id} is not an elastic job registered with amoebad; `amoebactl jobs` lists them"
            )
            return None
        if req.sender.uid != agent.uid and not self.is_operator(req.sender):
            self._deny(
                req,
                f"uid {req.sender.uid} may not resize job {job_id}: only its owner ({agent.user}) or an operator may",
            )
            return None
        reg = agent.registration
        if not reg.min_workers <= target <= reg.max_workers:
            self._refuse(
                req, f"job {job_id} runs with {reg.min_workers}..{reg.max_workers} workers; {target} is outside that"
            )
            return None
        if self.state.draining and target > reg.min_workers:
            self._refuse(
                req,
                f"every elastic job is drained to its minimum ({reg.min_workers} for job {job_id}) until an "
                f"operator runs `amoebactl resume`",
            )
            return None
        report = agent.report
        if agent.in_flight is not None or (report is not None and report.resizing):
            moving_to = agent.in_flight.target if agent.in_flight is not None else report.target if report else target
            self._refuse(req, f"job {job_id} is still resizing to {moving_to} workers; try again when it is done")
            return None
        if report is not None and report.size == target:
            return req.message.reply(data={"size": report.size, "target": target, "note": "already at that size"})
        user_reason = str(body.get("reason") or "")
        reason = f"amoebactl resize by uid {req.sender.uid}" + (f": {user_reason}" if user_reason else "")
        self._order(agent, target, reason, "ctl", token=req)
        return None  # answered when the agent answers (see apply_outcomes)

    def _on_pin(self, req: Request) -> Message | None:
        job_id = check_job_id(str(req.message.body["job_id"]))
        pinned = bool(req.message.body["pinned"])
        agent = self.agents.get(job_id)
        if agent is not None:
            owner_uid = agent.uid
        else:
            records = self._slurm_job(job_id)
            if not records:
                self._refuse(req, f"Slurm runs no job {job_id}; only running or pending jobs can be pinned")
                return None
            owner_uid = min(records, key=lambda r: r.het_job_offset).uid
        if req.sender.uid != owner_uid and not self.is_operator(req.sender):
            self._deny(req, f"uid {req.sender.uid} may not pin job {job_id}: only its owner or an operator may")
            return None
        if pinned:
            self.state.pinned.add(job_id)
        else:
            self.state.pinned.discard(job_id)
        self._save()
        logger.info("[daemon/api] job %s %s by uid %d", job_id, "pinned" if pinned else "unpinned", req.sender.uid)
        return req.message.reply(data={"job_id": job_id, "pinned": pinned})

    def _on_drain(self, req: Request) -> Message | None:
        return self._set_draining(req, True)

    def _on_resume(self, req: Request) -> Message | None:
        return self._set_draining(req, False)

    def _set_draining(self, req: Request, draining: bool) -> Message | None:
        if not self.is_operator(req.sender):
            self._deny(req, f"uid {req.sender.uid} is not an operator; only operators may drain or resume")
            return None
        self.state.draining = draining
        self._save()
        logger.warning(
            "[daemon/api] %s by uid %d",
            "drain: every elastic job goes to its minimum" if draining else "resume: the policy decides again",
            req.sender.uid,
        )
        return req.message.reply(data={"draining": draining})

    def status(self) -> dict[str, Any]:
        """What ``amoebactl status`` shows (JSON-ready)."""
        obs = self.last_observation
        now = self.clock()
        snapshot = obs.snapshot if obs is not None else None
        last = self.last_round
        return {
            "protocol": PROTOCOL_VERSION,
            "pid": os.getpid(),
            "uid": self.uid,
            "listen": self.server.endpoint if self.server is not None else self.config.listen,
            "metrics_port": self.metrics_server.port if self.metrics_server is not None else 0,
            "uptime_s": round(now - self.started_at, 3),
            "policy": self.policy.name,
            "interval_s": self.config.interval_s,
            "draining": self.state.draining,
            "agents": len(self.agents),
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
            "in_flight": {job: agent.in_flight.target for job, agent in self.agents.items() if agent.in_flight},
            "pinned": sorted(self.state.pinned),
            "orphans": [s.as_dict() for s in obs.orphans] if obs else [],
            "unclaimed": [s.as_dict() for s in obs.unclaimed] if obs else [],
            "last_round": dataclasses.asdict(last) if last else None,
            "refusals": (self.server.refusals if self.server else 0) + int(self.metrics.refusals.total()),
        }

    def _on_status(self, req: Request) -> Message:
        return req.message.reply(data=self.status())

    def _on_jobs(self, req: Request) -> Message:
        now = self.clock()
        # Many jobs share one reply (at most 1 MiB): fewer history events each as the list grows.
        events = max(1, min(HISTORY_KEPT, JOBS_REPLY_EVENTS // max(1, len(self.agents))))
        jobs = [
            agent.summary(now, job_id in self.state.pinned, events) for job_id, agent in sorted(self.agents.items())
        ]
        return req.message.reply(data={"jobs": jobs})

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

    # ------------------------------------------------------------------ rounds

    def run_round(self) -> RoundSummary:
        """Observe, decide and order once; never raises (a failed round is logged and reported)."""
        started = time.perf_counter()
        now = self.clock()
        try:
            summary = self._round(now, started)
        except Exception as exc:
            logger.exception("[daemon] the round failed; the next one starts afresh")
            summary = RoundSummary(now, time.perf_counter() - started, 0.0, {}, f"internal error: {exc}")
        self.last_round = summary
        self.rounds.append(summary)
        self.save_state()
        self.metrics.loop_time.observe(summary.duration_s)
        if not summary.error:
            self.metrics.last_round.set(now)
        return summary

    def _round(self, now: float, started: float) -> RoundSummary:
        try:
            view = observe(self.slurm, now)
        except (SlurmCommandError, ParseError) as exc:
            self.metrics.observe_failures.inc()
            logger.warning("[daemon/observer] Slurm did not answer (%s); no decisions this round", exc)
            return RoundSummary(now, time.perf_counter() - started, 0.0, {}, f"Slurm did not answer: {exc}")
        self.view = view
        self._expire_resizes(now)
        obs = build_snapshot(
            view,
            self.agents,
            pinned=self.state.pinned,
            regular_partitions=self.config.regular_partitions,
            elastic_partition=self.config.elastic_partition,
            stale_after_s=self.config.agents.stale_after_s,
            now=now,
            make_room_after_s=self.config.make_room_after_s,
        )
        self.last_observation = obs
        self._forget(obs, view)
        self._watch_orphans(obs, now)
        policy_s = 0.0
        if self.state.draining:
            targets = {
                job_id: info.min_workers
                for job_id, info in obs.managed.items()
                if not info.resizing and info.workers > info.min_workers
            }
            reasons = dict.fromkeys(targets, "drain: an operator asked every elastic job to its minimum")
            source = "drain"
        else:
            tick = time.perf_counter()
            decisions = self.policy.decide(obs.snapshot, now)
            policy_s = time.perf_counter() - tick
            self.metrics.policy_time.observe(policy_s)
            try:
                check_decisions(obs.snapshot, decisions)
            except PolicyError as exc:
                logger.error(
                    "[daemon/policy] %s broke an invariant (%s); no directives this round", self.policy.name, exc
                )
                return RoundSummary(now, time.perf_counter() - started, policy_s, {}, f"policy error: {exc}")
            targets, reasons = {}, {}
            for decision in decisions:
                info = obs.managed.get(decision.job_id)
                if info is None or not info.is_resizable or decision.workers in (0, info.workers):
                    continue  # Slurm starts and preempts jobs; the daemon only resizes the elastic ones it manages
                targets[decision.job_id] = decision.workers
                reasons[decision.job_id] = decision.reason or self.policy.name
            source = "policy"
        for job_id, target in targets.items():
            self._order(self.agents[job_id], target, reasons[job_id], source)
        self._update_gauges(obs)
        return RoundSummary(now, time.perf_counter() - started, policy_s, dict(targets))

    def _expire_resizes(self, now: float) -> None:
        for agent in self.agents.values():
            flight = agent.in_flight
            if flight is not None and flight.acknowledged and now - flight.ordered_at > self.config.resize_timeout_s:
                size = agent.report.size if agent.report else "unknown"
                logger.warning(
                    "[daemon/actuator] job %s did not reach %d workers within %g s (it reports %s); giving up on "
                    "that resize and leaving the job alone for %g s",
                    agent.job_id,
                    flight.target,
                    self.config.resize_timeout_s,
                    size,
                    self.config.agents.backoff_s,
                )
                self.metrics.directive_failures.inc(labels={"reason": "timeout"})
                agent.in_flight = None
                agent.backoff_until = now + self.config.agents.backoff_s
                self._save()

    def _forget(self, obs: Observation, view: ClusterView) -> None:
        for job_id in obs.gone:
            agent = self.agents.pop(job_id)
            logger.info("[daemon/observer] job %s (user %s) has ended; its agent is forgotten", job_id, agent.user)
        active = view.active_groups()
        stale_pins = {job for job in self.state.pinned if job not in active}
        stale_recovered = {job for job in self._recovered if job not in active}
        for job in stale_recovered:
            del self._recovered[job]
        if stale_pins or obs.gone or stale_recovered:
            self.state.pinned -= stale_pins
            self._save()

    def _watch_orphans(self, obs: Observation, now: float) -> None:
        current = {s.job_id: s for s in obs.orphans}
        for job_id in list(self._orphans_seen):
            if job_id not in current:
                del self._orphans_seen[job_id]
                self._orphans_reported.discard(job_id)
        for job_id, sat in current.items():
            first = self._orphans_seen.setdefault(job_id, now)
            if now - first >= self.config.orphan_grace_s and job_id not in self._orphans_reported:
                self._orphans_reported.add(job_id)
                _report_orphan(sat)
        unclaimed = {s.job_id for s in obs.unclaimed}
        self._unclaimed_reported &= unclaimed
        for sat in obs.unclaimed:
            if sat.job_id in self._unclaimed_reported:
                continue
            self._unclaimed_reported.add(sat.job_id)
            logger.warning(
                "[daemon/observer] satellite %s of job %s (user %s) is not among the satellites its agent reports; "
                "the agent should release it (scancel %s)",
                sat.job_id,
                sat.parent,
                sat.user,
                sat.job_id,
            )

    def _order(self, agent: AgentRecord, target: int, reason: str, source: str, token: Any = None) -> None:
        now = self.clock()
        size = agent.report.size if agent.report else 0
        kind = "grow" if target > size else "shrink"
        agent.in_flight = InFlight(target=target, ordered_at=now, source=source, reason=reason)
        self.metrics.decisions.inc(labels={"kind": kind, "source": source})
        logger.info("[daemon/actuator] job %s: %s %d -> %d workers (%s)", agent.job_id, kind, size, target, reason)
        self.actuator.send(
            Directive(
                job_id=agent.job_id,
                endpoint=agent.registration.endpoint,
                uid=agent.uid,
                target=target,
                reason=reason,
                ordered_at=now,
                token=token,
            )
        )

    def apply_outcomes(self) -> None:
        """Apply the outcomes of directives that came back since the last call (the loop calls it)."""
        for outcome in self.actuator.completed():
            self._apply(outcome)
        self.save_state()

    def _apply(self, outcome: Outcome) -> None:
        directive = outcome.directive
        agent = self.agents.get(directive.job_id)
        flight = agent.in_flight if agent is not None else None
        ours = flight is not None and flight.ordered_at == directive.ordered_at and flight.target == directive.target
        if outcome.ok and agent is not None and flight is not None and ours:
            flight.acknowledged = True
            flight.acknowledged_at = self.clock()
            report = agent.report
            if report is not None and report.size == flight.target and report.target == flight.target:
                agent.in_flight = None
            self._save()
        elif not outcome.ok:
            why = "unreachable" if outcome.unreachable else "refused"
            self.metrics.directive_failures.inc(labels={"reason": why})
            logger.warning(
                "[daemon/actuator] the agent of job %s %s the resize to %d: %s; leaving the job alone for %g s",
                directive.job_id,
                "did not answer" if outcome.unreachable else "refused",
                directive.target,
                outcome.error,
                self.config.agents.backoff_s,
            )
            if agent is not None and ours:
                agent.in_flight = None
                agent.backoff_until = self.clock() + self.config.agents.backoff_s
        token = directive.token
        if isinstance(token, Request):
            if outcome.ok:
                self._answer(token, token.message.reply(data=outcome.data))
            else:
                self._answer(
                    token, token.message.reply(ok=False, error=f"the job's agent did not resize: {outcome.error}")
                )

    def _update_gauges(self, obs: Observation) -> None:
        m = self.metrics
        m.jobs.replace(
            [
                ({"kind": "elastic"}, len(obs.managed)),
                ({"kind": "regular_running"}, obs.regular_running),
                ({"kind": "regular_pending"}, obs.regular_pending),
            ]
        )
        m.agents.set(len(self.agents))
        m.workers.replace(({"job": job_id}, info.workers) for job_id, info in obs.managed.items())
        m.gpus.replace([({"state": "total"}, obs.snapshot.total_gpus), ({"state": "free"}, obs.snapshot.free_gpus)])
        m.in_flight.set(sum(1 for agent in self.agents.values() if agent.in_flight is not None))
        m.orphans.set(len(obs.orphans))
        m.draining.set(1 if self.state.draining else 0)

    def _save(self) -> None:
        """Mark the persistent state changed; :meth:`save_state` writes it (once per batch of requests)."""
        self._state_dirty = True

    def save_state(self) -> None:
        """Write the state file if anything in it changed since the last write."""
        if not self._state_dirty:
            return
        self._state_dirty = False
        self.state.in_flight = {
            job_id: agent.in_flight
            for job_id, agent in self.agents.items()
            if agent.in_flight is not None and agent.in_flight.acknowledged
        }
        self.state.in_flight.update(self._recovered)
        save_state(self.state_path, self.state)

    def managed_job(self, job_id: str) -> JobInfo | None:
        """The managed job as the last snapshot showed it, or None."""
        obs = self.last_observation
        return obs.managed.get(job_id) if obs is not None else None


def _report_orphan(sat: SatelliteInfo) -> None:
    logger.warning(
        "[daemon/observer] satellite %s (user %s, %s, %d GPU(s) on %s) outlived its parent job %s; the daemon "
        "never cancels other users' jobs: its owner or an administrator should `scancel %s`",
        sat.job_id,
        sat.user,
        sat.state,
        sat.gpus,
        ",".join(sat.nodes) or "no node",
        sat.parent,
        sat.job_id,
    )
