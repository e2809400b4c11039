"""``amoeba-sim``: replay workloads on a model cluster with the daemon's own policies.

``amoeba-sim run --policy P --workload FILE [--nodes 16 --gpus-per-node 4 --interval 60 --resize-cost S] --json OUT``
runs one simulation; ``amoeba-sim compare --workloads DIR --policies P1,P2,... --json OUT --plot OUT.png
[--reference DIR]`` runs every policy on every workload of a folder, in parallel, with a progress bar, and prints a
table (beside the Pollux artifact's numbers with ``--reference``). The logic lives in ``slurm_amoeba.sim``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from slurm_amoeba.cli.entry import add_version_flag, extra_missing
from slurm_amoeba.core.errors import AmoebaError
from slurm_amoeba.policy import make_policy, policy_names
from slurm_amoeba.sim.data import SimError, data_dir, resolve
from slurm_amoeba.sim.engine import ARTIFACT_RESTART_COST_S, RUNTIME_GROW_LAG_S, RUNTIME_RESIZE_COST_S, SimConfig
from slurm_amoeba.sim.progress import ProgressBar
from slurm_amoeba.sim.report import (
    infer_load,
    load_reference,
    plot,
    summary_table,
    workload_table,
    write_json,
)
from slurm_amoeba.sim.runner import RunOutcome, RunSpec, run_many


def _add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=16, help="nodes in the cluster (default 16)")
    parser.add_argument("--gpus-per-node", type=int, default=4, help="GPUs per node (default 4)")
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
    parser.add_argument(
        "--format", choices=("auto", "pollux", "philly"), default="auto", help="workload format (by header)"
    )
    parser.add_argument("--limit", type=int, default=None, help="read only the first N jobs of a Philly trace")
    parser.add_argument("--processes", type=int, default=None, help="parallel runs (default: the CPUs)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


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
    run.add_argument("--policy", required=True, help=f"one of {', '.join(policy_names())}")
    run.add_argument("--workload", required=True, type=Path, help="a workload CSV (Pollux or philly.csv)")
    run.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE", help="a policy setting")
    run.add_argument("--json", type=Path, default=None, help="write the figures as JSON here")
    _add_cluster_flags(run)
    compare = commands.add_parser("compare", help="several policies on every workload of a folder")
    compare.add_argument("--workloads", required=True, type=Path, help="a folder of workload CSVs, or one CSV")
    compare.add_argument("--policies", default=",".join(policy_names()), help="comma-separated policies (default: all)")
    compare.add_argument("--json", type=Path, default=None, help="write the figures as JSON here")
    compare.add_argument("--plot", type=Path, default=None, help="write the JCT CDF and utilization plot here")
    compare.add_argument(
        "--reference", type=Path, default=None, help="the Pollux artifact's results-jobload folder, shown beside"
    )
    compare.add_argument("--load", default=None, help="the load for --reference (default: from the folder name)")
    _add_cluster_flags(compare)
    commands.add_parser("data", help="print the reference data folder and the workload folders in it")
    return parser


def _parse_knob(text: str) -> tuple[str, object]:
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise SimError(f"--knob {text!r} is not NAME=VALUE, e.g. --knob min_gain=0.2")
    lowered = raw.strip().lower()
    value: object
    if lowered in ("true", "false"):
        value = lowered == "true"
    else:
        try:
            value = float(raw)
        except ValueError:
            value = raw
    return name.strip(), value


def _config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        interval=args.interval,
        resize_cost=args.resize_cost,
        grow_lag=args.grow_lag,
        restart_cost=args.restart_cost,
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


def _run(specs: list[RunSpec], quiet: bool, processes: int | None) -> list[RunOutcome]:
    bar = None if quiet else ProgressBar(len(specs))

    def report(done: int, total: int, outcome: RunOutcome) -> None:
        if bar is not None:
            bar.update(done, f"{outcome.policy} {outcome.workload}")

    outcomes = run_many(specs, processes, report)
    if bar is not None:
        bar.close()
    return outcomes


def _common_spec(
    args: argparse.Namespace, policy: str, workload: Path, knobs: tuple[tuple[str, object], ...]
) -> RunSpec:
    return RunSpec(
        policy=policy,
        workload=workload,
        config=_config(args),
        trace_format=args.format,
        elastic_fraction=args.elastic_fraction,
        elastic_factor=args.elastic_factor,
        philly_limit=args.limit,
        knobs=knobs,
    )


def _cmd_run(args: argparse.Namespace) -> int:
    knobs = tuple(_parse_knob(text) for text in args.knob)
    make_policy(args.policy, **dict(knobs))
    args.workload = resolve(args.workload)
    if not args.workload.is_file():
        raise SimError(f"--workload {args.workload} is not a file, here or in the data folder {data_dir()}")
    spec = _common_spec(args, args.policy, args.workload, knobs)
    outcomes = _run([spec], True, 1)
    print(summary_table(outcomes))
    if args.json is not None:
        write_json(outcomes, args.json)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    policies = [name.strip() for name in args.policies.split(",") if name.strip()]
    if not policies:
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
    specs = [_common_spec(args, policy, path, ()) for policy in policies for path in files]
    outcomes = _run(specs, args.quiet, args.processes)
    print(workload_table(outcomes, reference))
    print()
    print(summary_table(outcomes))
    if args.json is not None:
        write_json(outcomes, args.json)
    if args.plot is not None:
        plot(outcomes, args.plot, title=f"{args.workloads.name}: {args.nodes} nodes x {args.gpus_per_node} GPUs")
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
        return _cmd_compare(args)
    except AmoebaError as exc:
        print(f"amoeba-sim: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
