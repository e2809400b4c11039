"""What a coordinator shows: read-only snapshots of one job's membership, throughput and failures.

:meth:`~slurm_amoeba.runtime.coordinator.Coordinator.view` returns a :class:`CoordinatorView`; the job's agent
(DESIGN.md, job flow: its pure planner :mod:`slurm_amoeba.agent.plan` reads it through ``CoordinatorSeen``), local
mode and the status tools read it. Plain frozen data over the pure membership's types: importing it loads no torch,
so the agent's planner stays importable where torch is not installed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from slurm_amoeba.runtime.failures import ErrorReport, FailureClass
from slurm_amoeba.runtime.membership import GenerationRecord, Phase, WorkerInfo, WorkerStatus
from slurm_amoeba.runtime.protocol import GenerationPlan

__all__ = ["CoordinatorView", "ThroughputStats", "WorkerView"]


@dataclasses.dataclass(frozen=True)
class ThroughputStats:
    """Measured training speed at one world size, from rank 0's progress reports.

    Attributes:
        world_size: number of workers.
        samples_per_s: the latest reported samples per second.
        step_time_s: the latest reported mean step time.
        reports: how many progress reports were seen at this size.
    """

    world_size: int
    samples_per_s: float
    step_time_s: float
    reports: int


@dataclasses.dataclass(frozen=True)
class WorkerView:
    """A read-only copy of what the coordinator knows about a worker."""

    worker_id: str
    status: WorkerStatus
    pid: int
    host: str
    heartbeat_age_s: float
    leave_requested: bool
    reason: str

    @classmethod
    def of(cls, info: WorkerInfo, now: float) -> WorkerView:
        """The view of ``info`` at ``now`` (the coordinator's monotonic clock, as its heartbeat times)."""
        return cls(
            worker_id=info.worker_id,
            status=info.status,
            pid=info.pid,
            host=info.host,
            heartbeat_age_s=now - info.last_heartbeat,
            leave_requested=info.leave_requested,
            reason=info.reason,
        )


@dataclasses.dataclass(frozen=True)
class CoordinatorView:
    """A consistent read-only snapshot of the coordinator's state.

    Attributes:
        phase: the job's phase.
        generation: the current generation number (0 before the first).
        plan: the current generation's plan.
        workers: every worker ever seen, by id.
        history: formed generations in order.
        throughput: measured speed per world size.
        progress: rank 0's latest progress report (JSON object), if any.
        lost_reason: why the job was lost, if it was.
        refused: store values and events refused so far (not sealed with the job's secret, replayed, or from a
            worker the coordinator did not issue or that may not change what it claimed to).
        errors: every worker's error event, oldest first (runtime/failures.py).
        failure: the class of the failure that ended the job (a user error on every member, or again after a
            rollback), or None.
    """

    phase: Phase
    generation: int
    plan: GenerationPlan | None
    workers: dict[str, WorkerView]
    history: tuple[GenerationRecord, ...]
    throughput: dict[int, ThroughputStats]
    progress: dict[str, Any]
    lost_reason: str
    refused: int = 0
    errors: tuple[ErrorReport, ...] = ()
    failure: FailureClass | None = None

    @property
    def world_size(self) -> int:
        """Members in the current generation (0 before the first)."""
        return 0 if self.plan is None else self.plan.world_size

    def ready_workers(self) -> list[str]:
        """Warm workers waiting for admission."""
        return [w for w, v in self.workers.items() if v.status is WorkerStatus.READY]
