"""``amoeba-sbatch``: submit a batch script as an elastic job (``amoeba-sbatch --elastic 2:8 job.sh [args]``).

Our options come first; every other option before the script goes to sbatch unchanged (``-t 30``, ``--account=x``,
``-o out.log``), and what follows the script goes to the script. The worker range may also come from an
``#SBATCH --elastic=MIN[:MAX]`` line in the script (the SPANK plugin's option); the command line wins. The script
runs its workers with ``amoeba-run``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from slurm_amoeba.core.errors import ParseError, SpecError
from slurm_amoeba.core.jobenv import JobEnv
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.launcher.submission import ElasticJobShape
from slurm_amoeba.slurm import CliSlurmClient, SlurmCommandError

# sbatch options that take their value as the next argument (when not written --opt=value).
_VALUE_OPTIONS = {
    "-A",
    "--account",
    "-p",
    "--partition",
    "-J",
    "--job-name",
    "-t",
    "--time",
    "-o",
    "--output",
    "-e",
    "--error",
    "-D",
    "--chdir",
    "-q",
    "--qos",
    "--mem",
    "-c",
    "--cpus-per-task",
    "-d",
    "--dependency",
    "--comment",
    "-w",
    "--nodelist",
    "-x",
    "--exclude",
    "--mail-type",
    "--mail-user",
    "--begin",
    "--signal",
    "--export",
    "-C",
    "--constraint",
    "--reservation",
    "--gres",
    "-G",
    "--gpus",
    "-n",
    "--ntasks",
    "-N",
    "--nodes",
}
_OWN_RESOURCES = {"-n", "--ntasks", "-N", "--nodes", "-c", "--cpus-per-task", "--gres", "-G", "--gpus"}
_ELASTIC_LINE = re.compile(r"^#SBATCH\s+--elastic(?:=|\s+)(\S+)")


def split_sbatch_args(args: Sequence[str]) -> tuple[list[str], str, list[str]]:
    """Split ``[sbatch options] script [script args]``.

    Returns:
        The sbatch options, the script, and its arguments.

    Raises:
        SpecError: no script is named.
    """
    options: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-") or arg == "-":
            return options, arg, list(args[i + 1 :])
        options.append(arg)
        if arg in _VALUE_OPTIONS and i + 1 < len(args):
            options.append(args[i + 1])
            i += 1
        i += 1
    raise SpecError("amoeba-sbatch needs a batch script: amoeba-sbatch --elastic MIN:MAX [sbatch options] job.sh")


def elastic_from_script(script: Path) -> str | None:
    """The value of an ``#SBATCH --elastic=...`` line in the script's header, if any."""
    for line in script.read_text(errors="replace").splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        match = _ELASTIC_LINE.match(line)
        if match:
            return match.group(1)
    return None


def _option_value(options: Sequence[str], names: tuple[str, ...]) -> str | None:
    for i, arg in enumerate(options):
        for name in names:
            if arg == name and i + 1 < len(options):
                return options[i + 1]
            if name.startswith("--") and arg.startswith(name + "="):
                return arg.split("=", 1)[1]
            if not name.startswith("--") and arg.startswith(name) and len(arg) > len(name):
                return arg[len(name) :]
    return None


def _without(options: Sequence[str], names: tuple[str, ...]) -> list[str]:
    """``options`` less the named ones (in every spelling) and their values."""
    out: list[str] = []
    skip = False
    for arg in options:
        if skip:
            skip = False
            continue
        if arg in names:
            skip = True
            continue
        if any(
            arg.startswith(n + "=") if n.startswith("--") else (arg.startswith(n) and len(arg) > len(n)) for n in names
        ):
            continue
        out.append(arg)
    return out


