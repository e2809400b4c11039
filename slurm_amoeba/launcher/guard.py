"""The admission guard: the job owner's side of admission at the requested size (DESIGN.md, job flow and control
flow; docs/admin.md, section 8c).

A pending elastic job has no agent yet, and a daemon without Slurm rights may not hold another user's job; its owner
may (``scontrol hold`` and ``scontrol release`` of one's own job: SLURM-FACTS.md). So ``amoeba-sbatch`` and
:class:`~slurm_amoeba.launcher.executor.ElasticExecutor` start one guard beside each elastic job they submit to a
site with a daemon (:func:`start_guard`): a small process of the job's user that, while the job is pending, asks the
daemon every few seconds what to do with it (an ``admission`` request, munge-authenticated; the reply must come from
the daemon's uid) and applies the verdict (:class:`AdmissionGuard`):

- ``hold``: it holds the job (once; a job its user holds already is left alone);
- ``release`` or ``none``: it releases the hold *it* made (never a hold of the user's own or an admin's);
- no trusted answer for ``silence_s``: it releases its hold (a daemon that stopped or crashed leaves no hold behind)
  and keeps asking.

It ends when the job leaves the queue (started, cancelled, or gone); ``SIGTERM`` releases its hold first.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from types import FrameType
from typing import Protocol

from slurm_amoeba.agent.config import configured_daemon_uid
from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.core.messages import Message, standby_redirect
from slurm_amoeba.slurm import CliSlurmClient, JobRecord, JobState, SlurmCommandError
from slurm_amoeba.transport.channel import ChannelError, request

logger = logging.getLogger(__name__)

#: How often a guard asks the daemon (seconds); the daemon's rounds come every ``interval_s`` (5 s by default).
DEFAULT_POLL_S = 5.0
#: How long a guard keeps its hold without a trusted answer from the daemon.
DEFAULT_SILENCE_S = 60.0
#: Where the submitter's environment may switch guards off (``0``): the job then starts as without admission.
GUARD_ENV = "AMOEBA_ADMISSION_GUARD"


class GuardSlurm(Protocol):
    """What a guard needs of Slurm: a part of :class:`~slurm_amoeba.slurm.SlurmClient`."""

    def jobs(self, *, job_ids: Collection[int] | None = None) -> list[JobRecord]:
        """``squeue`` of the given jobs."""
        ...

    def hold(self, job_id: int) -> None:
        """``scontrol hold``."""
        ...

    def release(self, job_id: int) -> None:
        """``scontrol release``."""
        ...


#: Asks the daemon for a job's verdict: ``hold``, ``release`` or ``none``; None when nothing trusted answered.
Ask = Callable[[str], "str | None"]


@dataclasses.dataclass
class AdmissionGuard:
    """Applies the daemon's verdicts on one pending job as its owner (see the module docstring).

    Attributes:
        job_id: the job (the heterogeneous leader's id for a heterogeneous job).
        slurm: Slurm, as the job's user.
        ask: the daemon's verdict on the job.
        clock: seconds (monotonic is enough).
        silence_s: how long a hold is kept without an answer.
        held: whether the job is held by this guard.
    """

    job_id: int
    slurm: GuardSlurm
    ask: Ask
    clock: Callable[[], float] = time.monotonic
    silence_s: float = DEFAULT_SILENCE_S
    held: bool = False
    _answered_at: float | None = dataclasses.field(default=None, repr=False)
    _failing_since: float | None = dataclasses.field(default=None, repr=False)
    _seen: bool = dataclasses.field(default=False, repr=False)
    _born: float = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._born = self.clock()

    def step(self) -> bool:
        """Look once at the job and the daemon's verdict, and act on it.

        Returns:
            False when the guard's work is done: the job is no longer pending.
        """
        try:
            records = self.slurm.jobs(job_ids=[self.job_id])
        except SlurmCommandError as exc:  # Slurm busy: look again; without a hold, give up after the silence bound
            now = self.clock()
            if self._failing_since is None:
                self._failing_since = now
            logger.warning("[guard/%s] squeue failed (%s); trying again", self.job_id, exc)
            return self.held or now - self._failing_since < self.silence_s
        self._failing_since = None
        mine = [r for r in records if self.job_id in (r.job_id, r.het_job_id)]
        leader = min(mine, key=lambda r: r.het_job_offset, default=None)
        now = self.clock()
        if leader is None and not self._seen and now - self._born < self.silence_s:
            return True  # a job just submitted may not be listed yet
        self._seen = True
        if leader is None or leader.state is not JobState.PENDING:
            logger.info(
                "[guard/%s] the job is no longer pending (%s): done",
                self.job_id,
                "gone" if leader is None else leader.state.value,
            )
            return False
        verdict = self.ask(str(self.job_id))
        if verdict is None:
            if self._answered_at is None:
                self._answered_at = now
            elif self.held and now - self._answered_at >= self.silence_s:
                self.release(f"the daemon has not answered for {self.silence_s:g} s")
            return True
        self._answered_at = now
        if verdict == "hold" and not self.held and not leader.is_held:
            self._hold()
        elif verdict != "hold" and self.held:
            self.release(f"the daemon's verdict is {verdict}")
        return True

    def _hold(self) -> None:
        try:
            self.slurm.hold(self.job_id)
        except SlurmCommandError as exc:  # it started meanwhile: the next step ends the guard
            logger.info("[guard/%s] hold refused: %s", self.job_id, exc)
            return
        self.held = True
        logger.info("[guard/%s] held at the daemon's word", self.job_id)

    def release(self, why: str) -> None:
        """Release the hold this guard made (no-op without one)."""
        if not self.held:
            return
        try:
            self.slurm.release(self.job_id)
        except SlurmCommandError as exc:  # released by its user, or gone
            logger.info("[guard/%s] release: %s", self.job_id, exc)
        self.held = False
        logger.info("[guard/%s] released: %s", self.job_id, why)

    def run(self, poll_s: float = DEFAULT_POLL_S, sleep: Callable[[float], None] = time.sleep) -> None:
        """Step every ``poll_s`` until the job leaves the queue."""
        while self.step():
            sleep(poll_s)


def daemon_asker(endpoints: Sequence[str], daemon_uid: int | None, timeout_s: float = 3.0) -> Ask:
    """An :data:`Ask` over the daemon's endpoints (a standby pair's two, tried in turn; a standby's reply is no
    answer): the reply must come from ``daemon_uid`` (None: the guard's own uid, as the agent's link does)."""
    expect = os.getuid() if daemon_uid is None else daemon_uid

    def ask(job_id: str) -> str | None:
        for endpoint in endpoints:
            try:
                reply = request(
                    endpoint,
                    Message("admission", {"job_id": job_id}),
                    timeout_s=timeout_s,
                    retries=0,
                    expect_uid=expect,
                )
            except ChannelError as exc:
                logger.debug("[guard/%s] %s: %s", job_id, endpoint, exc)
                continue
            if standby_redirect(reply) is not None:
                continue
            if not reply.body["ok"]:  # the daemon has not seen the job yet: no word on it
                return "none"
            verdict = reply.body["data"].get("verdict")
            return verdict if verdict in ("hold", "release") else "none"
        return None

    return ask


def guard_argv(job_id: int, endpoint: str, python: str = sys.executable) -> list[str]:
    """The command that starts a guard for ``job_id`` reporting to ``endpoint``."""
    return [python, "-m", "slurm_amoeba.launcher.guard", "--daemon", endpoint, str(job_id)]


def start_guard(job_id: int, endpoint: str | None, environ: Mapping[str, str]) -> bool:
    """Start a detached guard for a just-submitted elastic job (no-op without a daemon, or with
    ``AMOEBA_ADMISSION_GUARD=0``); it outlives the submitter. Returns whether one was started."""
    if not endpoint or environ.get(GUARD_ENV, "1").strip() == "0":
        return False
    log = environ.get("AMOEBA_GUARD_LOG", "")
    with open(log or os.devnull, "ab") as out:
        subprocess.Popen(  # a fixed argv of our own module, never a shell
            guard_argv(job_id, endpoint),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            env=dict(environ),
            close_fds=True,
        )
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m slurm_amoeba.launcher.guard --daemon ENDPOINT JOB_ID``."""
    parser = argparse.ArgumentParser(prog="amoeba-guard", description=__doc__.split("\n\n")[0])
    parser.add_argument("job_id", type=int)
    parser.add_argument("--daemon", required=True, help="the daemon's endpoint(s), comma-separated")
    parser.add_argument("--poll", type=float, default=DEFAULT_POLL_S, help="seconds between two looks")
    parser.add_argument("--silence", type=float, default=DEFAULT_SILENCE_S, help="seconds a hold is kept unanswered")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        daemon_uid = configured_daemon_uid()
    except SpecError as exc:
        print(f"amoeba-guard: {exc}", file=sys.stderr)
        return 2
    endpoints = [e.strip() for e in args.daemon.split(",") if e.strip()]
    guard = AdmissionGuard(
        args.job_id, CliSlurmClient.from_environment(), daemon_asker(endpoints, daemon_uid), silence_s=args.silence
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        guard.release("the guard was stopped")
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    guard.run(args.poll)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
