"""The daemon's actuator: sends resize directives to job agents, off the daemon's main loop.

Last step of DESIGN.md's control flow. Each directive is an authenticated ``resize`` request to the job's agent
(:func:`slurm_amoeba.transport.channel.request`: a deadline per attempt, retries, and the reply must be signed by the
job owner's uid). Directives run on a small thread pool so that a slow or dead agent never stalls the loop that
answers everyone else; their outcomes come back through :meth:`Actuator.completed`, which the loop drains (ZeroMQ
sockets are used by one thread each: the pool's sockets never meet the loop's).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import queue
from typing import Any

from slurm_amoeba.core.messages import Message
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
    """

    job_id: str
    endpoint: str
    uid: int
    target: int
    reason: str
    ordered_at: float
    token: Any = None
    batch: int | None = None


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
