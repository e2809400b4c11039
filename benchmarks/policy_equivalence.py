"""Every policy's simulator results, job by job, to the last digit: the check that a refactoring changes no decision.

``scripts/check-policy-equivalence`` runs :func:`main`. Each configuration of :data:`CONFIGURATIONS` (every
registered policy, and ``amoebad``, the ``slurm`` baseline with the daemon on top, in each combination of layers that
``benchmarks/sim_study.py`` and docs/simulator.md use) runs on a set of the shared Pollux workloads
(``slurm_amoeba/sim/datafiles/pollux``, :data:`WORKLOADS`). The JSON it writes holds, per configuration label and
workload, every job's submit, first start, completion and JCT, its resizes, preemptions and restarts, the run's
summary (:mod:`slurm_amoeba.sim.metrics`, without its wall time), the number of decisions and a digest of the GPU
usage timeline. Floats are written as Python's ``repr`` (``json`` does so), so two files compare to the last digit.

``--compare BEFORE.json`` (or ``--compare BEFORE.json AFTER.json`` without running) prints every difference
(configuration, workload, job, field, before, after) and exits 1 when there is any. A configuration or workload only
in the newer file is listed as new, not as a difference; one missing from it is a difference.

The table of configurations is the part to edit when constructors change: the labels stay, the functions that build
the policies follow the code. A registered policy absent from the table runs with its defaults under its own name.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import multiprocessing
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_amoeba.policy import Policy, make_policy, policy_names
from slurm_amoeba.sim.adaptive import adaptive_models
from slurm_amoeba.sim.application import load_applications
from slurm_amoeba.sim.data import data_dir
from slurm_amoeba.sim.engine import ARTIFACT_RESTART_COST_S, SimConfig, Simulator, trace_models
from slurm_amoeba.sim.interference import load_colocation
from slurm_amoeba.sim.metrics import SimResult
from slurm_amoeba.sim.runner import RunSpec, load_jobs


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One row: how to build the policy, and which jobs of a workload are elastic or adaptive.

    Attributes:
        build: builds a fresh policy (called once per run).
        elastic_fraction: share of the jobs given a worker range (``RunSpec.elastic_fraction``).
        adaptive_fraction: share of the jobs whose batch adapts (``RunSpec.adaptive_fraction``).
        config: the cluster and its costs (default: 16 x 4 GPUs, the runtime's resize costs).
    """

    build: Callable[[], Policy]
    elastic_fraction: float = 1.0
    adaptive_fraction: float = 0.0
    config: SimConfig = dataclasses.field(default_factory=SimConfig)


def _slurm(elastic_fraction: float = 1.0) -> Configuration:
    """The ``slurm`` baseline alone."""
    return Configuration(lambda: make_policy("slurm"), elastic_fraction)


def _amoebad(elastic_fraction: float = 1.0, /, **knobs: Any) -> Configuration:
    """The ``amoebad`` policy (Slurm's baseline with the daemon on top) with these layered knobs."""
    return Configuration(lambda: make_policy("amoebad", **knobs), elastic_fraction)


#: The daemon with operator rights (sim_study's ``ADMIT_SETUP``): the admission layer.
_ADMIT: dict[str, Any] = {"admission": True}

