"""The snapshot step: Slurm's view plus the agents' reports -> the policy's :class:`~slurm_amoeba.policy.Snapshot`.

Second step of DESIGN.md's control flow, after :func:`~slurm_amoeba.daemon.observer.observe`. :func:`build_snapshot`
is a pure function made of named steps, each pure and tested on its own:

- :func:`split_satellites`: satellites whose parent is a registered job of the same owner belong to it; satellites
  whose parent is gone are **orphans**; satellites the parent's agent does not list are **unclaimed**;
- :func:`placeable_nodes`: the nodes of the regular and elastic partitions that have GPUs, and with
  ``sharing.enabled`` those of the sharing partitions (no GPU of theirs free to a policy: Slurm places the opted-in
  jobs there itself; their hosts' and sharers' workers are placed on them); a node of a partition in
  ``sharing.gpu_memory_gib`` states its GPUs' memory;
- :func:`managed_job`: every job the daemon manages (a registered agent whose Slurm job runs) is elastic, sized as
  its agent reports, placed where Slurm says its own allocation and its satellites hold GPUs, and marked
  ``resizing`` while a resize is in flight (the agent's target differs from its size, the daemon ordered one that
  has not arrived, a satellite is still pending, or the agent has not reported lately) so that no policy re-orders
  it;
- GPU sharing (:func:`sharing_inputs`): a managed job that opted in to sharing has its Slurm job name as its job type
  (what the co-location prior is keyed by), the device memory its runtime reported, its speeds measured alone and
  beside each type of partner (:class:`~slurm_amoeba.daemon.agents.MeasuredRates`), and, opportunistic and below its
  maximum, ``grows_beside``; the snapshot's ``colocation`` is the site's prior for the types present
  (:meth:`~slurm_amoeba.daemon.config.Sharing.prior`). A job that did not opt in has no job type: no prior and no
  measurement ever pairs it;
- :func:`adaptive_inputs`: for a managed job whose runtime reported adaptive-batch statistics, the goodput model
  (:func:`~slurm_amoeba.policy.goodput.model_from_report`) and its best goodput per size
  (:func:`~slurm_amoeba.policy.goodput.goodput_rates`) replace the measured throughput, so that every policy sees
  the job's statistical progress, and the ``goodput`` policy's batch for a size is ``JobInfo.adaptive.best(size)``;
- :func:`unmanaged_job`: every other job that holds GPUs is a fixed-size running job; every job that waits for GPUs
  in a regular partition is a pending fixed-size job (the ones elastic extras make room for); a pending job that
  carries the elastic mark (``amoeba-elastic=MIN:MAX`` in its comment, :mod:`slurm_amoeba.slurm.marks`) is a pending
  elastic job of that range, and one the daemon holds (its hold mark in the ``AdminComment``) shows ``held`` with
  ``held_since`` and the priority it had before the hold: what the admission layer decides on, even while Slurm
  keeps it for another reason (``--begin``); every job carries its time limit and the GPU-seconds it attained
  (``service``: the daemon's service book, :class:`~slurm_amoeba.daemon.observer.ServiceBook`);
- :func:`show_released` and :func:`cap_young_pending`: the near future rather than the last second (see
  :func:`build_snapshot`).

Counting: a worker of a managed job holds ``gpus_per_worker`` GPUs; other jobs are counted in GPUs (one "worker"
per GPU), which is all the policies need of them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Collection, Iterable, Mapping, Sequence

from slurm_amoeba.core.sharing import ShareRole
from slurm_amoeba.daemon.agents import AdaptiveStats, AgentRecord
from slurm_amoeba.daemon.config import Sharing
from slurm_amoeba.daemon.observer import ClusterView, Observation, SatelliteInfo, satellite_parent
from slurm_amoeba.policy import JobInfo, JobPhase, NodeInfo, Snapshot
from slurm_amoeba.policy.goodput import GoodputModel, goodput_rates, model_from_report
from slurm_amoeba.slurm import JobRecord, NodeRecord
from slurm_amoeba.slurm import JobState as SlurmState
from slurm_amoeba.slurm.marks import parse_elastic_comment, parse_hold_mark
from slurm_amoeba.slurm.reasons import waits_for_resources

#: An adaptive job's goodput is tabled at every size up to this one, beyond it on a grid 1.25 times apart
#: (``JobInfo.rate`` interpolates linearly between, which keeps a concave table concave): a job costs a round about
#: 20-40 :meth:`GoodputModel.best` calls whatever size it registers (~12 us each at load 6).
DENSE_SIZES = 16
#: A satellite submitted this long before a report that does not list it is "unclaimed" (reports race submits).
UNCLAIMED_MARGIN_S = 10.0


_RUNNING, _COMPLETING = SlurmState.RUNNING, SlurmState.COMPLETING
_RUNNING_PHASE = JobPhase.RUNNING


def _gpus_by_node(records: Iterable[JobRecord]) -> dict[str, int]:
    held: dict[str, int] = {}
    for record in records:
        state = record.state
        if state is not _RUNNING and state is not _COMPLETING:
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
    service: Mapping[str, float] | None = None,
    reuse: SnapshotCache | None = None,
    sharing: Sharing | None = None,
) -> Observation:
    """Turn Slurm's view and the agents' records into the policy's snapshot (see the module docstring).

    The steps, each a pure function of its own: :func:`split_satellites` (claimed, orphaned, unclaimed),
    :func:`placeable_nodes`, one :class:`~slurm_amoeba.policy.JobInfo` per job (:func:`managed_job` for the elastic
    jobs the daemon manages, :func:`unmanaged_job` for the others), then two adjustments that make the snapshot
    show the near future rather than the last second:

    - :func:`show_released`: GPUs a managed job is **giving back** (Slurm still lists them for the job, but its
      agent reports a size that no longer needs them and is not growing: a satellite on its way out after a shrink
      or a preemption) are shown free, so that nobody else is shrunk for GPUs that are about to be free anyway;
    - :func:`cap_young_pending`: a pending regular job younger than ``make_room_after_s`` asks only for what is
      free now: Slurm starts it or preempts elastic extras for it by itself at once, and the agents report that
      within seconds; the daemon makes room for it (shrinks elastic jobs) only if it is still waiting after that.

    Args:
        view: Slurm's jobs and nodes.
        agents: job id -> registered agent.
        pinned: ids of jobs an operator excluded from the policy.
        regular_partitions: partitions whose pending jobs count as waiting for GPUs.
        elastic_partition: the satellites' partition (its nodes are placeable too).
        stale_after_s: a managed job whose agent has not reported for this long is left alone.
        now: the daemon's clock (Unix seconds).
        make_room_after_s: see above; 0 makes room for every pending job at once.
        service: job id -> GPU-seconds it attained, its earlier runs included (the daemon's service book); a job
            it does not name has attained what its current run has (None: every job).
        reuse: the previous rounds' nodes and jobs (:class:`SnapshotCache`): those whose inputs did not change are
            taken from it instead of being built again (None: build every one).
        sharing: the site's GPU sharing settings (None: off).

    Returns:
        The observation.
    """
    pins = set(pinned)
    split = split_satellites(view.groups, agents)
    reuse = SnapshotCache() if reuse is None else reuse
    sharing = sharing if sharing is not None and sharing.enabled else None
    reuse.start_round(regular_partitions, elastic_partition, sharing)
    hosting = {agent.beside.host for agent in agents.values() if agent.beside is not None}
    job_types: list[str] = []
    placeable = reuse.placeable_nodes(view.nodes)
    cluster_gpus = sum(node.gpus_total for node in placeable)
    jobs: list[JobInfo] = []
    managed: dict[str, JobInfo] = {}
    releasing: dict[str, int] = {}
    for key, records in split.groups.items():
        agent = agents.get(key)
        if agent is not None and any(r.state is SlurmState.RUNNING for r in records):
            sats = split.satellites.get(key, [])
            info, leaving = reuse.managed_job(
                key,
                agent,
                records,
                sats,
                now,
                stale_after_s=stale_after_s,
                pinned=key in pins,
                cluster_gpus=cluster_gpus,
                sharing=sharing,
                hosting=key in hosting,
            )
            job_types.append(info.job_type)
            if service is not None:
                info = _with_service(info, service)
            managed[key] = info
            for name, gpus in leaving.items():
                releasing[name] = releasing.get(name, 0) + gpus
        else:
            other = reuse.unmanaged_job(key, records, pinned=key in pins, now=now)
            if other is None:
                continue
            info = other if service is None else _with_service(other, service)
        jobs.append(info)
    nodes = show_released(placeable, releasing)
    others = [info for info in jobs if info.job_id not in managed]
    free_now = sum(node_info.gpus_free for node_info in nodes)
    kept, left = cap_young_pending(jobs, free_now, now, make_room_after_s)
    return Observation(
        snapshot=Snapshot(
            nodes=nodes,
            jobs=kept,
            colocation=sharing.prior(job_types) if sharing is not None else {},
            left_to_slurm=left,
        ),
        managed=managed,
        orphans=split.orphans,
        unclaimed=split.unclaimed,
        gone=tuple(job_id for job_id in agents if job_id not in split.groups),
        regular_running=sum(1 for info in others if info.state is JobPhase.RUNNING),
        regular_pending=sum(1 for info in others if info.state is JobPhase.PENDING),
    )


@dataclasses.dataclass(frozen=True)
class SatelliteSplit:
    """Slurm's active jobs with the satellites sorted out (see :func:`split_satellites`).

    Attributes:
        groups: job id -> records, without the satellites claimed by a registered parent.
        satellites: parent job id -> its claimed satellites.
        orphans: satellites whose parent job is gone (they stay in ``groups``: fixed-size jobs holding GPUs).
        unclaimed: claimed satellites that the parent's agent does not list (a report that predates the submit by
            less than :data:`UNCLAIMED_MARGIN_S` does not count).
    """

    groups: dict[str, Sequence[JobRecord]]
    satellites: dict[str, list[JobRecord]]
    orphans: tuple[SatelliteInfo, ...]
    unclaimed: tuple[SatelliteInfo, ...]


def split_satellites(groups: Mapping[str, Sequence[JobRecord]], agents: Mapping[str, AgentRecord]) -> SatelliteSplit:
    """Sort the satellites out of the active jobs: claimed by their registered parent (same owner), or orphans.

    Args:
        groups: active job id -> records (:attr:`ClusterView.groups`).
        agents: job id -> registered agent.

    Returns:
        The split; ``groups`` is a new mapping.
    """
    rest = dict(groups)
    satellites: dict[str, list[JobRecord]] = {}
    orphans: list[SatelliteInfo] = []
    unclaimed: list[SatelliteInfo] = []
    for key, records in groups.items():
        parent = satellite_parent(records[0]) if len(records) == 1 else None
        if parent is None:
            continue
        record = records[0]
        if parent not in groups:
            orphans.append(SatelliteInfo.of(record, parent))
            continue  # stays a fixed-size job holding GPUs
        agent = agents.get(parent)
        if agent is None or agent.uid != record.uid:
            continue
        satellites.setdefault(parent, []).append(record)
        del rest[key]
        report = agent.report
        if (
            report is not None
            and key not in report.satellites
            and record.submit_time + UNCLAIMED_MARGIN_S < (report.received_at)
        ):
            unclaimed.append(SatelliteInfo.of(record, parent))
    return SatelliteSplit(rest, satellites, tuple(orphans), tuple(unclaimed))


def placeable_nodes(
    nodes: Iterable[NodeRecord],
    regular_partitions: Sequence[str],
    elastic_partition: str,
    sharing: Sharing | None = None,
) -> tuple[NodeInfo, ...]:
    """The nodes with GPUs in a regular or the elastic partition (or, with ``sharing``, a sharing partition), each
    once, named by its first such partition (see :func:`placeable_node`)."""
    regular = set(regular_partitions)
    placeable: dict[str, NodeInfo] = {}
    for node in nodes:
        info = placeable_node(node, regular, elastic_partition, sharing)
        if info is not None and node.name not in placeable:
            placeable[node.name] = info
    return tuple(placeable.values())


def placeable_node(
    node: NodeRecord, regular: Collection[str], elastic_partition: str, sharing: Sharing | None = None
) -> NodeInfo | None:
    """The node as the policy sees it, named by its first regular or elastic partition; None without GPUs there.

    With ``sharing`` (enabled), a node of a sharing partition only is placeable too, with no GPU free (Slurm places
    the opted-in jobs there itself), and a node of a partition in ``sharing.gpu_memory_gib`` states its GPUs' memory
    (the smallest, when it is in several)."""
    parts = [part for part in node.partitions if part in regular or part == elastic_partition]
    free = node.gpus_free
    if sharing is not None and not parts:
        parts = [part for part in node.partitions if sharing.limit(part) > 0]
        free = 0
    if not parts or node.gpus_total <= 0:
        return None
    sizes = sharing.gpu_memory_gib if sharing is not None else {}
    memory = [sizes[part] for part in node.partitions if part in sizes]
    return NodeInfo(node.name, node.gpus_total, free, parts[0], min(memory) if memory else None)


def unmanaged_job(
    key: str, records: Sequence[JobRecord], *, pinned: bool, regular_partitions: Sequence[str], now: float
) -> JobInfo | None:
    """A job the daemon does not manage, as the policy sees it: fixed-size, counted in GPUs (a "worker" per GPU).

    Args:
        key: the job's id.
        records: its active records (a heterogeneous job's components).
        pinned: whether an operator pinned it.
        regular_partitions: partitions whose pending jobs count as waiting for GPUs.
        now: the daemon's clock.

    Returns:
        A running job where it holds GPUs; a pending job where it asks for GPUs in a regular partition and every
        component waits for no reason free GPUs cannot cure (:func:`~slurm_amoeba.slurm.reasons.waits_for_resources`),
        or it carries the elastic mark or the daemon's hold mark (see the module docstring; another's hold leaves
        it out); None otherwise.
    """
    held = _gpus_by_node(records)
    first = min(records, key=lambda r: r.het_job_offset)
    limit = None if first.time_limit_s is None else float(first.time_limit_s)
    priority = max(r.priority for r in records)
    fixed = functools.partial(
        JobInfo,
        job_id=key,
        submit_time=float(first.submit_time),
        owner=first.user,
        partition=first.partition,
        time_limit=limit,
    )
    if held:
        gpus = sum(held.values())
        ran = run_seconds(first, now)
        return fixed(
            state=JobPhase.RUNNING,
            requested_workers=gpus,
            min_workers=gpus,
            max_workers=gpus,
            workers=gpus,
            placement=held,
            attained_service=ran * gpus,
            executed_time=ran,
            pinned=pinned,
            priority=priority,
        )
    if not all(r.state is SlurmState.PENDING for r in records):
        return None
    # Per node times nodes, or the requested TRES where a job asks for GPUs per job (``--gpus``).
    wanted = sum(max(r.gpus_per_node * max(r.node_count, 1), r.gpus_requested) for r in records)
    in_regular = any(_partitions(r) & set(regular_partitions) for r in records)
    if wanted <= 0 or not in_regular:
        return None
    hold = parse_hold_mark(first.admin_comment) if first.admin_comment else None
    slurm_holds = first.priority == 0 or any(r.is_held for r in records)
    elastic = parse_elastic_comment(first.comment) if first.comment else None
    if slurm_holds and hold is None:
        return None  # its owner's or an admin's hold: not the daemon's to lift, and Slurm will not start it
    if hold is None and elastic is None and not all(waits_for_resources(r.state_reason) for r in records):
        return None
    low, high = elastic if elastic is not None and wanted >= elastic[0] else (wanted, wanted)
    per_worker = math.ceil(wanted / low)
    return fixed(
        state=JobPhase.PENDING,
        requested_workers=low,
        min_workers=low,
        max_workers=high,
        gpus_per_worker=per_worker,
        priority=hold.priority if hold is not None else priority,
        held=slurm_holds,
        held_since=None if hold is None else float(hold.since),
    )


def _with_service(info: JobInfo, service: Mapping[str, float] | None) -> JobInfo:
    """The job with the attained service of the daemon's book, where the book has it (the same object when the book
    agrees with it, so that a job the snapshot cache reused stays reused)."""
    attained = None if service is None else service.get(info.job_id)
    if attained is None or attained == info.attained_service:
        return info
    return dataclasses.replace(info, attained_service=attained)


def run_seconds(first: JobRecord, now: float) -> float:
    """How long a job (its first component's record) has held its GPUs at ``now``."""
    return max(0.0, now - first.start_time) if first.start_time else 0.0


def show_released(nodes: Sequence[NodeInfo], releasing: Mapping[str, int]) -> tuple[NodeInfo, ...]:
    """The nodes with the GPUs managed jobs are giving back shown free (never more than a node has).

    Args:
        nodes: the placeable nodes.
        releasing: node name -> GPUs being given back there.

    Returns:
        The nodes, in the same order.
    """
    return tuple(
        dataclasses.replace(node, gpus_free=min(node.gpus_total, node.gpus_free + releasing[node.name]))
        if releasing.get(node.name)
        else node
        for node in nodes
    )


def cap_young_pending(
    jobs: Sequence[JobInfo], free_gpus: int, now: float, make_room_after_s: float
) -> tuple[tuple[JobInfo, ...], tuple[JobInfo, ...]]:
    """Pending jobs younger than ``make_room_after_s`` ask for at most the free GPUs; those that get none are left out.

    Args:
        jobs: the snapshot's jobs.
        free_gpus: GPUs free now (after :func:`show_released`).
        now: the daemon's clock.
        make_room_after_s: how long a pending job is left to Slurm; 0 leaves every job as it is.

    Returns:
        The jobs kept, in the same order (pending elastic jobs as they are: admission decides on their whole range),
        and the jobs left out, as they were (``Snapshot.left_to_slurm``: they still wait in Slurm's queue, and
        queue ordering orders them).
    """
    if make_room_after_s <= 0:
        return tuple(jobs), ()
    kept: list[JobInfo] = []
    left: list[JobInfo] = []
    for info in jobs:
        if info.state is not JobPhase.PENDING or now - info.submit_time >= make_room_after_s or info.is_elastic:
            kept.append(info)
            continue
        capped = min(info.requested_workers, free_gpus)
        if capped > 0:
            kept.append(dataclasses.replace(info, requested_workers=capped, min_workers=capped, max_workers=capped))
        else:
            left.append(info)
    return tuple(kept), tuple(left)


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


def managed_job(
    key: str,
    records: Sequence[JobRecord],
    satellites: Sequence[JobRecord],
    agent: AgentRecord,
    pinned: bool,
    stale_after_s: float,
    now: float,
    *,
    cluster_gpus: int | None = None,
    sharing: Sharing | None = None,
    hosting: bool = False,
) -> tuple[JobInfo, dict[str, int]]:
    """A managed elastic job as the policy sees it, and node -> GPUs it is giving back (see :func:`build_snapshot`).

    Its size is what its agent reports (or, without a recent report, what Slurm says it holds); it shows as
    ``resizing`` whenever the daemon must leave it alone: its agent is moving, has not reported lately, or refused
    a directive a moment ago, a resize is in flight, or a satellite is still pending.

    Args:
        key: the job's id.
        records: its own records (the agent's component and the minimum workers).
        satellites: its claimed satellites.
        agent: its registered agent.
        pinned: whether an operator (or its owner) pinned it.
        stale_after_s: a report older than this is no word from the agent.
        now: the daemon's clock.
        cluster_gpus: GPUs of the placeable nodes: an adaptive job's goodput is tabled up to the sizes that fit
            (None: up to its maximum).
        sharing: the site's GPU sharing settings when sharing is on (None: off; no sharing inputs).
        hosting: another job's workers run beside this job's (a share the daemon ordered).

    Returns:
        The job, and node -> GPUs it is giving back.
    """
    reg = agent.registration
    held = _gpus_by_node([*records, *satellites])
    report = agent.report
    fresh = agent.is_fresh(now, stale_after_s)
    leaving: dict[str, int] = {}
    if report is not None and fresh:
        workers = report.size
        resizing = report.resizing or not reg.min_workers <= report.size <= reg.max_workers
        throughput = {**report.predicted, **report.throughput}  # measured where run, predicted elsewhere
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
    fits = (
        reg.max_workers if cluster_gpus is None else max(1, min(reg.max_workers, cluster_gpus // reg.gpus_per_worker))
    )
    model, rates, batch = adaptive_inputs(agent.adaptive if report is not None and fresh else None, fits)
    throughput = rates or throughput
    # A planned job fits its memory budget only from its smallest feasible size: never shrink it below that.
    feasible = report.min_feasible if report is not None and fresh else 0
    min_workers = min(max(reg.min_workers, feasible), max(reg.max_workers, 1))
    first = min(records, key=lambda r: r.het_job_offset)
    started = float(first.start_time) if first.start_time else now
    shares = sharing_inputs(
        agent,
        first.name,
        workers,
        min_workers,
        report.memory_gib if report is not None and fresh else None,
        sharing=sharing,
        hosting=hosting or resizing or pinned,
    )
    info = JobInfo(
        job_id=key,
        state=JobPhase.RUNNING,
        submit_time=float(first.submit_time),
        requested_workers=min_workers,  # what it asked for, raised with its minimum (a policy refuses less)
        min_workers=min_workers,
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
        time_limit=None if first.time_limit_s is None else float(first.time_limit_s),
        resizing=resizing,
        pinned=pinned,
        adaptive=model,
        batch=batch,
        lent=lent_workers(satellites, reg.gpus_per_worker) if satellites else {},
        job_type=shares.job_type,
        solo_rate=shares.solo_rate,
        shared_rates=shares.shared_rates,
        memory_gib=shares.memory_gib,
        grows_beside=shares.grows_beside,
    )
    return info, leaving


@dataclasses.dataclass(frozen=True)
class SharingInputs:
    """What the sharing policies read of a managed job (see :func:`sharing_inputs`)."""

    job_type: str = ""
    solo_rate: float | None = None
    shared_rates: Mapping[str, float] = dataclasses.field(default_factory=dict)
    memory_gib: float | None = None
    grows_beside: bool = False


def sharing_inputs(
    agent: AgentRecord,
    name: str,
    workers: int,
    requested: int,
    memory_gib: float | None,
    *,
    sharing: Sharing | None,
    hosting: bool,
) -> SharingInputs:
    """A managed job's job type, measured speeds, device memory and whether it may grow beside a host.

    Args:
        agent: its registered agent (its opt-in, its share, its measured rates).
        name: its Slurm job name: the job type of a job that opted in.
        workers: its size now.
        requested: the workers a share places beside a host (its ``requested_workers``).
        memory_gib: the device memory one worker peaked at, from its fresh report (None: unknown).
        sharing: the site's sharing settings, None when sharing is off.
        hosting: another job runs beside it, or it must be left alone (resizing, pinned): it does not grow beside.
            Nor does a job whose speed alone at its size is not measured yet (the daemon judges a loss beside a host
            by it), or that once trained slower for it (``MeasuredRates.grew_at_a_loss``).

    Returns:
        Its inputs; empty ones for a job that did not opt in (or with sharing off). The rates are those at the
        size the pairing compares: its size now, or for a job that may grow beside a host its size afterwards.
    """
    reg = agent.registration
    if sharing is None or reg.share is None:
        return SharingInputs()
    grows = (
        reg.share == ShareRole.OPPORTUNISTIC.value
        and agent.beside is None
        and not agent.rates.grew_at_a_loss
        and agent.rates.solo.get(workers) is not None  # its speed alone, which a loss beside a host is judged by
        and not hosting
        and workers + requested <= reg.max_workers
    )
    solo, shared = agent.rates.at(workers + requested if grows else workers)
    return SharingInputs(name, solo, shared, memory_gib, grows)


def lent_workers(satellites: Iterable[JobRecord], gpus_per_worker: int) -> dict[str, int]:
    """Node -> workers a managed job runs there in running satellites of one node each (``JobInfo.lent``)."""
    lent: dict[str, int] = {}
    for record in satellites:
        workers = record.gpus_held // max(gpus_per_worker, 1)
        if record.state is SlurmState.RUNNING and len(record.nodes) == 1 and workers > 0:
            lent[record.nodes[0]] = lent.get(record.nodes[0], 0) + workers
    return lent


def adaptive_inputs(
    stats: AdaptiveStats | None, max_workers: int
) -> tuple[GoodputModel | None, dict[int, float], int | None]:
    """An adaptive job's goodput model, its best goodput at sizes 1 to ``max_workers``, and its batch.

    Args:
        stats: the statistics its agent reported last, or None.
        max_workers: the largest size to table (every size up to :data:`DENSE_SIZES`, a grid beyond).

    Returns:
        ``(model, rates, batch)``: ``(None, {}, None)`` without statistics or before the runtime measured a step
        time; ``batch`` (the policy's batch the job is moving to, else the one it runs with) is None where the user
        sets the batch (``batch_source: user``).
    """
    if stats is None:
        return None, {}, None
    model = model_from_report(stats.as_report())
    if model is None:
        return None, {}, None
    rates = goodput_rates(model, min(max_workers, DENSE_SIZES))
    size = DENSE_SIZES
    while size < max_workers:
        size = min(max_workers, max(size + 1, int(size * 1.25)))
        rates[size] = model.best(size)[1]
    if stats.batch_source == "user":
        return model, rates, None
    return model, rates, stats.policy_batch or stats.global_batch


class SnapshotCache:
    """The nodes and jobs of the previous round, reused where what they were built from did not change.

    Most of a large cluster is the same from one round to the next: a few jobs start, end or resize, a few nodes
    change. The snapshot step asks this cache for each node and each job; a node or job the daemon does not manage
    whose records equal (``==``: every field Slurm reported; the same objects, from the incremental squeue reader,
    compare at once) those it was built from last round is answered with the object built then, and only the others
    are built again (:func:`placeable_node`, :func:`unmanaged_job`). A managed job is reused likewise while its
    records, its satellites and what :func:`managed_job` reads of its agent are equal (:meth:`managed_job`).
    A reused running job has its time-dependent fields (``attained_service``, ``executed_time``) brought up to
    ``now`` in place, as :class:`~slurm_amoeba.policy.JobInfo` allows its owner; the snapshot step copies before it
    changes anything else (the service book, young pending jobs). What a round does not ask for (a job that ended,
    a node that left) is forgotten at the next one. One cache serves one daemon's rounds, which never overlap.

    Attributes:
        built: jobs and nodes built in the last round.
        reused: jobs and nodes reused in the last round.
    """

    def __init__(self) -> None:
        self._partitions: tuple[tuple[str, ...], str, Sharing | None] = ((), "", None)
        self._nodes: dict[str, tuple[NodeRecord, NodeInfo | None]] = {}
        self._jobs: dict[str, tuple[Sequence[JobRecord], bool, JobInfo | None]] = {}
        self._asked: dict[str, tuple[Sequence[JobRecord], bool, JobInfo | None]] = {}
        self._managed: dict[str, tuple[tuple[object, ...], JobInfo, dict[str, int]]] = {}
        self._managed_asked: dict[str, tuple[tuple[object, ...], JobInfo, dict[str, int]]] = {}
        self.built = 0
        self.reused = 0

    def start_round(
        self, regular_partitions: Sequence[str], elastic_partition: str, sharing: Sharing | None = None
    ) -> None:
        """Begin a round: what the last round did not ask for is forgotten; new partitions or sharing settings (a
        reload) empty it."""
        partitions = (tuple(regular_partitions), elastic_partition, sharing)
        if partitions != self._partitions:
            self._partitions = partitions
            self._nodes, self._asked, self._managed_asked = {}, {}, {}
        self._jobs, self._asked = self._asked, {}
        self._managed, self._managed_asked = self._managed_asked, {}
        self.built = self.reused = 0

    def placeable_nodes(self, nodes: Iterable[NodeRecord]) -> tuple[NodeInfo, ...]:
        """:func:`placeable_nodes` for this round's partitions, reusing each node whose record did not change."""
        regular, elastic, sharing = set(self._partitions[0]), self._partitions[1], self._partitions[2]
        previous, self._nodes = self._nodes, {}
        placeable: dict[str, NodeInfo] = {}
        for node in nodes:
            known = previous.get(node.name)
            if known is not None and known[0] == node:
                info = known[1]
                self.reused += 1
            else:
                info = placeable_node(node, regular, elastic, sharing)
                self.built += 1
            self._nodes[node.name] = (node, info)
            if info is not None and node.name not in placeable:
                placeable[node.name] = info
        return tuple(placeable.values())

    def unmanaged_job(self, key: str, records: Sequence[JobRecord], *, pinned: bool, now: float) -> JobInfo | None:
        """:func:`unmanaged_job` for this round's partitions, reusing the job built from equal records (and the same
        pin) last round, its time-dependent fields brought up to ``now``."""
        known = self._jobs.get(key)
        if known is not None and known[1] == pinned and known[0] == records:  # the same records: a pointer test
            info = known[2]
            if info is not None and info.state is _RUNNING_PHASE:
                first = records[0] if len(records) == 1 else min(records, key=lambda r: r.het_job_offset)
                ran = run_seconds(first, now)
                info.attained_service = ran * info.workers
                info.executed_time = ran
            self.reused += 1
        else:
            info = unmanaged_job(key, records, pinned=pinned, regular_partitions=self._partitions[0], now=now)
            self.built += 1
        self._asked[key] = (records, pinned, info)
        return info

    def managed_job(
        self,
        key: str,
        agent: AgentRecord,
        records: Sequence[JobRecord],
        satellites: Sequence[JobRecord],
        now: float,
        *,
        stale_after_s: float,
        pinned: bool,
        cluster_gpus: int,
        sharing: Sharing | None = None,
        hosting: bool = False,
    ) -> tuple[JobInfo, dict[str, int]]:
        """:func:`managed_job`, reusing last round's job where everything it is built from is equal: Slurm's records
        and satellites, and of its agent the registration, what the latest report says (size, target, throughput
        measured and predicted, smallest feasible size: a report alike that came later changes nothing), the
        adaptive statistics, the size of a resize in flight, whether its report is fresh and whether it is backed off,
        and for sharing its memory, measured rates, share and whether it hosts one (its time-dependent fields brought
        up to ``now``)."""
        in_flight, report = agent.in_flight, agent.report
        fresh = agent.is_fresh(now, stale_after_s)  # the one use of the report's time: a new report alike reuses
        inputs: tuple[object, ...] = (
            records,
            tuple(satellites),
            agent.registration,
            agent.user,
            None if report is None else (report.size, report.target, *report.throughput.items(), None),
            None if report is None else tuple(report.predicted.items()),  # in order: the job's table keeps it
            None if report is None else report.min_feasible,
            agent.adaptive,
            None if in_flight is None else in_flight.target,
            fresh,
            agent.backoff_until > now,
            pinned,
            cluster_gpus,
            None if report is None else report.memory_gib,
            agent.rates.version,
            agent.beside,
            hosting,
        )
        known = self._managed.get(key)
        if known is not None and known[0] == inputs:
            _, info, leaving = known
            first = records[0] if len(records) == 1 else min(records, key=lambda r: r.het_job_offset)
            ran = max(0.0, now - first.start_time) if first.start_time else 0.0
            info.attained_service = ran * info.workers * info.gpus_per_worker
            info.executed_time = ran
            self.reused += 1
        else:
            info, leaving = managed_job(
                key,
                records,
                satellites,
                agent,
                pinned,
                stale_after_s,
                now,
                cluster_gpus=cluster_gpus,
                sharing=sharing,
                hosting=hosting,
            )
            self.built += 1
        self._managed_asked[key] = (inputs, info, leaving)
        return info, leaving
