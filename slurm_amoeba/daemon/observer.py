"""The daemon's observer: one read of Slurm, and the types the snapshot step hands to the round.

First step of DESIGN.md's control flow. :func:`observe` takes one consistent-enough picture of the cluster
(``squeue --json`` and ``sinfo --json`` through the Slurm layer) as a :class:`ClusterView`; :mod:`.snapshot` turns
it, with the registered agents, into an :class:`Observation`: the policy's snapshot and what the daemon learned
while building it. :func:`satellite_parent` recognises the satellites of elastic jobs (``amoeba-sat-<parent>-<group>``,
comment ``amoeba-parent=<parent>``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import threading
import types
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Protocol

from slurm_amoeba.policy import JobInfo, Snapshot
from slurm_amoeba.policy.queue_order import JobService, RunSample, account
from slurm_amoeba.slurm import JobRecord, JobState, NodeRecord, SlurmClient, SlurmCommandError
from slurm_amoeba.slurm.satellite import PARENT_COMMENT_PREFIX, SATELLITE_PREFIX, parse_satellite_name

logger = logging.getLogger(__name__)

#: The states :meth:`JobState.is_active` names, as a set for the view's pass over every job.
_ACTIVE = frozenset(state for state in JobState if state.is_active())

#: The most pending jobs whose past runs the first round reads from accounting (one sacct call).
SEED_MOST = 5000

SATELLITE_COMMENT = re.compile(rf"(?:^|[\s,;]){re.escape(PARENT_COMMENT_PREFIX)}(?P<parent>[0-9]+)(?:$|[\s,;])")


class ClusterSource(Protocol):
    """What the observer needs of Slurm (a part of :class:`~slurm_amoeba.slurm.SlurmClient`)."""

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

    @property
    def groups(self) -> Mapping[str, tuple[JobRecord, ...]]:
        """:meth:`active_groups` without the copy (read-only: the snapshot step reads it once per round)."""
        return types.MappingProxyType(self._groups)

    @property
    def active_ids(self) -> Collection[str]:
        """The ids of the active jobs (:meth:`active_groups`' keys, without a copy)."""
        return self._groups.keys()

    def active_job(self, job_id: str) -> list[JobRecord]:
        """The active records of one job (empty when it is not active); cheap, for each registration."""
        return list(self._groups.get(job_id, ()))

    @functools.cached_property
    def _groups(self) -> dict[str, tuple[JobRecord, ...]]:
        groups: dict[str, tuple[JobRecord, ...]] = {}
        active = _ACTIVE
        for record in self.jobs:  # the round's one pass over every job: no call per record beyond str()
            if record.state in active:
                key = str(record.het_job_id or record.job_id)
                known = groups.get(key)
                groups[key] = (record,) if known is None else (*known, record)
        return groups


def observe(source: ClusterSource, now: float, submissions: SubmissionBook | None = None) -> ClusterView:
    """Read Slurm's jobs and nodes (and the submitted shape of jobs whose agents wait to register).

    Args:
        source: the Slurm client.
        now: the daemon's clock.
        submissions: where registrations note the jobs they need Slurm's record of; read here when any are.

    Returns:
        The view.

    Raises:
        SlurmCommandError: a command failed or timed out.
        ParseError: its output made no sense.
    """
    nodes = source.nodes()
    jobs = source.jobs()
    view = ClusterView(tuple(jobs), tuple(nodes), now)
    if submissions is not None:
        submissions.refresh(view.active_ids)
    return view


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
    if not record.name.startswith(SATELLITE_PREFIX):  # most jobs: no pattern match (one call per job per round)
        return None
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


@dataclasses.dataclass(frozen=True)
class SubmittedComponent:
    """One component of a job as Slurm recorded it at submission (its :class:`~slurm_amoeba.slurm.JobRecord`).

    Attributes:
        offset: its index in a heterogeneous job (0 for an ordinary job).
        tasks: the tasks it asked for (``--ntasks``).
        gpus_per_task: GPUs per task (``--gpus-per-task``, Slurm's ``tres_per_task``); 0 when not asked per task.
    """

    offset: int
    tasks: int
    gpus_per_task: int


@dataclasses.dataclass(frozen=True)
class Submitted:
    """What Slurm says an elastic job is, for checking its agent's claims (:func:`~.limits.vet_registration`).

    ``amoeba-sbatch`` and the executor submit a heterogeneous job of two components: 0, the agent (one task, no
    GPU), and 1, the minimum workers (``--ntasks=MIN --gpus-per-task=G``). So Slurm holds the minimum and the GPUs
    per worker in component 1's record, where the job's owner cannot change them after submission. The maximum
    travels only in the job's environment (``AMOEBA_ELASTIC_MAX``, which no Slurm command shows another uid): the
    daemon bounds it with the site's caps. A job submitted with the SPANK plugin alone is one component whose shape
    is the user's (``--gpus-per-node`` or ``--gpus-per-task``): only its GPUs per task, when given, are checked.

    Attributes:
        job_id: the job's id (the heterogeneous leader's).
        components: its components, by offset.
    """

    job_id: str
    components: tuple[SubmittedComponent, ...]

    @property
    def workers(self) -> SubmittedComponent | None:
        """The component holding the minimum workers in amoeba-sbatch's shape; None for another shape."""
        if len(self.components) == 2 and self.components[0].gpus_per_task == 0:
            return self.components[1]
        return None


def submitted_of(records: Iterable[JobRecord], wanted: Collection[str]) -> dict[str, Submitted]:
    """The :class:`Submitted` shapes of the ``wanted`` jobs among Slurm's ``records`` (every component's)."""
    found: dict[str, list[SubmittedComponent]] = {}
    for record in records:
        key = group_id(record)
        if key in wanted:
            component = SubmittedComponent(record.het_job_offset, record.tasks, record.gpus_per_task)
            found.setdefault(key, []).append(component)
    return {key: Submitted(key, tuple(sorted(parts, key=lambda c: c.offset))) for key, parts in found.items()}


class SubmissionBook:
    """Slurm's record of the jobs whose agents register, read on the round's Slurm thread, never on the loop.

    The request loop asks :meth:`get`; a job not read yet is noted as wanted (the registration is told to retry, as
    for a job the last view does not show) and the next round's read of Slurm (:func:`observe`) fetches it. Records
    of jobs no longer active are dropped.

    Args:
        read: returns Slurm's job records (:meth:`~slurm_amoeba.slurm.SlurmClient.jobs`); None where the Slurm
            source cannot give them (a test's fake of the observer's calls only): then :attr:`available` is False
            and registrations are vetted without them.
        most: at most this many jobs are kept (a round reads them all at once; more are asked again later).
    """

    def __init__(self, read: Callable[[], Sequence[JobRecord]] | None, most: int = 4096) -> None:
        self._read = read
        self._most = most
        self._lock = threading.Lock()
        self._known: dict[str, Submitted] = {}
        self._wanted: set[str] = set()

    @classmethod
    def for_source(cls, source: object, timeout_s: float | None = None) -> SubmissionBook:
        """A book reading through ``source`` when it is a whole :class:`~slurm_amoeba.slurm.SlurmClient` (the
        observer's own fakes in tests are not).

        Args:
            source: the daemon's Slurm source.
            timeout_s: not used: the client's own timeout applies to every command it runs.
        """
        if not isinstance(source, SlurmClient):
            return cls(None)
        return cls(source.jobs)

    @property
    def available(self) -> bool:
        """Whether Slurm's records can be read at all."""
        return self._read is not None

    def get(self, job_id: str) -> Submitted | None:
        """Slurm's record of ``job_id``; None (and the job noted as wanted) when it has not been read yet."""
        with self._lock:
            known = self._known.get(job_id)
            if known is None and len(self._wanted) < self._most:
                self._wanted.add(job_id)
            return known

    def refresh(self, active: Collection[str]) -> None:
        """Read the wanted jobs (on the Slurm thread) and forget the records of jobs not in ``active``.

        Raises:
            SlurmCommandError: Slurm's command failed or timed out.
            ParseError: its output made no sense.
        """
        with self._lock:
            self._wanted &= set(active)  # a job that is not active (yet, or any more) is asked for again if needed
            wanted = set(self._wanted)
            for gone in [job for job in self._known if job not in active]:
                del self._known[gone]
        if not wanted or self._read is None:
            return
        found = submitted_of(self._read(), wanted)
        with self._lock:
            if len(self._known) + len(found) <= self._most:
                self._known.update(found)
            self._wanted -= set(found)


def service_key(record: JobRecord) -> str:
    """The job a record's GPU-seconds count for: a satellite's parent, a heterogeneous job's leader, or itself."""
    return satellite_parent(record) or group_id(record)


def run_samples(view: ClusterView) -> list[RunSample]:
    """Every active record of the view as a run of its job, for :func:`~slurm_amoeba.policy.queue_order.account`."""
    return [run_sample(record) for record in view.jobs if record.state.is_active()]


def run_sample(record: JobRecord) -> RunSample:
    """One active record as a run of its job (:func:`run_samples`)."""
    return RunSample(
        job=service_key(record),
        record=str(record.job_id),
        running=record.state is JobState.RUNNING and bool(record.start_time),
        start_time=float(record.start_time),
        gpus=record.gpus_held,
    )


class ServiceBook:
    """The GPU-seconds every job attained, kept by the daemon's snapshot step from round to round (the queue-order
    layer's input, ``JobInfo.attained_service``).

    Each round :meth:`update` banks what Slurm shows (:func:`~slurm_amoeba.policy.queue_order.account`); the first
    round also reads the service pending jobs attained before the daemon watched them (earlier runs of requeued jobs,
    from accounting: ``past_service``, at most :data:`SEED_MOST` jobs), so that a restart does not send them back
    to the first LAS queue.

    Args:
        past_service: the Slurm call that reads earlier runs (job ids -> GPU-seconds), or None (no accounting).

    Attributes:
        book: job -> the service it attained.
    """

    def __init__(self, past_service: Callable[[Collection[int]], Mapping[int, float]] | None = None) -> None:
        self.book: dict[str, JobService] = {}
        self._past_service = past_service
        self._samples: dict[int, tuple[JobRecord, RunSample]] = {}

    def update(self, view: ClusterView, now: float) -> dict[str, float]:
        """Bank the view's runs; returns job id -> GPU-seconds attained (a satellite's count for its parent).

        A record that is the same object as last round's (the incremental ``squeue`` reader keeps a job's record
        while Slurm reports it alike) keeps its run sample (:func:`run_sample`)."""
        known, self._samples = self._samples, {}
        samples: list[RunSample] = []
        active = _ACTIVE
        for record in view.jobs:
            if record.state not in active:
                continue
            last = known.get(record.job_id)
            sample = last[1] if last is not None and last[0] is record else run_sample(record)
            self._samples[record.job_id] = (record, sample)
            samples.append(sample)
        self.book = account(self.book, samples, now)
        if self._past_service is not None:
            read, self._past_service = self._past_service, None
            self._seed(view, read)
        return {job: service.total for job, service in self.book.items()}

    def _seed(self, view: ClusterView, read: Callable[[Collection[int]], Mapping[int, float]]) -> None:
        pending = [r.job_id for r in view.jobs if r.state is JobState.PENDING and r.het_job_offset == 0][:SEED_MOST]
        try:
            past = read(pending)
        except SlurmCommandError as exc:
            logger.warning("[daemon/queue] no past runs from accounting (%s); pending jobs count from now on", exc)
            return
        for job_id, gpu_s in past.items():
            old = self.book.get(str(job_id), JobService())
            self.book[str(job_id)] = JobService(old.banked + gpu_s, old.runs)
        if past:
            logger.info("[daemon/queue] %d pending job(s) ran before (from accounting)", len(past))
