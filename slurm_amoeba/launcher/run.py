"""``amoeba-run``: the in-job entry, like ``torchrun`` but elastic (``amoeba-run python train.py ...``).

In the batch script of an elastic job (submitted with ``amoeba-sbatch``, ``#SBATCH --elastic`` or
:class:`~slurm_amoeba.launcher.executor.ElasticExecutor`) it becomes the job's **agent**: it hosts the rendezvous,
starts the minimum workers and grows or shrinks the job on directive (:mod:`slurm_amoeba.agent.agent`). The minimum
workers run in component 1 of the heterogeneous job that ``amoeba-sbatch`` and the executor submit; in the
ordinary job that plain ``sbatch`` makes from ``#SBATCH --elastic=MIN:MAX`` they run as a step of the job's own
allocation (``#SBATCH --ntasks=MIN --gpus-per-task=G``), beside the agent in the batch step. That way round is the
robust one: SPANK cannot turn a job into a heterogeneous one, and submitting the workers as a second job from the
batch step would wait in the queue twice and hold the first allocation idle meanwhile.

Each worker runs the given command with the torchrun environment contract (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), valid for each generation, plus the ``AMOEBA_*`` variables the
elastic runtime reads.

Every option can also come from the job's environment (:class:`~slurm_amoeba.core.jobenv.JobEnv`, with its
defaults): ``AMOEBA_ELASTIC_MIN``/``AMOEBA_ELASTIC_MAX`` (set by ``amoeba-sbatch`` and by the SPANK plugin),
``AMOEBA_ELASTIC_PARTITION``, ``AMOEBA_GPUS_PER_WORKER``, ``AMOEBA_CPUS_PER_WORKER``, ``AMOEBA_STATE_DIR``,
``AMOEBA_DAEMON_ENDPOINT``; the command line wins.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slurm_amoeba.agent.agent import Agent, AgentConfig
from slurm_amoeba.agent.config import (
    DEFAULT_MAX_REQUEUES,
    DEFAULT_MAX_RESTARTS,
    ENV_MAX_REQUEUES,
    ENV_MAX_RESTARTS,
    count_from_environ,
)
from slurm_amoeba.core.errors import ParseError, SpecError
from slurm_amoeba.core.jobenv import (
    DEFAULT_CPUS_PER_WORKER,
    DEFAULT_ELASTIC_PARTITION,
    DEFAULT_GPUS_PER_WORKER,
    ENV_CPUS_PER_WORKER,
    ENV_GPUS_PER_WORKER,
    JobEnv,
)
from slurm_amoeba.core.sharing import DEFAULT_SHARE_PARTITION
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.slurm import CliSlurmClient
from slurm_amoeba.slurm.allocation import WorkerAllocation, worker_allocation

log = logging.getLogger(__name__)


def advertise_address() -> str:
    """An address of this host that other nodes reach (its name resolved; the name itself as a fallback)."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        return name
    return name if address.startswith("127.") else address


