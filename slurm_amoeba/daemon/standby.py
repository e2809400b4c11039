"""The standby half of a pair of ``amoebad`` and the fence on the active half's directives (docs/admin.md, "A standby
daemon on a second host").

DESIGN.md, control flow: with ``ha.lease_dir`` set, ``amoebad`` starts as a :class:`Standby`. It reads the lease
(:mod:`.lease`) every ``ha.renew_s`` and answers every request, agents' and ``amoebactl``'s alike, with a refusal that
names the active daemon ("this amoebad is the standby; the active one is X"), so that agents and ``amoebactl``
follow it. When the active daemon stops renewing the lease, the standby takes it over and the ordinary
:class:`~slurm_amoeba.daemon.daemon.Daemon` starts in the same process: it loads ``state_file`` as a restarted daemon
does (resizes the old one had ordered stay in flight; a job is decided again only once its agent has registered and
reported), and from then on the daemon's loop calls :meth:`Lease.keep <slurm_amoeba.daemon.lease.Lease.keep>`
before each step and leaves as soon as the lease is lost.

:class:`FencedActuator` sends the active daemon's directives: each carries the lease generation as its ``fence``,
and none leaves once the daemon may no longer act (checked before every attempt, on this host's monotonic clock).
An agent refuses a directive whose fence is older than one it has seen; it sees the new generation when it registers
with the new active daemon, which happens before that daemon directs its job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm_amoeba.core.messages import STANDBY, Message
from slurm_amoeba.daemon.actuator import Actuator, Directive, Outcome
from slurm_amoeba.daemon.config import DaemonConfig
from slurm_amoeba.daemon.lease import Lease, LeaseStore, Role
from slurm_amoeba.daemon.metrics import DaemonMetrics, MetricsServer
from slurm_amoeba.transport.channel import ChannelError, ChannelServer, Request, request

logger = logging.getLogger(__name__)

#: The refusal a directive gets that this daemon would have sent after it lost the lease.
NOT_ACTING = "this amoebad no longer holds the lease (another daemon took over); the directive was not sent"


def make_lease(config: DaemonConfig, clock: Callable[[], float] = time.monotonic) -> Lease:
    """The lease of a daemon configured with ``ha`` (its directory checked).

    Raises:
        LeaseError: the lease directory cannot be created or written.
        ValueError: ``ha`` is not configured.
    """
    ha = config.ha
    if ha.lease_dir is None:
        raise ValueError("make_lease() needs ha.lease_dir in the configuration")
    store = LeaseStore(Path(ha.lease_dir))
    store.prepare()
    return Lease(store, ha.advertise, renew_s=ha.renew_s, expiry_s=ha.expiry_s, margin_s=ha.margin_s, clock=clock)


def show_role(metrics: DaemonMetrics, lease: Lease | None) -> None:
    """Set ``amoeba_ha_role`` and ``amoeba_lease_generation`` (``single`` and 0 without a pair)."""
    role = "single" if lease is None else "active" if lease.role is Role.ACTIVE else STANDBY
    metrics.ha_role.replace([({"role": role}, 1)])
    metrics.lease_generation.set(0 if lease is None else lease.generation)


def standby_answer(req: Request, lease: Lease) -> Message:
    """The standby's answer to any request: refused, naming the active daemon and the lease generation."""
    seen = lease.describe()
    active = str(seen["active"])
    named = active or "not known yet (no daemon holds the lease)"
    return req.message.reply(
        ok=False,
        error=f"this amoebad is the standby; the active one is {named} (lease generation {seen['generation']})",
        data={"role": STANDBY, "active": active, "generation": seen["generation"], "lease_dir": seen["lease_dir"]},
    )


