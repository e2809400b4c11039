"""Admission at the requested size: which pending elastic jobs the daemon holds, and which it releases.

The live counterpart of the ``slurm`` baseline's ``admit_at_request`` (``policy/slurm_baseline.py``; docs/simulator.md,
"The daemon's default against the baseline"). Slurm alone starts an elastic job as soon as its *minimum* fits, and
long half-size jobs then crowd the cluster; a daemon with Slurm operator rights instead holds a pending elastic job
(``scontrol hold``) until its *requested* size is available now, and then releases it. The semantics, as in the
simulator:

- Slurm's queue is walked in its own order (priority, then submit time, then id; a job the daemon holds by the
  priority it had before the hold). Every pending job the daemon does not hold gets what Slurm's backfill gives it:
  it starts now if its GPUs are free for its whole time limit without delaying a reservation made before it, else a
  reservation at its earliest start within the window (running jobs end at their start plus their time limit).
- An elastic job is **admissible** when its requested size fits *now* in the free GPUs plus the GPUs the daemon
  lends (satellites, which Slurm preempts and the daemon takes back) for its whole time limit, without delaying any
  reservation made before it. It is then released (or, not held yet, left alone) and its requested size is taken
  from the profile. Otherwise it is held and holds **no reservation** (as a held job in Slurm).
- **Starvation bound** (not in the simulator, where held jobs may in principle wait forever): a job held for
  ``max_hold_s`` is released anyway and starts at its minimum as Slurm sees fit; from then on it is an ordinary
  pending job of its minimum size, never held again (nor is a job once admitted).

Pure: the caller reads Slurm and applies the verdicts (``daemon/admission.py``); the clock is passed in.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence

# The free-GPU profile of the baseline's backfill, the same step function (one of it in the code base; policy/ owns
# slurm_baseline.py, whose private name this borrows until it is made public there).
from slurm_amoeba.policy.slurm_baseline import DEFAULT_MAX_HOLD_S, Profile

#: Slurm's default ``bf_window`` (one day): reservations lie at most this far ahead.
DEFAULT_WINDOW_S = 24 * 3600.0
#: A job without a time limit (``UNLIMITED``) runs, as far as reservations know, for a year.
UNLIMITED_S = 365 * 24 * 3600.0


class Standing(str, enum.Enum):
    """Where a pending job stands with the daemon."""

    NEW = "new"  # elastic, neither held nor admitted yet
    HELD = "held"  # the daemon holds it
    ADMITTED = "admitted"  # released (or admitted while not held): Slurm's to start, never held again
    REGULAR = "regular"  # not a job the daemon admits


class Action(str, enum.Enum):
    """What the daemon does with one job this round."""

    HOLD = "hold"  # hold it: its requested size is not available
    WAIT = "wait"  # keep holding it
    RELEASE = "release"  # release it: its requested size is available now
    STARVED = "starved"  # release it: held for max_hold_s; it starts at its minimum
    ADMIT = "admit"  # not held and admissible: leave it to Slurm, never hold it


@dataclasses.dataclass(frozen=True)
class Running:
    """A running job as reservations see it.

    Attributes:
        gpus: GPUs Slurm counts as taken (not the satellites the daemon lends: those are free for admission).
        ends_at: when it ends at the latest (start plus time limit); ``math.inf`` when unlimited.
    """

    gpus: int
    ends_at: float


@dataclasses.dataclass(frozen=True)
class Waiting:
    """A pending job in Slurm's queue.

    Attributes:
        job_id: its id (a heterogeneous job's leader).
        min_gpus: GPUs of its own allocation (an elastic job's minimum workers; a regular job's request).
        request_gpus: GPUs of its requested size (an elastic job's); ``min_gpus`` for a regular job.
        limit_s: its time limit in seconds; None when unlimited.
        priority: Slurm's priority (for a job the daemon holds: the one it had before the hold).
        submit_time: when it was submitted.
        standing: where it stands with the daemon.
        held_since: when the daemon held it (``HELD`` only).
    """

    job_id: str
    min_gpus: int
    request_gpus: int
    limit_s: float | None
    priority: int
    submit_time: float
    standing: Standing = Standing.REGULAR
    held_since: float | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The decision about one elastic job.

    Attributes:
        job_id: the job.
        action: what to do.
        wanted: GPUs of its requested size.
        available: GPUs free or lendable now (before this job).
        reason: one sentence for the log.
    """

    job_id: str
    action: Action
    wanted: int
    available: int
    reason: str


@dataclasses.dataclass(frozen=True)
class AdmissionSettings:
    """The pure part of the ``admission`` section.

    Attributes:
        max_hold_s: a job held this long is released anyway (the starvation bound).
        window_s: reservations lie at most this far ahead (Slurm's ``bf_window``).
        max_jobs: the most pending jobs walked (Slurm's ``bf_max_job_test``); later ones are left as they are.
    """

    max_hold_s: float = DEFAULT_MAX_HOLD_S
    window_s: float = DEFAULT_WINDOW_S
    max_jobs: int = 500


def slurm_order(queue: Sequence[Waiting]) -> list[Waiting]:
    """The pending jobs in the order Slurm tests them (priority, submit time, id)."""
    return sorted(queue, key=lambda job: (-job.priority, job.submit_time, _id_key(job.job_id)))


def _id_key(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (-1, job_id)


def admit(
    now: float,
    free_gpus: int,
    lendable_gpus: int,
    running: Sequence[Running],
    queue: Sequence[Waiting],
    settings: AdmissionSettings,
) -> list[Verdict]:
    """The verdicts for the elastic jobs of ``queue`` (see the module docstring); regular jobs get none.

    Args:
        now: the caller's clock.
        free_gpus: idle GPUs of the partitions admitted into.
        lendable_gpus: GPUs the daemon lends now (satellites) and takes back for a job Slurm starts.
        running: the running jobs (their GPUs come back at their latest end).
        queue: the pending jobs.
        settings: the bound and the window.

    Returns:
        One verdict per elastic job (``NEW`` or ``HELD``) among the first ``max_jobs`` in Slurm's order.
    """
    profile = Profile(now, free_gpus + lendable_gpus)
    for run in running:
        profile.add(run.ends_at, math.inf, run.gpus)
    latest = now + settings.window_s
    verdicts: list[Verdict] = []
    for job in slurm_order(queue)[: settings.max_jobs]:
        duration = job.limit_s if job.limit_s is not None else UNLIMITED_S
        if job.standing in (Standing.REGULAR, Standing.ADMITTED):
            _backfill(profile, job.min_gpus, duration, now, latest)
            continue
        available = profile.free[0]
        if profile.earliest(job.request_gpus, duration, now) == now:
            profile.add(now, now + duration, -job.request_gpus)
            action = Action.RELEASE if job.standing is Standing.HELD else Action.ADMIT
            why = f"its requested {job.request_gpus} GPUs are free or lendable now ({available})"
        elif job.standing is Standing.HELD and now - (job.held_since or now) >= settings.max_hold_s:
            _backfill(profile, job.min_gpus, duration, now, latest)
            action = Action.STARVED
            why = (
                f"held {now - (job.held_since or now):.0f} s >= admission.max_hold_s {settings.max_hold_s:g} s; "
                f"it starts at its minimum ({job.min_gpus} GPUs) when Slurm can"
            )
        else:
            action = Action.WAIT if job.standing is Standing.HELD else Action.HOLD
            why = f"waiting for {job.request_gpus} GPUs ({available} free or lendable)"
        verdicts.append(Verdict(job.job_id, action, job.request_gpus, available, why))
    return verdicts


def _backfill(profile: Profile, gpus: int, duration: float, now: float, latest: float) -> None:
    """What Slurm's backfill does with a pending job it may start: now, or a reservation at its earliest start."""
    at = profile.earliest(gpus, duration, latest)
    if at is not None:
        profile.add(at, at + duration, -gpus)
