"""Entry points the agent starts inside Slurm: one worker task, and a satellite's batch script.

``python -m slurm_amoeba.agent.entry worker --group g1 -- CMD...``
    runs in every task of a worker group's step: names the worker ``<group>-<SLURM_PROCID>`` (the id the agent
    expects) and replaces itself with the user's command, which joins the job through the runtime.

``python -m slurm_amoeba.agent.entry satellite --parent JOB --group g1 --ntasks K ... -- CMD...``
    is a satellite's batch script: it starts the group's workers — forked from itself once it has imported torch and
    the user's module (:mod:`slurm_amoeba.agent.warm`), else, the reason logged, cold as a step of ``srun`` tasks of
    the ``worker`` mode — and watches the parent job. When the parent is gone
    (finished, cancelled, failed, or requeued: its next run has a new agent) it stops its workers and exits within a
    few seconds, so no satellite outlives its job. On SIGTERM (preemption, shrink) it passes the signal to its
    workers, who leave at a step boundary.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from slurm_amoeba.agent.warm import ENV_WARM_START, WarmStartRefused, WarmWorkers, preload_modules
from slurm_amoeba.core.errors import AmoebaError, SpecError
from slurm_amoeba.core.runtime_env import ENV_WORKER_ID
from slurm_amoeba.slurm import CliSlurmClient, JobState, SlurmClient, SlurmCommandError
from slurm_amoeba.slurm.steps import StepOptions, start_step

log = logging.getLogger(__name__)

PARENT_CHECK_S = 2.0


def worker_entry(group: str, command: list[str] | tuple[str, ...]) -> list[str]:
    """The argv of each task of group ``group``'s step: this module's ``worker`` mode, then the user's command."""
    return [sys.executable, "-m", "slurm_amoeba.agent.entry", "worker", "--group", group, "--", *command]


def run_worker(group: str, command: list[str]) -> int:
    """Become one worker of ``group``: set its id and exec the user's command (never returns on success)."""
    task = os.environ.get("SLURM_PROCID", "0")
    os.environ[ENV_WORKER_ID] = f"{group}-{task}"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"amoeba worker {group}-{task}: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127


def parent_started(client: SlurmClient, parent: int) -> int | None:
    """When the parent's current run started (Slurm's start time), None when Slurm cannot be asked now."""
    try:
        record = client.job(parent)
    except (SlurmCommandError, AmoebaError) as exc:
        log.warning("[%s/satellite] cannot ask Slurm about the parent: %s", parent, exc)
        return None
    return record.start_time if record is not None else None


def parent_alive(client: SlurmClient, parent: int, started: int | None = None) -> bool:
    """Whether the parent job still runs the run that started this satellite (True when Slurm cannot be asked:
    never kill on a failed poll). A parent requeued (pending again, or running again from a later start) is gone
    for the satellite: its agent and store are new."""
    try:
        record = client.job(parent)
    except (SlurmCommandError, AmoebaError) as exc:
        log.warning("[%s/satellite] cannot ask Slurm about the parent: %s", parent, exc)
        return True
    if record is None or not record.state.is_active():
        return False
    if record.state in (JobState.PENDING, JobState.REQUEUED):
        return False
    return started is None or record.start_time == started


def run_satellite(args: argparse.Namespace, client: SlurmClient) -> int:
    """Run a satellite's worker step and watch its parent through ``client`` (see the module docstring)."""
    prefix = f"[{args.parent}/satellite {args.group}]"
    # When Slurm started the satellite, for the job's history and scripts/bench-grow (Slurm's part of a grow).
    (Path(args.log_dir) / f"satellite-{args.group}.started").write_text(f"{time.time():.6f}\n")
    stop: list[str] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.append(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    step = start_workers(args, prefix)
    started = parent_started(client, args.parent)
    next_check = time.monotonic() + PARENT_CHECK_S
    while True:
        code = step.poll()
        if code is not None:
            log.info("%s worker step ended with status %s", prefix, code)
            return code
        if stop:
            log.info("%s got %s: workers leave at the next step boundary", prefix, stop[-1])
            return _stop_step(step, grace_s=30)
        if time.monotonic() >= next_check:
            if not parent_alive(client, args.parent, started):
                log.warning("%s parent job %s is gone: stopping the workers", prefix, args.parent)
                return _stop_step(step, grace_s=3)
            next_check = time.monotonic() + PARENT_CHECK_S
        time.sleep(0.2)


def start_workers(args: argparse.Namespace, prefix: str) -> WarmWorkers | subprocess.Popen[bytes]:
    """Start the satellite's workers: forked warm (:mod:`slurm_amoeba.agent.warm`), else cold as an srun step, the
    reason logged."""
    if os.environ.get(ENV_WARM_START, "1") == "0":
        reason = f"{ENV_WARM_START}=0"
    else:
        try:
            workers = WarmWorkers(
                args.group,
                args.ntasks,
                args.cpus_per_task,
                args.gpus_per_task,
                Path(args.log_dir),
                args.command,
                os.environ,
            )
            workers.start(preload_modules(os.environ))
            return workers
        except (WarmStartRefused, OSError) as exc:
            reason = str(exc)
    log.warning("%s starting the workers cold, as an srun step: %s", prefix, reason)
    return start_step(
        StepOptions(
            ntasks=args.ntasks,
            cpus_per_task=args.cpus_per_task,
            gpus_per_task=args.gpus_per_task,
            name=f"amoeba-workers-{args.group}",
            output=str(Path(args.log_dir) / f"worker-{args.group}-%t.log"),
        ),
        worker_entry(args.group, args.command),
        env=os.environ,
    )


def _stop_step(step: WarmWorkers | subprocess.Popen[bytes], grace_s: float) -> int:
    step.send_signal(signal.SIGTERM)  # srun forwards it to every task
    try:
        return step.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        step.kill()
        return step.wait()


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the worker or satellite entry."""
    parser = argparse.ArgumentParser(
        prog="python -m slurm_amoeba.agent.entry",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="mode", required=True)
    worker = sub.add_parser("worker", help="one task of a worker group")
    worker.add_argument("--group", required=True)
    worker.add_argument("command", nargs=argparse.REMAINDER)
    sat = sub.add_parser("satellite", help="a satellite's batch script")
    sat.add_argument("--parent", type=int, required=True)
    sat.add_argument("--group", required=True)
    sat.add_argument("--ntasks", type=int, required=True)
    sat.add_argument("--cpus-per-task", type=int, default=1)
    sat.add_argument("--gpus-per-task", type=int, default=0)
    sat.add_argument("--log-dir", default=".")
    sat.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = list(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if not command:
        parser.error("a command to run is missing after --")
    args.command = command
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.mode == "worker":
        return run_worker(args.group, command)
    try:
        client = CliSlurmClient.from_environment()
    except SpecError as exc:
        print(f"amoeba satellite {args.group}: {exc}", file=sys.stderr)
        return 2
    return run_satellite(args, client)


if __name__ == "__main__":
    sys.exit(main())
