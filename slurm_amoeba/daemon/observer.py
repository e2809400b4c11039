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
import re
from collections.abc import Mapping
from typing import Protocol

from slurm_amoeba.policy import JobInfo, Snapshot
from slurm_amoeba.slurm import JobRecord, NodeRecord
from slurm_amoeba.slurm.satellite import PARENT_COMMENT_PREFIX, parse_satellite_name

SATELLITE_COMMENT = re.compile(rf"(?:^|[\s,;]){re.escape(PARENT_COMMENT_PREFIX)}(?P<parent>[0-9]+)(?:$|[\s,;])")


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