def build_parser(job: JobEnv | None = None) -> argparse.ArgumentParser:
    """The command line of ``amoeba-sbatch``; defaults from ``job`` (the submitter's environment), else JobEnv's."""
    job = job or JobEnv()
    parser = argparse.ArgumentParser(
        prog="amoeba-sbatch",
        usage="amoeba-sbatch --elastic MIN[:MAX] [--gpus-per-worker G] [sbatch options] job.sh [args]",
        description="Submit a batch script as an elastic Slurm job; its workers run under `amoeba-run`.",
        epilog="The script runs `amoeba-run python train.py ...`. Any other option goes to sbatch as it is.",
    )
    parser.add_argument("--elastic", metavar="MIN[:MAX]", help="worker range (or #SBATCH --elastic= in the script)")
    parser.add_argument("--gpus-per-worker", type=int, default=job.gpus_per_worker)
    parser.add_argument("--cpus-per-worker", type=int, default=job.cpus_per_worker)
    parser.add_argument("--mem-per-worker", type=int, default=0, metavar="MB")
    parser.add_argument("--elastic-partition", default=job.elastic_partition)
    parser.add_argument(
        "--daemon",
        default=job.daemon_endpoint,
        help="amoebad endpoint the job's agent reports to",
    )
    return parser


def prepare(argv: Sequence[str], slurm: CliSlurmClient) -> tuple[ElasticJobShape, Path, list[str]]:
    """Check everything and build the job's shape; nothing is submitted.

    Returns:
        The shape, the script, and the script's arguments.

    Raises:
        SpecError: a bad range or resource, a missing script, sbatch resource options that amoeba-sbatch sets
            itself, or a minimum the partition can never hold.
    """
    ours, rest = build_parser(JobEnv.from_environ(os.environ)).parse_known_args(argv)
    options, script_name, script_args = split_sbatch_args(rest)
    script = Path(script_name)
    if not script.is_file():
        raise SpecError(f"batch script {script_name!r} does not exist or is not a file")
    clash = sorted({o.split("=", 1)[0] for o in options} & _OWN_RESOURCES)
    if clash:
        raise SpecError(
            f"amoeba-sbatch sets {', '.join(clash)} itself from --elastic and --gpus-per-worker/--cpus-per-worker; "
            "leave them out"
        )
    elastic = ours.elastic or elastic_from_script(script)
    if elastic is None:
        raise SpecError(f"no worker range: pass --elastic MIN:MAX or put #SBATCH --elastic=MIN:MAX in {script_name}")
    spec = ElasticSpec.parse(
        elastic,
        gpus_per_worker=ours.gpus_per_worker,
        cpus_per_worker=ours.cpus_per_worker,
        mem_per_worker_mb=ours.mem_per_worker,
    )
    partition = _option_value(options, ("--partition", "-p"))
    time_text = _option_value(options, ("--time", "-t"))
    time_min = None
    if time_text is not None:
        if not time_text.isdigit():
            raise SpecError(f"--time={time_text!r}: amoeba-sbatch takes whole minutes, e.g. --time=30")
        time_min = int(time_text)
    passthrough = tuple(_without(options, ("--partition", "-p", "--time", "-t")))
    shape = ElasticJobShape(
        spec=spec,
        partition=partition,
        elastic_partition=ours.elastic_partition,
        time_min=time_min,
        daemon_endpoint=ours.daemon,
        extra=passthrough,
    )
    shape.check_capacity(slurm)
    return shape, script, script_args


def main(argv: Sequence[str] | None = None) -> int:
    """``amoeba-sbatch``: print the job id like ``sbatch --parsable``; exit 2 on bad input, 1 when sbatch fails."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args in ([], ["-h"], ["--help"]):
        build_parser().print_help()
        return 0 if args else 2
    base = CliSlurmClient(timeout=30)
    try:
        shape, script, script_args = prepare(args, base)
    except (SpecError, ParseError) as exc:
        print(f"amoeba-sbatch: error: {exc}", file=sys.stderr)
        return 2
    except SlurmCommandError as exc:
        print(f"amoeba-sbatch: error: {exc}", file=sys.stderr)
        return 1
    slurm = CliSlurmClient({**base.env, **shape.environment()}, timeout=30)
    try:
        job = slurm.submit(script, shape.components(), script_args)
    except (SlurmCommandError, ParseError, SpecError) as exc:
        print(f"amoeba-sbatch: error: {exc}", file=sys.stderr)
        return 1
    print(job)
    print(
        f"amoeba-sbatch: elastic job {job}: {shape.spec.min_workers}..{shape.spec.max_workers} workers; "
        f"satellites in partition {shape.elastic_partition}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
