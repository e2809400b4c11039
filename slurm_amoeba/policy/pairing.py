"""Which two jobs share GPUs, with which sub-batch, and when a sharer must go: the one pairing code.

The sharing policies (:mod:`slurm_amoeba.policy.sharing`) call it from ``decide``, so the daemon and the simulator
(DESIGN.md, the control and simulation flows) pair jobs by the same rules; the simulator's engine also takes the
speeds of a paced pair from :func:`paced_fractions`. Everything here is a pure function of
:class:`~slurm_amoeba.policy.types.JobInfo`/:class:`~slurm_amoeba.policy.types.NodeInfo` values.

- **What a job keeps beside a partner** (:func:`kept_fraction`): its own measured rates, solo and beside a job of
  the partner's type (``JobInfo.solo_rate``, ``JobInfo.shared_rates``), when the runtime reported both; otherwise
  the prior, ``Snapshot.colocation`` (Gavel's measured co-location table in the simulator); otherwise unknown.
- **The benefit rule** (SJF-BSBF, Ye et al., arXiv 2407.13088; :func:`sharing_benefit`): share only when the pair's
  summed completion time together is lower than one after the other.
- **The sub-batch search** (:func:`fitting_micro_batches`, :func:`plan_pair`): the sharer runs a micro-batch and
  gradient accumulation that keep its global batch (``JobInfo.micro_batches``); only micro-batches whose memory fits
  what the host leaves on the device (``NodeInfo.gpu_memory_gib - host.memory_gib``) are tried, and the one of
  largest benefit is taken. A sharer without profiles keeps its own micro-batch (:func:`sharer_options`).
- **Opportunistic pacing** (AntMan, OSDI'20; :func:`paced_fractions`): the sharer yields computation so that the
  host keeps at least ``1 - bound`` of its exclusive speed; its own slowdown grows accordingly.
- **Reclaiming** (:func:`reclaims`): a sharer that no longer fits the memory its host leaves shrinks its
  sub-batch, or leaves when none fits; a paced sharer whose host measurably keeps less than its bound leaves.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Mapping, Sequence

from slurm_amoeba.policy.actions import Action, Preempt, Share
from slurm_amoeba.policy.types import JobInfo, MicroBatch, NodeInfo, PolicyError, Snapshot


class ShareMode(str, enum.Enum):
    """How a sharing policy pairs a waiting job with a running one.

    ``BENEFIT``: SJF-BSBF's rule; both jobs run at their co-located speeds, and the pair is formed only when the
    summed completion time falls. ``OPPORTUNISTIC``: AntMan's; the running job is guaranteed its speed within a
    bound, the sharer is paced and takes what is left, formed whenever the sharer makes progress.
    """

    BENEFIT = "benefit"
    OPPORTUNISTIC = "opportunistic"


def kept_fraction(job: JobInfo, partner_type: str, prior: Mapping[tuple[str, str], float]) -> float | None:
    """The fraction of its solo speed ``job`` keeps beside a job of ``partner_type``.

    Args:
        job: the job.
        partner_type: the partner's ``job_type``.
        prior: ``Snapshot.colocation``, used when the job's own speeds were not both measured.

    Returns:
        The job's ``shared_rates[partner_type] / solo_rate`` when both are measured (capped at 1), else the
        prior's entry, else ``None``.

    Raises:
        PolicyError: a prior entry lies outside (0, 1].
    """
    shared = job.shared_rates.get(partner_type)
    if shared is not None and job.solo_rate is not None and job.solo_rate > 0.0 and shared > 0.0:
        return min(1.0, shared / job.solo_rate)
    kept = prior.get((job.job_type, partner_type))
    if kept is not None and not 0.0 < kept <= 1.0:
        raise PolicyError(
            f"co-location factor {kept} for {job.job_type} beside {partner_type} must lie in (0, 1]; fix the table"
        )
    return kept


def sharing_benefit(mine: float, partner: float, keep_mine: float, keep_partner: float) -> float:
    """Seconds of summed completion time saved by running two jobs together instead of one after the other.

    One after the other, the running partner finishes after ``partner`` seconds and the new job after
    ``partner + mine``. Together, both run at their co-located speeds until the first finishes; the other then runs
    alone.

    Args:
        mine: remaining seconds of the new job alone.
        partner: remaining seconds of the running job alone.
        keep_mine: fraction of its speed the new job keeps while sharing (0, 1].
        keep_partner: fraction of its speed the running job keeps while sharing (0, 1].

    Returns:
        The saving; negative when sharing is worse.
    """
    sequential = partner + (partner + mine)
    t_partner = partner / keep_partner
    t_mine = mine / keep_mine
    if t_partner <= t_mine:
        first = t_partner
        second = first + (mine - keep_mine * first)
    else:
        first = t_mine
        second = first + (partner - keep_partner * first)
    return sequential - (first + second)


def growth_gain(workers: int, beside: int, keep: float) -> float:
    """How many times faster a running data-parallel job trains once ``beside`` more workers run beside a host.

    The runtime splits every step evenly over the workers, so a step takes as long as its slowest worker: with its
    new workers at a fraction ``keep`` of a worker's exclusive speed, every worker steps at that pace.

    Args:
        workers: the job's workers now (on GPUs of its own).
        beside: the workers it would add beside the host.
        keep: the fraction of its exclusive speed each of those keeps (paced, sub-batch included).

    Returns:
        ``(workers + beside) * min(1, keep) / workers``; above 1 only when ``keep > workers / (workers + beside)``.
    """
    return (workers + beside) * min(1.0, keep) / workers


def growth_benefit(mine: float, theirs: float, gain: float, keep_host: float) -> float:
    """Seconds of summed completion time saved when a running job grows beside a host: it trains ``gain`` times as
    fast (:func:`growth_gain`) and the host at ``keep_host`` of its speed until the first of them ends; the other
    then runs as before.

    Args:
        mine: the growing job's remaining seconds at its size now.
        theirs: the host's remaining seconds.
        gain: the growing job's speed-up (below 1: it slows down).
        keep_host: the host's fraction of its speed while shared.

    Returns:
        The saving against both going on apart; negative when the pair is worse.
    """
    t_mine, t_host = mine / gain, theirs / keep_host
    if t_host <= t_mine:
        mine_done = t_host + (mine - gain * t_host)
        return mine + theirs - (t_host + mine_done)
    host_done = t_mine + (theirs - keep_host * t_mine)
    return mine + theirs - (t_mine + host_done)


def paced_fractions(keep_host: float, keep_sharer: float, bound: float) -> tuple[float, float]:
    """The speeds a pair keeps when the sharer paces itself so that the host loses at most ``bound``.

    The sharer runs a fraction ``d`` of the time it would run unpaced; the pair's speeds move on the line from
    (host alone, sharer stopped) to (both co-located): the host keeps ``1 - d * (1 - keep_host)`` and the sharer
    ``d * keep_sharer``. This is the least either can keep when the sharer yields (the measured frontier of two
    jobs on a GPU lies on or above that line), so the host's guarantee holds and the sharer's speed is not
    overstated.

    Args:
        keep_host: fraction of its speed the host keeps co-located, unpaced (0, 1].
        keep_sharer: fraction the sharer keeps co-located, unpaced (0, 1].
        bound: the host's allowed slowdown, in [0, 1).

    Returns:
        (host's fraction, sharer's fraction).

    Raises:
        PolicyError: ``bound`` lies outside [0, 1).
    """
    if not 0.0 <= bound < 1.0:
        raise PolicyError(f"pace bound {bound} must lie in [0, 1) (0.05: the host keeps 95% of its speed)")
    if keep_host >= 1.0 - bound:
        return keep_host, keep_sharer
    duty = bound / (1.0 - keep_host)
    return 1.0 - bound, duty * keep_sharer


@dataclasses.dataclass(frozen=True, slots=True)
class PairPlan:
    """A waiting job placed on a running job's GPUs.

    Attributes:
        host: the running job.
        sub_batch: the sharer's micro-batch (a key of its ``micro_batches``); ``None``: its own.
        accumulation: the sharer's micro-steps per optimizer step with it; ``None`` with ``sub_batch``.
        keep_sharer: fraction of its solo speed (at its own micro-batch) the sharer keeps, sub-batch included.
        keep_host: fraction of its solo speed the host keeps.
        benefit: seconds of summed completion time saved (``BENEFIT``), or ``keep_sharer`` (``OPPORTUNISTIC``).
    """

    host: JobInfo
    sub_batch: int | None
    accumulation: int | None
    keep_sharer: float
    keep_host: float
    benefit: float


def memory_left(host: JobInfo, nodes: Mapping[str, NodeInfo]) -> float | None:
    """Device memory a sharer may use on the host's GPUs (GiB): the smallest over its nodes.

    Args:
        host: the running job.
        nodes: node name -> node.

    Returns:
        ``gpu_memory_gib - host.memory_gib`` on the host's tightest node; ``None`` when no node states its memory
        (nothing bounds a sharer); 0 when the host's own use is unknown on a node that states it.
    """
    sizes = [nodes[name].gpu_memory_gib for name in host.placement if name in nodes]
    known = [size for size in sizes if size is not None]
    if not known:
        return None
    if host.memory_gib is None:
        return 0.0
    return max(0.0, min(known) - host.memory_gib)


def fitting_micro_batches(sharer: JobInfo, left_gib: float | None) -> list[tuple[int, MicroBatch]]:
    """The sharer's micro-batches that fit ``left_gib``, largest first.

    Args:
        sharer: the job that would join.
        left_gib: memory the host leaves (:func:`memory_left`); ``None``: unbounded.

    Returns:
        (micro-batch, profile) pairs.
    """
    return sorted(
        (
            (size, profile)
            for size, profile in sharer.micro_batches.items()
            if left_gib is None or profile.memory_gib <= left_gib
        ),
        key=lambda item: -item[0],
    )


def sharer_options(sharer: JobInfo, left_gib: float | None) -> list[tuple[int | None, MicroBatch]]:
    """The micro-batches :func:`plan_pair` tries for a sharer: its profiles that fit (:func:`fitting_micro_batches`),
    or, for a sharer without profiles (the live daemon knows none), its own micro-batch (``None``) at full speed,
    where the memory it uses (when known) fits ``left_gib`` and the host leaves some."""
    if sharer.micro_batches:
        return list(fitting_micro_batches(sharer, left_gib))
    used = sharer.memory_gib
    if left_gib is not None and (left_gib <= 0.0 or (used is not None and used > left_gib)):
        return []
    return [(None, MicroBatch(1.0, used or 0.0, 1))]


def remaining_seconds(job: JobInfo, workers: int | None = None) -> float | None:
    """Seconds left at a size (the requested one by default): the oracle's or the runtime's estimate
    (:meth:`JobInfo.remaining_time`), else what the time limit leaves, else ``None``."""
    remaining = job.remaining_time(workers)
    if remaining is None and job.time_limit is not None:
        remaining = max(job.time_limit - job.executed_time, 0.0)
    return remaining


def plan_pair(
    sharer: JobInfo,
    hosts: Sequence[JobInfo],
    snapshot: Snapshot,
    mode: ShareMode,
    pace_bound: float = 0.0,
) -> PairPlan | None:
    """The best host and sub-batch for a waiting job, or ``None`` when no pair pays (or fits).

    A host qualifies when it has as many GPUs per worker and at least as many workers as the sharer asks for, and
    both keep-fractions are known (:func:`kept_fraction`). For each host every fitting micro-batch is tried; in
    ``BENEFIT`` mode the pair's :func:`sharing_benefit` must be positive and the largest wins, in
    ``OPPORTUNISTIC`` mode the sharer's paced speed (:func:`paced_fractions`) must be positive and the largest
    wins. A running sharer that grows beside the host (``grows_beside``) must train faster than it does now
    (:func:`growth_gain` above 1: its steps are split evenly, so the workers beside the host set every step's pace),
    and in ``BENEFIT`` mode the pair's :func:`growth_benefit` must be positive. Ties go to the earlier host and the
    larger micro-batch.

    Args:
        sharer: the waiting job.
        hosts: running jobs that run exclusively and have no sharer, in the order to prefer on ties.
        snapshot: the cluster (its nodes' memory and the co-location prior).
        mode: the pairing rule.
        pace_bound: the host's allowed slowdown in ``OPPORTUNISTIC`` mode.

    Returns:
        The plan.
    """
    nodes = {node.name: node for node in snapshot.nodes}
    mine = remaining_seconds(sharer, sharer.workers if sharer.grows_beside else None)
    if mode is ShareMode.BENEFIT and mine is None:
        return None  # the benefit cannot be known without the sharer's remaining time
    best: PairPlan | None = None
    for host in hosts:
        if host.gpus_per_worker != sharer.gpus_per_worker or host.workers < sharer.requested_workers:
            continue
        keep_mine = kept_fraction(sharer, host.job_type, snapshot.colocation)
        keep_host = kept_fraction(host, sharer.job_type, snapshot.colocation)
        if keep_mine is None or keep_host is None:
            continue
        theirs = remaining_seconds(host, host.workers)
        if mode is ShareMode.BENEFIT and theirs is None:
            continue
        if mode is ShareMode.OPPORTUNISTIC:
            keep_host, keep_mine = paced_fractions(keep_host, keep_mine, pace_bound)
        for size, profile in sharer_options(sharer, memory_left(host, nodes)):
            keep = keep_mine * profile.speed
            if sharer.grows_beside:  # it runs already: it must train faster with the workers beside the host
                gain = growth_gain(sharer.workers, sharer.requested_workers, keep)
                if mode is ShareMode.OPPORTUNISTIC or mine is None or theirs is None:
                    score = gain - 1.0
                else:
                    score = growth_benefit(mine, theirs, gain, keep_host)
            elif mode is ShareMode.OPPORTUNISTIC or mine is None or theirs is None:  # both known under BENEFIT
                score = keep
            else:
                score = sharing_benefit(mine, theirs, keep, keep_host)
            if score > 0.0 and (best is None or score > best.benefit):
                accumulation = None if size is None else profile.accumulation
                best = PairPlan(host, size, accumulation, keep, keep_host, score)
    return best


def reclaims(snapshot: Snapshot, pace_bound: float | None) -> list[Action]:
    """What the running sharers must give back to their hosts now.

    A sharer whose memory no longer fits what its host leaves (the host grew its own use) gets a :class:`Share`
    with the largest micro-batch that fits, or a :class:`Preempt` when none does (it waits again). With
    ``pace_bound``, a sharer whose host measured (``solo_rate`` and ``shared_rates``) keeps less than
    ``1 - pace_bound`` of its speed leaves too.

    Args:
        snapshot: the cluster now.
        pace_bound: the hosts' guaranteed bound (opportunistic sharing); ``None`` checks memory only.

    Returns:
        One action per sharer that must shrink or leave.
    """
    nodes = {node.name: node for node in snapshot.nodes}
    jobs = snapshot.by_id()
    actions: list[Action] = []
    for sharer in snapshot.running():
        host = jobs.get(sharer.shared_with or "")
        if host is None:
            continue
        if pace_bound is not None:
            measured = host.shared_rates.get(sharer.job_type)
            if measured is not None and host.solo_rate and measured / host.solo_rate < 1.0 - pace_bound:
                kept = measured / host.solo_rate
                actions.append(
                    Preempt(
                        sharer.job_id,
                        f"evicted: host {host.job_id} kept {kept:.0%} of its speed, below its {1 - pace_bound:.0%}",
                    )
                )
                continue
        left = memory_left(host, nodes)
        if left is None or host.memory_gib is None or sharer.memory_gib is None or sharer.memory_gib <= left + 1e-9:
            continue
        fitting = fitting_micro_batches(sharer, left)
        if not fitting:
            actions.append(
                Preempt(sharer.job_id, f"evicted: host {host.job_id} needs its memory back ({left:.1f} GiB left)")
            )
            continue
        size, profile = fitting[0]
        actions.append(
            Share(
                sharer.job_id,
                host.job_id,
                sharer.workers,
                dict(sharer.placement),
                f"shrinks to micro-batch {size} x {profile.accumulation}: host {host.job_id} needs its memory back",
                sub_batch=size,
                accumulation=profile.accumulation,
                pace_bound=pace_bound,
            )
        )
    return actions


def open_hosts(snapshot: Snapshot, decided: Collection[str]) -> list[JobInfo]:
    """The running jobs a waiting job may share with: on GPUs of their own, without a sharer, not ``decided`` in
    this answer; in submit order (the order ties are broken in)."""
    hosting = {job.shared_with for job in snapshot.jobs if job.shared_with is not None}
    return [
        job
        for job in sorted(snapshot.running(), key=lambda j: (j.submit_time, j.job_id))
        if job.shared_with is None and job.job_id not in hosting and job.job_id not in decided
    ]


def placement_within(host: JobInfo, workers: int) -> dict[str, int]:
    """The first ``workers`` of the host's workers, node by node: where a sharer of that size runs."""
    result: dict[str, int] = {}
    left = workers
    for name, count in host.placement.items():
        if left == 0:
            break
        take = min(count, left)
        result[name] = take
        left -= take
    return result
