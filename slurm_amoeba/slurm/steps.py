"""Start a job step (``srun``) that runs while its caller goes on: the worker groups of an elastic job.

:func:`start_step` launches ``srun`` inside the current allocation (or one component of it) and returns the running
process; the caller watches it and stops it gracefully with SIGTERM (srun forwards it to every task) or through
``scancel JOB.STEP``. Like every Slurm command in slurm_amoeba it is an argv list, never a shell.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.slurm.runner import SlurmCommandError

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StepOptions:
    """srun options of one step.

    Attributes:
        ntasks: tasks (one per worker).
        het_group: the heterogeneous component to run in (None: the job's only one).
        cpus_per_task: CPUs of each task.
        gpus_per_task: GPUs of each task (0: none).
        name: the step's name (shown by ``squeue --steps``).
        output: srun's ``--output`` pattern (``%t`` is the task number), or None to inherit the caller's.
        jobid: run inside this job's allocation instead of the caller's (``--jobid``).
    """

    ntasks: int
    het_group: int | None = None
    cpus_per_task: int = 1
    gpus_per_task: int = 0
    name: str | None = None
    output: str | None = None
    jobid: int | None = None

    def __post_init__(self) -> None:
        if self.ntasks < 1:
            raise SpecError(f"StepOptions.ntasks={self.ntasks} is invalid: a step needs at least one task")
        if self.cpus_per_task < 1 or self.gpus_per_task < 0:
            raise SpecError(
                f"StepOptions cpus_per_task={self.cpus_per_task}, gpus_per_task={self.gpus_per_task} are invalid"
            )

    def to_args(self) -> list[str]:
        """The srun arguments."""
        args = [f"--ntasks={self.ntasks}", f"--cpus-per-task={self.cpus_per_task}", "--kill-on-bad-exit=0"]
        # Steps of one allocation start and stop independently (SLURM-FACTS.md): --exact keeps each to its own CPUs.
        args.append("--exact")
        if self.het_group is not None:
            args.append(f"--het-group={self.het_group}")
        if self.gpus_per_task:
            args.append(f"--gpus-per-task={self.gpus_per_task}")
        if self.name:
            args.append(f"--job-name={self.name}")
        if self.output:
            args.append(f"--output={self.output}")
        if self.jobid is not None:
            args.append(f"--jobid={self.jobid}")
        return args


def start_step(
    options: StepOptions,
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    log_path: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Launch ``srun`` with ``command`` in the background.

    Args:
        options: the step's options.
        command: argv of each task.
        env: srun's environment (it passes it on to the tasks).
        log_path: where srun's own messages go (None: the caller's stderr).

    Returns:
        The running srun process (its exit status is the step's).

    Raises:
        SpecError: the command is empty.
        SlurmCommandError: srun could not be started (not installed).
    """
    if not command:
        raise SpecError("a step needs a command to run")
    argv = ["srun", *options.to_args(), *command]
    logger.info("[slurm/steps] starting %s", " ".join(argv))
    try:
        if log_path is None:
            return subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL)
        with open(log_path, "ab") as log:
            return subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    except OSError as exc:
        raise SlurmCommandError(argv, None, str(exc), hint="is Slurm's srun installed and on PATH?") from None
