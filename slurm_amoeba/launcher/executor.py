"""``ElasticExecutor``: submitit's executor for elastic jobs (``executor.submit(train, ...)``).

Built on submitit through its extension points (:class:`submitit.core.core.PicklingExecutor` hooks and
:class:`submitit.core.core.Job`), not a copy of it: submitit pickles the function into the job folder, writes the
submission file, and reads the result back; this module makes the submission file a heterogeneous elastic job
(:mod:`slurm_amoeba.launcher.submission`) whose batch script runs the agent (``amoeba-run``), and every worker runs
the function under the elastic runtime. ``result()`` is rank 0's return value.

    executor = ElasticExecutor(folder="jobs/%j")
    executor.update_parameters(min_workers=2, max_workers=8, gpus_per_worker=1, time=60)
    job = executor.submit(train, epochs=10)
    job.resize(4)            # grow into idle GPUs now
    job.history()            # generations, sizes, pauses, throughput per size
    job.result()
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import sys
import time
import typing as tp
import uuid
from pathlib import Path

import cloudpickle
from submitit.core import core, utils

from slurm_amoeba.core.errors import AmoebaError, SpecError
from slurm_amoeba.core.jobenv import DEFAULT_GPUS_PER_WORKER, ENV_JOB_FOLDER, ENV_STATE_DIR
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.launcher.handle import AgentHandle
from slurm_amoeba.launcher.submission import ElasticJobShape
from slurm_amoeba.slurm import CliSlurmClient, JobState, SlurmCommandError, parse_sbatch_reply, render_batch_script
from slurm_amoeba.slurm.runner import run_command

R = tp.TypeVar("R")
log = logging.getLogger(__name__)


@dataclasses.dataclass
class ElasticParameters:
    """The parameters :meth:`ElasticExecutor.update_parameters` accepts, with their defaults."""

    min_workers: int = 1
    max_workers: int = 1
    gpus_per_worker: int = DEFAULT_GPUS_PER_WORKER
    cpus_per_worker: int = 1
    mem_per_worker: int = 0
    partition: str | None = None
    elastic_partition: str = "elastic"
    time: int | None = None
    job_name: str = "amoeba"
    daemon_endpoint: str | None = None
    python: str = sys.executable


class ElasticInfoWatcher(core.InfoWatcher):
    """submitit's state watcher, fed by slurm_amoeba's Slurm client (one ``squeue --json`` for all jobs)."""

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        """Slurm's state of ``job_id`` (``UNKNOWN`` until known)."""
        return self.get_info(job_id, mode=mode).get("State") or "UNKNOWN"

    def update(self) -> None:
        """Read every registered job's state: squeue for remembered jobs, accounting for the others."""
        self._num_calls += 1
        slurm = CliSlurmClient(timeout=30)  # this process's environment now (SLURM_CONF may change)
        try:
            ids = {int(j) for j in self._registered}
            records = {str(r.job_id): r.state.value for r in slurm.jobs(job_ids=ids)}
            for job_id in self._registered - set(records):
                state = slurm.accounting_state(int(job_id))
                if state is not JobState.UNKNOWN:
                    records[job_id] = state.value
        except (SlurmCommandError, AmoebaError) as exc:
            log.warning("[launcher] could not read job states (%s); they may be stale", exc)
        else:
            self._info_dict.update({job_id: {"State": state} for job_id, state in records.items()})
        self._last_status_check = time.time()
        for job_id in self._registered - self._finished:
            if self.is_done(job_id, mode="cache"):
                self._finished.add(job_id)


class ElasticJob(core.Job[R]):
    """A submitted elastic job: submitit's ``Job`` (``result``, ``done``, ``cancel``, ``exception``, ``stdout``)
    plus :meth:`resize`, :meth:`workers` and :meth:`history`."""

    watcher = ElasticInfoWatcher()

    @property
    def state_dir(self) -> Path:
        """Where the job's agent keeps its status and the workers' logs."""
        return self.paths.folder / f"{self.job_id}_amoeba"

    @property
    def agent(self) -> AgentHandle:
        """The handle on the job's agent (status, resize)."""
        return AgentHandle(self.job_id, self.state_dir)

    def status(self) -> dict[str, tp.Any]:
        """The agent's latest status (empty until the agent has started)."""
        return self.agent.status()

    def workers(self) -> int:
        """Workers training in the current generation (0 before the first)."""
        return self.agent.workers()

    def history(self) -> dict[str, tp.Any]:
        """Generations (size, members, pause before each), resize events, and throughput per worker count."""
        return self.agent.history()

    def resize(self, workers: int, *, reason: str = "user request", timeout_s: float = 10.0) -> int:
        """Ask the job's agent for ``workers`` workers; it grows or shrinks in the background.

        Returns:
            The target the agent accepted.

        Raises:
            SpecError: ``workers`` is outside the job's range, or the agent refused.
            AmoebaError: the agent is not running yet (or any more), or did not answer.
        """
        return self.agent.resize(workers, reason=reason, timeout_s=timeout_s)

    def cancel(self, check: bool = True) -> None:
        """Cancel the job; its agent releases every satellite on the way out."""
        try:
            CliSlurmClient(timeout=30).cancel(int(self.job_id))
        except SlurmCommandError:
            if check:
                raise


