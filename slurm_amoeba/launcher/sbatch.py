"""``amoeba-sbatch``: submit a batch script as an elastic job (``amoeba-sbatch --elastic 2:8 job.sh [args]``).

Its own options (``--elastic``, ``--gpus-per-worker``, ``--cpus-per-worker``, ``--mem-per-worker``,
``--elastic-partition``, ``--share``, ``--share-partition``, ``--daemon``, ``--test-only``, ``--dry-run``,
``--slurm-release``) are recognised only when
written out in full; every other option before the script is sbatch's and is read as sbatch reads it
(:mod:`slurm_amoeba.slurm.options`: ``-t 30``, ``-t1:00:00``, ``--account=x``, ``-Hv``, ``--wrap=CMD`` instead of a
script), and what follows the script goes to the script. The job becomes one heterogeneous job
(:mod:`slurm_amoeba.launcher.submission`): sbatch's options go to the agent's component, which sbatch copies to the
workers' one; the account, QOS, constraint, reservation and the like are given to both. The worker range may also come
from the script's ``#SBATCH --elastic=MIN[:MAX]`` line (the SPANK plugin's option); a script written for plain
``sbatch`` (``#SBATCH --ntasks=MIN --gpus-per-task=G``) gives each worker its task's GPUs and CPUs, and the agent's
component is kept free of GPUs. The script runs its workers with ``amoeba-run``.

``--dry-run`` asks Slurm nothing (no ``sinfo``, not even ``sinfo --version``): it reads sbatch's options as the
release given by ``--slurm-release`` or ``AMOEBA_SLURM_RELEASE`` reads them, else as the newest supported release
does, and skips the check that the partition can hold the minimum. Without it, the release is asked of Slurm once.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_amoeba.core.errors import ParseError, SpecError
from slurm_amoeba.core.jobenv import JobEnv
from slurm_amoeba.core.sharing import DEFAULT_SHARE_PARTITION, SHARE_MODES
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.launcher.guard import start_guard
from slurm_amoeba.launcher.parameters import parse_memory_mb
from slurm_amoeba.launcher.submission import ElasticJobShape, admission_delay_s, lifecycle_options, signal_lead_s
from slurm_amoeba.slurm import CliSlurmClient, SlurmClient, SlurmCommandError, sbatch_argv
from slurm_amoeba.slurm.options import (
    PLUGIN_OPTION_ENV_PREFIX,
    SIZING_OPTIONS,
    SbatchOption,
    last_value,
    parse_time_minutes,
    read_directives,
    read_option,
    wrap_script,
)
from slurm_amoeba.slurm.release import SUPPORTED_SERIES, SlurmRelease

# Our options: name -> whether it takes a value. Matched exactly, never abbreviated (sbatch has --mem and --gpus).
_OURS = {
    "--elastic": True,
    "--gpus-per-worker": True,
    "--cpus-per-worker": True,
    "--mem-per-worker": True,
    "--elastic-partition": True,
    "--daemon": True,
    "--test-only": False,
    "--dry-run": False,
    "--restart": False,
    "--share": False,  # a mode only as --share=MODE
    "--share-partition": True,
    "--slurm-release": True,
}
#: Where ``--dry-run`` finds the Slurm release to read options as, when ``--slurm-release`` is not given.
ENV_SLURM_RELEASE = "AMOEBA_SLURM_RELEASE"
# sbatch options amoeba-sbatch cannot pass on, with what to write instead.
_REFUSED = {
    "array": "an elastic job cannot be a job array (Slurm has no heterogeneous arrays)",
    "wait": "amoeba-sbatch returns once the job is submitted; wait with `scontrol show job` or the executor",
    "help": "see `amoeba-sbatch --help`",
    "usage": "see `amoeba-sbatch --help`",
    "version": "see `amoeba-sbatch --version`",
    "no-elastic": "amoeba-sbatch submits an elastic job; submit an ordinary one with plain sbatch",
}
# Sizing options a plain-sbatch script may hold: the minimum workers, one task each (launcher/run.py reads them so).
_PLAIN_SBATCH_SIZING = {"ntasks", "gpus-per-task", "cpus-per-task"}


@dataclasses.dataclass
class Request:
    """What the command line and the script say, before the job's shape is built.

    Attributes:
        ours: amoeba-sbatch's own options.
        options: sbatch's options from the command line, in order.
        directives: the script's ``#SBATCH`` options.
        script: the batch script, or None with ``--wrap``.
        script_args: arguments for the script.
    """

    ours: argparse.Namespace
    options: list[SbatchOption]
    directives: list[SbatchOption]
    script: Path | None
    script_args: list[str]


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A checked submission, ready for sbatch.

    Attributes:
        shape: the job's components and environment.
        script: the batch script, or None with ``--wrap``.
        script_args: arguments for the script.
        wrap: the ``--wrap`` command, if any.
        test_only: ask Slurm when it would start the job, submit nothing.
        dry_run: print what would be submitted, ask Slurm nothing more.
        note: what to tell the user besides (empty: nothing).
        restart: the job's ``amoeba-run`` restarts an unmodified torchrun script at each resize (``AMOEBA_RESTART``).
    """

    shape: ElasticJobShape
    script: Path | None
    script_args: list[str]
    wrap: str | None = None
    test_only: bool = False
    dry_run: bool = False
    note: str = ""
    restart: bool = False


