"""The agent's link to the control daemon: registration, periodic reports, and who may direct the job.

DESIGN.md, control flow: the agent registers its job with ``amoebad`` (its directive endpoint, worker range, GPUs
per worker, partitions), reports size, throughput and recent history every few seconds, and takes directives from
the job's owner and from the daemon's uid (as munge vouches for the sender), and from nobody else. A daemon that
restarted and forgot the job answers a report with "unknown job": the agent registers again.

The daemon's uid is pinned from the site's configuration (:func:`~slurm_amoeba.agent.config.configured_daemon_uid`),
never taken from whoever answers on the daemon's port: every registration and report expects a reply from that uid,
and only that uid's directives are obeyed. A site that configured none gets a link that trusts only a daemon running
as the job's own uid (a user's private amoebad); any other answerer is logged once and the job runs without a daemon
(a configured link keeps trying: the real daemon may be back after a restart).

A site with a standby pair of daemons gives the agent both addresses, comma-separated (``AMOEBA_DAEMON_ENDPOINT=
tcp://ctl1:6820,tcp://ctl2:6820``). The link talks to one at a time: one that does not answer makes it try the next,
and a standby's refusal ("this amoebad is the standby; the active one is X", signed by the daemon's uid) makes it
send the same message to X at once; the new active daemon does not know the job and answers its report with
"unknown job", so the agent registers there. Directives of a daemon of a pair carry its lease generation
(``fence``); the link remembers the highest it has seen (from directives, and from the registration's reply) and
refuses a directive of an older generation: a deposed daemon's late directive is never applied.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from slurm_amoeba.core.messages import RETRY_SOON, Message, standby_redirect
from slurm_amoeba.transport.channel import ChannelError, request

log = logging.getLogger(__name__)

ROOT_UID = 0
#: A registration the daemon cannot vet yet (its Slurm thread reads the job's record at its next round, within a
#: round interval) is sent again this many times, this far apart, before the agent goes on to its loop.
REGISTER_RETRIES = 8
REGISTER_RETRY_S = 1.0
#: Deadline of one attempt to register: an address that does not answer costs two of them (one retry) before the
#: agent turns to the next.
REGISTER_TIMEOUT_S = 3.0


class DaemonLink:
    """One job's link to ``amoebad`` (see the module docstring).

    Args:
        endpoint: the daemon's address (``tcp://host:port``), or the addresses of a standby pair, comma-separated;
            None to run without a daemon.
        owner_uid: the job owner's uid (the agent's own).
        prefix: the log prefix (``[job/agent]``).
        daemon_uid: the uid the site says the daemon runs as; None: not configured (only ``owner_uid`` is trusted).
    """

    def __init__(self, endpoint: str | None, owner_uid: int, prefix: str, daemon_uid: int | None = None) -> None:
        self.endpoints = [part.strip() for part in (endpoint or "").split(",") if part.strip()]
        #: The daemon the link talks to now (the active one of a pair, as far as it knows).
        self.endpoint: str | None = self.endpoints[0] if self.endpoints else None
        #: The highest lease generation seen (0: none; a daemon that runs alone sends none).
        self.fence = 0
        self.owner_uid = owner_uid
        self.configured = daemon_uid is not None
        #: The only uid whose replies and directives count as the daemon's.
        self.daemon_uid: int = owner_uid if daemon_uid is None else daemon_uid
        self.registered = False
        self._prefix = prefix
        self._registration: dict[str, Any] | None = None
        self._warned: set[str] = set()
        self._munge_down = False

    def may_direct(self, uid: int) -> bool:
        """Whether the sender ``uid`` may resize the job: its owner, or the daemon's pinned uid."""
        return uid == self.owner_uid or (self.configured and uid == self.daemon_uid)

    def may_read(self, uid: int) -> bool:
        """Whether ``uid`` may read the job's status: its owner, the daemon's pinned uid, or root."""
        return uid == ROOT_UID or self.may_direct(uid)

    def admit(self, body: Mapping[str, Any]) -> str:
        """Check a directive's ``fence`` against the highest lease generation seen, and remember it.

        Returns:
            "" when the directive may be applied, else the refusal (a deposed daemon's directive).
        """
        fence = body.get("fence")
        if fence is None:
            return ""  # the owner's, or a daemon that runs alone
        if int(fence) < self.fence:
            return (
                f"directive of lease generation {fence} refused: this agent has seen generation {self.fence}, a newer "
                f"active daemon"
            )
        self.fence = int(fence)
        return ""

    def _next_endpoint(self, named: str | None = None) -> None:
        """Talk to ``named`` (the active daemon a standby named), else the next configured address."""
        if named:
            self.endpoint = named
        elif len(self.endpoints) > 1 and self.endpoint in self.endpoints:
            self.endpoint = self.endpoints[(self.endpoints.index(self.endpoint) + 1) % len(self.endpoints)]
        elif self.endpoints:
            self.endpoint = self.endpoints[0]
        else:
            return
        self.registered = False
        log.info("%s talking to the daemon at %s", self._prefix, self.endpoint)

    def _warn_once(self, key: str, text: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(text, *args)

    def _request(self, message: Message, timeout_s: float, retries: int, level: int) -> Message | None:
        """Send to the active daemon, expecting its pinned uid; None (logged) when nothing trusted answered.

        A standby's answer sends the message once more, to the active daemon it names; no answer at all moves the
        link to the next configured address for the next message.
        """
        reply = self._request_one(message, timeout_s, retries, level)
        if reply is None:
            if self.endpoint is not None and len(self.endpoints) > 1:
                self._next_endpoint()
            return None
        active = standby_redirect(reply)
        if active is None:
            return reply
        log.info("%s %s is the standby daemon; the active one is %s", self._prefix, self.endpoint, active or "unknown")
        if not active or active == self.endpoint:
            self._next_endpoint()
            return None
        self._next_endpoint(active)
        return self._request_one(message, timeout_s, retries, level)

    def _request_one(self, message: Message, timeout_s: float, retries: int, level: int) -> Message | None:
        """One request to :attr:`endpoint`; None (logged) when nothing trusted answered."""
        assert self.endpoint is not None
        try:
            reply = request(self.endpoint, message, timeout_s=timeout_s, retries=retries, expect_uid=self.daemon_uid)
        except ChannelError as exc:  # no answer, munged down (signing failed), or an answer from another uid
            if exc.unsigned:  # munged restarting: the job goes on, the next report tries again
                if not self._munge_down:
                    self._munge_down = True
                    log.warning(
                        "%s munged does not sign the agent's messages (%s); the job goes on and the agent retries "
                        "with every report",
                        self._prefix,
                        exc,
                    )
            elif "expected" in str(exc):
                answerer = self.endpoint
                if not self.configured:
                    self.endpoint = None  # nothing to pin: run without a daemon rather than report to a stranger
                self._warn_once(
                    "identity",
                    "%s %s is not trusted: %s (the daemon's uid is %s); its answers and directives are ignored",
                    self._prefix,
                    answerer,
                    exc,
                    f"configured as {self.daemon_uid}"
                    if self.configured
                    else "not configured: set daemon_uid in the SPANK plugstack line or the site file",
                )
            else:
                log.log(level, "%s %s to the daemon: %s", self._prefix, message.kind, exc)
            return None
        if self._munge_down:
            self._munge_down = False
            log.warning("%s munged signs again: the %s reached the daemon", self._prefix, message.kind)
        return reply

    def register(self, registration: Mapping[str, Any]) -> None:
        """Register the job (a ``register`` message's body); a daemon that does not answer is logged, not fatal."""
        self._registration = dict(registration)
        if not self.endpoint:
            return
        reply = self._request(
            Message("register", self._registration), timeout_s=REGISTER_TIMEOUT_S, retries=1, level=logging.WARNING
        )
        for _ in range(REGISTER_RETRIES):  # the daemon has not read Slurm's record of the job yet: ask again soon
            if reply is None or reply.body["ok"] or RETRY_SOON not in str(reply.body["error"]):
                break
            time.sleep(REGISTER_RETRY_S)
            again = Message("register", self._registration)
            reply = self._request(again, timeout_s=REGISTER_TIMEOUT_S, retries=0, level=logging.DEBUG)
        if reply is None:
            return
        if reply.body["ok"]:
            self.registered = True
            fence = reply.body["data"].get("fence")
            if isinstance(fence, int) and not isinstance(fence, bool):
                self.fence = max(self.fence, fence)
            log.info("%s registered with the daemon at %s (uid %d)", self._prefix, self.endpoint, self.daemon_uid)
        else:
            log.warning("%s the daemon refused the registration: %s", self._prefix, reply.body["error"])

    def report(self, body: Mapping[str, Any]) -> None:
        """Send a ``report``; register again if the daemon forgot the job. An undelivered report is dropped."""
        if not self.endpoint:
            return
        reply = self._request(Message("report", dict(body)), timeout_s=2, retries=0, level=logging.DEBUG)
        if reply is None:
            return
        if not reply.body["ok"] and "unknown job" in str(reply.body["error"]) and self._registration is not None:
            self.register(self._registration)  # the daemon restarted and forgot us
