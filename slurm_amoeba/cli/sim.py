"""``amoeba-sim``: replay workloads on a model cluster with the daemon's own policies.

``amoeba-sim run --policy P --workload FILE [--nodes 16 --gpus-per-node 4 --interval 60 --resize-cost S] --json OUT``
runs one simulation; ``amoeba-sim compare --workloads DIR --policies P1,P2,... --json OUT --plot OUT.png
[--reference DIR]`` runs every policy on every workload of a folder, in parallel, with a progress bar, and prints a
table (beside the Pollux artifact's numbers with ``--reference``). ``--daemon-config FILE`` (an amoebad YAML) runs
Slurm's baseline with exactly that daemon on top (the ``amoebad`` policy, :mod:`slurm_amoeba.cli.sim_daemon`): the
policy of ``run``, a row named after the file in ``compare``. The logic lives in ``slurm_amoeba.sim``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_amoeba.cli.entry import add_version_flag, extra_missing
from slurm_amoeba.core.errors import AmoebaError
from slurm_amoeba.policy import make_policy, policy_knobs, policy_names
from slurm_amoeba.sim.accounting import PARSABLE_FIELDS, load_history
from slurm_amoeba.sim.data import SimError, data_dir, resolve
from slurm_amoeba.sim.engine import (
    ARTIFACT_RESTART_COST_S,
    DEFAULT_SCALING_EXPONENT,
    DEFAULT_TIME_LIMIT_FACTOR,
    RUNTIME_GROW_LAG_S,
    RUNTIME_RESIZE_COST_S,
    SimConfig,
)
from slurm_amoeba.sim.progress import ProgressBar
from slurm_amoeba.sim.report import (
    infer_load,
    load_reference,
    plot,
    summary_table,
    workload_table,
    write_json,
)
from slurm_amoeba.sim.runner import RunOutcome, RunSpec, run_all
from slurm_amoeba.sim.site import SiteOptions, compare_site
from slurm_amoeba.sim.slurmconf import SlurmSite, read_slurm_conf

if TYPE_CHECKING:
    from slurm_amoeba.cli.sim_daemon import DaemonRun


def _add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes", type=int, default=None, help="nodes in the cluster (default: the --slurm-conf's GPU nodes, or 16)"
    )
    parser.add_argument(
        "--gpus-per-node", type=int, default=None, help="GPUs per node (default: the --slurm-conf's, or 4)"
    )
    parser.add_argument(
        "--slurm-conf",
        type=Path,
        default=None,
        help="a slurm.conf whose priority weights, SchedulerParameters, partitions (PriorityTier, PreemptMode, "
        "GraceTime) and GPU nodes the slurm policy uses",
    )
    parser.add_argument(
        "--time-limit-factor",
        type=float,
        default=DEFAULT_TIME_LIMIT_FACTOR,
        help=f"jobs without a time limit get this many times their real duration, rounded up to minutes (default "
        f"{DEFAULT_TIME_LIMIT_FACTOR:g}: the model of user estimates)",
    )
    parser.add_argument(
        "--grace-time",
        type=float,
        default=None,
        help="seconds a job preempted by the slurm policy keeps its GPUs (default: the --slurm-conf's GraceTime, "
        "else 0)",
    )
    parser.add_argument(
        "--horizon",
        type=float,
        default=None,
        help="stop at this simulated second; jobs not done by then are reported as unfinished",
    )
    parser.add_argument(
        "--queue-depth",
        type=int,
        default=0,
        help="show the policy only the N oldest pending jobs (and enough to ask for more GPUs than the cluster has): "
        "linear time on overloaded traces, exact for fifo, an approximation for the others (default 0: every job)",
    )
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between scheduling ticks (60)")
    parser.add_argument(
        "--resize-cost",
        type=float,
        default=RUNTIME_RESIZE_COST_S,
        help=f"seconds a running job's training pauses to grow or shrink (default {RUNTIME_RESIZE_COST_S}, the "
        f"runtime's measured pause; the Pollux artifact's setting is --resize-cost {ARTIFACT_RESTART_COST_S:.0f} "
        f"--grow-lag 0)",
    )
    parser.add_argument(
        "--grow-lag",
        type=float,
        default=RUNTIME_GROW_LAG_S,
        help=f"seconds from a grow order until the new workers train, the job training at its old size meanwhile "
        f"(default {RUNTIME_GROW_LAG_S}, measured by scripts/bench-grow)",
    )
    parser.add_argument(
        "--restart-cost",
        type=float,
        default=ARTIFACT_RESTART_COST_S,
        help=f"seconds a job pauses to start, resume or move (default {ARTIFACT_RESTART_COST_S:.0f})",
    )
    parser.add_argument(
        "--elastic-fraction", type=float, default=1.0, help="share of jobs given a worker range (default 1.0)"
    )
    parser.add_argument(
        "--elastic-factor",
        type=float,
        default=2.0,
        help="a range runs from requested/F to requested*F workers (default 2)",
    )
    parser.add_argument("--adaptive-fraction", type=float, default=0.0, help="share of jobs whose batch adapts")
    parser.add_argument(
        "--format", choices=("auto", "pollux", "philly"), default="auto", help="workload format (by header)"
    )
    parser.add_argument("--limit", type=int, default=None, help="read only the first N jobs of a Philly trace")
    parser.add_argument("--processes", type=int, default=None, help="parallel runs (default: the CPUs)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_daemon_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--daemon-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="an amoebad configuration (e.g. configs/amoebad.yaml): simulate Slurm's baseline with exactly that "
        "daemon on top (policy amoebad: its policy knobs, admission, whole_node_starts, queue_order)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amoeba-sim",
        description="Trace-driven simulation of elastic scheduling policies. The reference data ships with the "
        "package (`amoeba-sim data` prints where; $AMOEBA_DATA_DIR overrides it): a path such as "
        "pollux/workloads/workload-6.csv is found there when it is not in the current directory.",
    )
    add_version_flag(parser, "amoeba-sim")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="one policy on one workload")
    run.add_argument(
        "--policy", default=None, help=f"one of {', '.join(policy_names())} (or give --daemon-config instead)"
    )
    run.add_argument("--workload", required=True, type=Path, help="a workload CSV (Pollux or philly.csv)")
    run.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE", help="a policy setting")
    run.add_argument("--json", type=Path, default=None, help="write the figures as JSON here")
    _add_cluster_flags(run)
    _add_daemon_flag(run)
    compare = commands.add_parser("compare", help="several policies on every workload of a folder")
    compare.add_argument("--workloads", required=True, type=Path, help="a folder of workload CSVs, or one CSV")
    compare.add_argument(
        "--policies",
        default=None,
        help="comma-separated policies (default: all, slurm first; with --daemon-config: slurm alone), "
        "the --daemon-config row after them",
    )
    compare.add_argument(
        "--keep-going",
        action="store_true",
        help="a workload that fails (a bad file, a job too big) is named on stderr and the other runs go on",
    )
    compare.add_argument("--json", type=Path, default=None, help="write the figures as JSON here")
    compare.add_argument("--plot", type=Path, default=None, help="write the JCT CDF and utilization plot here")
    compare.add_argument(
        "--reference", type=Path, default=None, help="the Pollux artifact's results-jobload folder, shown beside"
    )
    compare.add_argument("--load", default=None, help="the load for --reference (default: from the folder name)")
    _add_cluster_flags(compare)
    _add_daemon_flag(compare)
    commands.add_parser("data", help="print the reference data folder and the workload folders in it")
    _add_site_parser(commands)
    return parser


def _add_site_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    site = commands.add_parser(
        "site",
        help="a site's accounting history under the slurm baseline vs with a share of its jobs elastic",
        description="Replays an accounting export twice on the site's cluster: under the slurm baseline, and with "
        "a share of the jobs elastic under the daemon's elastic backfill on top of the same Slurm model; prints "
        "avg/p50/p99 JCT, queueing, utilization and the regular jobs' wait side by side. Export with "
        "`sacct --json -a -S START -E END > history.json` or `sacct -a -P -X -S START -E END "
        f"--format={','.join(PARSABLE_FIELDS)} > history.txt`.",
    )
    site.add_argument("--history", required=True, type=Path, help="the sacct export (--json, or -P with the fields)")
    site.add_argument("--history-format", choices=("auto", "json", "parsable"), default="auto", help="by content")
    site.add_argument("--elastic-fraction", type=float, default=0.5, help="share of jobs made elastic (default 0.5)")
    site.add_argument(
        "--elastic-factor", type=float, default=2.0, help="a range runs from requested/F to requested*F GPUs (2)"
    )
    site.add_argument(
        "--scaling-exponent",
        type=float,
        default=DEFAULT_SCALING_EXPONENT,
        help=f"an elastic job at N GPUs runs at (N/requested)**E of its speed (default {DEFAULT_SCALING_EXPONENT}, "
        f"measured on the shared Pollux traces; 1 is linear)",
    )
    site.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE", help="a slurm policy setting")
    site.add_argument("--json", type=Path, default=None, help="write both runs' figures as JSON here")
    site.add_argument("--plot", type=Path, default=None, help="write the JCT CDF and utilization plot here")
    site.add_argument(
        "--slurm-conf", type=Path, default=None, help="the site's slurm.conf (weights, partitions, nodes)"
    )
    site.add_argument("--nodes", type=int, default=None, help="GPU nodes (default: the --slurm-conf's, or 16)")
    site.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (default: the conf's, or 4)")
    site.add_argument("--interval", type=float, default=60.0, help="seconds between scheduling rounds (60)")
    site.add_argument("--resize-cost", type=float, default=RUNTIME_RESIZE_COST_S, help="pause of a resize (s)")
    site.add_argument("--grow-lag", type=float, default=RUNTIME_GROW_LAG_S, help="seconds until grown workers train")
    site.add_argument(
        "--restart-cost",
        type=float,
        default=0.0,
        help="pause at a start or resume (default 0: the recorded durations already hold the jobs' start-up)",
    )
    site.add_argument("--grace-time", type=float, default=None, help="GraceTime (default: the --slurm-conf's)")
    site.add_argument(
        "--time-limit-factor",
        type=float,
        default=DEFAULT_TIME_LIMIT_FACTOR,
        help="for jobs without a recorded limit: this many times their duration",
    )
    site.add_argument("--horizon", type=float, default=None, help="stop at this simulated second")
    site.add_argument("--queue-depth", type=int, default=0, help="see `amoeba-sim run --help` (default 0: every job)")


def _default_policies() -> list[str]:
    """Every registered policy, the ``slurm`` baseline first (the row every other one is read against)."""
    names = policy_names()
    return ["slurm", *[name for name in names if name != "slurm"]] if "slurm" in names else names


#: The policies that run on the simulator's model of Slurm: they take ``--slurm-conf``'s knobs and grace time.
_ON_SLURM = ("slurm", "amoebad")


def _parse_knob(policy: str, text: str) -> tuple[str, object]:
    """One ``--knob NAME=VALUE``, its value checked against the type of the knob's default.

    Raises:
        SimError: not NAME=VALUE, or a value of the wrong kind (the message names the knob and its default).
        PolicyError: the policy or the knob is unknown.
    """
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise SimError(f"--knob {text!r} is not NAME=VALUE, e.g. --knob min_gain=0.2")
    knobs = policy_knobs(policy)
    if name not in knobs:
        make_policy(policy, **{name: raw})  # raises the registry's unknown-knob message
    default = knobs[name]
    lowered = raw.strip().lower()
    if isinstance(default, bool):
        if lowered not in ("true", "false"):
            raise SimError(f"--knob {text!r}: {name} of policy {policy} is true or false (default {default})")
        return name, lowered == "true"
    if isinstance(default, int | float):
        try:
            value = float(raw)
        except ValueError:
            raise SimError(f"--knob {text!r}: {name} of policy {policy} is a number (default {default})") from None
        if isinstance(default, int) and value != int(value):
            raise SimError(f"--knob {text!r}: {name} of policy {policy} is a whole number (default {default})")
        return name, int(value) if isinstance(default, int) else value
    if isinstance(default, str):
        return name, raw.strip()
    if isinstance(default, tuple) and all(isinstance(item, float) for item in default):
        try:
            return name, tuple(float(item) for item in raw.split(","))
        except ValueError:
            raise SimError(f"--knob {text!r}: {name} of policy {policy} is numbers separated by commas") from None
    raise SimError(f"--knob {text!r}: {name} of policy {policy} cannot be set on the command line; use --slurm-conf")


def _site(args: argparse.Namespace) -> SlurmSite | None:
    return None if args.slurm_conf is None else read_slurm_conf(resolve(args.slurm_conf))


def _config(args: argparse.Namespace, policy: str = "", site: SlurmSite | None = None) -> SimConfig:
    grace = args.grace_time if args.grace_time is not None else (site.grace_time if site is not None else 0.0)
    return SimConfig(
        nodes=args.nodes or (site.nodes if site is not None and site.nodes else 16),
        gpus_per_node=args.gpus_per_node or (site.gpus_per_node if site is not None and site.gpus_per_node else 4),
        interval=args.interval,
        resize_cost=args.resize_cost,
        grow_lag=args.grow_lag,
        restart_cost=args.restart_cost,
        horizon=args.horizon,
        time_limit_factor=args.time_limit_factor,
        grace_time=grace if policy in _ON_SLURM else 0.0,
        queue_depth=args.queue_depth,
    )


def _workload_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise SimError(f"--workloads {path} is neither a folder of workload CSVs nor a file")
    files = sorted(path.glob("*.csv"))
    if not files:
        raise SimError(f"--workloads {path} holds no .csv file")
    return files


def _run(specs: list[RunSpec], quiet: bool, processes: int | None, keep_going: bool = False) -> list[RunOutcome]:
    bar = None if quiet else ProgressBar(len(specs))

    def report(done: int, total: int, outcome: RunOutcome | str) -> None:
        if bar is not None:
            label = f"{outcome.policy} {outcome.workload}" if isinstance(outcome, RunOutcome) else "failed"
            bar.update(done, label)

    outcomes, failures = run_all(specs, processes, report, keep_going)
    if bar is not None:
        bar.close()
    for message in failures:
        print(f"amoeba-sim: skipped: {message}", file=sys.stderr)
    if not outcomes:
        raise SimError(f"every run failed ({len(failures)}); see the messages above")
    return outcomes


def _common_spec(
    args: argparse.Namespace,
    policy: str,
    workload: Path,
    knobs: tuple[tuple[str, object], ...],
    site: SlurmSite | None = None,
    label: str = "",
) -> RunSpec:
    if policy in _ON_SLURM and site is not None:
        knobs = tuple({**site.knobs, **dict(knobs)}.items())  # --knob overrides the slurm.conf
    return RunSpec(
        policy=policy,
        workload=workload,
        config=_config(args, policy, site),
        trace_format=args.format,
        elastic_fraction=args.elastic_fraction,
        elastic_factor=args.elastic_factor,
        adaptive_fraction=args.adaptive_fraction,
        philly_limit=args.limit,
        knobs=knobs,
        label=label,
    )


def _daemon(args: argparse.Namespace) -> DaemonRun | None:
    """The ``--daemon-config`` file as a run of the ``amoebad`` policy (its notes printed), or ``None``."""
    if args.daemon_config is None:
        return None
    from slurm_amoeba.cli.sim_daemon import daemon_run  # the daemon's loader, only when asked for

    run = daemon_run(args.daemon_config)
    make_policy("amoebad", **run.knobs)
    for note in run.notes:
        print(f"amoeba-sim: note: {args.daemon_config}: {note}", file=sys.stderr)
    return run


def _cmd_run(args: argparse.Namespace) -> int:
    daemon = _daemon(args)
    if daemon is not None and args.policy not in (None, "amoebad"):
        raise SimError(f"--policy {args.policy} and --daemon-config both name the policy; give one of them")
    if daemon is None and args.policy is None:
        raise SimError("give --policy NAME or --daemon-config FILE")
    policy = "amoebad" if daemon is not None else args.policy
    knobs = tuple(_parse_knob(policy, text) for text in args.knob)
    if daemon is not None:
        knobs = tuple({**daemon.knobs, **dict(knobs)}.items())  # --knob overrides the file
    make_policy(policy, **dict(knobs))
    site = _site(args)
    args.workload = resolve(args.workload)
    if not args.workload.is_file():
        raise SimError(f"--workload {args.workload} is not a file, here or in the data folder {data_dir()}")
    spec = _common_spec(args, policy, args.workload, knobs, site, daemon.label if daemon is not None else "")
    outcomes = _run([spec], True, 1)
    print(summary_table(outcomes))
    if args.json is not None:
        write_json(outcomes, args.json)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    daemon = _daemon(args)
    default = ["slurm"] if daemon is not None else _default_policies()
    policies = default if args.policies is None else [name.strip() for name in args.policies.split(",")]
    policies = [name for name in policies if name]
    if not policies and daemon is None:
        raise SimError("--policies is empty; name at least one of " + ", ".join(policy_names()))
    for name in policies:
        make_policy(name)
    if args.plot is not None and (missing := extra_missing("sim", "--plot")):
        raise SimError(missing)
    args.workloads = resolve(args.workloads)
    files = _workload_files(args.workloads)
    reference = None
    if args.reference is not None:
        args.reference = resolve(args.reference)
        folder = args.workloads if args.workloads.is_dir() else args.workloads.parent
        reference = load_reference(args.reference, args.load or infer_load(folder))
    site = _site(args)
    specs = [_common_spec(args, policy, path, (), site) for policy in policies for path in files]
    if daemon is not None:
        knobs = tuple(daemon.knobs.items())
        specs += [_common_spec(args, "amoebad", path, knobs, site, daemon.label) for path in files]
    outcomes = _run(specs, args.quiet, args.processes, args.keep_going)
    print(workload_table(outcomes, reference))
    print()
    print(summary_table(outcomes))
    if args.json is not None:
        write_json(outcomes, args.json)
    if args.plot is not None:
        cluster = specs[0].config
        plot(outcomes, args.plot, title=f"{args.workloads.name}: {cluster.nodes} nodes x {cluster.gpus_per_node} GPUs")
    return 0


def _cmd_site(args: argparse.Namespace) -> int:
    knobs = dict(_parse_knob("slurm", text) for text in args.knob)
    site = _site(args)
    if args.plot is not None and (missing := extra_missing("sim", "--plot")):
        raise SimError(missing)
    history = load_history(resolve(args.history), args.history_format)
    config = _config(args, "slurm", site)
    options = SiteOptions(
        fraction=args.elastic_fraction,
        factor=args.elastic_factor,
        scaling_exponent=args.scaling_exponent,
        knobs={**(site.knobs if site is not None else {}), **knobs},
    )
    comparison = compare_site(history, config, options, args.history.stem)
    print(f"{args.history}: {history.describe()}; {comparison.elastic_jobs} made elastic")
    print(f"cluster: {config.nodes} nodes x {config.gpus_per_node} GPUs")
    print()
    print(comparison.table())
    if args.json is not None:
        write_json(comparison.outcomes, args.json)
    if args.plot is not None:
        span = max((job.submit_time for job in history.jobs), default=0.0) + 1.0
        title = f"{args.history.name}: slurm vs {args.elastic_fraction:.0%} elastic"
        plot(comparison.outcomes, args.plot, title=title, bin_s=max(span / 100.0, 1.0))
    return 0


def _cmd_data() -> int:
    folder = data_dir()
    print(folder)
    for workloads in sorted(folder.glob("*/workloads*")):
        count = len(list(workloads.glob("*.csv")))
        print(f"  {workloads.relative_to(folder)}/  ({count} workloads)")
    print(f"origin and license of every file: {folder / 'SOURCES.md'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``amoeba-sim``.

    Args:
        argv: the arguments (``sys.argv[1:]`` by default).

    Returns:
        0 on success, 2 on a usage or input error (the message names the offending value).
    """
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return _cmd_run(args)
        if args.command == "data":
            return _cmd_data()
        if args.command == "site":
            return _cmd_site(args)
        return _cmd_compare(args)
    except AmoebaError as exc:
        print(f"amoeba-sim: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
