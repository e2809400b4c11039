"""``ElasticExecutor``: submitit's executor for elastic jobs (``executor.submit(train, ...)``).

Built on submitit through its extension points (:class:`submitit.core.core.PicklingExecutor` hooks and
:class:`submitit.core.core.Job`), not a copy of it: submitit pickles the function into the job folder, writes the
submission file, and reads the result back; this module makes the submission file a heterogeneous elastic job
(:mod:`slurm_amoeba.launcher.submission`) whose batch script runs the agent (``amoeba-run``), and every worker runs
the function under the elastic runtime. ``result()`` is rank 0's return value.

    executor = ElasticExecutor(folder="jobs/%j")
    executor.update_parameters(min_workers=2, max_workers=8, gpus_per_worker=1, timeout_min=60,
                               slurm_account="lab", mem_gb=32, slurm_setup=["module load cuda"])
    job = executor.submit(train, epochs=10)
    job.resize(4)            # grow into idle GPUs now
    job.history()            # generations, sizes, pauses, throughput per size
    job.stdout()             # rank 0's output so far; job.agent_log() is the agent's
    job.result()

Parameters are :class:`~slurm_amoeba.launcher.parameters.ElasticParameters`, under their own names or submitit's
(``timeout_min``, ``slurm_partition``, ``mem_gb``, ``slurm_additional_parameters``, ...). ``submit``, ``map_array``
and ``submit_array`` (one elastic job per item) check every function, its arguments and the job's minimum before
anything is submitted. The submitit internals this module extends are pinned in pyproject (``submitit>=1.5,<1.6``)
and checked by ``tests/unit/launcher/test_submitit_contract.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import time
import typing as tp
import uuid
from pathlib import Path

from slurm_amoeba.core.install import install_command

try:
    import cloudpickle
    from submitit.core import core, utils
except ImportError as _missing:  # the base install has neither: name the extra that brings them
    _module = (_missing.name or "submitit").split(".")[0]
    raise ImportError(f"ElasticExecutor needs {_module} (the 'train' extra): {install_command('train')}") from None

from slurm_amoeba.agent.config import DEFAULT_MAX_REQUEUES, ENV_MAX_REQUEUES
from slurm_amoeba.core.errors import AmoebaError, SpecError
from slurm_amoeba.core.jobenv import ENV_JOB_FOLDER, ENV_STATE_DIR
from slurm_amoeba.launcher.guard import start_guard
from slurm_amoeba.launcher.handle import AgentHandle
from slurm_amoeba.launcher.parameters import ElasticParameters, updated
from slurm_amoeba.launcher.submission import ElasticJobShape, admission_delay_s, lifecycle_options, signal_lead_s
from slurm_amoeba.slurm import (
    CliSlurmClient,
    JobState,
    SlurmClient,
    SlurmCommandError,
    parse_sbatch_reply,
    render_batch_script,
    sbatch_argv,
)

R = tp.TypeVar("R")
log = logging.getLogger(__name__)

#: Lines of the agent's log shown when a job ends without a result.
AGENT_LOG_TAIL = 40


class ElasticInfoWatcher(core.InfoWatcher):
    """submitit's state watcher, fed by slurm_amoeba's Slurm client (one read of Slurm's jobs for all jobs).

    Args:
        slurm: the executor's Slurm client.
        delay_s: as submitit's: the least time between two reads.
    """

    def __init__(self, slurm: SlurmClient, delay_s: int = 60) -> None:
        super().__init__(delay_s)
        self.slurm = slurm

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        """Slurm's state of ``job_id`` (``UNKNOWN`` until known)."""
        return self.get_info(job_id, mode=mode).get("State") or "UNKNOWN"

    def update(self) -> None:
        """Read every registered job's state: squeue for remembered jobs, accounting for the others."""
        self._num_calls += 1
        slurm = self.slurm
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
    """A submitted elastic job: submitit's ``Job`` (``result``, ``done``, ``cancel``, ``exception``) plus
    :meth:`resize`, :meth:`workers`, :meth:`history` and :meth:`agent_log`.

    ``stdout()`` and ``stderr()`` are rank 0's output (whichever worker holds rank 0 while it writes; see
    :mod:`slurm_amoeba.launcher.fn_worker`), in submitit's files ``<job id>_0_log.out``/``.err``.

    Args:
        folder: the job folder, as with submitit.
        job_id: Slurm's job id.
        tasks: as with submitit (an elastic job has one task: its agent).
        watcher: the state watcher of the executor that submitted it, which holds its Slurm client.
    """

    watcher: ElasticInfoWatcher

    def __init__(
        self, folder: str | Path, job_id: str, tasks: tp.Sequence[int] = (0,), *, watcher: ElasticInfoWatcher
    ) -> None:
        self.watcher = watcher  # before submitit's constructor, which registers the job with it
        super().__init__(folder, job_id, tasks)

    @property
    def slurm(self) -> SlurmClient:
        """The Slurm client of the executor that submitted the job."""
        return self.watcher.slurm

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

    @property
    def agent_log_path(self) -> Path:
        """The batch script's output: the agent's log (``stdout()``/``stderr()`` are rank 0's)."""
        return self.paths.folder / f"{self.job_id}_agent_log.out"

    def agent_log(self) -> str | None:
        """The agent's log so far (None before the job started)."""
        try:
            return self.agent_log_path.read_text(errors="replace")
        except FileNotFoundError:
            return None

    def _get_outcome_and_result(self) -> tuple[str, tp.Any]:
        try:
            return super()._get_outcome_and_result()
        except utils.UncompletedJobError as exc:  # no result: the agent's log usually says why
            tail = "\n".join((self.agent_log() or "").splitlines()[-AGENT_LOG_TAIL:])
            if not tail:
                raise
            raise utils.UncompletedJobError(
                f"{exc}\nThe last lines of the agent's log {self.agent_log_path}:\n{'-' * 40}\n{tail}"
            ) from None

    def cancel(self, check: bool = True) -> None:
        """Cancel the job; its agent releases every satellite on the way out."""
        try:
            self.slurm.cancel(int(self.job_id))
        except SlurmCommandError:
            if check:
                raise


class ElasticExecutor(core.PicklingExecutor):
    """Submit functions as elastic jobs (see the module docstring).

    Args:
        folder: the job folder (``%j`` becomes the job id), as with submitit.
        max_num_timeout: as with submitit: how many times the job may requeue itself before its time limit
            (after a final checkpoint; :mod:`slurm_amoeba.agent.lifecycle`); a node failure's requeue does not count.
        slurm: the Slurm client of every call the executor and its jobs make; None: the command-line client of this
            process's environment (the executor is its program's entry: the client is built here, once).
    """

    job_class = ElasticJob

    def __init__(
        self, folder: str | Path, max_num_timeout: int = DEFAULT_MAX_REQUEUES, *, slurm: SlurmClient | None = None
    ) -> None:
        super().__init__(folder, max_num_timeout=max_num_timeout)
        self.elastic = ElasticParameters()
        self.parameters: dict[str, tp.Any] = dataclasses.asdict(self.elastic)
        self.slurm: SlurmClient = CliSlurmClient.from_environment() if slurm is None else slurm
        self.watcher = ElasticInfoWatcher(self.slurm)

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(ElasticParameters)}

    def _internal_update_parameters(self, **kwargs: tp.Any) -> None:
        self.elastic = updated(self.elastic, kwargs)
        self.parameters = dataclasses.asdict(self.elastic)

    def _shape(self) -> ElasticJobShape:
        p = self.elastic
        folder = utils.JobPaths(self.folder).folder
        return ElasticJobShape(
            spec=p.spec(),
            partition=p.partition,
            elastic_partition=p.elastic_partition,
            name=p.job_name,
            time_min=p.time,
            daemon_endpoint=p.daemon_endpoint,
            output=str(folder / "%j_agent_log.out"),  # and its stderr
            extra=p.job_terms() + p.additional_args(),
            lifecycle=lifecycle_options(
                signal_lead_s(p.time, p.signal_delay_s), (k for k, _ in p.additional_parameters)
            ),
            begin_delay_s=admission_delay_s(os.environ, (k for k, _ in p.additional_parameters)),
            share=p.share,
            share_partition=p.share_partition,
        )

    def _check(self, submissions: tp.Sequence[utils.DelayedSubmission]) -> None:
        """Refuse, before anything is submitted, a function or arguments that cannot be pickled, or a job whose
        minimum can never run in its partition."""
        for delayed in submissions:
            try:
                cloudpickle.dumps((delayed.function, delayed.args, delayed.kwargs))
            except Exception as exc:  # cloudpickle raises many kinds; all mean the same to the user
                name = getattr(delayed.function, "__name__", delayed.function)
                raise SpecError(
                    f"{name!r} or its arguments cannot be pickled ({type(exc).__name__}: {exc}); "
                    "pass data by path or build it inside the function"
                ) from None
        self._shape().check_capacity(self.slurm)

    def submit(self, fn: tp.Callable[..., R], *args: tp.Any, **kwargs: tp.Any) -> ElasticJob[R]:
        """Submit ``fn(*args, **kwargs)`` to run on every worker of an elastic job.

        Raises:
            SpecError: the function or its arguments cannot be pickled, or the job's minimum can never run in its
                partition — before anything is submitted.
        """
        return tp.cast(ElasticJob[R], super().submit(fn, *args, **kwargs))

    def _internal_process_submissions(
        self, delayed_submissions: list[utils.DelayedSubmission]
    ) -> list[core.Job[tp.Any]]:
        # submit, map_array, submit_array and batch() all come here: one elastic job per submission, every one
        # checked before the first is submitted.
        self._check(delayed_submissions)
        jobs = super()._internal_process_submissions(delayed_submissions)
        endpoint = self._shape().daemon_endpoint
        for job in jobs:  # admission at the requested size: the owner's side (launcher/guard.py)
            start_guard(int(str(job.job_id).split("_")[0]), endpoint, os.environ)
        return jobs

    def _num_tasks(self) -> int:
        return 1

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        shape = self._shape()
        components = shape.components()
        job = components[0]
        components[0] = dataclasses.replace(job, extra=job.extra + self.elastic.worker_terms())
        python = self.elastic.python
        # exec: the agent is the batch shell, which Slurm's time-limit warning (--signal=B:USR1) is sent to.
        agent = [
            "exec",
            python,
            "-m",
            "slurm_amoeba.launcher.run",
            "--",
            python,
            "-m",
            "slurm_amoeba.launcher.fn_worker",
        ]
        # The folder may hold %j (submitit's convention): the batch script knows the id, so the shell fills it in.
        template = str(utils.JobPaths(self.folder).folder)
        folder = '"$SLURM_JOB_ID"'.join(shlex.quote(part) for part in template.split("%j"))
        preamble = [f"export {k}={shlex.quote(v)}" for k, v in shape.environment().items()]
        preamble.append(f"export {ENV_JOB_FOLDER}={folder}")
        preamble.append(f"export {ENV_MAX_REQUEUES}={self.max_num_timeout}")  # submitit's bound on timeouts
        preamble.append(f'export {ENV_STATE_DIR}="${ENV_JOB_FOLDER}/${{SLURM_JOB_ID}}_amoeba"')
        if self.elastic.setup:  # the user's lines, as submitit runs them: unset variables allowed (module load)
            preamble += ["# setup", "set +u", *self.elastic.setup, "set -u"]
        return render_batch_script(components, [agent], preamble)

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return sbatch_argv([], str(submission_file_path))

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
        job_id = str(self.slurm.submit(path, []))  # the script's #SBATCH lines say everything
        job: core.Job[tp.Any] = ElasticJob(folder=self.folder, job_id=job_id, tasks=[0], watcher=self.watcher)
        job.paths.move_temporary_file(path, "submission_file", keep_as_symlink=True)
        return job