def _memory(text: str) -> int:
    try:
        return parse_memory_mb(text)
    except SpecError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: write MiB as a number, or e.g. 32G or 512M"
        ) from None


def build_parser(job: JobEnv | None = None) -> argparse.ArgumentParser:
    """The command line of ``amoeba-sbatch``; defaults from ``job`` (the submitter's environment), else JobEnv's."""
    job = job or JobEnv()
    parser = argparse.ArgumentParser(
        prog="amoeba-sbatch",
        usage="amoeba-sbatch [--elastic MIN[:MAX]] [--gpus-per-worker G] [sbatch options] (job.sh [args] | --wrap=CMD)",
        description="Submit a batch script as an elastic Slurm job; its workers run under `amoeba-run`.",
        epilog="Any other option goes to sbatch as sbatch reads it (-t 1:00:00, -A acct, --qos=q, -C feat, "
        "--wrap=CMD). The script runs `amoeba-run python train.py ...`.",
        allow_abbrev=False,
    )
    parser.add_argument("--elastic", metavar="MIN[:MAX]", help="worker range (or #SBATCH --elastic= in the script)")
    parser.add_argument(
        "--gpus-per-worker",
        type=int,
        default=None,
        metavar="G",
        help=f"GPUs of each worker (default: the script's #SBATCH --gpus-per-task, else {job.gpus_per_worker})",
    )
    parser.add_argument(
        "--cpus-per-worker",
        type=int,
        default=None,
        metavar="C",
        help=f"CPUs of each worker (default: the script's #SBATCH --cpus-per-task, else {job.cpus_per_worker})",
    )
    parser.add_argument(
        "--mem-per-worker",
        type=_memory,
        default=0,
        metavar="SIZE",
        help="memory of each worker, as Slurm writes it: MiB without a unit, or e.g. 32G (default: Slurm's)",
    )
    parser.add_argument(
        "--elastic-partition",
        default=job.elastic_partition,
        metavar="NAME",
        help=f"partition of the satellites (default: {job.elastic_partition})",
    )
    parser.add_argument(
        "--daemon", default=job.daemon_endpoint, metavar="ENDPOINT", help="amoebad endpoint the job's agent reports to"
    )
    parser.add_argument(
        "--test-only", action="store_true", help="print what would be submitted and ask Slurm when it would start"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would be submitted; ask Slurm nothing (not even its release: see --slurm-release)",
    )
    parser.add_argument(
        "--slurm-release",
        metavar="YY.MM",
        default=None,
        help=f"with --dry-run: read sbatch's options as this Slurm release does (env {ENV_SLURM_RELEASE}; default "
        f"the newest supported, {SUPPORTED_SERIES[-1]}); without --dry-run Slurm is asked",
    )
    parser.add_argument(
        "--share",
        nargs="?",
        const=SHARE_MODES[0],
        default=job.share,
        metavar="MODE",
        help="let the daemon share the job's GPUs with another opted-in job: guaranteed (the default; its GPUs may "
        "host another job's worker, which yields to it) or opportunistic (its extra workers may also run beside "
        "another job's); its minimum workers run in --share-partition, one GPU per node",
    )
    parser.add_argument(
        "--share-partition",
        default=DEFAULT_SHARE_PARTITION,
        metavar="NAME",
        help=f"partition of the sharing nodes, where a job with --share runs (default: {DEFAULT_SHARE_PARTITION})",
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="the script's amoeba-run runs an unmodified torchrun script, restarted at each resize (AMOEBA_RESTART=1)",
    )
    return parser


