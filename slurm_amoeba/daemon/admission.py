"""Admission at the requested size, live: the daemon holds pending elastic jobs and releases each when its requested
size is free or lendable (docs/admin.md, section 8c; the pure decisions are :mod:`slurm_amoeba.policy.admission`).

Off by default; with ``admission.enabled`` and Slurm administrator rights (root, ``SlurmUser`` or AdminLevel
Administrator: Slurm refuses an Operator the ``AdminComment``), each round, on the daemon's Slurm thread:

1. :func:`admission_input` reads the round's view: idle GPUs of the admitted partitions, the GPUs satellites hold
   (the daemon lends them and takes them back), running jobs with their latest ends (start plus time limit), and
   the pending jobs in Slurm's queue, the elastic ones recognised by their comment (``amoeba-elastic=MIN:MAX``,
   :mod:`slurm_amoeba.slurm.marks`) with their requested size (MAX workers, capped by ``limits.max_workers``, times
   the GPUs per worker of the job's own allocation), those the daemon holds by their hold mark.
2. :func:`~slurm_amoeba.policy.admission.admit` decides.
3. :class:`Admitter` applies: a hold writes the hold mark (``AdminComment``: since when, the priority Slurm had
   given the job, the GPUs it waits for) and then holds the job (``scontrol hold``); a release releases it, clears
   the mark and, under ``priority/basic``, gives the job its priority back (a release would send it to the back of
   the queue). Mark first, hold second, release before clearing: a crash between two calls never leaves an
   unmarked hold behind.
   A call Slurm refuses is not repeated every round: that job backs off (:mod:`.refusals`: one warning with the fix,
   then debug-level).

**No hold is left behind**: the daemon releases every job it holds when it stops; a daemon that crashed finds its
holds again by their mark when it starts (with ``admission.enabled``: it keeps them, with their hold time; without:
it releases them on its first round). An admin can find them with ``squeue -O JobID,AdminComment``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Collection, Mapping
from typing import Protocol, runtime_checkable

from slurm_amoeba.daemon.actuator import ADMIN_LEVELS, VANISHED, QueueControl, checked_rights, grant_fix
from slurm_amoeba.daemon.config import Admission, ConfigError
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.daemon.observer import ClusterView, satellite_parent
from slurm_amoeba.daemon.refusals import Refusals
from slurm_amoeba.policy.admission import Action, AdmissionSettings, Running, Standing, Verdict, Waiting, admit
from slurm_amoeba.slurm import JobRecord, JobState, SlurmCommandError
from slurm_amoeba.slurm.marks import HoldMark, parse_elastic_comment, parse_hold_mark

logger = logging.getLogger(__name__)


@runtime_checkable
class AdmissionControl(QueueControl, Protocol):
    """What admission needs of Slurm: a part of :class:`~slurm_amoeba.slurm.SlurmClient`."""

    def set_admin_comment(self, job_id: int, text: str) -> None:
        """``scontrol update JobId=N AdminComment=...``."""
        ...


@dataclasses.dataclass(frozen=True)
class HeldJob:
    """A job the daemon holds, as ``amoebactl status`` shows it.

    Attributes:
        job_id: the job.
        user: its owner.
        wanted: GPUs of its requested size.
        available: GPUs free or lendable for it at the last round.
        since: when the hold began (Unix seconds).
    """

    job_id: str
    user: str
    wanted: int
    available: int
    since: float

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class AdmissionInput:
    """What :func:`~slurm_amoeba.policy.admission.admit` is asked, and the records behind it.

    Attributes:
        free: idle GPUs of the admitted partitions.
        lendable: GPUs the satellites hold.
        running: running jobs (not satellites) with GPUs.
        queue: pending jobs of the admitted partitions, not held by anyone but the daemon.
        records: job id -> its leader's record (pending jobs).
        marks: job id -> the daemon's hold mark (the jobs it holds).
        stale: jobs that carry the hold mark but are not held (a crash between release and clearing the mark).
    """

    free: int
    lendable: int
    running: tuple[Running, ...]
    queue: tuple[Waiting, ...]
    records: Mapping[str, JobRecord]
    marks: Mapping[str, HoldMark]
    stale: tuple[str, ...]


def _is_held(record: JobRecord) -> bool:
    return record.priority == 0 or record.state_reason.startswith("JobHeld")


def _request_gpus(mark: tuple[int, int] | None, gpus: int, max_workers: int, total: int) -> int:
    """The requested size in GPUs of a pending elastic job (its mark's MAX, capped) or its own GPUs otherwise."""
    if mark is None or gpus <= 0:
        return gpus
    low, high = mark
    per_worker = math.ceil(gpus / low)
    return max(gpus, min(min(high, max_workers) * per_worker, total))


def admission_input(
    view: ClusterView,
    partitions: Collection[str],
    users: Collection[str],
    max_workers: int,
    admitted: Collection[str],
    lenders: Collection[str] | None = None,
) -> AdmissionInput:
    """Read the round's view for admission (see the module docstring).

    Args:
        view: Slurm's jobs and nodes.
        partitions: the partitions admitted into.
        users: only these users' elastic jobs are held; empty: everyone's.
        max_workers: the site's cap on an elastic job's workers (``limits.max_workers``).
        admitted: jobs admitted earlier (never held again).
        lenders: the jobs whose satellites the daemon can take back (its managed jobs); None: every job's.
    """
    allowed = set(partitions)
    nodes = [node for node in view.nodes if allowed & set(node.partitions)]
    names = {node.name for node in nodes}
    total = sum(node.gpus_total for node in nodes if node.is_usable)
    lendable = 0
    running: list[Running] = []
    queue: list[Waiting] = []
    records: dict[str, JobRecord] = {}
    marks: dict[str, HoldMark] = {}
    stale: list[str] = []
    for job_id, group in view.active_groups().items():
        leader = min(group, key=lambda record: record.het_job_offset)
        parent = satellite_parent(leader)
        if parent is not None:
            if lenders is not None and parent not in lenders:
                continue  # another daemon's (or nobody's) loan: busy GPUs as far as admission knows
            lendable += sum(r.gpus_held for r in group if r.state is JobState.RUNNING and names & set(r.nodes))
            continue
        if leader.state is JobState.RUNNING:
            gpus = sum(r.gpus_held for r in group if names & set(r.nodes))
            if gpus:
                ends = math.inf if leader.time_limit_s is None else float(leader.start_time + leader.time_limit_s)
                running.append(Running(gpus, ends))
            continue
        parts = {part for part in leader.partition.split(",") if part}
        if leader.state is not JobState.PENDING or not parts or not parts <= allowed:
            continue
        mark = parse_hold_mark(leader.admin_comment)
        held = _is_held(leader)
        if mark is not None and not held:
            stale.append(job_id)
        if held and mark is None:
            continue  # its owner's or an admin's hold: Slurm will not start it, and it is not the daemon's to lift
        gpus = sum(r.gpus_requested for r in group)
        range_mark = parse_elastic_comment(leader.comment)
        elastic = range_mark is not None and (not users or leader.user in users)
        if held and mark is not None:
            standing, priority, since = Standing.HELD, mark.priority, float(mark.since)
            marks[job_id] = mark
        else:
            standing = (
                Standing.ADMITTED if job_id in admitted else Standing.NEW if elastic and gpus > 0 else Standing.REGULAR
            )
            priority, since = leader.priority, 0.0
        request = _request_gpus(range_mark, gpus, max_workers, total) if standing is not Standing.REGULAR else gpus
        limit_s = float(leader.time_limit_s) if leader.time_limit_s is not None else None
        queue.append(
            Waiting(job_id, gpus, request, limit_s, priority, float(leader.submit_time), standing, since or None)
        )
        records[job_id] = leader
    free = sum(node.gpus_free for node in nodes)
    return AdmissionInput(free, lendable, tuple(running), tuple(queue), records, marks, tuple(stale))


@dataclasses.dataclass(frozen=True)
class AdmissionRound:
    """What one round of admission did.

    Attributes:
        held: jobs held this round.
        released: jobs released because their requested size became available.
        starved: jobs released by the starvation bound.
        waiting: every job the daemon holds after the round.
        failed: jobs Slurm refused to hold or release.
        backing_off: jobs not tried this round because Slurm refused them lately (:mod:`.refusals`).
    """

    held: tuple[str, ...]
    released: tuple[str, ...]
    starved: tuple[str, ...]
    waiting: tuple[HeldJob, ...]
    failed: tuple[str, ...]
    backing_off: tuple[str, ...] = ()


class Admitter:
    """Holds and releases pending elastic jobs each round (see the module docstring).

    Args:
        settings: the ``admission`` section (``enabled`` False: only releases the holds of a previous life, once).
        partitions: the partitions admitted into.
        max_workers: the site's cap on an elastic job's workers.
        control: Slurm.
        metrics: the daemon's metrics.
        restore_priority: give a released job the priority it had before the hold (``priority/basic``, where a
            release puts a job at the back of the queue: measured); False under ``priority/multifactor``, which
            computes it again.
        user: the daemon's user (named in the fix of a refused hold).

    Attributes:
        marks: job id -> the hold mark of every job the daemon holds (as of its last round).
        admitted: jobs released or admitted while still pending (never held again).
        waiting: the held jobs as ``status`` shows them.
        refusals: the per-job backoff of holds, releases and marks Slurm refused (one warning per job, then debug).
    """

    def __init__(
        self,
        settings: Admission,
        partitions: Collection[str],
        max_workers: int,
        control: AdmissionControl,
        metrics: DaemonMetrics,
        *,
        restore_priority: bool = True,
        user: str = "amoebad",
    ) -> None:
        self.settings = settings
        self.partitions = tuple(partitions)
        self.max_workers = max_workers
        self.control = control
        self.metrics = metrics
        self.restore_priority = restore_priority
        self.marks: dict[str, HoldMark] = {}
        self.admitted: set[str] = set()
        self.waiting: tuple[HeldJob, ...] = ()
        self.refusals = Refusals("[daemon/admission]", grant_fix(user, user, ADMIN_LEVELS, "admission.enabled"))
        self._first = True

    def apply(self, view: ClusterView, now: float, lenders: Collection[str] | None = None) -> AdmissionRound:
        """One round: read, decide, hold and release (disabled: release a previous life's holds, first round only).

        ``lenders`` are the jobs whose satellites the daemon can take back (its managed jobs; None: every job's).
        """
        if not self.settings.enabled and not self._first:
            return AdmissionRound((), (), (), (), ())
        seen = admission_input(view, self.partitions, self.settings.users, self.max_workers, self.admitted, lenders)
        first, self._first = self._first, False
        self.refusals.keep({job.job_id for job in seen.queue})
        for job_id in seen.stale:
            if self.refusals.ready(job_id, now) and self._call(
                "clear", job_id, functools.partial(self.control.set_admin_comment, int(job_id), ""), now=now
            ):
                self.refusals.succeeded(job_id)
        if not self.settings.enabled:
            if first and seen.marks:
                self.marks = dict(seen.marks)
                self.release_all("admission is off")
            return AdmissionRound((), (), (), (), ())
        if first and seen.marks:
            logger.info("[daemon/admission] %d job(s) held by the previous daemon: kept", len(seen.marks))
        self.marks = dict(seen.marks)
        self.admitted &= {job.job_id for job in seen.queue}
        settings = AdmissionSettings(max_hold_s=self.settings.max_hold_s)
        verdicts = admit(now, seen.free, seen.lendable, seen.running, seen.queue, settings)
        done: dict[Action, list[str]] = {action: [] for action in Action}
        failed: list[str] = []
        waiting: list[HeldJob] = []
        backing_off: list[str] = []
        for verdict in verdicts:
            record = seen.records[verdict.job_id]
            if verdict.action not in (Action.WAIT, Action.ADMIT) and not self.refusals.ready(verdict.job_id, now):
                backing_off.append(verdict.job_id)
                continue
            ok = self._act(verdict, record, now)
            (done[verdict.action] if ok else failed).append(verdict.job_id)
            if ok:
                self.refusals.succeeded(verdict.job_id)
            mark = self.marks.get(verdict.job_id)
            if ok and mark is not None and verdict.action in (Action.HOLD, Action.WAIT):
                waiting.append(HeldJob(verdict.job_id, record.user, verdict.wanted, verdict.available, mark.since))
        self.waiting = tuple(waiting)
        self.metrics.admission_held.set(len(waiting))
        return AdmissionRound(
            tuple(done[Action.HOLD]),
            tuple(done[Action.RELEASE]),
            tuple(done[Action.STARVED]),
            self.waiting,
            tuple(failed),
            tuple(backing_off),
        )

    def _act(self, verdict: Verdict, record: JobRecord, now: float) -> bool:
        job_id = verdict.job_id
        if verdict.action is Action.WAIT:
            return True
        if verdict.action is Action.ADMIT:
            self.admitted.add(job_id)
            logger.info("[daemon/admission] job %s (user %s) admitted: %s", job_id, record.user, verdict.reason)
            return True
        if verdict.action is Action.HOLD:
            return self.hold(job_id, record.user, record.priority, verdict.wanted, verdict.reason, now)
        return self.release(job_id, record.user, verdict.reason, now, starved=verdict.action is Action.STARVED)

    def hold(self, job_id: str, user: str, priority: int, wanted: int, reason: str, now: float) -> bool:
        """Hold a pending job: write the hold mark (since ``now``, its ``priority``, the ``wanted`` GPUs), then hold
        it; a hold Slurm refuses clears the mark again.

        Returns:
            Whether the job is held.
        """
        mark = HoldMark(int(now), priority, wanted)
        comment = functools.partial(self.control.set_admin_comment, int(job_id), mark.text())
        if self._call("hold", job_id, comment, now=now):
            if self._call("hold", job_id, functools.partial(self.control.hold, int(job_id)), count=True, now=now):
                self.marks[job_id] = mark
                logger.info("[daemon/admission] job %s (user %s) held: %s", job_id, user, reason)
                return True
            self._call("clear", job_id, functools.partial(self.control.set_admin_comment, int(job_id), ""), now=now)
        return False

    def release(self, job_id: str, user: str, reason: str, now: float, *, starved: bool = False) -> bool:
        """Release a job the daemon holds (see :meth:`_release`); it is admitted from then on, never held again.

        Returns:
            Whether the release went through (False for a job the daemon does not hold).
        """
        held = self.marks.get(job_id)
        action = Action.STARVED if starved else Action.RELEASE
        if held is None or not self._release(job_id, held, action.value, now):
            return False
        self.admitted.add(job_id)
        logger.info(
            "[daemon/admission] job %s (user %s) released after %.0f s: %s", job_id, user, now - held.since, reason
        )
        return True

    def _release(self, job_id: str, mark: HoldMark, action: str, now: float | None = None) -> bool:
        """Release, clear the mark, give the priority back; True when the release itself went through.

        ``now`` None (the stop): a refusal is a warning, not a backoff."""
        if not self._call(action, job_id, functools.partial(self.control.release, int(job_id)), count=True, now=now):
            return False
        self.marks.pop(job_id, None)
        self._call("clear", job_id, functools.partial(self.control.set_admin_comment, int(job_id), ""), now=now)
        if self.restore_priority and mark.priority > 0:
            restore = functools.partial(self.control.set_priority, int(job_id), mark.priority)
            self._call("priority", job_id, restore, now=now)
        return True

    def release_all(self, why: str = "the daemon stops") -> int:
        """Release every job the daemon holds (the stop, or a daemon started with admission off); returns how many.

        A job Slurm cannot release is logged with the command that does it by hand.
        """
        released = 0
        for job_id, mark in sorted(self.marks.items()):
            if self._release(job_id, mark, "undo"):
                released += 1
            else:
                logger.warning(
                    "[daemon/admission] job %s is still held by amoebad; release it with `scontrol release %s`",
                    job_id,
                    job_id,
                )
        if self.marks or released:
            logger.info("[daemon/admission] %s: released %d held job(s)", why, released)
        self.marks = {}
        self.waiting = ()
        self.metrics.admission_held.set(0)
        return released

    def _call(
        self, action: str, job_id: str, call: Callable[[], None], *, count: bool = False, now: float | None = None
    ) -> bool:
        """Run one update; a refusal during a round (``now`` given) goes to :attr:`refusals`, one at the stop
        (``now`` None) is a warning."""
        try:
            call()
        except SlurmCommandError as exc:
            outcome = "vanished" if any(text in exc.stderr for text in VANISHED) else "failed"
            if outcome == "failed" and now is not None:
                self.refusals.refused(job_id, action, exc, now)
            else:
                (logger.debug if outcome == "vanished" else logger.warning)(
                    "[daemon/admission] %s of job %s: %s", action, job_id, exc
                )
        else:
            outcome = "ok"
        if count or outcome != "ok":
            self.metrics.admission_decisions.inc(labels={"action": action, "outcome": outcome})
        return outcome == "ok"


def make_admitter(
    settings: Admission,
    partitions: Collection[str],
    max_workers: int,
    source: object,
    metrics: DaemonMetrics,
    *,
    uid: int,
    user: str,
) -> Admitter | None:
    """The admitter, after checking the daemon's rights when enabled; None when the Slurm source cannot hold jobs.

    Disabled, it only releases the holds a previous daemon left (rights are not checked: a failure is logged with
    the command to run by hand).

    Raises:
        ConfigError: it is enabled but the daemon may not hold jobs, or its Slurm source cannot.
    """
    if not isinstance(source, AdmissionControl):
        if settings.enabled:
            raise ConfigError("admission.enabled: the daemon's Slurm source cannot hold jobs (scontrol)")
        return None
    restore = True
    if settings.enabled:
        why, priority_type = checked_rights(source, uid, user, "admission.enabled", ADMIN_LEVELS)
        restore = priority_type == "priority/basic"
        logger.info(
            "[daemon/admission] admitting elastic jobs at their requested size in %s (rights: %s; %s; max_hold_s %g)",
            ", ".join(partitions),
            why,
            priority_type,
            settings.max_hold_s,
        )
    return Admitter(settings, partitions, max_workers, source, metrics, restore_priority=restore, user=user)
