"""What one user may ask of the daemon: requests per second, and a job's worker range as the site allows it.

Both are the site's (``limits`` in ``amoebad.yaml``, docs/admin.md's Security model). :class:`RateLimiter` is a token
bucket per uid: a uid that sends more than ``requests_per_s`` (after a ``burst``) is refused until it slows down.
:func:`vet_registration` checks the worker range an agent claims against the site's caps and against what Slurm
says the job holds: an agent's numbers are a claim, Slurm's records and the configuration are the facts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from slurm_amoeba.core.errors import AmoebaError
from slurm_amoeba.daemon.agents import Registration
from slurm_amoeba.daemon.config import Limits
from slurm_amoeba.daemon.observer import Submitted
from slurm_amoeba.slurm import JobRecord

#: Uids the limiter remembers; past it, those whose bucket is full again are forgotten (they lose nothing).
MAX_TRACKED_UIDS = 4096


class LimitError(AmoebaError):
    """A request beyond what the site allows; the message names the limit and the setting that sets it."""


class RateLimiter:
    """A token bucket per uid (see the module docstring).

    Args:
        rate: tokens added per second (requests per second, sustained).
        burst: the bucket's size.
    """

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._buckets: dict[int, tuple[float, float]] = {}  # uid -> (tokens, when they were counted)

    def allow(self, uid: int, now: float) -> bool:
        """Take a token from ``uid``'s bucket; False when it is empty (refuse the request)."""
        tokens, then = self._buckets.get(uid, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - then) * self.rate)
        if len(self._buckets) >= MAX_TRACKED_UIDS and uid not in self._buckets:
            self._forget_full(now)
        if tokens < 1.0:
            self._buckets[uid] = (tokens, now)
            return False
        self._buckets[uid] = (tokens - 1.0, now)
        return True

    def _forget_full(self, now: float) -> None:
        for uid, (tokens, then) in list(self._buckets.items()):
            if tokens + (now - then) * self.rate >= self.burst:
                del self._buckets[uid]


@dataclasses.dataclass(frozen=True)
class Vetted:
    """A registration as the daemon takes it.

    Attributes:
        registration: the claimed one, with its range clamped where the site or Slurm says otherwise.
        notes: what was clamped and why (sent back in the reply and logged); empty when nothing was.
    """

    registration: Registration
    notes: tuple[str, ...]


def slurm_workers(records: Sequence[JobRecord], gpus_per_worker: int) -> int:
    """Workers the job's own allocation holds as Slurm says (its GPUs / GPUs per worker); 0 when unknown.

    An elastic job's own allocation (amoeba-sbatch's component 1, or the job itself with the SPANK plugin) holds its
    minimum workers; satellites are jobs of their own and are not among ``records``.
    """
    gpus = sum(record.gpus_held for record in records)
    return gpus // gpus_per_worker if gpus_per_worker > 0 else 0


def check_submitted(reg: Registration, submitted: Submitted) -> tuple[int, list[str]]:
    """The minimum Slurm recorded for the job, and notes on a claim that differs from it.

    In amoeba-sbatch's shape (:attr:`Submitted.workers`) the minimum is component 1's task count and the GPUs per
    worker its GPUs per task; a claimed minimum that differs is replaced by Slurm's (noted); claimed GPUs per worker
    that differ are refused (the policy would count every satellite wrong). A job of one component is checked
    for its GPUs per task only, when it gave them; a heterogeneous job of another shape is refused.

    Returns:
        The minimum to take (the claim where Slurm's record does not say), and the notes.

    Raises:
        LimitError: GPUs per worker that disagree with Slurm's record, or a heterogeneous job that is not an elastic
            job's shape.
    """
    workers = submitted.workers
    if workers is None and len(submitted.components) > 1:
        raise LimitError(
            f"job {reg.job_id} is a heterogeneous job of {len(submitted.components)} components, not an elastic job "
            "as amoeba-sbatch submits it (component 0: the agent, without GPUs; component 1: the minimum workers); "
            "the daemon does not manage it"
        )
    component = workers or submitted.components[0]
    if component.gpus_per_task and component.gpus_per_task != reg.gpus_per_worker:
        raise LimitError(
            f"job {reg.job_id} claims {reg.gpus_per_worker} GPU(s) per worker, but Slurm's record of its workers "
            f"says {component.gpus_per_task} (--gpus-per-task of component {component.offset}); the daemon does not "
            "manage it"
        )
    if workers is None or workers.tasks == reg.min_workers:
        return reg.min_workers, []
    note = (
        f"min_workers set from {reg.min_workers} to {workers.tasks}: Slurm's record of job {reg.job_id} (component 1, "
        f"--ntasks={workers.tasks}) says so"
    )
    return workers.tasks, [note]


def vet_registration(
    reg: Registration, records: Sequence[JobRecord], limits: Limits, submitted: Submitted | None = None
) -> Vetted:
    """Check an agent's claimed worker range against the site's caps and Slurm's record of the job.

    * The minimum and GPUs per worker are Slurm's where its record of the submission says
      (:func:`check_submitted`).
    * The minimum is at most what the job's own allocation holds (Slurm's GPUs of the job); a claim above it is
      clamped to it: every worker beyond it is a satellite in the preemptible partition, and a job that claimed them
      as its minimum would keep them from the policy's shrinks. A lower claim stands (the agent refuses a shrink
      below its own minimum, and the policy learns it from the refusal).
    * The maximum is at most the cap for the job's user and account (:meth:`Limits.worker_cap`); above it, clamped.

    Args:
        reg: the agent's registration.
        records: Slurm's active records of the job (one per heterogeneous component).
        limits: the site's limits.
        submitted: Slurm's record of the job's submission (None: not available, e.g. a test's fake Slurm).

    Returns:
        The registration as taken, and what was clamped.

    Raises:
        LimitError: the job's own allocation already holds more workers than the cap allows, or the claim
            disagrees with Slurm's record in a way no clamp fixes (:func:`check_submitted`).
    """
    first = min(records, key=lambda r: r.het_job_offset)
    cap, setting = limits.worker_cap(first.uid, first.account)
    notes: list[str] = []
    low, high = reg.min_workers, reg.max_workers
    if submitted is not None:
        low, notes = check_submitted(reg, submitted)
    held = slurm_workers(records, reg.gpus_per_worker)
    if held and low > held:
        notes.append(
            f"min_workers clamped from {low} to {held}: Slurm's allocation of job {reg.job_id} holds "
            f"{held} worker(s) of {reg.gpus_per_worker} GPU(s)"
        )
        low = held
    if low > cap:
        raise LimitError(
            f"job {reg.job_id} runs with at least {low} workers, over this site's cap of {cap} ({setting} in "
            f"amoebad.yaml); the daemon does not manage it: resubmit with --elastic MIN:MAX within {cap}"
        )
    if high > cap:
        notes.append(f"max_workers clamped from {high} to {cap} ({setting} in amoebad.yaml)")
        high = cap
    if high < low:
        notes.append(f"max_workers raised from {high} to {low}, the job's minimum")
        high = low
    return Vetted(dataclasses.replace(reg, min_workers=low, max_workers=high), tuple(notes))
