"""Slurm's refusals of the daemon's updates of users' jobs, with a backoff per job (admission's holds, releases and
marks; queue ordering's priorities).

An update Slurm refuses (the daemon's user lacks a right, or Slurm will not change that job) would otherwise be
tried again every round, each time with a warning. :class:`Refusals` keeps, per job, when it may be tried again:
after its first refusal ``base_s``, twice as long after each further one, at most ``cap_s``; a success, or the job
leaving the queue, forgets it. A job's first refusal is one warning naming the job, what was refused, Slurm's
message and the fix (for a denied right, :data:`DENIED`: the AdminLevel the daemon's user needs); its later refusals
are debug-level. A job that finished or started meanwhile is not a refusal (the callers count it as ``vanished``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection

from slurm_amoeba.slurm import SlurmCommandError

logger = logging.getLogger(__name__)

#: What Slurm answers when the daemon's user lacks the right to change another user's job (scontrol; compared in
#: lower case). Measured on Slurm 22.05: ``Priority=`` by a user without AdminLevel -> ``Invalid user id for job N``;
#: ``AdminComment=`` by an Operator -> ``Access/permission denied for job N``.
DENIED = ("access/permission denied", "permission denied", "invalid user id")
#: The first wait after a refusal, and the longest (seconds).
BASE_S = 10.0
CAP_S = 600.0


@dataclasses.dataclass
class _Backoff:
    delay_s: float  # the current wait
    until: float  # no try before
    refusals: int  # how many so far
    last: float  # the round (its ``now``) of the last refusal: two refusals in one round count once


class Refusals:
    """Per-job backoff and one warning per job for refused updates (see the module docstring).

    Args:
        prefix: the log prefix (``[daemon/admission]``).
        fix_denied: the sentence that tells the admin how to grant the right Slurm asked for.
        base_s: the first wait after a refusal.
        cap_s: the longest wait.
    """

    def __init__(self, prefix: str, fix_denied: str, *, base_s: float = BASE_S, cap_s: float = CAP_S) -> None:
        if not 0 < base_s <= cap_s:
            raise ValueError(f"need 0 < base_s <= cap_s, got {base_s} and {cap_s}")
        self.prefix = prefix
        self.fix_denied = fix_denied
        self.base_s = base_s
        self.cap_s = cap_s
        self._jobs: dict[str, _Backoff] = {}

    def ready(self, job_id: str, now: float) -> bool:
        """Whether an update of ``job_id`` may be tried at ``now`` (never refused, or its wait is over)."""
        backoff = self._jobs.get(job_id)
        return backoff is None or now >= backoff.until

    def waiting(self, now: float) -> tuple[str, ...]:
        """The jobs whose wait is not over at ``now``, sorted."""
        return tuple(sorted(job_id for job_id, backoff in self._jobs.items() if now < backoff.until))

    def refused(self, job_id: str, action: str, error: SlurmCommandError, now: float) -> float:
        """Record that Slurm refused ``action`` on ``job_id`` at ``now``, log it, and return the wait before the next
        try (a second refusal in the same round does not lengthen it)."""
        backoff = self._jobs.get(job_id)
        if backoff is None:
            backoff = self._jobs[job_id] = _Backoff(self.base_s, now + self.base_s, 1, now)
            fix = self.fix_denied if any(text in error.stderr.lower() for text in DENIED) else ""
            logger.warning(
                "%s %s of job %s refused by Slurm: %s%s; the daemon tries again in %g s, then backs off to at most "
                "every %g s (further refusals of job %s are logged at debug level)",
                self.prefix,
                action,
                job_id,
                error,
                f"; {fix}" if fix else "",
                backoff.delay_s,
                self.cap_s,
                job_id,
            )
            return backoff.delay_s
        if now != backoff.last:
            backoff.refusals += 1
            backoff.delay_s = min(self.cap_s, 2 * backoff.delay_s)
            backoff.until = now + backoff.delay_s
            backoff.last = now
        logger.debug(
            "%s %s of job %s refused again (%d rounds): %s; next try in %g s",
            self.prefix,
            action,
            job_id,
            backoff.refusals,
            error,
            backoff.until - now,
        )
        return backoff.until - now

    def succeeded(self, job_id: str) -> None:
        """Forget ``job_id``'s refusals (an update of it went through)."""
        self._jobs.pop(job_id, None)

    def keep(self, job_ids: Collection[str]) -> None:
        """Forget the jobs not in ``job_ids`` (they left the queue)."""
        for job_id in [job_id for job_id in self._jobs if job_id not in job_ids]:
            del self._jobs[job_id]

    def refusals(self, job_id: str) -> int:
        """How many rounds Slurm refused ``job_id`` since its last success (0: none)."""
        backoff = self._jobs.get(job_id)
        return 0 if backoff is None else backoff.refusals