def build_parser(job: JobEnv) -> argparse.ArgumentParser:
    """The command line of ``amoeba-run``, its defaults taken from the job's environment ``job``."""
    parser = argparse.ArgumentParser(
        prog="amoeba-run",
        description="Run an elastic training job's workers inside a Slurm job (like torchrun, but elastic).",
        epilog="Example, in a batch script submitted with `amoeba-sbatch --elastic 2:8 job.sh`:\n"
        "    amoeba-run python train.py --epochs 10",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--elastic",
        default=job.elastic_range,
        metavar="MIN[:MAX]",
        help="worker range (default: AMOEBA_ELASTIC_MIN/MAX from amoeba-sbatch or the SPANK plugin)",
    )
    parser.add_argument(
        "--gpus-per-worker",
        type=int,
        default=None,
        help="GPUs of each worker (default: AMOEBA_GPUS_PER_WORKER, else the job's --gpus-per-task in a plain sbatch "
        f"job, else {DEFAULT_GPUS_PER_WORKER}; 0: CPU only)",
    )
    parser.add_argument(
        "--cpus-per-worker",
        type=int,
        default=None,
        help="CPUs of each worker (default: AMOEBA_CPUS_PER_WORKER, else the job's --cpus-per-task, else "
        f"{DEFAULT_CPUS_PER_WORKER})",
    )
    parser.add_argument(
        "--elastic-partition",
        default=job.elastic_partition,
        help=f"partition of the satellites that grow the job (default: AMOEBA_ELASTIC_PARTITION, else "
        f"{DEFAULT_ELASTIC_PARTITION})",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(job.state_dir) if job.state_dir else None,
        help="status file and logs (default: AMOEBA_STATE_DIR or ./amoeba-<jobid>)",
    )
    parser.add_argument(
        "--daemon",
        default=job.daemon_endpoint,
        help="the amoebad endpoint to register with (default: AMOEBA_DAEMON_ENDPOINT; none: no daemon)",
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        default=os.environ.get("AMOEBA_RESTART", "") == "1",
        help="the command is an unmodified torchrun-style script: restart it at each resize, with the torchrun "
        "variables of the new size (default: AMOEBA_RESTART=1; docs/runtime.md, Unmodified torchrun scripts)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the worker command, e.g. python train.py")
    return parser


def _per_worker(flag: int | None, variable: int | None, allocation_value: int | None, default: int) -> int:
    """One per-worker resource: the flag, else the job's variable, else what the allocation gives each task."""
    for value in (flag, variable, allocation_value):
        if value is not None:
            return value
    return default


def _check_one_component(alloc: WorkerAllocation, spec: ElasticSpec) -> None:
    """Refuse a plain-sbatch job whose allocation cannot hold its minimum workers, naming the lines that fix it."""
    fix = f"#SBATCH --ntasks={spec.min_workers}" + (
        f" --gpus-per-task={spec.gpus_per_worker}" if spec.gpus_per_worker else ""
    )
    if alloc.tasks < spec.min_workers:
        raise SpecError(
            f"job {alloc.job_id} holds {alloc.tasks} task(s), fewer than the {spec.min_workers} minimum workers of "
            f"--elastic {spec.min_workers}:{spec.max_workers}: with plain sbatch the job's allocation holds them, one "
            f"task each; add `{fix}` to the script (or submit it with amoeba-sbatch, which sizes the job itself)"
        )
    if spec.gpus_per_worker and alloc.gpus_per_task is None and not alloc.gpus_on_batch_node:
        raise SpecError(
            f"job {alloc.job_id} holds no GPU but each worker takes {spec.gpus_per_worker} "
            f"(AMOEBA_GPUS_PER_WORKER/--gpus-per-worker): add `{fix}` to the script, or run CPU-only workers with "
            "--gpus-per-worker 0"
        )
    if alloc.gpus_per_task is not None and alloc.gpus_per_task != spec.gpus_per_worker:
        raise SpecError(
            f"job {alloc.job_id} gives each task {alloc.gpus_per_task} GPU(s) (--gpus-per-task) but each worker "
            f"takes {spec.gpus_per_worker} (AMOEBA_GPUS_PER_WORKER/--gpus-per-worker): make them the same"
        )


