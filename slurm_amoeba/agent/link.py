"""The agent's link to the control daemon: registration, periodic reports, and who may direct the job.

DESIGN.md, control flow: the agent registers its job with ``amoebad`` (its directive endpoint, worker range, GPUs
per worker, partitions), reports size, throughput and recent history every few seconds, and takes directives from
the job's owner and from the daemon's uid (as munge vouches for the sender), and from nobody else. A daemon that
restarted and forgot the job answers a report with "unknown job": the agent registers again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from slurm_amoeba.core.messages import Message
from slurm_amoeba.transport.channel import ChannelError, request, request_from

log = logging.getLogger(__name__)


class DaemonLink:
    """One job's link to ``amoebad`` (see the module docstring).

    Args:
        endpoint: the daemon's address (``tcp://host:port``), or None to run without a daemon.
        owner_uid: the job owner's uid (the agent's own).
        prefix: the log prefix (``[job/agent]``).
    """

    def __init__(self, endpoint: str | None, owner_uid: int, prefix: str) -> None:
        self.endpoint = endpoint
        self.owner_uid = owner_uid
        self.daemon_uid: int | None = None
        self._prefix = prefix
        self._registration: dict[str, Any] | None = None

    def may_direct(self, uid: int) -> bool:
        """Whether the sender ``uid`` may resize the job: its owner, or the daemon it registered with."""
        return uid == self.owner_uid or (self.daemon_uid is not None and uid == self.daemon_uid)

    def register(self, registration: Mapping[str, Any]) -> None:
        """Register the job (a ``register`` message's body); a daemon that does not answer is logged, not fatal."""
        self._registration = dict(registration)
        if not self.endpoint:
            return
        try:
            daemon, reply = request_from(self.endpoint, Message("register", self._registration), timeout_s=3, retries=1)
        except ChannelError as exc:
            log.warning("%s the daemon did not take the registration (%s); running without it", self._prefix, exc)
            return
        if reply.body["ok"]:
            self.daemon_uid = daemon.uid
            log.info("%s registered with the daemon at %s", self._prefix, self.endpoint)
        else:
            log.warning("%s the daemon refused the registration: %s", self._prefix, reply.body["error"])

    def report(self, body: Mapping[str, Any]) -> None:
        """Send a ``report``; register again if the daemon forgot the job. An undelivered report is dropped."""
        if not self.endpoint:
            return
        try:
            reply = request(self.endpoint, Message("report", dict(body)), timeout_s=2, retries=0)
        except ChannelError as exc:
            log.debug("%s report not delivered: %s", self._prefix, exc)
            return
        if not reply.body["ok"] and "unknown job" in str(reply.body["error"]) and self._registration is not None:
            self.register(self._registration)  # the daemon restarted and forgot us
