"""The daemon's observer: Slurm's view plus the agents' reports -> the policy's :class:`Snapshot`.

First step of DESIGN.md's control flow. :func:`observe` takes one consistent-enough picture of the cluster
(``squeue --json`` and ``sinfo --json`` through the Slurm layer); :func:`build_snapshot` is a pure function that
turns it, with the registered agents, into the policy's typed snapshot:

- every job the daemon manages (a registered agent whose Slurm job runs) is elastic, sized as its agent reports,
  placed where Slurm says its own allocation and its **satellites** hold GPUs, and marked ``resizing`` while a
  resize is in flight (the agent's target differs from its size, the daemon ordered one that has not arrived, a
  satellite is still pending, or the agent has not reported lately) so that no policy re-orders it;
- every other job that holds GPUs is a fixed-size running job; every job that waits for GPUs in a regular partition
  is a pending fixed-size job (the ones elastic extras make room for);
- satellites whose parent is gone are **orphans**; satellites the parent's agent does not list are **unclaimed**.

Counting: a worker of a managed job holds ``gpus_per_worker`` GPUs; other jobs are counted in GPUs (one "worker"
per GPU), which is all the policies need of them.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from slurm_amoeba.daemon.agents import AgentRecord
from slurm_amoeba.policy import JobInfo, JobPhase, NodeInfo, Snapshot
from slurm_amoeba.slurm import JobRecord, NodeRecord
from slurm_amoeba.slurm import JobState as SlurmState
from slurm_amoeba.slurm.satellite import PARENT_COMMENT_PREFIX, parse_satellite_name

SATELLITE_COMMENT = re.compile(rf"(?:^|[\s,;]){re.escape(PARENT_COMMENT_PREFIX)}(?P<parent>[0-9]+)(?:$|[\s,;])")
#: Pending reasons of jobs that cannot start whatever GPUs are free (no point making room for them).
BLOCKED_REASONS = frozenset(
    {
        "JobHeldUser",
        "JobHeldAdmin",
        "Dependency",
        "DependencyNeverSatisfied",
        "BeginTime",
        "PartitionDown",
        "PartitionInactive",
        "PartitionTimeLimit",
        "AssocGrpGRES",
        "QOSMaxGRESPerUser",
    }
)
#: A satellite submitted this long before a report that does not list it is "unclaimed" (reports race submits).
UNCLAIMED_MARGIN_S = 10.0


class ClusterSource(Protocol):
    """What the observer needs of Slurm (:class:`~slurm_amoeba.slurm.CliSlurmClient` has it)."""

    def jobs(self) -> list[JobRecord]:
        """Every job Slurm remembers."""
        ...

    def nodes(self) -> list[NodeRecord]:
        """Every node."""
        ...


@dataclasses.dataclass(frozen=True)
class ClusterView:
    """Slurm's jobs and nodes, read at one moment.

    Attributes:
        jobs: every job Slurm remembers (finished ones included, for ``MinJobAge``).
        nodes: every node.
        taken_at: when it was read (the daemon's clock).
    """

    jobs: tuple[JobRecord, ...]
    nodes: tuple[NodeRecord, ...]
    taken_at: float

    def active_groups(self) -> dict[str, list[JobRecord]]:
        """Active jobs grouped by job id (a heterogeneous job's components under their leader's id); a fresh copy."""
        return {key: list(records) for key, records in self._groups.items()}

    def active_job(self, job_id: str) -> list[JobRecord]:
        """The active records of one job (empty when it is not active); cheap, for each registration."""
        return list(self._groups.get(job_id, ()))

    @functools.cached_property
    def _groups(self) -> dict[str, tuple[JobRecord, ...]]:
        groups: dict[str, list[JobRecord]] = {}
        for record in self.jobs:
            if record.state.is_active():
                groups.setdefault(group_id(record), []).append(record)
        return {key: tuple(records) for key, records in groups.items()}


def observe(source: ClusterSource, now: float) -> ClusterView:
    """Read Slurm's jobs and nodes.

    Args:
        source: the Slurm client.
        now: the daemon's clock.

    Returns:
        The view.

    Raises:
        SlurmCommandError: a command failed or timed out.
        ParseError: its output made no sense.
    """
    nodes = source.nodes()
    jobs = source.jobs()
    return ClusterView(tuple(jobs), tuple(nodes), now)


def group_id(record: JobRecord) -> str:
    """The id a job is known by: its heterogeneous leader's id, or its own."""
    return str(record.het_job_id or record.job_id)


def satellite_parent(record: JobRecord) -> str | None:
    """The parent job id of a satellite (``amoeba-sat-<parent>-<group>``, comment ``amoeba-parent=<parent>``).

    The name is the agent's (:func:`slurm_amoeba.agent.groups.satellite_name`); a job whose name says satellite but
    whose comment names another parent is not taken for a satellite.

    Returns:
        The parent's id, or None when the job is not a satellite.
    """
    parsed = parse_satellite_name(record.name)
    if parsed is None:
        return None
    parent = parsed[0]
    comment = SATELLITE_COMMENT.search(record.comment or "")
    if comment is not None and comment.group("parent") != parent:
        return None
    return parent


@dataclasses.dataclass(frozen=True)
class SatelliteInfo:
    """A satellite job as the daemon reports it (orphans, unclaimed ones).

    Attributes:
        job_id: the satellite's Slurm id.
        parent: its parent job's id.
        user: its owner.
        state: its Slurm state.
        nodes: where it runs.
        gpus: GPUs it holds.
    """

    job_id: str
    parent: str
    user: str
    state: str
    nodes: tuple[str, ...]
    gpus: int

    @classmethod
    def of(cls, record: JobRecord, parent: str) -> SatelliteInfo:
        """Describe ``record``, a satellite of ``parent``."""
        return cls(str(record.job_id), parent, record.user, record.state.value, record.nodes, record.gpus_held)

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {**dataclasses.asdict(self), "nodes": list(self.nodes)}


@dataclasses.dataclass(frozen=True)
class Observation:
    """The snapshot for the policy and what the daemon learned while building it.

    Attributes:
        snapshot: the policy's input.
        managed: job id -> the managed (registered, running) elastic jobs as the policy sees them.
        orphans: satellites whose parent job is gone.
        unclaimed: satellites whose parent's agent does not list them.
        gone: registered jobs Slurm no longer runs (the daemon forgets them).
        regular_running: fixed-size jobs holding GPUs.
        regular_pending: fixed-size jobs waiting for GPUs in a regular partition.
    """

    snapshot: Snapshot
    managed: Mapping[str, JobInfo]
    orphans: tuple[SatelliteInfo, ...]
    unclaimed: tuple[SatelliteInfo, ...]
    gone: tuple[str, ...]
    regular_running: int
    regular_pending: int


def _gpus_by_node(records: Iterable[JobRecord]) -> dict[str, int]:
    held: dict[str, int] = {}
    for record in records:
        if record.state is not SlurmState.RUNNING and record.state is not SlurmState.COMPLETING:
            continue
        for node, indices in zip(record.nodes, record.gpu_indices, strict=False):
            if indices:
                held[node] = held.get(node, 0) + len(indices)
    return held


def fit_placement(gpus_by_node: Mapping[str, int], gpus_per_worker: int, workers: int) -> dict[str, int]:
    """A placement of exactly ``workers`` workers, as close to where Slurm says the job holds GPUs as possible.

    While a resize is under way Slurm's allocations and the agent's size disagree for a moment; the policy needs a
    placement that adds up to the size, so extra nodes are dropped (smallest first) and missing workers are put on
    the node where the job holds most (or nowhere in particular: the first node named).

    Args:
        gpus_by_node: node -> GPUs the job (and its satellites) hold there.
        gpus_per_worker: GPUs per worker.
        workers: the size to place.

    Returns:
        node -> workers, summing to ``workers``.
    """
    placement = {node: gpus // gpus_per_worker for node, gpus in gpus_by_node.items() if gpus >= gpus_per_worker}
    total = sum(placement.values())
    for node in sorted(placement, key=lambda name: (placement[name], name)):
        if total <= workers:
            break
        take = min(placement[node], total - workers)
        placement[node] -= take
        total -= take
    placement = {node: count for node, count in placement.items() if count > 0}
    if total < workers:
        anchor = max(placement, key=lambda name: placement[name]) if placement else next(iter(gpus_by_node), "")
        if anchor:
            placement[anchor] = placement.get(anchor, 0) + workers - total
        else:
            return {}
    return placement


def _partitions(record: JobRecord) -> set[str]:
    return {part for part in record.partition.split(",") if part}


def build_snapshot(
    view: ClusterView,
    agents: Mapping[str, AgentRecord],
    *,
    pinned: Iterable[str],
    regular_partitions: Sequence[str],
    elastic_partition: str,
    stale_after_s: float,
    now: float,
    make_room_after_s: float = 0.0,
) -> Observation:
    """Turn Slurm's view and the agents' records into the policy's snapshot (see the module docstring).

    Two adjustments make the snapshot show the near future rather than the last second:

    - GPUs a managed job is **giving back** (Slurm still lists them for the job, but its agent reports a size that
      no longer needs them and is not growing: a satellite on its way out after a shrink or a preemption) are
      shown free, so that nobody else is shrunk for GPUs that are about to be free anyway;
    - a pending regular job younger than ``make_room_after_s`` asks only for what is free now: Slurm starts it or
      preempts elastic extras for it by itself at once, and the agents report that within seconds; the daemon
      makes room for it (shrinks elastic jobs) only if it is still waiting after that.

    Args:
        view: Slurm's jobs and nodes.
        agents: job id -> registered agent.
        pinned: ids of jobs an operator excluded from the policy.
        regular_partitions: partitions whose pending jobs count as waiting for GPUs.
        elastic_partition: the satellites' partition (its nodes are placeable too).
        stale_after_s: a managed job whose agent has not reported for this long is left alone.
        now: the daemon's clock (Unix seconds).
        make_room_after_s: see above; 0 makes room for every pending job at once.

    Returns:
        The observation.
    """
    pins = set(pinned)
    regular = set(regular_partitions)
    groups = view.active_groups()
    satellites: dict[str, list[JobRecord]] = {}
    orphans: list[SatelliteInfo] = []
    unclaimed: list[SatelliteInfo] = []
    for key in list(groups):
        records = groups[key]
        parent = satellite_parent(records[0]) if len(records) == 1 else None
        if parent is None:
            continue
        parent_records = groups.get(parent)
        if parent_records is None:
            orphans.append(SatelliteInfo.of(records[0], parent))
            continue  # stays a fixed-size job holding GPUs
        if parent in agents and agents[parent].uid == records[0].uid:
            satellites.setdefault(parent, []).append(records[0])
            del groups[key]
            report = agents[parent].report
            if (
                report is not None
                and key not in report.satellites
                and records[0].submit_time + UNCLAIMED_MARGIN_S < report.received_at
            ):
                unclaimed.append(SatelliteInfo.of(records[0], parent))
    nodes: dict[str, NodeInfo] = {}
    for node in view.nodes:
        parts = [part for part in node.partitions if part in regular or part == elastic_partition]
        if not parts or node.name in nodes or node.gpus_total <= 0:
            continue
        nodes[node.name] = NodeInfo(node.name, node.gpus_total, node.gpus_free, parts[0])
    jobs: list[JobInfo] = []
    managed: dict[str, JobInfo] = {}
    running_count = pending_count = 0
    gone = [job_id for job_id in agents if job_id not in groups]
    releasing: dict[str, int] = {}
    young: list[tuple[JobInfo, int]] = []
    for key, records in groups.items():
        agent = agents.get(key)
        is_running = any(r.state is SlurmState.RUNNING for r in records)
        if agent is not None and is_running:
            info, leaving = _managed_job(key, records, satellites.get(key, []), agent, key in pins, stale_after_s, now)
            managed[key] = info
            jobs.append(info)
            for name, gpus in leaving.items():
                releasing[name] = releasing.get(name, 0) + gpus
            continue
        held = _gpus_by_node(records)
        first = min(records, key=lambda r: r.het_job_offset)
        submit = float(first.submit_time)
        priority = max(r.priority for r in records)
        if held:
            gpus = sum(held.values())
            jobs.append(
                JobInfo(
                    job_id=key,
                    state=JobPhase.RUNNING,
                    submit_time=submit,
                    requested_workers=gpus,
                    min_workers=gpus,
                    max_workers=gpus,
                    workers=gpus,
                    placement=held,
                    priority=priority,
                    owner=first.user,
                    partition=first.partition,
                    attained_service=max(0.0, now - first.start_time) * gpus if first.start_time else 0.0,
                    executed_time=max(0.0, now - first.start_time) if first.start_time else 0.0,
                    pinned=key in pins,
                )
            )
            running_count += 1
        elif all(r.state is SlurmState.PENDING for r in records):
            wanted = sum(r.gpus_per_node * max(r.node_count, 1) for r in records)
            waits_for_gpus = any(_partitions(r) & regular for r in records) and not any(
                r.state_reason in BLOCKED_REASONS for r in records
            )
            if wanted > 0 and waits_for_gpus:
                info = JobInfo(
                    job_id=key,
                    state=JobPhase.PENDING,
                    submit_time=submit,
                    requested_workers=wanted,
                    min_workers=wanted,
                    max_workers=wanted,
                    priority=priority,
                    owner=first.user,
                    partition=first.partition,
                )
                if make_room_after_s > 0 and now - submit < make_room_after_s:
                    young.append((info, len(jobs)))
                jobs.append(info)
                pending_count += 1
    for name, gpus in releasing.items():
        node_info = nodes.get(name)
        if node_info is not None:
            nodes[name] = dataclasses.replace(
                node_info, gpus_free=min(node_info.gpus_total, node_info.gpus_free + gpus)
            )
    free_now = sum(node_info.gpus_free for node_info in nodes.values())
    for info, index in reversed(young):
        capped = min(info.requested_workers, free_now)
        if capped <= 0:
            del jobs[index]
        else:
            jobs[index] = dataclasses.replace(info, requested_workers=capped, min_workers=capped, max_workers=capped)
    snapshot = Snapshot(nodes=tuple(nodes.values()), jobs=tuple(jobs))
    return Observation(
        snapshot=snapshot,
        managed=managed,
        orphans=tuple(orphans),
        unclaimed=tuple(unclaimed),
        gone=tuple(gone),
        regular_running=running_count,
        regular_pending=pending_count,
    )


def _split_leaving(
    records: Sequence[JobRecord], satellites: Sequence[JobRecord], keep_gpus: int
) -> tuple[dict[str, int], dict[str, int]]:
    """Split a job's GPUs into the ``keep_gpus`` it keeps and those it is giving back.

    The job's own allocation is kept first, then its satellites in the order they were submitted; what is left
    over belongs to satellites on their way out (a shrink or a preemption the agent has already counted).
    """
    kept: dict[str, int] = {}
    leaving: dict[str, int] = {}
    room = keep_gpus
    for record in [*records, *sorted(satellites, key=lambda r: r.job_id)]:
        for name, gpus in _gpus_by_node([record]).items():
            take = min(gpus, room)
            room -= take
            if take:
                kept[name] = kept.get(name, 0) + take
            if gpus > take:
                leaving[name] = leaving.get(name, 0) + gpus - take
    return kept, leaving


def _managed_job(
    key: str,
    records: Sequence[JobRecord],
    satellites: Sequence[JobRecord],
    agent: AgentRecord,
    pinned: bool,
    stale_after_s: float,
    now: float,
) -> tuple[JobInfo, dict[str, int]]:
    """The managed job as the policy sees it, and node -> GPUs it is giving back (see :func:`build_snapshot`)."""
    reg = agent.registration
    held = _gpus_by_node([*records, *satellites])
    report = agent.report
    fresh = agent.is_fresh(now, stale_after_s)
    leaving: dict[str, int] = {}
    if report is not None and fresh:
        workers = report.size
        resizing = report.resizing or not reg.min_workers <= report.size <= reg.max_workers
        throughput = dict(report.throughput)
        growing = report.target > report.size or (agent.in_flight is not None and agent.in_flight.target > report.size)
        if not growing:  # a report sent before the agent took a grow order must not turn its new satellite "free"
            held, leaving = _split_leaving(records, satellites, report.size * reg.gpus_per_worker)
    else:
        workers = sum(gpus // reg.gpus_per_worker for gpus in held.values())
        resizing = True  # no recent word from the agent: leave the job alone until it reports
        throughput = {}
    resizing = resizing or agent.in_flight is not None or agent.backoff_until > now
    resizing = resizing or any(s.state is SlurmState.PENDING for s in satellites)
    workers = min(max(workers, 1), max(reg.max_workers, 1))
    first = min(records, key=lambda r: r.het_job_offset)
    started = float(first.start_time) if first.start_time else now
    info = JobInfo(
        job_id=key,
        state=JobPhase.RUNNING,
        submit_time=float(first.submit_time),
        requested_workers=reg.min_workers,
        min_workers=reg.min_workers,
        max_workers=reg.max_workers,
        workers=workers,
        gpus_per_worker=reg.gpus_per_worker,
        placement=fit_placement(held, reg.gpus_per_worker, workers),
        throughput=throughput,
        priority=max(r.priority for r in records),
        owner=agent.user,
        partition=reg.partition,
        attained_service=max(0.0, now - started) * workers * reg.gpus_per_worker,
        executed_time=max(0.0, now - started),
        resizing=resizing,
        pinned=pinned,
    )
    return info, leaving
