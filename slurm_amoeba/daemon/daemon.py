"""``amoebad``: the control daemon's one thread, which runs rounds and answers requests (DESIGN.md, control flow).

One thread runs everything that touches the daemon's state: every ``interval_s`` a **round** (:mod:`.rounds`:
observe Slurm -> snapshot -> policy -> directives), and in between the **requests** of agents and ``amoebactl``
(:mod:`.requests`, with the who-may-do-what table every request goes through). Both read and write the same
**ledger** (:mod:`.ledger`: registered jobs, resizes in flight, pins, the drain switch, the state file). Directives go
out on the actuator's threads and come back as outcomes the loop applies, so a dead agent never stalls the loop.

On :meth:`Daemon.request_reload` (amoebad's SIGHUP handler) the loop reads the configuration's file again: a valid
file whose changes a running daemon can take (:data:`~slurm_amoeba.daemon.config.RESTART_ONLY` names those it
cannot) replaces the configuration and the policy from the next round; any other keeps the running one, and says so
in the log and in ``amoeba_config_reloads_total{outcome}``. ``amoeba_config_loaded{source,digest}`` and ``amoebactl
status`` name the file in force.

With a lease (a daemon of a standby pair, :mod:`.standby`) the loop renews it before every step and leaves as soon as
it is lost (:attr:`Daemon.deposed`); directives then carry the lease generation and none leaves after the loss.

A job whose resize is in flight is never ordered again until it arrives (or is abandoned after
``resize_timeout_s``); after a restart the daemon waits for each agent to re-register and report before deciding
anything about its job, and the state file keeps the resizes the previous daemon had ordered.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import pwd
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from slurm_amoeba.daemon.actuator import Actuator, make_queue_orderer
from slurm_amoeba.daemon.admission import make_admitter
from slurm_amoeba.daemon.agents import AgentRecord
from slurm_amoeba.daemon.config import ConfigError, DaemonConfig, load_config
from slurm_amoeba.daemon.executor import LiveExecutor, live_refusal
from slurm_amoeba.daemon.lease import Lease, Role
from slurm_amoeba.daemon.ledger import Ledger
from slurm_amoeba.daemon.metrics import DaemonMetrics, MetricsServer
from slurm_amoeba.daemon.observer import ClusterSource, Observation
from slurm_amoeba.daemon.requests import RequestHandler
from slurm_amoeba.daemon.rounds import REFRESH_MIN_S, RoundLoop, RoundSummary
from slurm_amoeba.daemon.standby import FencedActuator, show_role
from slurm_amoeba.daemon.state import DaemonState
from slurm_amoeba.policy import DrainPolicy, JobInfo, Policy, make_policy
from slurm_amoeba.policy.admission import AdmissionGate, slurm_rule
from slurm_amoeba.policy.moves import WholeNodeMoves
from slurm_amoeba.policy.queue_order import QueueOrderLayer
from slurm_amoeba.transport.channel import ChannelServer, Request, RequestServer
from slurm_amoeba.transport.front import FrontChannel
from slurm_amoeba.transport.munge import Credential

logger = logging.getLogger(__name__)

#: Requests handled before the loop looks at outcomes and the round clock again.
BATCH = 256


@dataclasses.dataclass(frozen=True)
class DaemonUser:
    """The user the daemon runs as (its uid may act on every job; its name goes into Slurm's rights checks).

    Attributes:
        uid: its uid.
        name: its user name (the uid as text where the password database has none).
    """

    uid: int
    name: str

    @classmethod
    def current(cls) -> DaemonUser:
        """The user this process runs as (read once, at the daemon's entry)."""
        uid = os.getuid()
        try:
            return cls(uid, pwd.getpwuid(uid).pw_name)
        except KeyError:
            return cls(uid, str(uid))


def compose_policy(
    config: DaemonConfig, moves: Collection[str] = frozenset(), own_priorities: Mapping[str, int] | None = None
) -> DrainPolicy:
    """The daemon's policy: the configured one with the layers the configuration turns on (whole-node moves,
    queue order, admission, from the inside out), the drain outermost (built once, at the daemon's entry; the
    drain's switch is set each round from the ledger).

    Args:
        config: the validated configuration.
        moves: the jobs a whole-node move was ordered of or for lately (the ledger's record), read by the
            whole-node moves layer at each call.
        own_priorities: job id -> the priority Slurm had given a job before the daemon set one (the executor's
            record, read by the queue-order layer at each call).

    Returns:
        The composed policy, its drain off.

    Raises:
        ConfigError: the policy (with its layers) can answer with an action the daemon cannot apply live
            (:func:`~slurm_amoeba.daemon.executor.live_refusal`'s sentence).
    """
    policy: Policy = make_policy(config.policy, **config.effective_knobs())
    if config.whole_node_starts:
        policy = WholeNodeMoves(policy, moves)
    queue = config.queue_order
    if queue.enabled:
        partitions = frozenset(queue.partitions or config.regular_partitions)
        owned = {} if own_priorities is None else own_priorities
        policy = QueueOrderLayer(policy, tuple(queue.thresholds_gpu_s), partitions, frozenset(queue.users), owned)
    admission = config.admission
    if admission.enabled:
        rule = slurm_rule(admission.max_hold_s)
        partitions = frozenset(admission.partitions or config.regular_partitions)
        policy = AdmissionGate(policy, rule, partitions, frozenset(admission.users), config.limits.max_workers)
    refusal = live_refusal(config.policy, policy.emits, sharing=config.sharing.enabled)
    if refusal:
        raise ConfigError(f"{config.source}: policy.name: {refusal}")
    return DrainPolicy(policy, draining=False)


class Daemon:
    """The control daemon (see the module docstring): its lifecycle, its loop, and what ``status`` shows.

    Args:
        config: the validated configuration.
        slurm: where jobs and nodes are read from (and, for queue ordering and admission, jobs held, released and
            reprioritised).
        clock: the wall clock (Unix seconds); tests pass their own.
        lease: the lease this daemon holds as the active one of a standby pair; None: it runs alone.
        user: the user the daemon runs as (default: this process's).

    Raises:
        ConfigError: the policy emits an action the daemon cannot apply live (:func:`compose_policy`), or queue
            ordering or admission is enabled but the daemon's user may not do it.

    Attributes:
        ledger: the registered jobs and the persistent state.
        round_loop: the observe -> snapshot -> decide -> act rounds.
        requests: the API.
        server: the API socket (after :meth:`start`).
        metrics_server: the Prometheus endpoint (after :meth:`start`, when configured).
    """

    def __init__(
        self,
        config: DaemonConfig,
        slurm: ClusterSource,
        *,
        clock: Callable[[], float] = time.time,
        lease: Lease | None = None,
        user: DaemonUser | None = None,
    ) -> None:
        self.config = config
        self.lease = lease
        self.slurm = slurm
        self.clock = clock
        self.metrics = DaemonMetrics()
        user = user or DaemonUser.current()
        self.uid = user.uid
        self.metrics_server: MetricsServer | None = None
        agents = config.agents
        self.actuator = actuator = (
            Actuator(agents.parallel, agents.timeout_s, agents.retries)
            if lease is None
            else FencedActuator(agents.parallel, agents.timeout_s, agents.retries, lease)
        )
        self.ledger = ledger = Ledger(config, self.metrics, clock)
        orderer = make_queue_orderer(
            config.queue_order,
            config.queue_order.partitions or config.regular_partitions,
            slurm,
            self.metrics,
            uid=user.uid,
            user=user.name,
        )
        admitter = make_admitter(
            config.admission,
            config.admission.partitions or config.regular_partitions,
            slurm,
            self.metrics,
            uid=user.uid,
            user=user.name,
        )
        self.policy = compose_policy(config, ledger.moves, orderer.touched if orderer is not None else None)
        self.executor = LiveExecutor(
            ledger,
            actuator,
            self.metrics,
            admitter=admitter,
            orderer=orderer,
            revert_on_stop=config.queue_order.revert_on_stop,
            sharing=config.sharing,
        )
        self.round_loop = RoundLoop(config, slurm, self.policy, ledger, self.metrics, self.executor, clock)

        def order(agent: AgentRecord, target: int, reason: str, source: str, token: Any) -> None:
            actuator.send(ledger.order(agent, target, reason, source, token))

        # No part holds a reference back to the daemon (see RequestHandler): order() closes over the parts only.
        self.requests = RequestHandler(
            config, ledger, self.round_loop, self.metrics, daemon_uid=self.uid, clock=clock, order=order
        )
        self.requests.lease = lease
        self._reload_wanted = threading.Event()
        self._show_config()
        show_role(self.metrics, lease)

    # ------------------------------------------------------------------ what the parts hold, for status and tests

    @property
    def server(self) -> RequestServer | None:
        """The API socket (None before :meth:`start`); tests may put their own in place."""
        return self.requests.server

    @server.setter
    def server(self, server: RequestServer | None) -> None:
        self.requests.server = server

    @property
    def deposed(self) -> bool:
        """Whether this daemon lost its lease: it must not act again (the process ends; it starts as a standby)."""
        return self.lease is not None and self.lease.role is Role.DEPOSED

    @property
    def agents(self) -> dict[str, AgentRecord]:
        """Job id -> its registered agent."""
        return self.ledger.agents

    @property
    def state(self) -> DaemonState:
        """Pins, the drain switch and acknowledged resizes."""
        return self.ledger.state

    @property
    def state_path(self) -> Path | None:
        """The state file, or None."""
        return self.ledger.state_path

    @property
    def last_observation(self) -> Observation | None:
        """The last round's snapshot and what came with it."""
        return self.round_loop.last_observation

    @property
    def last_round(self) -> RoundSummary | None:
        """The last round's summary."""
        return self.round_loop.last_round

    @property
    def rounds(self) -> collections.deque[RoundSummary]:
        """The recent rounds' summaries."""
        return self.round_loop.rounds

    # ------------------------------------------------------------------ configuration

    def request_reload(self) -> None:
        """Ask the loop to read the configuration's file again before its next step (safe from a signal handler)."""
        self._reload_wanted.set()

    def reload(self) -> bool:
        """Read the configuration's file (``config.source``) again and apply it from the next round.

        A file that cannot be read or is invalid, or that changes a setting only a restart applies, leaves the
        running configuration in place (logged as an error, counted in ``amoeba_config_reloads_total``).

        Returns:
            Whether the new configuration is now in force.
        """
        running = self.config
        kept = f"amoebad keeps running with {running.source} (sha256 {running.digest or '-'})"
        try:
            new = load_config(running.source)
            orderer = self.executor.orderer
            policy = compose_policy(
                new, self.ledger.moves, orderer.touched if orderer is not None else None
            )  # a policy the daemon cannot apply live is refused
        except ConfigError as exc:
            self.metrics.config_reloads.inc(labels={"outcome": "invalid"})
            logger.error("[daemon/config] reload refused: %s; %s", exc, kept)
            return False
        restart = running.restart_needed_for(new)
        if restart:
            self.metrics.config_reloads.inc(labels={"outcome": "needs_restart"})
            logger.error(
                "[daemon/config] reload refused: %s changes %s, which only a restart applies "
                "(systemctl restart amoebad); %s",
                new.source,
                ", ".join(restart),
                kept,
            )
            return False
        self.config = self.round_loop.config = self.ledger.config = self.requests.config = new
        self.policy = self.round_loop.policy = self.requests.policy = policy
        if new.log_level != running.log_level:
            logging.getLogger().setLevel(new.log_level.upper())
        self.metrics.config_reloads.inc(labels={"outcome": "applied"})
        self._show_config()
        logger.info(
            "[daemon/config] reloaded %s (sha256 %s): policy %s every %g s",
            new.source,
            new.digest or "-",
            policy.name,
            new.interval_s,
        )
        return True

    def _show_config(self) -> None:
        self.metrics.config_loaded.replace([({"source": self.config.source, "digest": self.config.digest}, 1)])
        self.metrics.config_loaded_at.set(self.clock())

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Bind the API socket and start the metrics endpoint.

        Raises:
            zmq.ZMQError: the API address is taken or cannot be bound.
            FrontError: with ``front_process``, the front process did not start or bind the API address.
            OSError: the metrics port is taken.
        """
        listen = self.config.listen
        self.server = FrontChannel(listen) if self.config.front_process else ChannelServer(listen)
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
            self.requests.metrics_port = self.metrics_server.port

    def close(self) -> None:
        """Stop the actuators (queue ordering undoes its changes), the metrics endpoint and the socket; save state."""
        self.actuator.close()
        self.round_loop.close()
        self.apply_outcomes()
        self.ledger.changed()
        self.ledger.save()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.server is not None:
            self.server.close()
        logger.info("[daemon] stopped")

    def abandon(self) -> None:
        """Stop after losing the lease: close the socket and the metrics endpoint, send nothing more, and neither save
        the state file nor undo queue ordering or admission (the new active daemon owns them now)."""
        self.actuator.close()  # what is still queued meets the fence and is not sent
        if self.metrics_server is not None:
            self.metrics_server.stop()
        if self.server is not None:
            self.server.close()
        logger.error("[daemon] stopped without saving state: another daemon holds the lease")

    def run(self, stop: threading.Event) -> None:
        """Run rounds and answer requests until ``stop`` is set (or, with a lease, until the lease is lost).

        Args:
            stop: set it (e.g. from a signal handler) to leave the loop.
        """
        if self.server is None:
            self.start()
        next_round = time.monotonic()
        last_begun = -REFRESH_MIN_S
        while not stop.is_set():
            if self.lease is not None and not self.lease.keep():
                show_role(self.metrics, self.lease)
                return
            if self._reload_wanted.is_set():
                self._reload_wanted.clear()
                self.reload()
            now = time.monotonic()
            early = self.round_loop.refresh_wanted and now - last_begun >= REFRESH_MIN_S
            try:
                if (now >= next_round or early) and self.round_loop.begin_round():
                    last_begun = now
                    next_round = max(next_round + self.config.interval_s, now) if now >= next_round else next_round
                self.round_loop.finish_round()
                self.apply_outcomes()
                # While Slurm is being read the round waits on it, not on the clock: no need to wake up early.
                wait = 0.05 if self.round_loop.observing else min(0.05, max(0.001, next_round - time.monotonic()))
                self.serve(wait)
            except Exception:  # the loop outlives anything (a state file that cannot be written, a socket error)
                self.metrics.loop_errors.inc()
                logger.exception("[daemon] the loop hit an error; it goes on")
                time.sleep(0.05)

    def serve(self, timeout_s: float) -> int:
        """Answer the requests that arrive within ``timeout_s`` (at most :data:`BATCH` of them).

        Returns:
            How many were handled.
        """
        server = self.server
        if server is None:
            raise RuntimeError("Daemon.serve() before Daemon.start(): the API socket is not bound yet")
        handled = 0
        refused = server.refusals
        try:
            req = server.receive(timeout_s)
            while req is not None:
                self.handle(req)
                handled += 1
                if handled >= BATCH:
                    break
                req = server.receive(0.001)
        finally:
            self.metrics.unreadable.inc(max(0, server.refusals - refused))
        self.ledger.save()
        return handled

    def handle(self, req: Request) -> None:
        """Answer one authenticated request (see :meth:`RequestHandler.handle`); never raises."""
        self.requests.handle(req)

    def run_round(self) -> RoundSummary:
        """Observe, decide and order once (see :meth:`RoundLoop.run_round`); never raises."""
        return self.round_loop.run_round()

    def apply_outcomes(self) -> None:
        """Apply the outcomes of directives that came back since the last call (the loop calls it)."""
        for outcome in self.actuator.completed():
            self.ledger.apply(outcome)
            token = outcome.directive.token
            if isinstance(token, Request):
                self.requests.answer_resize(token, outcome)
        self.ledger.save()

    def save_state(self) -> None:
        """Write the state file if anything in it changed since the last write."""
        self.ledger.save()

    def is_operator(self, sender: Credential) -> bool:
        """Whether ``sender`` may act on every job: a configured operator (or group), or the daemon's own uid."""
        return self.requests.is_operator(sender)

    def status(self) -> dict[str, Any]:
        """What ``amoebactl status`` shows (JSON-ready; see :meth:`RequestHandler.status`)."""
        return self.requests.status()

    def managed_job(self, job_id: str) -> JobInfo | None:
        """The managed job as the last snapshot showed it, or None."""
        obs = self.last_observation
        return obs.managed.get(job_id) if obs is not None else None
