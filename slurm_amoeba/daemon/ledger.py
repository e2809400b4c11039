"""The daemon's books: the registered jobs, their resizes in flight, and what survives a restart.

Bookkeeping of DESIGN.md's control flow, kept apart from its steps (:mod:`.rounds`) and from the requests that feed it
(:mod:`.requests`): a resize is ordered (:meth:`Ledger.order`), acknowledged by the agent (:meth:`Ledger.apply`),
reached or abandoned according to the agent's reports (:meth:`Ledger.take_report`), or given up after
``resize_timeout_s`` (:meth:`Ledger.expire_resizes`). A job whose resize is in flight is never ordered again until it
arrives. The persistent part (pins, the drain switch, acknowledged resizes) is written to the state file at most once
per batch of requests or round (:meth:`Ledger.save`); after a restart the acknowledged resizes of the previous daemon
wait in :attr:`Ledger.recovered` for their agents to register again.

:class:`SatelliteWatch` logs each orphaned or unclaimed satellite once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import slurm_amoeba.policy.actions as act
from slurm_amoeba.daemon.actuator import Directive, Outcome
from slurm_amoeba.daemon.agents import AgentRecord, Beside, InFlight, Registration, Report
from slurm_amoeba.daemon.config import DaemonConfig
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.daemon.observer import Observation, SatelliteInfo
from slurm_amoeba.daemon.state import DaemonState, load_state, save_state

logger = logging.getLogger(__name__)

#: A report this long after the agent accepted a resize that shows it settled elsewhere means it changed course.
SETTLED_AFTER_S = 3.0
#: A node name an agent's ``node_failing`` event may carry, and how many nodes per job the daemon keeps.
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_FAILING_NODES_KEPT = 64


class Ledger:
    """The registered jobs and the daemon's persistent state (see the module docstring).

    Args:
        config: the daemon's configuration (backoffs, timeouts, the state file).
        metrics: where resize latencies, decisions and directive failures are counted.
        clock: the daemon's wall clock.

    Attributes:
        agents: job id -> its registered agent.
        state_path: the state file, or None.
        state: pins, the drain switch and acknowledged resizes (as last saved or loaded).
        recovered: acknowledged resizes of the previous daemon whose agents have not registered again yet.
        failing_nodes: job id -> nodes its agent reported failing under it repeatedly -> how often (its
            ``node_failing`` history events; shown by ``amoebactl jobs``).
        moves: job id -> when a whole-node move was ordered of it or for it (a pending job whose node is being
            vacated); kept for ``resize_timeout_s`` (by then the move has arrived or was abandoned), read by the
            whole-node moves layer (:class:`~slurm_amoeba.policy.moves.WholeNodeMoves`), which leaves them alone.
    """

    def __init__(self, config: DaemonConfig, metrics: DaemonMetrics, clock: Callable[[], float]) -> None:
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.agents: dict[str, AgentRecord] = {}
        self._per_uid: dict[int, int] = {}  # uid -> its agents in ``agents`` (a registration's limit, in O(1))
        self.state_path = Path(config.state_file) if config.state_file else None
        self.state: DaemonState = load_state(self.state_path)
        self.recovered: dict[str, InFlight] = dict(self.state.in_flight)
        self.failing_nodes: dict[str, dict[str, int]] = {}
        self.moves: dict[str, float] = {}
        self.requested_shares: list[act.Share] = []
        self._dirty = False
        if self.recovered or self.state.pinned or self.state.draining or self.state.shares:
            logger.info(
                "[daemon/recovery] from %s: %d pinned job(s), draining=%s, %d resize(s) in flight, %d share(s)",
                self.state_path,
                len(self.state.pinned),
                self.state.draining,
                len(self.recovered),
                len(self.state.shares),
            )

    # ------------------------------------------------------------------ the state file

    def changed(self) -> None:
        """Mark the persistent state changed; :meth:`save` writes it."""
        self._dirty = True

    def save(self) -> None:
        """Write the state file if anything in it changed since the last write."""
        if not self._dirty:
            return
        self._dirty = False
        self.state.in_flight = {
            job_id: agent.in_flight
            for job_id, agent in self.agents.items()
            if agent.in_flight is not None and agent.in_flight.acknowledged
        }
        self.state.in_flight.update(self.recovered)
        save_state(self.state_path, self.state)

    def set_pinned(self, job_id: str, pinned: bool) -> None:
        """Pin (exclude from the policy) or unpin a job."""
        if pinned:
            self.state.pinned.add(job_id)
        else:
            self.state.pinned.discard(job_id)
        self.changed()

    def set_draining(self, draining: bool) -> None:
        """Switch the drain (every elastic job to its minimum) on or off."""
        self.state.draining = draining
        self.changed()

    # ------------------------------------------------------------------ agents

    def register(self, reg: Registration, uid: int, user: str) -> bool:
        """Record an agent's registration, keeping what the daemon knew of the job before.

        Returns:
            Whether the job was registered already (an agent registering again).
        """
        previous = self.agents.get(reg.job_id)
        record = AgentRecord(registration=reg, uid=uid, user=user, registered_at=self.clock())
        if previous is not None:
            record.in_flight, record.backoff_until = previous.in_flight, previous.backoff_until
            record.history, record.adaptive, record.rates = previous.history, previous.adaptive, previous.rates
        elif reg.job_id in self.recovered:
            record.in_flight = self.recovered.pop(reg.job_id)
        record.beside = previous.beside if previous is not None else self.state.shares.get(reg.job_id)
        if previous is not None:
            self._per_uid[previous.uid] -= 1
        self._per_uid[uid] = self._per_uid.get(uid, 0) + 1
        self.agents[reg.job_id] = record
        return previous is not None

    def registered_by(self, uid: int, besides: str = "") -> int:
        """How many jobs of ``uid`` have their agent registered, the job ``besides`` not counted."""
        agent = self.agents.get(besides)
        return self._per_uid.get(uid, 0) - (1 if agent is not None and agent.uid == uid else 0)

    def take_report(self, agent: AgentRecord, report: Report) -> None:
        """Keep an agent's report and settle its resize in flight: reached, or abandoned by the agent."""
        agent.accept_report(report)
        self._note_failing_nodes(agent, report)
        flight = agent.in_flight
        now = report.received_at
        if flight is not None and flight.batch_only and report.size == flight.target == report.target:
            agent.in_flight = None  # the runtime applies the batch at its next decision point; nothing to time
            self.changed()
        elif flight is not None and report.size == flight.target and report.target == flight.target:
            latency = max(0.0, now - flight.ordered_at)
            self.metrics.resize_latency.observe(latency)
            logger.info(
                "[daemon/actuator] job %s reached %d workers %.1f s after the order (%s)",
                agent.job_id,
                report.size,
                latency,
                flight.source,
            )
            agent.in_flight = None
            self.changed()
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
                agent.job_id,
                report.size,
                flight.target,
                pause,
            )
            self.metrics.directive_failures.inc(labels={"reason": "abandoned"})
            agent.in_flight = None
            agent.backoff_until = now + pause
            self.changed()

    def _note_failing_nodes(self, agent: AgentRecord, report: Report) -> None:
        """Keep the nodes the agent's ``node_failing`` events name (repeated infrastructure failures under its job);
        an event whose node or count is malformed is skipped."""
        nodes = self.failing_nodes.setdefault(agent.job_id, {})
        for event in report.history:
            if not isinstance(event, dict) or event.get("event") != "node_failing":
                continue
            node, failures = event.get("node"), event.get("failures")
            if not isinstance(node, str) or not _NODE_NAME.fullmatch(node):
                continue
            if isinstance(failures, bool) or not isinstance(failures, int) or not 0 < failures < 1_000_000:
                continue
            if node in nodes or len(nodes) < _FAILING_NODES_KEPT:
                if failures > nodes.get(node, 0):
                    logger.warning(
                        "[daemon/ledger] job %s reports node %s failing under it %d times", agent.job_id, node, failures
                    )
                nodes[node] = max(nodes.get(node, 0), failures)
        if not nodes:
            del self.failing_nodes[agent.job_id]

    def attribute_rates(self, job_types: Mapping[str, str]) -> None:
        """Take each agent's new report as a sample of its speed alone or beside its partner
        (:meth:`~.agents.MeasuredRates.observe`), from the daemon's own shares: a sharer computes beside its host,
        a host beside its one sharer. The pairing is settled when no share is being placed or taken back (neither
        job has a resize in flight nor reports one), the host has one sharer, and the partner's type is known.

        Args:
            job_types: job id -> its job type (its Slurm job name, for the jobs that opted in to sharing).
        """
        sharers: dict[str, list[AgentRecord]] = {}
        for agent in self.agents.values():
            if agent.beside is not None:
                sharers.setdefault(agent.beside.host, []).append(agent)
        for agent in self.agents.values():
            report = agent.report
            if report is None or report.received_at <= agent.rates.seen_at:
                continue
            partner: AgentRecord | None = None
            settled = agent.in_flight is None
            if agent.beside is not None:
                partner = self.agents.get(agent.beside.host)
                settled = settled and partner is not None
            elif agent.job_id in sharers:
                beside = sharers[agent.job_id]
                partner = beside[0]
                settled = settled and len(beside) == 1
            partner_type = None if partner is None else job_types.get(partner.job_id, "")
            if partner is not None:
                settled = (
                    settled
                    and bool(partner_type)
                    and partner.in_flight is None
                    and partner.report is not None
                    and not partner.report.resizing
                )
            agent.rates.observe(report, partner_type, settled)

    def forget(self, gone: Collection[str], active: Collection[str]) -> None:
        """Forget ended jobs, and pins, recovered resizes and shares of jobs Slurm no longer runs.

        Args:
            gone: registered jobs Slurm no longer runs.
            active: ids of every job Slurm runs or holds pending.
        """
        for job_id in gone:
            agent = self.agents.pop(job_id)
            self._per_uid[agent.uid] -= 1
            self.failing_nodes.pop(job_id, None)
            logger.info("[daemon/observer] job %s (user %s) has ended; its agent is forgotten", job_id, agent.user)
        stale_pins = {job for job in self.state.pinned if job not in active}
        stale_recovered = {job for job in self.recovered if job not in active}
        stale_shares = {job for job in self.state.shares if job not in active or job in gone}
        for job in stale_recovered:
            del self.recovered[job]
        for job in stale_shares:
            del self.state.shares[job]
        if stale_pins or gone or stale_recovered or stale_shares:
            self.state.pinned -= stale_pins
            self.changed()

    # ------------------------------------------------------------------ resizes

    def request_share(self, sharer: str, host: str, nodes: dict[str, int], reason: str) -> act.Share:
        """An operator's share (``amoebactl share``): ``nodes[node]`` new workers of ``sharer`` beside ``host``,
        applied by the next round with the policy's actions (and the same checks). Returns the share."""
        agent = self.agents[sharer]
        own = agent.report.size if agent.report is not None else agent.registration.min_workers
        share = act.Share(sharer, host, own + sum(nodes.values()), nodes, f"{reason}: beside job {host}")
        self.requested_shares.append(share)
        return share

    def take_requested_shares(self) -> list[act.Share]:
        """The operators' shares since the last round (taken: each is tried once)."""
        shares, self.requested_shares = self.requested_shares, []
        return shares

    def order(
        self,
        agent: AgentRecord,
        target: int,
        reason: str,
        source: str,
        token: Any = None,
        batch: int | None = None,
        vacate: str = "",
        for_job: str = "",
        beside: Beside | None = None,
        unshare: bool = False,
    ) -> Directive:
        """Record a resize as in flight and return the directive that carries it to the agent.

        Args:
            agent: the job's agent.
            target: the size ordered.
            reason: why (the agent logs it).
            source: ``policy``, ``drain`` or ``ctl``.
            token: handed back with the outcome (a deferred ``amoebactl`` request).
            batch: the global batch the policy chose for ``target`` workers (an adaptive job), sent along; a
                directive to the job's current size that carries only a new batch is counted as ``batch``.
            vacate: a node the job's satellites move off, the size kept (counted as ``move``); the job and
                ``for_job``, the pending job the node is vacated for, are kept in :attr:`moves`.
            for_job: see ``vacate``.
            beside: the growth goes beside another job (a share, counted as ``share``); kept as the agent's
                :attr:`~.agents.AgentRecord.beside` until a directive with ``unshare`` orders it back.
            unshare: the job goes back to its own workers (``target`` leaves out those beside another job, which its
                agent takes back first); the share is forgotten.

        Returns:
            The directive, for the actuator.
        """
        now = self.clock()
        size = agent.report.size if agent.report else 0
        kind = "grow" if target > size else "batch" if target == size and batch is not None else "shrink"
        kind = "move" if vacate else "share" if beside is not None else kind
        if beside is not None or unshare:
            agent.beside = beside
            if beside is not None:
                self.state.shares[agent.job_id] = beside
            else:
                self.state.shares.pop(agent.job_id, None)
            self.changed()
        if vacate:
            self.moves[agent.job_id] = now
            if for_job:
                self.moves[for_job] = now
        agent.in_flight = InFlight(target, now, source, reason, batch=batch, batch_only=kind == "batch")
        self.metrics.decisions.inc(labels={"kind": kind, "source": source})
        with_batch = ("" if batch is None else f", global batch {batch}") + (f", off {vacate}" if vacate else "")
        with_batch += f", beside job {beside.host} on {dict(beside.nodes)}" if beside is not None else ""
        logger.info(
            "[daemon/actuator] job %s: %s %d -> %d workers%s (%s)", agent.job_id, kind, size, target, with_batch, reason
        )
        return Directive(
            job_id=agent.job_id,
            endpoint=agent.registration.endpoint,
            uid=agent.uid,
            target=target,
            reason=reason,
            ordered_at=now,
            token=token,
            batch=batch,
            vacate=vacate,
            place_beside=beside,
        )

    def apply(self, outcome: Outcome) -> None:
        """Apply what became of a directive: acknowledged, or refused/unanswered (then the job is left alone)."""
        directive = outcome.directive
        agent = self.agents.get(directive.job_id)
        flight = agent.in_flight if agent is not None else None
        ours = flight is not None and flight.ordered_at == directive.ordered_at and flight.target == directive.target
        if outcome.ok and agent is not None and flight is not None and ours:
            flight.acknowledged = True
            flight.acknowledged_at = self.clock()
            report = agent.report
            if report is not None and not flight.batch_only and report.size == flight.target == report.target:
                agent.in_flight = None
            self.changed()
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

    def expire_resizes(self, now: float) -> None:
        """Give up on acknowledged resizes older than ``resize_timeout_s``; their jobs are left alone for a backoff.
        Moves older than that are forgotten (:attr:`moves`)."""
        timeout = self.config.resize_timeout_s
        for job_id in [job_id for job_id, at in self.moves.items() if now - at >= timeout]:
            del self.moves[job_id]
        for agent in self.agents.values():
            flight = agent.in_flight
            if flight is None or not flight.acknowledged or now - flight.ordered_at <= self.config.resize_timeout_s:
                continue
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
            self.changed()

    def in_flight_count(self) -> int:
        """Resizes ordered and not yet reached."""
        return sum(1 for agent in self.agents.values() if agent.in_flight is not None)


class SatelliteWatch:
    """Logs each orphaned satellite (after a grace period) and each unclaimed satellite once.

    Args:
        orphan_grace_s: a satellite whose parent is gone is reported after this long.
    """

    def __init__(self, orphan_grace_s: float) -> None:
        self.orphan_grace_s = orphan_grace_s
        self._orphans_seen: dict[str, float] = {}
        self._orphans_reported: set[str] = set()
        self._unclaimed_reported: set[str] = set()

    def update(self, obs: Observation, now: float) -> None:
        """Log what is new in ``obs``'s orphans and unclaimed satellites."""
        current = {s.job_id: s for s in obs.orphans}
        for job_id in list(self._orphans_seen):
            if job_id not in current:
                del self._orphans_seen[job_id]
                self._orphans_reported.discard(job_id)
        for job_id, sat in current.items():
            first = self._orphans_seen.setdefault(job_id, now)
            if now - first >= self.orphan_grace_s and job_id not in self._orphans_reported:
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