class ElasticExecutor(core.PicklingExecutor):
    """Submit functions as elastic jobs (see the module docstring).

    Args:
        folder: the job folder (``%j`` becomes the job id), as with submitit.
        max_num_timeout: as with submitit.
    """

    job_class = ElasticJob

    def __init__(self, folder: str | Path, max_num_timeout: int = 0) -> None:
        super().__init__(folder, max_num_timeout=max_num_timeout)
        self.parameters: dict[str, tp.Any] = dataclasses.asdict(ElasticParameters())
        self.slurm = CliSlurmClient(timeout=30)

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(ElasticParameters)}

    def _internal_update_parameters(self, **kwargs: tp.Any) -> None:
        unknown = sorted(set(kwargs) - self._valid_parameters())
        if unknown:
            defaults = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(ElasticParameters))
            raise SpecError(f"unknown parameter(s) {', '.join(unknown)}; valid parameters (defaults): {defaults}")
        merged = {**self.parameters, **kwargs}
        self._spec(merged)  # validate now, with the user's values in the message
        self.parameters = merged

    @staticmethod
    def _spec(params: dict[str, tp.Any]) -> ElasticSpec:
        return ElasticSpec(
            min_workers=int(params["min_workers"]),
            max_workers=int(params["max_workers"]),
            gpus_per_worker=int(params["gpus_per_worker"]),
            cpus_per_worker=int(params["cpus_per_worker"]),
            mem_per_worker_mb=int(params["mem_per_worker"]),
        )

    def _shape(self) -> ElasticJobShape:
        p = self.parameters
        folder = utils.JobPaths(self.folder).folder
        return ElasticJobShape(
            spec=self._spec(p),
            partition=p["partition"],
            elastic_partition=p["elastic_partition"],
            name=p["job_name"],
            time_min=p["time"],
            daemon_endpoint=p["daemon_endpoint"],
            output=str(folder / "%j_0_log.out"),
            error=str(folder / "%j_0_log.err"),
        )

    def submit(self, fn: tp.Callable[..., R], *args: tp.Any, **kwargs: tp.Any) -> ElasticJob[R]:
        """Submit ``fn(*args, **kwargs)`` to run on every worker of an elastic job.

        Raises:
            SpecError: the function or its arguments cannot be pickled, or the job's minimum can never run in its
                partition — before anything is submitted.
        """
        try:
            cloudpickle.dumps((fn, args, kwargs))
        except Exception as exc:  # cloudpickle raises many kinds; all mean the same to the user
            raise SpecError(
                f"{getattr(fn, '__name__', fn)!r} or its arguments cannot be pickled ({type(exc).__name__}: {exc}); "
                "pass data by path or build it inside the function"
            ) from None
        self._shape().check_capacity(self.slurm)
        job = super().submit(fn, *args, **kwargs)
        return tp.cast(ElasticJob[R], job)

    def _num_tasks(self) -> int:
        return 1

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        shape = self._shape()
        python = str(self.parameters["python"])
        agent = [python, "-m", "slurm_amoeba.launcher.run", "--", python, "-m", "slurm_amoeba.launcher.fn_worker"]
        text = render_batch_script(shape.components(), [agent])
        # The folder may hold %j (submitit's convention): the batch script knows the id, so the shell fills it in.
        template = str(utils.JobPaths(self.folder).folder)
        folder = '"$SLURM_JOB_ID"'.join(shlex.quote(part) for part in template.split("%j"))
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in shape.environment().items())
        exports += f"export {ENV_JOB_FOLDER}={folder}\n"
        exports += f'export {ENV_STATE_DIR}="${ENV_JOB_FOLDER}/${{SLURM_JOB_ID}}_amoeba"\n'
        return text.replace("set -euo pipefail\n", "set -euo pipefail\n" + exports, 1)

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return ["sbatch", "--parsable", str(submission_file_path)]

    @staticmethod
    def _get_job_id_from_submission_command(string: bytes | str) -> str:
        text = string.decode() if isinstance(string, bytes) else string
        return str(parse_sbatch_reply(text))

    def _submit_command(self, command: str) -> core.Job[tp.Any]:
        # submitit's own version runs sbatch itself; here it goes through the Slurm layer (timeouts, typed errors).
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = uuid.uuid4().hex
        path = folder / f".submission_file_{tmp}.sh"
        path.write_text(self._make_submission_file_text(command, tmp))
        output = run_command(self._make_submission_command(path), timeout=30, env=self.slurm.env).stdout
        job_id = self._get_job_id_from_submission_command(output)
        job: core.Job[tp.Any] = self.job_class(folder=self.folder, job_id=job_id, tasks=[0])
        job.paths.move_temporary_file(path, "submission_file", keep_as_symlink=True)
        return job