def split_args(argv: Sequence[str], job: JobEnv, release: SlurmRelease | None = None) -> Request:
    """Separate our options, sbatch's options, the script and its arguments; read the script's header. sbatch's
    options are read as ``release``'s sbatch reads them (None: any supported release's).

    Raises:
        SpecError: an sbatch option sbatch would refuse, no script (and no ``--wrap``), a script that does not
            exist, script arguments with ``--wrap``, or a bad ``#SBATCH`` line.
    """
    ours: list[str] = []
    options: list[SbatchOption] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        name = word.split("=", 1)[0]
        if name in _OURS:
            takes_value = _OURS[name] and "=" not in word
            ours.extend(argv[i : i + 2] if takes_value else argv[i : i + 1])
            i += 2 if takes_value else 1
        elif word == "--" or not word.startswith("-") or word == "-":
            rest = list(argv[i + 1 :] if word == "--" else argv[i:])
            break
        else:
            found, i = read_option(argv, i, release)
            options.extend(found)
    parsed = build_parser(job).parse_args(ours)
    wrap = last_value(options, "wrap")
    if wrap is not None:
        if rest:
            raise SpecError(f"--wrap takes no script and no script arguments, but {shlex.join(rest)!r} follows it")
        return Request(parsed, options, [], None, [])
    if not rest:
        raise SpecError(
            "amoeba-sbatch needs a batch script (or --wrap=CMD): "
            "amoeba-sbatch --elastic MIN:MAX [sbatch options] job.sh"
        )
    script = Path(rest[0])
    if not script.is_file():
        raise SpecError(f"batch script {rest[0]!r} does not exist or is not a file")
    directives = read_directives(script.read_text(errors="replace"), release)
    return Request(parsed, options, directives, script, rest[1:])


def _check_options(request: Request) -> None:
    """Refuse sbatch options that would size or break the elastic job, naming each and what to write instead."""
    for option in request.options:
        if option.name in _REFUSED:
            raise SpecError(f"{' '.join(option.words)}: {_REFUSED[option.name]}")
        if option.name in SIZING_OPTIONS:
            raise SpecError(
                f"amoeba-sbatch sets {' '.join(option.words)} itself from --elastic and "
                "--gpus-per-worker/--cpus-per-worker/--mem-per-worker; leave it out"
            )
        _check_time(option)
    for option in request.directives:
        if option.name in SIZING_OPTIONS - _PLAIN_SBATCH_SIZING or option.name in _REFUSED:
            raise SpecError(
                f"#SBATCH {' '.join(option.words)} in {request.script}: amoeba-sbatch sizes the job itself (it would "
                "apply to the agent too); give each worker's GPUs as #SBATCH --gpus-per-task=G or --gpus-per-worker G"
            )
        _check_time(option)


def _check_time(option: SbatchOption) -> None:
    if option.name == "signal" and option.value is not None and "B" not in option.value.partition(":")[0]:
        signal = option.value.partition(":")[2] or option.value
        raise SpecError(
            f"{' '.join(option.words)} would signal the workers' steps, which do not handle it: write "
            f"--signal=B:{signal} so that the job's agent gets it (it saves the state and requeues the job)"
        )
    if option.name in ("time", "time-min") and option.value is not None:
        try:
            parse_time_minutes(option.value)
        except SpecError as exc:
            raise SpecError(f"{' '.join(option.words)}: {exc}") from None


def execs_agent(script: str) -> bool:
    """Whether a batch script replaces its shell with ``amoeba-run`` (``exec amoeba-run ...``), so that the job's
    agent is the process Slurm's ``--signal=B:...`` reaches."""
    for raw in script.splitlines():
        words = raw.split("#", 1)[0].split()
        if words[:1] == ["exec"] and any(w.endswith("amoeba-run") or w == "slurm_amoeba.launcher.run" for w in words):
            return True
    return False


def _time_limit(request: Request) -> int | None:
    """The job's time limit in minutes as sbatch will read it (the command line over the script), None: unset."""
    text = last_value(request.options, "time") or last_value(request.directives, "time")
    return parse_time_minutes(text) if text is not None else None


def _per_worker(flag: int | None, directive: str | None, what: str, default: int) -> int:
    if directive is not None and not directive.isdigit():
        raise SpecError(f"#SBATCH --{what}={directive!r}: give a whole number")
    if flag is not None and directive is not None and flag != int(directive):
        raise SpecError(
            f"the script says #SBATCH --{what}={directive} but the command line {flag} per worker: make them the same"
        )
    return flag if flag is not None else int(directive) if directive is not None else default


