"""Invariants every set of decisions must keep, checked in one place.

Both callers of a policy run :func:`check_decisions` before acting (the daemon before sending directives, the
simulator before applying them), and the policy tests run it on random snapshots. A violation is a bug in a policy,
so it raises :class:`~slurm_amoeba.policy.types.PolicyError` with the offending job and numbers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from slurm_amoeba.policy.types import Decision, JobInfo, JobPhase, PolicyError, Snapshot


def check_decisions(snapshot: Snapshot, decisions: Sequence[Decision]) -> None:
    """Raise if applying ``decisions`` to ``snapshot`` would break an invariant.

    The invariants: every decision names a job of the snapshot, at most once; no job is sized outside
    ``min_workers..max_workers`` (0 preempts); a non-elastic, pinned, resizing or sharing job is never resized;
    a placement names known nodes and adds up to the size; no node and no cluster ends up with more GPUs held
    than it has; a sharing job shares with a job that runs exclusively afterwards, on a subset of its nodes, one
    sharer per job.

    Args:
        snapshot: the cluster the decisions were made for.
        decisions: the policy's answer.

    Raises:
        PolicyError: the first broken invariant, named with the job and the numbers.
    """
    jobs = {job.job_id: job for job in snapshot.jobs}
    nodes = {node.name: node for node in snapshot.nodes}
    seen: set[str] = set()
    free = {name: node.gpus_free for name, node in nodes.items()}
    unplaced_gpus = 0
    for decision in decisions:
        job = jobs.get(decision.job_id)
        if job is None:
            raise PolicyError(f"decision for job {decision.job_id!r}, which is not in the snapshot")
        if decision.job_id in seen:
            raise PolicyError(f"two decisions for job {decision.job_id!r}; a policy answers once per job")
        seen.add(decision.job_id)
        _check_size(job, decision)
        placement = dict(decision.placement)
        for name, count in placement.items():
            if name not in nodes:
                raise PolicyError(f"job {job.job_id}: placement names node {name!r}, which is not in the snapshot")
            if count <= 0:
                raise PolicyError(f"job {job.job_id}: placement puts {count} workers on node {name}")
        if placement and sum(placement.values()) != decision.workers:
            raise PolicyError(
                f"job {job.job_id}: placement {placement} holds {sum(placement.values())} workers, "
                f"not the decided {decision.workers}"
            )
        if job.shared_with is None:
            for name, count in job.placement.items():
                if name in free:
                    free[name] += count * job.gpus_per_worker
            if not job.placement:
                unplaced_gpus -= job.gpus
        if decision.share_with is None:
            for name, count in placement.items():
                free[name] -= count * job.gpus_per_worker
            if not placement:
                unplaced_gpus += decision.workers * job.gpus_per_worker
    for name, left in free.items():
        if left < 0:
            raise PolicyError(
                f"node {name} would hold {nodes[name].gpus_total - left} GPUs after these decisions "
                f"but has {nodes[name].gpus_total}"
            )
    if unplaced_gpus > sum(free.values()):
        raise PolicyError(
            f"the decisions ask for {unplaced_gpus} GPUs without a placement but only {sum(free.values())} "
            f"would be free"
        )
    _check_sharing(jobs, {decision.job_id: decision for decision in decisions})


def _check_size(job: JobInfo, decision: Decision) -> None:
    if decision.workers == 0:
        if job.state is JobPhase.PENDING:
            raise PolicyError(f"job {job.job_id} is pending and cannot be preempted (decision for 0 workers)")
        return
    resized = job.state is JobPhase.RUNNING and decision.workers != job.workers
    if resized and not job.is_elastic:
        raise PolicyError(f"job {job.job_id} is not elastic and cannot be resized to {decision.workers} workers")
    if not job.min_workers <= decision.workers <= job.max_workers:
        raise PolicyError(
            f"job {job.job_id}: {decision.workers} workers lies outside its range {job.min_workers}:{job.max_workers}"
        )
    if resized and (job.pinned or job.resizing or job.shared_with is not None):
        why = "pinned by an operator" if job.pinned else "still resizing" if job.resizing else "sharing GPUs"
        raise PolicyError(f"job {job.job_id} is {why} and cannot be resized to {decision.workers} workers")


def _check_sharing(jobs: dict[str, JobInfo], decided: dict[str, Decision]) -> None:
    def final(job_id: str) -> tuple[int, Mapping[str, int], str | None]:
        decision = decided.get(job_id)
        if decision is not None:
            return decision.workers, decision.placement, decision.share_with
        job = jobs[job_id]
        return job.workers, job.placement, job.shared_with

    sharers = [key for key, decision in decided.items() if decision.share_with is not None]
    sharers += [job.job_id for job in jobs.values() if job.shared_with is not None and job.job_id not in decided]
    partners: Counter[str] = Counter()
    for job_id in sharers:
        workers, placement, share_with = final(job_id)
        if share_with is None or workers == 0:
            continue
        if share_with not in jobs or final(share_with)[0] == 0:
            raise PolicyError(f"job {job_id} shares the GPUs of {share_with!r}, which does not run")
        _, target_placement, target_share = final(share_with)
        if target_share is not None:
            raise PolicyError(f"job {job_id} shares with {share_with}, which itself shares another job's GPUs")
        for name, count in placement.items():
            held = target_placement.get(name, 0)
            if count * jobs[job_id].gpus_per_worker > held * jobs[share_with].gpus_per_worker:
                raise PolicyError(
                    f"job {job_id} shares with {share_with} but puts {count} workers on node {name}, "
                    f"where {share_with} holds {held}"
                )
        partners[share_with] += 1
        if partners[share_with] > 1:
            raise PolicyError(f"job {share_with} would share its GPUs with more than one job")
