"""The shape of an elastic job on Slurm, shared by ``amoeba-sbatch`` and :class:`ElasticExecutor`.

One heterogeneous job: component 0 runs the agent (one task, CPUs only, never leaves); component 1 holds the
minimum workers (one task per worker). The worker range and per-worker resources travel to ``amoeba-run`` in the
job's environment (:class:`~slurm_amoeba.core.jobenv.JobEnv`, whose first variables the SPANK plugin sets too).
Everything here is checked before anything is submitted.
"""

from __future__ import annotations

import dataclasses

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.core.jobenv import DEFAULT_ELASTIC_PARTITION, JobEnv
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.slurm import SlurmClient, SubmitOptions


@dataclasses.dataclass(frozen=True)
class ElasticJobShape:
    """An elastic job's Slurm request.

    Attributes:
        spec: worker range and per-worker resources.
        partition: partition of the job itself (the agent and the minimum workers); None: the default.
        elastic_partition: partition of the satellites that grow it.
        name: job name.
        time_min: time limit in minutes (None: the partition's).
        output: the batch script's (the agent's) stdout path pattern.
        error: its stderr path pattern.
        daemon_endpoint: the daemon the agent reports to, if any.
        extra: further sbatch arguments for component 0 (the user's own sbatch options; sbatch copies most of them
            to component 1).
        worker_extra: further sbatch arguments for component 1 (options sbatch does not copy, e.g. the account).
    """

    spec: ElasticSpec
    partition: str | None = None
    elastic_partition: str = DEFAULT_ELASTIC_PARTITION
    name: str | None = None
    time_min: int | None = None
    output: str | None = None
    error: str | None = None
    daemon_endpoint: str | None = None
    extra: tuple[str, ...] = ()
    worker_extra: tuple[str, ...] = ()

    def components(self) -> list[SubmitOptions]:
        """Component 0 (the agent) and component 1 (the minimum workers)."""
        spec = self.spec
        agent = SubmitOptions(
            name=self.name,
            partition=self.partition,
            ntasks=1,
            cpus_per_task=1,
            time_min=self.time_min,
            output=self.output,
            error=self.error,
            extra=self.extra,
        )
        workers = SubmitOptions(
            partition=self.partition,
            ntasks=spec.min_workers,
            cpus_per_task=spec.cpus_per_worker,
            time_min=self.time_min,
            mem_mb=spec.mem_per_worker_mb * spec.min_workers or None,
            extra=(
                *self.worker_extra,
                *((f"--gpus-per-task={spec.gpus_per_worker}",) if spec.gpus_per_worker else ()),
            ),
        )
        return [agent, workers]

    def job_env(self) -> JobEnv:
        """The job's settings as ``amoeba-run`` reads them from its environment."""
        return JobEnv.for_spec(
            self.spec, elastic_partition=self.elastic_partition, daemon_endpoint=self.daemon_endpoint or None
        )

    def environment(self) -> dict[str, str]:
        """What ``amoeba-run`` reads in the job (sbatch exports the submitter's environment)."""
        return self.job_env().to_environ()

    def check_capacity(self, slurm: SlurmClient) -> None:
        """Refuse a job whose minimum can never run in its partition (before anything is submitted).

        Raises:
            SpecError: the partition does not exist, or all its nodes together hold fewer GPUs or CPUs than the
                minimum workers (plus the agent) need.
        """
        nodes = slurm.nodes(partition=self.partition) if self.partition else slurm.nodes()
        if not nodes:
            raise SpecError(f"partition {self.partition!r} has no nodes (or does not exist); `sinfo` lists them")
        spec = self.spec
        gpus = sum(n.gpus_total for n in nodes)
        need_gpus = spec.min_workers * spec.gpus_per_worker
        if need_gpus > gpus:
            raise SpecError(
                f"--elastic {spec.min_workers}:{spec.max_workers} with {spec.gpus_per_worker} GPU(s) per worker needs "
                f"{need_gpus} GPUs at least, but partition {self.partition or '(default)'} has {gpus} in all; "
                f"lower MIN to {gpus // max(1, spec.gpus_per_worker)} or fewer"
            )
        cpus = sum(n.cpus for n in nodes)
        need_cpus = spec.min_workers * spec.cpus_per_worker + 1
        if need_cpus > cpus:
            raise SpecError(
                f"--elastic {spec.min_workers}:{spec.max_workers} needs {need_cpus} CPUs at least (workers and the "
                f"agent), but partition {self.partition or '(default)'} has {cpus} in all"
            )
