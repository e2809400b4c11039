"""The allocation a batch script runs in, read from the ``SLURM_*`` variables Slurm sets there.

``amoeba-run`` (DESIGN.md, job flow) starts the job's minimum workers as a step of the allocation it finds: component
1 of the heterogeneous job that ``amoeba-sbatch`` and the executor submit, or, for plain ``sbatch --elastic`` (the
SPANK plugin), the job's only component, which the agent then shares with the workers from the batch step.
:func:`worker_allocation` tells which, and what that component holds, so that a job too small for its minimum is
refused with the ``#SBATCH`` lines that would fix it instead of an srun error. Pure: no command is run.

Slurm 22.05 sets, in a batch step: ``SLURM_HET_SIZE`` (heterogeneous jobs only), ``SLURM_NTASKS`` (only when the
job asked for a task count), ``SLURM_TASKS_PER_NODE`` (always, e.g. ``2(x3),1``), ``SLURM_CPUS_PER_TASK`` and
``SLURM_GPUS_PER_TASK`` (when asked for), ``SLURM_GPUS_ON_NODE`` (GPUs of the batch node), and each of these with a
``_HET_GROUP_<n>`` suffix per component of a heterogeneous job (measured; SLURM-FACTS.md).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from slurm_amoeba.core.errors import ParseError

_TASKS_PER_NODE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_tasks_per_node(text: str) -> int:
    """The task count of Slurm's compressed per-node list, e.g. ``"2(x3),1"`` -> 7.

    Raises:
        ParseError: the text is not such a list.
    """
    total = 0
    for part in text.split(","):
        match = _TASKS_PER_NODE.match(part.strip())
        if match is None:
            raise ParseError("expected counts like 2(x3),1", source="SLURM_TASKS_PER_NODE", text=text)
        total += int(match.group(1)) * int(match.group(2) or 1)
    return total


def _gpus(env: Mapping[str, str], name: str) -> int | None:
    """``--gpus-per-task`` as Slurm exports it: ``2``, or typed, ``a100:2`` (several types add up)."""
    text = env.get(name, "")
    if not text:
        return None
    counts = [part.rsplit(":", 1)[-1] for part in text.split(",")]
    if not all(c.isdigit() for c in counts):
        raise ParseError("expected [TYPE:]COUNT[,...]", source=name, text=text)
    return sum(int(c) for c in counts)


def _count(env: Mapping[str, str], name: str) -> int | None:
    text = env.get(name, "")
    if not text:
        return None
    if not text.isdigit():
        raise ParseError("expected a whole number", source=name, text=text)
    return int(text)


@dataclasses.dataclass(frozen=True)
class WorkerAllocation:
    """The part of the current job that holds the minimum workers.

    Attributes:
        job_id: the job (the heterogeneous leader's id).
        het_group: the component (1 in a heterogeneous job), or None for a job of one component.
        tasks: its task count (one worker per task).
        cpus_per_task: ``--cpus-per-task`` of that component, if it gave one.
        gpus_per_task: ``--gpus-per-task`` of that component, if it gave one.
        gpus_on_batch_node: GPUs the job holds on the batch node (one-component jobs; 0 when none).
    """

    job_id: str
    het_group: int | None
    tasks: int
    cpus_per_task: int | None
    gpus_per_task: int | None
    gpus_on_batch_node: int


def worker_allocation(env: Mapping[str, str]) -> WorkerAllocation:
    """Read the worker component of the job a batch script runs in.

    Args:
        env: the batch script's environment.

    Returns:
        Component 1 of a heterogeneous job, else the whole job.

    Raises:
        ParseError: not inside a Slurm job (no ``SLURM_JOB_ID``), or a variable Slurm sets is malformed.
    """
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        raise ParseError("not inside a Slurm job", source="SLURM_JOB_ID")
    het_size = _count(env, "SLURM_HET_SIZE") or 1
    if het_size >= 2:
        suffix = "_HET_GROUP_1"
        tasks = _count(env, "SLURM_NTASKS" + suffix)
        if tasks is None:
            tasks = parse_tasks_per_node(env.get("SLURM_TASKS_PER_NODE" + suffix, "0"))
        return WorkerAllocation(
            job_id=job_id,
            het_group=1,
            tasks=tasks,
            cpus_per_task=_count(env, "SLURM_CPUS_PER_TASK" + suffix),
            gpus_per_task=_gpus(env, "SLURM_GPUS_PER_TASK" + suffix),
            gpus_on_batch_node=0,
        )
    tasks = _count(env, "SLURM_NTASKS")
    if tasks is None:
        tasks = parse_tasks_per_node(env.get("SLURM_TASKS_PER_NODE", "1"))
    return WorkerAllocation(
        job_id=job_id,
        het_group=None,
        tasks=tasks,
        cpus_per_task=_count(env, "SLURM_CPUS_PER_TASK"),
        gpus_per_task=_gpus(env, "SLURM_GPUS_PER_TASK"),
        gpus_on_batch_node=_count(env, "SLURM_GPUS_ON_NODE") or 0,
    )