class Standby:
    """Waits for the lease while telling everyone where the active daemon is (see the module docstring).

    Args:
        config: the daemon's configuration (``listen``, metrics, ``ha``).
        lease: this daemon's lease.
    """

    def __init__(self, config: DaemonConfig, lease: Lease) -> None:
        self.config = config
        self.lease = lease
        self.metrics = DaemonMetrics()
        self.server: ChannelServer | None = None
        self.metrics_server: MetricsServer | None = None

    def start(self) -> None:
        """Bind the API socket and the metrics endpoint, as the active daemon would.

        Raises:
            zmq.ZMQError: the API address is taken or cannot be bound.
            OSError: the metrics port is taken.
        """
        self.server = ChannelServer(self.config.listen)
        if self.config.metrics_port:
            self.metrics_server = MetricsServer(
                self.config.metrics_address, self.config.metrics_port, self.metrics.registry.render
            )
            self.metrics_server.start()
        logger.info(
            "[daemon/standby] standby on %s; watching the lease in %s every %g s",
            self.server.endpoint,
            self.lease.store.directory,
            self.lease.renew_s,
        )

    def close(self) -> None:
        """Release the socket and the metrics port (for the active daemon that starts next in this process)."""
        if self.metrics_server is not None:
            self.metrics_server.stop()
            self.metrics_server = None
        if self.server is not None:
            self.server.close()
            self.server = None

    def run(self, stop: threading.Event) -> bool:
        """Answer requests and watch the lease until this daemon may act or ``stop`` is set.

        Returns:
            Whether this daemon now holds the lease and may act (False: stopped first).
        """
        if self.server is None:
            self.start()
        next_watch = time.monotonic()
        holder = None
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_watch:
                next_watch = now + self.lease.renew_s
                if self.lease.watch() and self.lease.keep():
                    show_role(self.metrics, self.lease)
                    return True
                if self.lease.role is Role.DEPOSED:
                    return False
                if self.lease.holder != holder:
                    holder = self.lease.holder
                    logger.info("[daemon/standby] the active daemon is %s", self.lease.describe()["active"] or "none")
                show_role(self.metrics, self.lease)
            self.serve(min(0.2, max(0.001, next_watch - time.monotonic())))
        return False

    def serve(self, timeout_s: float) -> int:
        """Answer the requests that arrive within ``timeout_s`` with :func:`standby_answer`.

        Returns:
            How many were answered.
        """
        if self.server is None:
            raise RuntimeError("Standby.serve() before Standby.start(): the API socket is not bound yet")
        handled = 0
        req = self.server.receive(timeout_s)
        while req is not None and handled < 256:
            self.server.answer(req, standby_answer(req, self.lease))
            handled += 1
            req = self.server.receive(0.001)
        return handled


class FencedActuator(Actuator):
    """The actuator of a daemon of a pair: directives carry the lease generation and leave only while it may act.

    Args:
        parallel: directives in flight at once.
        timeout_s: deadline of one attempt.
        retries: further attempts after a timeout (each checked against the lease again).
        lease: the lease this daemon holds.
    """

    def __init__(self, parallel: int, timeout_s: float, retries: int, lease: Lease) -> None:
        super().__init__(parallel, timeout_s, 0)
        self.lease = lease
        self._attempts = retries + 1
        self._attempt_s = timeout_s
        self._outcomes: list[Outcome] = []
        self._lock = threading.Lock()

    def _deliver(self, directive: Directive) -> None:
        outcome = self.deliver(directive)
        with self._lock:
            self._outcomes.append(outcome)

    def completed(self) -> list[Outcome]:
        """Outcomes that arrived since the last call."""
        with self._lock:
            outcomes, self._outcomes = self._outcomes, []
        return outcomes

    def message(self, directive: Directive) -> Message:
        """The ``resize`` directive as sent, with the lease generation as its ``fence``."""
        order: dict[str, Any] = {
            "job_id": directive.job_id,
            "target": directive.target,
            "reason": directive.reason,
            "fence": self.lease.generation,
        }
        if directive.batch is not None:
            order["batch"] = directive.batch
        if directive.vacate:
            order["vacate"] = directive.vacate
        return Message("resize", order)

    def deliver(self, directive: Directive) -> Outcome:
        """Send ``directive`` (on the caller's thread); every attempt only while this daemon may act."""
        message = self.message(directive)
        error = ""
        for _ in range(self._attempts):
            if not self.lease.acting():
                logger.warning("[daemon/actuator] resize of job %s not sent: %s", directive.job_id, NOT_ACTING)
                return Outcome(directive, False, NOT_ACTING, {}, unreachable=True)
            try:
                reply = request(
                    directive.endpoint, message, timeout_s=self._attempt_s, retries=0, expect_uid=directive.uid
                )
            except ChannelError as exc:
                error = str(exc)
                continue
            except Exception as exc:  # a bug or an exotic transport failure must still come back as an outcome
                logger.exception("[daemon/actuator] sending resize of job %s failed unexpectedly", directive.job_id)
                return Outcome(directive, False, f"internal error: {exc}", {}, unreachable=True)
            body = reply.body
            return Outcome(directive, bool(body.get("ok")), str(body.get("error", "")), dict(body.get("data") or {}))
        return Outcome(directive, False, error, {}, unreachable=True)