#: label -> configuration. The labels are the keys the JSON files are compared by: keep them; change the builders.
CONFIGURATIONS: dict[str, Configuration] = {
    # Every registered policy, with the share of elastic jobs of sim_study's claims table.
    "fifo": Configuration(lambda: make_policy("fifo"), elastic_fraction=0.0),
    "srtf": Configuration(lambda: make_policy("srtf"), elastic_fraction=0.0),
    "tiresias": Configuration(lambda: make_policy("tiresias"), elastic_fraction=0.0),
    "e-tiresias": Configuration(lambda: make_policy("e-tiresias")),
    "elastic-backfill": Configuration(lambda: make_policy("elastic-backfill")),
    "elastic-backfill, rigid jobs": Configuration(lambda: make_policy("elastic-backfill"), elastic_fraction=0.0),
    "elastic-backfill, stop-resume 30 s": Configuration(
        lambda: make_policy("elastic-backfill"),
        config=SimConfig(resize_cost=ARTIFACT_RESTART_COST_S, restart_cost=ARTIFACT_RESTART_COST_S, grow_lag=0.0),
    ),
    "sjf-ffs": Configuration(lambda: make_policy("sjf-ffs"), elastic_fraction=0.0),
    "sjf-bsbf": Configuration(lambda: make_policy("sjf-bsbf"), elastic_fraction=0.0),
    "antman": Configuration(lambda: make_policy("antman"), elastic_fraction=0.0),
    "goodput": Configuration(lambda: make_policy("goodput")),
    "goodput, adaptive batches": Configuration(lambda: make_policy("goodput"), adaptive_fraction=1.0),
    "goodput, packed with moves": Configuration(lambda: make_policy("goodput", pack=True), adaptive_fraction=1.0),
    # The slurm baseline alone, and with the daemon on top (sim_study's DEFAULT_ROWS and claims rows).
    "slurm": _slurm(elastic_fraction=0.0),
    "slurm + plain daemon": _amoebad(),
    "slurm + plain daemon, half elastic": _amoebad(0.5),
    "slurm + plain daemon, submitted at request": _amoebad(**{"elastic.submitted_at": "request"}),
    "slurm + plain daemon, restore_requests": _amoebad(**{"elastic.restore_requests": True}),
    "slurm + admission": _amoebad(**_ADMIT),
    "slurm + admission, half elastic": _amoebad(0.5, **_ADMIT),
    "slurm + admission, loans and requests alike": _amoebad(**_ADMIT, **{"admission.slurm_takes_loans_only": False}),
    "slurm + admission, unbounded hold": _amoebad(**_ADMIT, **{"admission.max_hold_s": 0.0}),
    "slurm + admission, restore_requests": _amoebad(**_ADMIT, **{"elastic.restore_requests": True}),
    "slurm + admission, protect_requests": _amoebad(**_ADMIT, **{"admission.protect_requests": True}),
    "slurm + admission, spare_longer_jobs": _amoebad(**_ADMIT, **{"admission.spare_longer_jobs": True}),
    "slurm + admission, whole-node starts": _amoebad(**_ADMIT, whole_node=True),
    "slurm + admission, compact admissions": _amoebad(**_ADMIT, **{"admission.compact_admissions": True}),
    "slurm + admission + simulator-only rules": _amoebad(
        **_ADMIT,
        whole_node=True,
        **{"whole_node.moves_minimum": True, "admission.spare_tail_factor": 5.0},
    ),
    "slurm + admission + LAS order": _amoebad(
        **_ADMIT, las_order=True, **{"las_order.thresholds_gpu_s": (16 * 3600.0,)}
    ),
    "slurm + plain daemon, loose placement": _amoebad(
        **{"elastic.compact_starts": False, "elastic.compact_growth": False}
    ),
}

#: The shared workloads every configuration runs on, (load, workload number) of the Pollux set: all eight at 0.5x
#: and 1.0x, two at 1.5x and two at 2.0x (the overloaded ones cost the ``slurm`` rows most). About 6 minutes on one
#: core of a 2-core machine; ``--workloads`` picks others.
WORKLOADS: tuple[tuple[str, int], ...] = (
    *((load, number) for load in ("0.5", "1.0") for number in range(1, 9)),
    ("1.5", 2),
    ("1.5", 5),
    ("2.0", 3),
    ("2.0", 6),
)


def configurations() -> dict[str, Configuration]:
    """:data:`CONFIGURATIONS`, plus every registered policy the table does not name (with its defaults)."""
    table = dict(CONFIGURATIONS)
    for name in policy_names():
        if name not in table:
            table[name] = Configuration(functools.partial(make_policy, name))
    return table


def workload_path(load: str, number: int) -> Path:
    """The shipped Pollux workload ``number`` at ``load`` (``"0.5"``, ``"1.0"``, ``"1.5"`` or ``"2.0"``)."""
    folder = "workloads" if load == "1.0" else f"workloads-{load}"
    return data_dir() / "pollux" / folder / f"workload-{number}.csv"


