"""Admission at the requested size, live: the daemon's executor holds and releases pending elastic jobs
(docs/admin.md, section 8c). What to hold and release is decided by the admission layer
(:class:`~slurm_amoeba.policy.admission.AdmissionGate`, the simulator's rule) and arrives as typed
:class:`~slurm_amoeba.policy.actions.Hold` and :class:`~slurm_amoeba.policy.actions.Release` actions.

Who applies them is ``admission.holds_by``:

- ``owner`` (the default; no Slurm rights): each job's owner holds and releases it. :class:`OwnerHolds` stands in
  for Slurm: a hold or release becomes the job's **verdict**, which the job's admission guard (started by
  ``amoeba-sbatch`` and the executor beside each elastic job they submit, running as the job's user:
  :mod:`slurm_amoeba.launcher.guard`) asks for with an ``admission`` request and applies with ``scontrol hold`` and
  ``scontrol release`` of its own job (Slurm lets an owner do both: SLURM-FACTS.md). The hold mark lives in the
  daemon's memory instead of the ``AdminComment``: :meth:`Admitter.overlay` shows it on Slurm's record of a job its
  owner holds at the daemon's word, so that the snapshot and :meth:`Admitter.sync` see the daemon's hold as in
  ``daemon`` mode. A guard releases its hold by itself when the daemon stops answering, so no hold outlives it.
- ``daemon``: the daemon holds and releases in Slurm itself (below).

With ``holds_by: daemon`` and Slurm administrator rights (root, ``SlurmUser`` or AdminLevel
Administrator: Slurm refuses an Operator the ``AdminComment``), :class:`Admitter` applies them on the daemon's Slurm
thread: a hold writes the hold mark (``AdminComment``: since when, the priority Slurm had given the job, the GPUs it
waits for) and then holds the job (``scontrol hold``); a release releases it, clears the mark and, under
``priority/basic``, gives the job its priority back (a release would send it to the back of the queue). Mark first,
hold second, release before clearing: a crash between two calls never leaves an unmarked hold behind. A call Slurm
refuses is not repeated every round: that job backs off (:mod:`.refusals`: one warning with the fix, then
debug-level).

**No hold is left behind**: the daemon releases every job it holds when it stops; a daemon that crashed finds its
holds again by their mark (the snapshot's ``JobInfo.held_since``, :meth:`Admitter.sync`): with ``admission.enabled``
it keeps them, with their hold time; without, it releases them on its first round. An admin can find them with
``squeue -O JobID,AdminComment``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Protocol, runtime_checkable

from slurm_amoeba.daemon.actuator import ADMIN_LEVELS, VANISHED, QueueControl, checked_rights, grant_fix
from slurm_amoeba.daemon.config import Admission, ConfigError
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.daemon.observer import ClusterView, group_id
from slurm_amoeba.daemon.refusals import Refusals
from slurm_amoeba.policy import JobInfo
from slurm_amoeba.slurm import JobRecord, JobState, SlurmCommandError
from slurm_amoeba.slurm.marks import HoldMark, parse_hold_mark

logger = logging.getLogger(__name__)


@runtime_checkable
class AdmissionControl(QueueControl, Protocol):
    """What admission needs of Slurm: a part of :class:`~slurm_amoeba.slurm.SlurmClient`."""

    def set_admin_comment(self, job_id: int, text: str) -> None:
        """``scontrol update JobId=N AdminComment=...``."""
        ...


#: What an admission guard is told to do with its job (``OwnerHolds.verdict``): hold it, release its hold, or
#: nothing (the daemon has no word on it).
VERDICTS = ("hold", "release", "none")


class OwnerHolds:
    """The owners' side of admission (``admission.holds_by: owner``): the daemon's holds and releases as verdicts its
    jobs' guards apply (see the module docstring). An :class:`AdmissionControl` that runs no Slurm command.

    Attributes:
        verdicts: job id -> ``hold`` or ``release``, the daemon's last word on the job.
        marks: job id -> the hold mark's text, while the daemon holds the job.
    """

    def __init__(self) -> None:
        self.verdicts: dict[str, str] = {}
        self.marks: dict[str, str] = {}
        self._lock = threading.Lock()  # the Slurm thread writes, the request thread reads

    def hold(self, job_id: int) -> None:
        """The job's guard is to hold it."""
        with self._lock:
            self.verdicts[str(job_id)] = "hold"

    def release(self, job_id: int) -> None:
        """The job's guard is to release the hold it made."""
        with self._lock:
            self.verdicts[str(job_id)] = "release"

    def set_admin_comment(self, job_id: int, text: str) -> None:
        """Keep (``""``: drop) the hold mark of a job the daemon holds, in memory; the mark of a job to be released
        stays until its guard has released it (:meth:`overlay`)."""
        with self._lock:
            if text:
                self.marks[str(job_id)] = text
            elif self.verdicts.get(str(job_id)) != "release":
                self.marks.pop(str(job_id), None)

    def set_priority(self, job_id: int, priority: int) -> None:
        """Refused: an owner cannot give a job its priority back (``Admitter(restore_priority=False)`` never asks).

        Raises:
            ConfigError: always.
        """
        raise ConfigError(
            f"admission.holds_by: owner cannot set job {job_id}'s priority to {priority}: build its Admitter with "
            "restore_priority=False (make_admitter does)"
        )

    def config_values(self) -> dict[str, str]:
        """Not needed: owners need no rights checked."""
        return {}

    def admin_level(self, user: str) -> str:
        """Not needed: owners need no rights checked."""
        return "None"

    def past_service(self, job_ids: Collection[int]) -> dict[int, float]:
        """Not needed by admission."""
        return {}

    def verdict(self, job_id: str) -> str:
        """What the job's guard is to do now (one of :data:`VERDICTS`)."""
        with self._lock:
            return self.verdicts.get(job_id, "none")

    def overlay(self, view: ClusterView) -> ClusterView:
        """Slurm's view with the daemon's hold marks on the jobs their owners hold at its word (Slurm shows no mark
        on a job its owner holds), at the start of a round.

        A job to be released keeps its mark until its guard has released it: until then it is the daemon's held job
        that asks for its requested size (its GPUs do not look free to the jobs behind it). Released and not started
        yet, it keeps the priority it had before the hold (an owner's release gives it a lower one under
        ``priority/basic``, which the daemon may not undo: the jobs the daemon still holds must not pass it in the
        admission rule's queue). The verdict ``hold`` of a job that is not held (its guard has not acted yet) is
        forgotten: the round's admission layer orders it again if the job still waits, and a guard that holds a job
        whose verdict is gone releases it. Jobs no longer pending are forgotten.
        """
        with self._lock:
            pending = {group_id(r): r.is_held for r in view.jobs if r.state is JobState.PENDING}
            for job_id, verdict in list(self.verdicts.items()):
                if job_id not in pending or (verdict == "hold" and not pending[job_id]):
                    del self.verdicts[job_id]
                    self.marks.pop(job_id, None)
            if not self.marks:
                return view
            jobs = tuple(self._shown(record) for record in view.jobs)
        return dataclasses.replace(view, jobs=jobs)

    def _shown(self, record: JobRecord) -> JobRecord:
        key = group_id(record)
        text = self.marks.get(key)
        if text is None or key not in self.verdicts or record.admin_comment or record.state is not JobState.PENDING:
            return record
        if record.is_held:
            return dataclasses.replace(record, admin_comment=text)
        mark = parse_hold_mark(text)
        return record if mark is None or mark.priority <= 0 else dataclasses.replace(record, priority=mark.priority)