def prepare(argv: Sequence[str], slurm: SlurmClient | None, release: SlurmRelease | None = None) -> Prepared:
    """Check everything and build the job's shape; nothing is submitted. ``release``: the cluster's Slurm, whose
    sbatch options are known (None: those of any supported release). ``slurm`` None: ask Slurm nothing, so the
    partition's capacity is not checked (``--dry-run``).

    Returns:
        The checked submission.

    Raises:
        SpecError: a bad range or resource, a missing script, sbatch options that amoeba-sbatch sets itself or
            cannot pass on, a bad time limit, or a minimum the partition can never hold.
    """
    job = JobEnv.from_environ(os.environ)
    request = split_args(argv, job, release)
    _check_options(request)
    ours = request.ours
    elastic = ours.elastic or last_value(request.directives, "elastic")
    if elastic is None:
        where = f"#SBATCH --elastic=MIN:MAX in {request.script}" if request.script else "no script with --wrap"
        raise SpecError(f"no worker range: pass --elastic MIN:MAX or put {where}")
    gpus = _per_worker(
        ours.gpus_per_worker, last_value(request.directives, "gpus-per-task"), "gpus-per-task", job.gpus_per_worker
    )
    cpus = _per_worker(
        ours.cpus_per_worker, last_value(request.directives, "cpus-per-task"), "cpus-per-task", job.cpus_per_worker
    )
    spec = ElasticSpec.parse(elastic, gpus_per_worker=gpus, cpus_per_worker=cpus, mem_per_worker_mb=ours.mem_per_worker)
    # The comment is the job's elastic mark followed by the user's own (ElasticJobShape.comment): the command line's
    # --comment replaces a script's #SBATCH --comment, so the user's comment travels whole, after the mark.
    passthrough = [
        w for o in request.options if o.name not in ("partition", "wrap", "parsable", "comment") for w in o.words
    ]
    if last_value(request.directives, "gpus-per-task") is not None:
        passthrough.append("--gpus-per-task=0")  # the script's line would give the agent's component GPUs too
    if any(o.name in ("elastic", "elastic-partition") for o in request.directives):
        # The SPANK plugin reads the script's line and sets AMOEBA_ELASTIC_* in the job over what we export: give it
        # the range and partition decided here, on the command line, which beats the script.
        passthrough += [
            f"--elastic={spec.min_workers}:{spec.max_workers}",
            f"--elastic-partition={ours.elastic_partition}",
        ]
    share = ours.share
    if share is None and any(o.name == "share" for o in request.directives):
        share = last_value(request.directives, "share") or SHARE_MODES[0]
    if share is not None and any(o.name == "share" for o in request.directives):
        passthrough.append(f"--share={share}")  # the plugin's reading of the script's line, made the same as ours
    given = [o.name for o in [*request.options, *request.directives]]
    text = (
        request.script.read_text(errors="replace")
        if request.script
        else wrap_script(last_value(request.options, "wrap") or "")
    )
    note = ""
    if "signal" not in given and not execs_agent(text):
        # Slurm's warning goes to the batch shell: a shell that runs amoeba-run as its child dies of it.
        given.append("signal")
        note = (
            f"amoeba-sbatch: note: {request.script or '--wrap'} does not `exec amoeba-run ...`, so the job does not "
            "ask for Slurm's warning before its time limit (USR1 would end the batch shell); write `exec amoeba-run "
            "...` to have it save its state and requeue itself before the limit"
        )
    shape = ElasticJobShape(
        spec=spec,
        partition=last_value(request.options, "partition") or last_value(request.directives, "partition"),
        elastic_partition=ours.elastic_partition,
        daemon_endpoint=ours.daemon,
        extra=tuple(passthrough),
        lifecycle=lifecycle_options(signal_lead_s(_time_limit(request)), given),
        comment=last_value(request.options, "comment") or last_value(request.directives, "comment"),
        begin_delay_s=admission_delay_s(os.environ, given),
        share=share,
        share_partition=ours.share_partition,
    )
    if slurm is not None:
        shape.check_capacity(slurm)
    return Prepared(
        shape,
        request.script,
        request.script_args,
        last_value(request.options, "wrap"),
        ours.test_only,
        ours.dry_run,
        note,
        ours.restart,
    )