def simulate(configuration: Configuration, workload: Path, horizon: float | None = None) -> SimResult:
    """One run of a configuration on a workload, as ``amoeba-sim run`` builds it.

    Args:
        configuration: the row.
        workload: a Pollux workload file.
        horizon: stop at this simulated time (``None``: run every job to its end).

    Returns:
        The simulator's result.
    """
    config = dataclasses.replace(configuration.config, horizon=horizon)
    spec = RunSpec(
        "-",
        workload,
        config,
        elastic_fraction=configuration.elastic_fraction,
        adaptive_fraction=configuration.adaptive_fraction,
    )
    jobs = load_jobs(spec)
    apps = load_applications()
    models = trace_models(apps, config.gpus_per_node)
    if any(job.adaptive for job in jobs):
        models = adaptive_models(apps, config.gpus_per_node, models)
    return Simulator(jobs, configuration.build(), config, models, load_colocation()).run()


def record(result: SimResult) -> dict[str, Any]:
    """A run as the JSON holds it: the summary (no wall time), decisions, the usage digest and every job."""
    usage = hashlib.sha256(repr(result.usage).encode()).hexdigest()
    summary = {key: value for key, value in result.summary().items() if key != "wall_s"}
    jobs = {
        job.name: {
            "submit": job.submit_time,
            "start": job.first_start,
            "end": job.completion,
            "jct": job.jct,
            "resizes": job.resizes,
            "preemptions": job.preemptions,
            "restarts": job.restarts,
        }
        for job in result.jobs
    }
    return {"summary": summary, "decisions": result.decisions, "usage_sha256": usage, "jobs": jobs}


def _run(task: tuple[str, str, int, float | None]) -> tuple[str, str, dict[str, Any], float]:
    label, load, number, horizon = task
    started = time.perf_counter()
    result = simulate(configurations()[label], workload_path(load, number), horizon)
    return label, f"{load}x/workload-{number}", record(result), time.perf_counter() - started


def run_all(
    labels: Sequence[str],
    workloads: Sequence[tuple[str, int]],
    processes: int = 1,
    horizon: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, float]]:
    """Run every configuration on every workload.

    Args:
        labels: the configurations (keys of :func:`configurations`).
        workloads: (load, workload number) pairs.
        processes: parallel processes (1: in this one).
        horizon: stop every run at this simulated time (``None``: to the end).
        progress: called with a line after each run.

    Returns:
        label -> workload -> :func:`record`, and label -> the seconds its runs took together.
    """
    tasks = [(label, load, number, horizon) for label in labels for load, number in workloads]
    results: dict[str, dict[str, dict[str, Any]]] = {label: {} for label in labels}
    seconds = dict.fromkeys(labels, 0.0)

    def collect(outcomes: Iterator[tuple[str, str, dict[str, Any], float]]) -> None:
        for done, (label, workload, run, elapsed) in enumerate(outcomes, start=1):
            results[label][workload] = run
            seconds[label] += elapsed
            if progress is not None:
                progress(f"[{done}/{len(tasks)}] {label} on {workload}: {elapsed:.1f} s")

    if processes > 1:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            collect(pool.imap_unordered(_run, tasks))
    else:
        collect(map(_run, tasks))
    ordered = {label: dict(sorted(results[label].items())) for label in labels}
    return ordered, seconds


def _same(before: object, after: object) -> bool:
    """Equal to the last digit (two NaNs are the same figure)."""
    if isinstance(before, float) and isinstance(after, float):
        return repr(before) == repr(after)
    return before == after and type(before) is type(after)


