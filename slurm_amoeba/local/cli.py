"""``amoeba-local``: run an elastic training job as local processes and resize it by hand or on a schedule.

Usage::

    amoeba-local -n 2 --max-workers 4 -- python train.py --epochs 3
    amoeba-local -n 2 --at 10:add --at 20:kill w1 -- python train.py

While the job runs, type commands on stdin (one per line): ``add [K]`` (start K workers; they warm up and join),
``remove ID`` (graceful leave at the next step boundary), ``term ID`` (SIGTERM, like Slurm preemption),
``kill ID`` (SIGKILL; the others roll back to the last commit and go on), ``stop ID``/``cont ID`` (SIGSTOP and
SIGCONT: a hung worker, caught by the collective or heartbeat timeout), ``status`` and ``help``. ``--at S:CMD``
runs a command S seconds after the start. Each flag also reads a default from ``AMOEBA_LOCAL_<FLAG>`` (e.g.
``AMOEBA_LOCAL_WORKERS=4``). ``--restart`` runs an unmodified torchrun-style script, restarted at each resize
(:mod:`slurm_amoeba.launcher.restart`). Exit status: 0 when the job finished; when it was lost, the first worker's
non-zero status (a script error's own status), else 1; 2 for bad usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

from slurm_amoeba.core.errors import AmoebaError
from slurm_amoeba.local.job import LocalJob
from slurm_amoeba.runtime.membership import Phase
from slurm_amoeba.runtime.view import CoordinatorView

log = logging.getLogger(__name__)

COMMANDS = {
    "add": "add [K]    start K new workers (default 1); they warm up, then join at a step boundary",
    "remove": "remove ID  ask worker ID to leave gracefully at the next step boundary",
    "term": "term ID    send SIGTERM to worker ID (it leaves at the next step boundary)",
    "kill": "kill ID    SIGKILL worker ID (the others roll back to the last commit)",
    "stop": "stop ID    SIGSTOP worker ID (it hangs; the others drop it after the collective/heartbeat timeout)",
    "cont": "cont ID    SIGCONT a stopped worker",
    "status": "status     print the current generation and every worker's status",
    "help": "help       print this list",
}


class CommandError(AmoebaError, ValueError):
    """A command line typed to ``amoeba-local`` cannot be understood."""


@dataclasses.dataclass(frozen=True)
class Command:
    """One parsed command.

    Attributes:
        verb: one of :data:`COMMANDS`.
        worker: the worker id (``remove``, ``term``, ``kill``, ``stop``, ``cont``).
        count: how many workers (``add``).
    """

    verb: str
    worker: str = ""
    count: int = 1


def parse_command(line: str) -> Command:
    """Parse one command line.

    Args:
        line: e.g. ``"add 2"`` or ``"kill w1"``.

    Returns:
        The command.

    Raises:
        CommandError: unknown verb or bad argument; the message lists the valid commands.
    """
    words = line.split()
    if not words or words[0] not in COMMANDS:
        raise CommandError(f"unknown command {line.strip()!r}; valid commands: {', '.join(COMMANDS)}")
    verb, args = words[0], words[1:]
    if verb == "add":
        if len(args) > 1 or (args and not args[0].isdigit()) or (args and int(args[0]) < 1):
            raise CommandError(f"{line.strip()!r}: write 'add' or 'add K' with K a whole number of at least 1")
        return Command(verb, count=int(args[0]) if args else 1)
    if verb in ("remove", "term", "kill", "stop", "cont"):
        if len(args) != 1:
            raise CommandError(f"{line.strip()!r}: write '{verb} ID', e.g. '{verb} w1'")
        return Command(verb, worker=args[0])
    if args:
        raise CommandError(f"{line.strip()!r}: '{verb}' takes no argument")
    return Command(verb)


def parse_at(text: str) -> tuple[float, Command]:
    """Parse a ``--at SECONDS:COMMAND`` value.

    Raises:
        CommandError: not ``SECONDS:COMMAND`` with a valid command.
    """
    when, sep, rest = text.partition(":")
    try:
        seconds = float(when)
    except ValueError:
        seconds = -1.0
    if not sep or seconds < 0:
        raise CommandError(f"--at {text!r} is not SECONDS:COMMAND, e.g. --at 10:add or --at 25.5:kill w1")
    return seconds, parse_command(rest)


def describe(view: CoordinatorView) -> str:
    """A one-paragraph status of the job."""
    members = list(view.plan.members) if view.plan else []
    lines = [f"job {view.phase.value}, generation {view.generation}, members {members}"]
    for worker_id, worker in sorted(view.workers.items()):
        extra = f" ({worker.reason})" if worker.reason else ""
        lines.append(f"  {worker_id}: {worker.status.value}{extra}")
    for size, stats in sorted(view.throughput.items()):
        lines.append(f"  {size} workers: {stats.samples_per_s:.1f} samples/s, step {stats.step_time_s * 1000:.1f} ms")
    return "\n".join(lines)


def execute(job: LocalJob, command: Command, out: TextIO) -> None:
    """Apply one command to a running job, printing what happened.

    Raises:
        AmoebaError: the job refused the command (e.g. unknown worker).
    """
    if command.verb == "add":
        print(f"started {', '.join(job.add(command.count))}", file=out, flush=True)
    elif command.verb == "remove":
        job.remove(command.worker)
        print(f"{command.worker} will leave at the next step boundary", file=out, flush=True)
    elif command.verb == "term":
        job.terminate(command.worker)
        print(f"sent SIGTERM to {command.worker}", file=out, flush=True)
    elif command.verb == "kill":
        job.kill(command.worker)
        print(f"sent SIGKILL to {command.worker}", file=out, flush=True)
    elif command.verb == "stop":
        job.pause(command.worker)
        print(f"sent SIGSTOP to {command.worker}", file=out, flush=True)
    elif command.verb == "cont":
        job.resume(command.worker)
        print(f"sent SIGCONT to {command.worker}", file=out, flush=True)
    elif command.verb == "status":
        print(describe(job.view()), file=out, flush=True)
    else:
        print("\n".join(COMMANDS.values()), file=out, flush=True)


def _env_default(name: str, fallback: str) -> str:
    return os.environ.get(f"AMOEBA_LOCAL_{name.upper().replace('-', '_')}", fallback)


# Coordinator deadlines settable from the command line: flag, default, meaning.
_TIMEOUT_FLAGS = (
    ("heartbeat-timeout", "10", "a worker whose heartbeat is older is declared dead"),
    ("report-timeout", "10", "after a generation's first end report, how long to wait for the other members"),
    ("join-timeout", "3600", "how long a warm joiner waits for admission"),
    ("admit-batch-window", "30", "how long ready joiners wait for joiners still warming up"),
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``amoeba-local``."""
    parser = argparse.ArgumentParser(
        prog="amoeba-local",
        description="Run an elastic training job as local processes; resize it with stdin commands or --at.",
        epilog="commands: " + "; ".join(COMMANDS.values()),
    )
    parser.add_argument(
        "-n", "--workers", type=int, default=int(_env_default("workers", "2")), help="initial workers (default 2)"
    )
    parser.add_argument(
        "--max-workers", type=int, default=int(_env_default("max-workers", "64")), help="most members at a time"
    )
    parser.add_argument("--job-id", default=_env_default("job-id", "local"), help="the job's name (default local)")
    parser.add_argument("--addr", default=_env_default("addr", "127.0.0.1"), help="address workers use for the store")
    parser.add_argument("--port", type=int, default=int(_env_default("port", "0")), help="store port (0 = any)")
    parser.add_argument(
        "--log-dir", default=_env_default("log-dir", "") or None, help="worker logs (default: a tmp dir)"
    )
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=float(_env_default("collective-timeout", "30")),
        metavar="S",
        help="deadline of one collective in the workers (default 30)",
    )
    for flag, default, meaning in _TIMEOUT_FLAGS:
        parser.add_argument(
            f"--{flag}",
            type=float,
            default=float(_env_default(flag, default)),
            metavar="S",
            help=f"{meaning} (default {default})",
        )
    parser.add_argument(
        "--formation-attempts",
        type=int,
        default=int(_env_default("formation-attempts", "3")),
        metavar="N",
        help="evict a worker missing from N failed generation formations in a row (default 3)",
    )
    parser.add_argument(
        "--timeout", type=float, default=float(_env_default("timeout", "86400")), metavar="S", help="give up after S s"
    )
    parser.add_argument("--at", action="append", default=[], metavar="S:CMD", help="run CMD S seconds after start")
    parser.add_argument(
        "--restart",
        action="store_true",
        default=_env_default("restart", "") == "1",
        help="run an unmodified torchrun-style script, restarted at each resize (docs/runtime.md)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the worker command, after --")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``amoeba-local``; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.print_usage(sys.stderr)
        print("amoeba-local: give the worker command after --, e.g. -- python train.py", file=sys.stderr)
        return 2
    if args.restart:  # each worker slot runs the restart supervisor (slurm_amoeba.launcher.restart)
        command = [sys.executable, "-m", "slurm_amoeba.launcher.restart", "--", *command]
    try:
        schedule = sorted((parse_at(text) for text in args.at), key=lambda item: item[0])
    except CommandError as exc:
        print(f"amoeba-local: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        job = LocalJob(
            command,
            initial_workers=args.workers,
            max_workers=args.max_workers,
            job_id=args.job_id,
            log_dir=args.log_dir,
            advertise_addr=args.addr,
            port=args.port,
            collective_timeout_s=args.collective_timeout,
            heartbeat_timeout_s=args.heartbeat_timeout,
            report_timeout_s=args.report_timeout,
            join_timeout_s=args.join_timeout,
            admit_batch_window_s=args.admit_batch_window,
            formation_attempts=args.formation_attempts,
        )
    except AmoebaError as exc:
        print(f"amoeba-local: {exc}", file=sys.stderr)
        return 2
    with job:
        print(f"amoeba-local: job {args.job_id!r}, worker logs in {job.log_dir}", flush=True)
        started = time.monotonic()
        threading.Thread(target=_read_stdin, args=(job,), daemon=True).start()
        shown = 0
        deadline = started + args.timeout
        while True:
            view = job.view()
            for record in view.history[shown:]:
                plan = record.plan
                print(
                    f"generation {plan.generation}: {list(plan.members)} ({plan.reason}; start step {plan.start_step})",
                    flush=True,
                )
            shown = len(view.history)
            while schedule and time.monotonic() - started >= schedule[0][0]:
                _, scheduled = schedule.pop(0)
                _run(job, scheduled)
            if view.phase.is_over() or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if not view.phase.is_over():
            print(f"amoeba-local: the job did not end within --timeout {args.timeout:.0f} s", file=sys.stderr)
            return 1
        result = job.wait(timeout_s=60)
        print(describe(result.view), flush=True)
        if result.phase is Phase.LOST:
            print(f"amoeba-local: the job was lost: {result.view.lost_reason}", file=sys.stderr)
            return next((code for code in result.returncodes.values() if code > 0), 1)
    return 0


def _run(job: LocalJob, command: Command) -> None:
    try:
        execute(job, command, sys.stdout)
    except AmoebaError as exc:
        print(f"amoeba-local: {exc}", file=sys.stderr, flush=True)


def _read_stdin(job: LocalJob) -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            command = parse_command(line)
        except CommandError as exc:
            print(f"amoeba-local: {exc}", file=sys.stderr, flush=True)
            continue
        _run(job, command)


if __name__ == "__main__":
    sys.exit(main())
