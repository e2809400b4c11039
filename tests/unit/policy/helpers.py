"""Small builders for hand-written policy scenarios."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slurm_amoeba.policy import Action, JobInfo, JobPhase, NodeInfo, Place, Preempt, Resize, Share, Snapshot, Start


def job(
    job_id: str,
    requested: int,
    *,
    placement: Mapping[str, int] | None = None,
    low: int | None = None,
    high: int | None = None,
    submit: float = 0.0,
    **extra: Any,
) -> JobInfo:
    """A job; running when ``placement`` is given, with range ``low..high`` (default: fixed at ``requested``)."""
    placement = dict(placement or {})
    return JobInfo(
        job_id=job_id,
        state=JobPhase.RUNNING if placement else JobPhase.PENDING,
        submit_time=submit,
        requested_workers=requested,
        min_workers=requested if low is None else low,
        max_workers=requested if high is None else high,
        workers=sum(placement.values()),
        placement=placement,
        **extra,
    )


def snapshot(node_gpus: Sequence[int], jobs: Sequence[JobInfo], **extra: Any) -> Snapshot:
    """Nodes ``n0, n1, ...`` with the given GPU counts; free GPUs are what the running jobs leave."""
    used: dict[str, int] = {}
    for info in jobs:
        if info.shared_with is None:
            for name, count in info.placement.items():
                used[name] = used.get(name, 0) + count * info.gpus_per_worker
    nodes = tuple(NodeInfo(f"n{i}", total, total - used.get(f"n{i}", 0)) for i, total in enumerate(node_gpus))
    return Snapshot(nodes, tuple(jobs), **extra)


def sizes(actions: Sequence[Action]) -> dict[str, int]:
    """job id -> its size after the action (0: preempted), for the actions that size a job."""
    return {
        action.job_id: action.workers
        for action in actions
        if isinstance(action, (Start, Resize, Preempt, Place, Share))
    }


#: The actions that give a job a size and placement (the ones tests read ``workers`` and ``placement`` of).
Sized = Start | Resize | Preempt | Place | Share


def sized(actions: Sequence[Action]) -> list[Sized]:
    """The actions, each checked to be one that sizes a job."""
    result: list[Sized] = []
    for action in actions:
        assert isinstance(action, (Start, Resize, Preempt, Place, Share)), f"{action} does not size a job"
        result.append(action)
    return result