def differences(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Every difference between two result files' ``results``, and what only the newer one has.

    Args:
        before: label -> workload -> run (the reference).
        after: the same of the run to check.

    Returns:
        Lines ``config | workload | job or summary field | before | after``, and lines naming the configurations and
        workloads only ``after`` has.
    """
    lines: list[str] = []
    new = [f"{label} | (new configuration)" for label in after if label not in before]
    for label, runs in before.items():
        if label not in after:
            lines.append(f"{label} | - | - | present | missing")
            continue
        new += [f"{label} | {workload} | (new workload)" for workload in after[label] if workload not in runs]
        for workload, run in runs.items():
            other = after[label].get(workload)
            if other is None:
                lines.append(f"{label} | {workload} | - | present | missing")
                continue
            lines += _run_differences(f"{label} | {workload}", run, other)
    return lines, new


def _run_differences(where: str, run: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    lines = []
    for key in ("decisions", "usage_sha256"):
        if not _same(run[key], other[key]):
            lines.append(f"{where} | {key} | {run[key]!r} | {other[key]!r}")
    for key in sorted(set(run["summary"]) | set(other["summary"])):
        mine, theirs = run["summary"].get(key), other["summary"].get(key)
        if not _same(mine, theirs):
            lines.append(f"{where} | summary.{key} | {mine!r} | {theirs!r}")
    for job in sorted(set(run["jobs"]) | set(other["jobs"])):
        mine_job, their_job = run["jobs"].get(job), other["jobs"].get(job)
        if mine_job is None or their_job is None:
            lines.append(f"{where} | {job} | - | {mine_job is not None} | {their_job is not None}")
            continue
        for key in mine_job:
            if not _same(mine_job[key], their_job.get(key)):
                lines.append(f"{where} | {job} | {key} | {mine_job[key]!r} | {their_job.get(key)!r}")
    return lines


def _tree() -> dict[str, str]:
    """The checkout measured: its commit and whether its working tree had changes (best effort)."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=False)
        except OSError:
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"path": str(root), "commit": git("rev-parse", "HEAD"), "changes": git("status", "--porcelain")}


def compare_files(before_path: Path, after: Mapping[str, Any]) -> int:
    """Print every difference between a reference file and ``after`` (a loaded file); 1 when there is any."""
    before = json.loads(before_path.read_text())
    lines, new = differences(before["results"], after["results"])
    for line in new:
        print(f"new, not compared: {line}")
    if lines:
        print("config | workload | job | field | before | after")
        print("\n".join(lines))
        print(f"{len(lines)} differences against {before_path}")
        return 1
    runs = sum(len(runs) for runs in before["results"].values())
    print(f"no difference: {len(before['results'])} configurations, {runs} runs, every job to the last digit")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the configurations and write the JSON; with ``--compare``, print the differences.

    Args:
        argv: ``[--json PATH] [--only LABEL ...] [--workloads 1.0:6,0.5:2] [--processes N]
            [--compare BEFORE.json [AFTER.json]]``.

    Returns:
        0, or 1 when ``--compare`` found a difference.
    """
    parser = argparse.ArgumentParser(prog="check-policy-equivalence", description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=Path("policy-equivalence.json"), help="where to write results")
    parser.add_argument("--only", action="append", default=None, help="run only this configuration (repeatable)")
    parser.add_argument(
        "--workloads",
        default=",".join(f"{load}:{number}" for load, number in WORKLOADS),
        help="load:number pairs of the Pollux set",
    )
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument(
        "--compare",
        nargs="+",
        type=Path,
        default=None,
        metavar="FILE",
        help="BEFORE.json: compare this run against it; BEFORE.json AFTER.json: compare two files, run nothing",
    )
    args = parser.parse_args(argv)
    if args.compare is not None and len(args.compare) == 2:
        return compare_files(args.compare[0], json.loads(args.compare[1].read_text()))
    if args.compare is not None and len(args.compare) != 1:
        parser.error(f"--compare takes BEFORE.json or BEFORE.json AFTER.json, not {len(args.compare)} files")
    table = configurations()
    labels = args.only or list(table)
    unknown = [label for label in labels if label not in table]
    if unknown:
        parser.error(f"unknown configurations {unknown}; valid ones: {', '.join(table)}")
    try:
        workloads = [(load, int(number)) for load, number in (pair.split(":") for pair in args.workloads.split(","))]
    except ValueError:
        parser.error(f"--workloads {args.workloads!r}: give load:number pairs such as 1.0:6,0.5:2")
    tree, started = _tree(), time.perf_counter()
    results, seconds = run_all(labels, workloads, args.processes, progress=lambda line: print(line, flush=True))
    wall = time.perf_counter() - started
    output = {
        "tree": tree,
        "python": platform.python_version(),
        "workloads": [f"{load}x/workload-{number}" for load, number in workloads],
        "wall_s": wall,
        "seconds_per_configuration": seconds,
        "results": results,
    }
    args.json.write_text(json.dumps(output, indent=1, sort_keys=False) + "\n")
    print(f"{len(labels)} configurations x {len(workloads)} workloads in {wall:.0f} s; wrote {args.json}")
    if args.compare is not None:
        return compare_files(args.compare[0], json.loads(args.json.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
