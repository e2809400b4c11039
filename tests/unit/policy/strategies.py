"""Hypothesis strategies for random but consistent cluster snapshots (nodes, running and pending jobs)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from slurm_amoeba.policy import JobInfo, JobPhase, NodeInfo, Snapshot

JOB_TYPES = ("a", "b", "c")


@st.composite
def snapshots(draw: st.DrawFn, max_nodes: int = 6, max_jobs: int = 12) -> Snapshot:
    """A snapshot whose node free counts agree with the placements of its running jobs."""
    node_count = draw(st.integers(1, max_nodes))
    totals = [draw(st.integers(1, 8)) for _ in range(node_count)]
    names = [f"n{i}" for i in range(node_count)]
    free = dict(zip(names, totals, strict=True))
    # GPUs held by work the policy does not manage (the daemon sees them in sinfo).
    for name in names:
        free[name] -= draw(st.integers(0, free[name] // 2))
    jobs: list[JobInfo] = []
    hosts: list[JobInfo] = []
    for index in range(draw(st.integers(0, max_jobs))):
        low = draw(st.integers(1, 4))
        high = draw(st.integers(low, low + 6))
        requested = draw(st.integers(low, high))
        gpw = draw(st.sampled_from((1, 1, 1, 2)))
        sizes = range(low, high + 1)
        rates = {size: float(size) ** draw(st.floats(0.3, 1.0)) for size in sizes} if draw(st.booleans()) else {}
        common: dict[str, Any] = {
            "job_id": f"j{index}",
            "submit_time": draw(st.floats(0, 10_000)),
            "requested_workers": requested,
            "min_workers": low,
            "max_workers": high,
            "gpus_per_worker": gpw,
            "throughput": rates,
            "remaining_work": draw(st.one_of(st.none(), st.floats(1, 100_000))),
            "priority": draw(st.integers(0, 3)),
            "attained_service": draw(st.sampled_from((0.0, 1000.0, 16 * 3600.0, 100_000.0))),
            "job_type": draw(st.sampled_from(JOB_TYPES)),
            "pinned": draw(st.integers(0, 9)) == 0,
            "resizing": draw(st.integers(0, 9)) == 0,
        }
        running = draw(st.booleans())
        placement: dict[str, int] = {}
        if running:
            size = draw(st.sampled_from(list(sizes)))
            need = size
            for name in names:
                take = min(free[name] // gpw, need)
                if take > 0:
                    placement[name] = take
                    need -= take
            if need > 0:
                placement = {}
        guest_of = None
        if running and not placement and hosts and draw(st.booleans()):
            host = draw(st.sampled_from(hosts))
            if host.gpus_per_worker == gpw and host.workers >= low:
                size = draw(st.integers(low, min(high, host.workers)))
                placement, left = {}, size
                for name, count in host.placement.items():
                    take = min(count, left)
                    if take:
                        placement[name] = take
                        left -= take
                guest_of = host.job_id
                hosts.remove(host)
        if placement and guest_of is None:
            for name, count in placement.items():
                free[name] -= count * gpw
        job = JobInfo(
            state=JobPhase.RUNNING if placement else JobPhase.PENDING,
            workers=sum(placement.values()),
            placement=placement,
            shared_with=guest_of,
            **common,
        )
        if placement and guest_of is None:
            hosts.append(job)
        jobs.append(job)
    nodes = tuple(NodeInfo(name, total, free[name]) for name, total in zip(names, totals, strict=True))
    colocation = {(a, b): draw(st.floats(0.1, 1.0)) for a in JOB_TYPES for b in JOB_TYPES}
    return Snapshot(nodes, tuple(jobs), colocation)
