"""The settings of one job's agent (:class:`AgentConfig`), built by ``amoeba-run`` from the job it runs in."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.core.spec import ElasticSpec


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """What one agent needs to know.

    Attributes:
        job_id: the Slurm job id of the elastic job (the heterogeneous leader).
        spec: worker range and per-worker resources.
        command: argv each worker runs (the user's training program).
        state_dir: where the status file, satellite scripts and logs go (on a file system the submitter sees).
        advertise_addr: the address of the agent's node that workers and the daemon can reach.
        elastic_partition: where satellites run.
        daemon_endpoint: the daemon's address (``tcp://host:port``), or None to run without a daemon.
        worker_env: extra environment for every worker.
        satellite_time_min: time limit of satellites in minutes (None: the partition's).
        satellite_qos: the QOS of satellites; None: the parent job's own. A site whose preemption is QOS-based
            (``PreemptType=preempt/qos``) names its preemptible QOS here, or satellites would not be preemptible.
        main_het_group: the heterogeneous component the main worker group runs in (1 with ``amoeba-sbatch``); None
            for a one-component allocation (plain ``sbatch --elastic``), where the workers' step shares the job with
            the agent in the batch step.
        poll_s: how often the agent looks at Slurm and the coordinator.
        report_s: how often it reports to the daemon.
        coordinator: further coordinator settings (timeouts).
    """

    job_id: str
    spec: ElasticSpec
    command: tuple[str, ...]
    state_dir: Path
    advertise_addr: str
    elastic_partition: str = "elastic"
    daemon_endpoint: str | None = None
    worker_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    satellite_time_min: int | None = None
    satellite_qos: str | None = None
    main_het_group: int | None = 1
    poll_s: float = 0.5
    report_s: float = 2.0
    coordinator: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.command:
            raise SpecError("the agent needs a worker command to run, e.g. ['python', 'train.py']")
        if not self.job_id.isdigit():
            raise SpecError(f"job_id={self.job_id!r} is not a Slurm job id")
