"""Test doubles for the daemon's unit tests: Slurm records, a Slurm that lives in memory, a recording server.

The daemon reads Slurm only through ``jobs()`` and ``nodes()`` (``observer.ClusterSource``); :class:`FakeSlurm`
answers those from lists the test edits, and can be told to fail like a dead slurmctld.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any

from slurm_amoeba.core.messages import Message
from slurm_amoeba.slurm import JobRecord, JobState, NodeRecord, SlurmCommandError
from slurm_amoeba.transport.channel import ChannelServer, Request
from slurm_amoeba.transport.munge import Credential

ME = os.getuid()
OTHER_UID = 65534


def job(
    job_id: int,
    *,
    state: JobState = JobState.RUNNING,
    name: str = "train",
    comment: str = "",
    uid: int = ME,
    user: str = "alice",
    partition: str = "batch",
    gpus: dict[str, int] | None = None,
    gpus_per_node: int = 0,
    node_count: int = 1,
    het_job_id: int = 0,
    het_job_offset: int = 0,
    reason: str = "None",
    submit_time: int = 1_000,
    priority: int = 100,
) -> JobRecord:
    """A squeue record; ``gpus`` is node -> GPUs held (running jobs)."""
    held = gpus or {}
    nodes = tuple(held)
    return JobRecord(
        job_id=job_id,
        name=name,
        comment=comment,
        state=state,
        state_reason=reason,
        user=user,
        uid=uid,
        partition=partition,
        nodes=nodes,
        batch_host=nodes[0] if nodes else "",
        gpus_per_node=gpus_per_node or (max(held.values()) if held else 0),
        gpu_indices=tuple(tuple(range(count)) for count in held.values()),
        cpus=1,
        node_count=node_count if not nodes else len(nodes),
        het_job_id=het_job_id,
        het_job_offset=het_job_offset,
        submit_time=submit_time,
        start_time=submit_time + 1 if state is JobState.RUNNING else 0,
        priority=priority,
    )


def satellite(job_id: int, parent: int, group: str = "g1", **kwargs: Any) -> JobRecord:
    """A satellite of ``parent`` in the elastic partition (named and commented as the agent does)."""
    kwargs.setdefault("partition", "elastic")
    return job(job_id, name=f"amoeba-sat-{parent}-{group}", comment=f"amoeba-parent={parent}", **kwargs)


def node(name: str, total: int = 4, used: int = 0, partitions: tuple[str, ...] = ("batch", "elastic")) -> NodeRecord:
    """An sinfo record."""
    return NodeRecord(
        name=name,
        address="127.0.0.1",
        hostname=name,
        state="mixed" if used else "idle",
        state_flags=(),
        partitions=partitions,
        cpus=8,
        alloc_cpus=used,
        gpus_total=total,
        gpus_used=used,
    )


@dataclasses.dataclass
class FakeSlurm:
    """Slurm in memory: the test edits ``job_list``/``node_list``; ``down`` makes every call fail; while ``hung``
    is set, ``jobs()`` blocks (a slurmctld that does not answer) until ``release`` is set."""

    job_list: list[JobRecord] = dataclasses.field(default_factory=list)
    node_list: list[NodeRecord] = dataclasses.field(default_factory=list)
    down: bool = False
    calls: int = 0
    hung: bool = False
    release: threading.Event = dataclasses.field(default_factory=threading.Event)

    def jobs(self) -> list[JobRecord]:
        self.calls += 1
        if self.hung:
            self.release.wait(60)
        if self.down:
            raise SlurmCommandError(
                ["squeue", "--json"], 1, "slurm_load_jobs error: Unable to contact slurm controller"
            )
        return list(self.job_list)

    def nodes(self) -> list[NodeRecord]:
        if self.down:
            raise SlurmCommandError(["sinfo", "--json"], 1, "Unable to contact slurm controller")
        return list(self.node_list)

    def set_used(self) -> None:
        """Recompute every node's used GPUs from the running jobs (what sinfo would say)."""
        used: dict[str, int] = {}
        for record in self.job_list:
            if record.state is JobState.RUNNING:
                for name, indices in zip(record.nodes, record.gpu_indices, strict=True):
                    used[name] = used.get(name, 0) + len(indices)
        self.node_list = [dataclasses.replace(n, gpus_used=used.get(n.name, 0)) for n in self.node_list]


class RecordingServer(ChannelServer):
    """A real channel server whose answers to hand-made requests are recorded instead of sent."""

    def __init__(self) -> None:
        super().__init__("tcp://127.0.0.1:*")
        self.answers: list[tuple[Request, Message]] = []

    def answer(self, request: Request, reply: Message) -> None:
        if request.route == (b"test",):
            self.answers.append((request, reply))
        else:
            super().answer(request, reply)

    def last(self) -> Message:
        assert self.answers, "the daemon answered nothing"
        return self.answers[-1][1]


def req(kind: str, body: dict[str, Any], uid: int = ME, gid: int = 0) -> Request:
    """A request as the channel would hand it over after munge vouched for ``uid``."""
    return Request(sender=Credential(uid=uid, gid=gid), message=Message(kind, body), route=(b"test",))


def register_body(job_id: str, endpoint: str = "tcp://127.0.0.1:1", low: int = 1, high: int = 4) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "endpoint": endpoint,
        "min_workers": low,
        "max_workers": high,
        "gpus_per_worker": 1,
        "partition": "batch",
        "elastic_partition": "elastic",
    }


def report_body(
    job_id: str, size: int, target: int | None = None, satellites: list[str] | None = None
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "size": size,
        "generation": size,
        "target": size if target is None else target,
        "throughput": {"1": 100.0, "2": 190.0, "3": 270.0, "4": 340.0},
        "history": [{"t": time.time(), "event": "report"}],
        "satellites": satellites or [],
    }