@dataclasses.dataclass(frozen=True)
class HeldJob:
    """A job the daemon holds, as ``amoebactl status`` shows it.

    Attributes:
        job_id: the job.
        user: its owner.
        wanted: GPUs of its requested size when it was held (the hold mark's).
        since: when the hold began (Unix seconds).
    """

    job_id: str
    user: str
    wanted: int
    since: float

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return dataclasses.asdict(self)


class Admitter:
    """Applies the admission layer's holds and releases (see the module docstring).

    Args:
        settings: the ``admission`` section (``enabled`` False: only releases the holds of a previous life, once).
        control: Slurm.
        metrics: the daemon's metrics.
        restore_priority: give a released job the priority it had before the hold (``priority/basic``, where a
            release puts a job at the back of the queue: measured); False under ``priority/multifactor``, which
            computes it again.
        user: the daemon's user (named in the fix of a refused hold).

    Attributes:
        marks: job id -> the hold mark of every job the daemon holds (as of its last round).
        waiting: the held jobs as ``status`` shows them.
        refusals: the per-job backoff of holds, releases and marks Slurm refused (one warning per job, then debug).
    """

    def __init__(
        self,
        settings: Admission,
        control: AdmissionControl,
        metrics: DaemonMetrics,
        *,
        restore_priority: bool = True,
        user: str = "amoebad",
    ) -> None:
        self.settings = settings
        self.control = control
        self.metrics = metrics
        self.restore_priority = restore_priority
        self.marks: dict[str, HoldMark] = {}
        self.waiting: tuple[HeldJob, ...] = ()
        self._owners: dict[str, str] = {}
        self.refusals = Refusals("[daemon/admission]", grant_fix(user, user, ADMIN_LEVELS, "admission.enabled"))
        self._first = True

    def sync(self, jobs: Mapping[str, JobInfo], now: float) -> None:
        """Bring the record of the daemon's holds up to a round's snapshot (before the round's actions).

        The jobs the snapshot shows held with the daemon's mark are its holds (a daemon that crashed finds them
        again: kept, with their hold time); a mark whose hold is gone is cleared. With admission off, the first
        round releases a previous life's holds, and later rounds do nothing.
        """
        first, self._first = self._first, False
        if not self.settings.enabled and not first:
            return
        marks: dict[str, HoldMark] = {}
        for job_id, info in jobs.items():
            if info.held_since is None:
                continue
            if not info.held:
                if self.refusals.ready(job_id, now) and self._call(
                    "clear", job_id, functools.partial(self.control.set_admin_comment, int(job_id), ""), now=now
                ):
                    self.refusals.succeeded(job_id)
                continue
            wanted = info.max_workers * info.gpus_per_worker
            marks[job_id] = self.marks.get(job_id) or HoldMark(int(info.held_since), info.priority, wanted)
            self._owners[job_id] = info.owner
        self.refusals.keep(set(jobs))
        if not self.settings.enabled:
            if marks:
                self.marks = marks
                self.release_all("admission is off")
            return
        if first and marks:
            logger.info("[daemon/admission] %d job(s) held by the previous daemon: kept", len(marks))
        self.marks = marks
        self._refresh()

    @property
    def owners_hold(self) -> bool:
        """Whether the jobs' owners apply the holds and releases (``admission.holds_by: owner``)."""
        return isinstance(self.control, OwnerHolds)

    def overlay(self, view: ClusterView) -> ClusterView:
        """Slurm's view as the round's snapshot is to see it: with the daemon's marks on the jobs their owners hold
        at its word (:meth:`OwnerHolds.overlay`); unchanged when the daemon holds in Slurm itself."""
        return self.control.overlay(view) if isinstance(self.control, OwnerHolds) else view

    def verdict(self, job_id: str) -> str:
        """What a job's admission guard is to do now (:data:`VERDICTS`; ``none`` when the daemon holds in Slurm)."""
        return self.control.verdict(job_id) if isinstance(self.control, OwnerHolds) else "none"

    def _refresh(self) -> None:
        """The held jobs as ``status`` shows them, and the gauge."""
        self.waiting = tuple(
            HeldJob(job_id, self._owners.get(job_id, ""), mark.gpus, float(mark.since))
            for job_id, mark in sorted(self.marks.items())
        )
        self.metrics.admission_held.set(len(self.waiting))

    def hold(self, job_id: str, user: str, priority: int, wanted: int, reason: str, now: float) -> bool:
        """Hold a pending job: write the hold mark (since ``now``, its ``priority``, the ``wanted`` GPUs), then hold
        it; a hold Slurm refuses clears the mark again.

        Returns:
            Whether the job is held.
        """
        if not self.refusals.ready(job_id, now):
            return False  # Slurm refused it lately: it backs off
        mark = HoldMark(int(now), priority, wanted)
        comment = functools.partial(self.control.set_admin_comment, int(job_id), mark.text())
        if self._call("hold", job_id, comment, now=now):
            if self._call("hold", job_id, functools.partial(self.control.hold, int(job_id)), count=True, now=now):
                self.marks[job_id] = mark
                self._owners[job_id] = user
                self.refusals.succeeded(job_id)
                self._refresh()
                logger.info("[daemon/admission] job %s (user %s) held: %s", job_id, user, reason)
                return True
            self._call("clear", job_id, functools.partial(self.control.set_admin_comment, int(job_id), ""), now=now)
        return False

    def release(self, job_id: str, user: str, reason: str, now: float, *, starved: bool = False) -> bool:
        """Release a job the daemon holds (see :meth:`_release`).

        Returns:
            Whether the release went through (False for a job the daemon does not hold).
        """
        held = self.marks.get(job_id)
        if (
            held is None
            or not self.refusals.ready(job_id, now)
            or not self._release(job_id, held, "starved" if starved else "release", now)
        ):
            return False
        self.refusals.succeeded(job_id)
        self._refresh()
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
    source: object,
    metrics: DaemonMetrics,
    *,
    uid: int,
    user: str,
) -> Admitter | None:
    """The admitter, after checking the daemon's rights when it holds in Slurm itself; None when the Slurm source
    cannot hold jobs.

    With ``holds_by: owner`` the jobs' owners hold and release (:class:`OwnerHolds`): no rights are needed. Disabled,
    it only releases the holds a previous daemon left in Slurm (rights are not checked: a failure is logged with the
    command to run by hand).

    Raises:
        ConfigError: it is enabled to hold in Slurm but the daemon may not hold jobs, or its Slurm source cannot.
    """
    if settings.enabled and settings.holds_by == "owner":
        logger.info(
            "[daemon/admission] admitting elastic jobs at their requested size in %s (holds by the jobs' owners, "
            "through their admission guards; max_hold_s %g)",
            ", ".join(partitions),
            settings.max_hold_s,
        )
        return Admitter(settings, OwnerHolds(), metrics, restore_priority=False, user=user)
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
    return Admitter(settings, source, metrics, restore_priority=restore, user=user)