def _show(shape: ElasticJobShape, script: str, script_args: Sequence[str]) -> None:
    """Print the sbatch command and the job's environment."""
    print("amoeba-sbatch: would submit:", file=sys.stderr)
    print("  " + " ".join(f"{k}={shlex.quote(v)}" for k, v in shape.environment().items()), file=sys.stderr)
    print("  " + shlex.join(sbatch_argv(shape.components(), script, script_args)), file=sys.stderr)


def submission_env(base: Mapping[str, str], shape: ElasticJobShape) -> dict[str, str]:
    """The environment sbatch runs in, which the job inherits: the submitter's, the job's variables, and not the
    ``--elastic`` of an enclosing elastic job (the SPANK plugin would set that job's range over this one's)."""
    env = {k: v for k, v in base.items() if not k.startswith(PLUGIN_OPTION_ENV_PREFIX)}
    return {**env, **shape.environment()}


def _submit(prepared: Prepared, slurm: SlurmClient, script: Path) -> int:
    """Submit (or with --test-only/--dry-run, show) the job; print its id. Returns the exit status."""
    shape = prepared.shape
    env = submission_env(os.environ, shape)
    if prepared.restart:  # sbatch exports it; amoeba-run reads it (launcher/restart.py)
        env["AMOEBA_RESTART"] = "1"
    if prepared.note:
        print(prepared.note, file=sys.stderr)
    try:
        if prepared.test_only or prepared.dry_run:
            _show(shape, str(script), prepared.script_args)
            if prepared.test_only:
                answer = slurm.test_submit(script, shape.components(), prepared.script_args, env=env)
                print(answer, file=sys.stderr)
            return 0
        job = slurm.submit(script, shape.components(), prepared.script_args, env=env)
    except (SlurmCommandError, ParseError, SpecError) as exc:
        print(f"amoeba-sbatch: error: {exc}", file=sys.stderr)
        return 1
    print(job)
    guarded = start_guard(int(job), shape.daemon_endpoint, env)
    print(
        f"amoeba-sbatch: elastic job {job}: {shape.spec.min_workers}..{shape.spec.max_workers} workers; "
        f"satellites in partition {shape.elastic_partition}"
        + ("; its admission guard asks the daemon while it is pending" if guarded else ""),
        file=sys.stderr,
    )
    return 0


def dry_run_release(argv: Sequence[str], env: Mapping[str, str]) -> SlurmRelease | None:
    """The release ``--dry-run`` reads sbatch's options as, or None when ``argv`` asks for no dry run.

    ``--slurm-release``, else ``AMOEBA_SLURM_RELEASE``, else the newest supported series; Slurm is not asked.

    Raises:
        SpecError: the arguments cannot be read, or the release given is not one such as 23.11.
    """
    ours = split_args(argv, JobEnv.from_environ(env)).ours  # any supported release's options: enough to find ours
    if not ours.dry_run:
        if ours.slurm_release is not None:
            raise SpecError(f"--slurm-release {ours.slurm_release} goes with --dry-run; otherwise Slurm is asked")
        return None
    text = ours.slurm_release or env.get(ENV_SLURM_RELEASE) or SUPPORTED_SERIES[-1]
    try:
        return SlurmRelease.parse(text)
    except ParseError:
        raise SpecError(
            f"Slurm release {text!r} (--slurm-release or {ENV_SLURM_RELEASE}) is not a release: write e.g. 23.11; "
            f"supported: {', '.join(SUPPORTED_SERIES)}"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """``amoeba-sbatch``: print the job id like ``sbatch --parsable``; exit 2 on bad input, 1 when sbatch fails."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args in ([], ["-h"], ["--help"]):
        build_parser().print_help()
        return 0 if args else 2
    try:
        base = CliSlurmClient.from_environment()
        offline = dry_run_release(args, os.environ)
        prepared = prepare(args, None, offline) if offline else prepare(args, base, base.slurm_release())
    except (SpecError, ParseError) as exc:
        print(f"amoeba-sbatch: error: {exc}", file=sys.stderr)
        return 2
    except SlurmCommandError as exc:
        print(f"amoeba-sbatch: error: {exc}", file=sys.stderr)
        return 1
    if prepared.script is not None:
        return _submit(prepared, base, prepared.script)
    with tempfile.TemporaryDirectory(prefix="amoeba-sbatch-") as tmp:  # --wrap: sbatch copies the script it is given
        script = Path(tmp) / "wrap.sh"
        script.write_text(wrap_script(prepared.wrap or ""))
        return _submit(prepared, base, script)


if __name__ == "__main__":
    sys.exit(main())