def config_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> AgentConfig:
    """Check the command line against the job Slurm started, and build the agent's settings.

    In a heterogeneous job (``amoeba-sbatch``, the executor) the minimum workers run in component 1; in a job of one
    component (plain ``sbatch`` with ``#SBATCH --elastic``) they run as a step of the job's own allocation, one task
    each, beside the agent in the batch step, and each worker's GPUs and CPUs default to what the job gives a task.

    Raises:
        SpecError: not inside a Slurm job, no worker range, no command, or a job too small for its minimum workers.
    """
    command = list(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if not command:
        raise SpecError("amoeba-run needs a command to run, e.g. `amoeba-run python train.py`")
    if args.restart:  # each worker slot runs the restart supervisor, which runs the command (launcher/restart.py)
        command = [sys.executable, "-m", "slurm_amoeba.launcher.restart", "--", *command]
    if not env.get("SLURM_JOB_ID"):
        raise SpecError(
            "amoeba-run runs inside a Slurm job: submit the script with `amoeba-sbatch --elastic MIN:MAX job.sh` "
            "or `sbatch` with `#SBATCH --elastic=MIN:MAX` (or run locally with `amoeba-local`)"
        )
    if args.elastic is None:
        raise SpecError(
            "amoeba-run does not know the worker range: pass --elastic MIN:MAX, put `#SBATCH --elastic=MIN:MAX` "
            "in the script, or submit with amoeba-sbatch"
        )
    try:
        alloc = worker_allocation(env)
    except ParseError as exc:
        raise SpecError(f"amoeba-run cannot read the job's allocation: {exc}") from None
    job = JobEnv.from_environ(env)
    gpus = _per_worker(
        args.gpus_per_worker,
        job.gpus_per_worker if env.get(ENV_GPUS_PER_WORKER) else None,
        alloc.gpus_per_task,
        DEFAULT_GPUS_PER_WORKER,
    )
    cpus = _per_worker(
        args.cpus_per_worker,
        job.cpus_per_worker if env.get(ENV_CPUS_PER_WORKER) else None,
        alloc.cpus_per_task,
        DEFAULT_CPUS_PER_WORKER,
    )
    spec = ElasticSpec.parse(args.elastic, gpus_per_worker=gpus, cpus_per_worker=cpus)
    if alloc.het_group is None:
        _check_one_component(alloc, spec)
    elif alloc.tasks < spec.min_workers:
        raise SpecError(
            f"component 1 of job {alloc.job_id} has {alloc.tasks} tasks but --elastic asks for at least "
            f"{spec.min_workers} workers"
        )
    state_dir = args.state_dir or Path(f"amoeba-{alloc.job_id}")
    return AgentConfig(
        job_id=alloc.job_id,
        spec=spec,
        command=tuple(command),
        state_dir=state_dir.absolute(),
        advertise_addr=advertise_address(),
        elastic_partition=args.elastic_partition,
        daemon_endpoint=args.daemon,
        main_het_group=alloc.het_group,
        max_requeues=count_from_environ(env, ENV_MAX_REQUEUES, DEFAULT_MAX_REQUEUES),
        max_restarts=count_from_environ(env, ENV_MAX_RESTARTS, DEFAULT_MAX_RESTARTS),
        share=job.share,
        share_partition=job.share_partition or DEFAULT_SHARE_PARTITION,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``amoeba-run``: run the job's agent (see the module docstring)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        job = JobEnv.from_environ(os.environ)
    except SpecError as exc:
        print(f"amoeba-run: error: the job's environment: {exc}", file=sys.stderr)
        return 2
    args = build_parser(job).parse_args(argv)
    try:
        config = config_from_args(args, os.environ)
    except SpecError as exc:
        print(f"amoeba-run: error: {exc}", file=sys.stderr)
        return 2
    try:
        slurm = CliSlurmClient.from_environment()
    except SpecError as exc:
        print(f"amoeba-run: error: {exc}", file=sys.stderr)
        return 2
    return Agent(config, slurm, before_requeue=requeue_hook(job, config.job_id)).run()


def requeue_hook(job: JobEnv, job_id: str) -> Callable[[], str] | None:
    """For a job of :class:`~slurm_amoeba.launcher.executor.ElasticExecutor` (its folder in ``AMOEBA_JOB_FOLDER``):
    submitit's ``checkpoint()`` convention before the job requeues itself (:func:`fn_worker.checkpoint_submission`)."""
    if not job.job_folder:
        return None
    from slurm_amoeba.launcher.fn_worker import checkpoint_submission  # submitit: only executor jobs have it

    folder = Path(job.job_folder)
    return lambda: checkpoint_submission(folder, job_id)


if __name__ == "__main__":
    sys.exit(main())
