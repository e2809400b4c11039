"""The study behind ``docs/simulator.md``: fidelity against the Pollux artifact, the claims, and speed.

``scripts/sim-report`` runs :func:`main`; every number in the document comes from here, nothing is typed in by hand.

- *Fidelity*: our Tiresias in the artifact's setting (30 s per reallocation, requested sizes, 16 x 4 GPUs, 60 s
  interval) against the artifact's own Tiresias, per workload, at the four loads.
- *Claims*: every policy against the ``slurm`` baseline (first row), Tiresias and Pollux's 0.764 h at 1.0x load,
  with the artifact's 30 s resize cost and with the runtime's measured pause and grow lag (``RUNTIME_RESIZE_COST_S``,
  ``RUNTIME_GROW_LAG_S``); elastic backfill also against itself without elastic jobs, and on top of the ``slurm``
  baseline (the ``amoebad`` policy).
- *Default*: the daemon's default on top of the ``slurm`` baseline against the baseline alone, per workload family
  and load (avg and p99 JCT, workloads that lose), the rigid jobs' wait when half the jobs are elastic, and the
  what-if of a queue in 2D-LAS order.
- *Goodput*: the goodput policy with adaptive batches (``sim/adaptive.py``) and with fixed ones beside the
  artifact's Pollux, Tiresias and the ``slurm`` baseline at every load (avg and p99 JCT, makespan).
- *Speed*: all workloads x all policies at 1.0x, FIFO over the full ``philly.csv``, and one decision of each policy
  on a snapshot of 1,000 nodes x 8 GPUs and 2,000 jobs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.record import Recording
from slurm_amoeba.cli.sim_daemon import daemon_run
from slurm_amoeba.policy import JobInfo, JobPhase, NodeInfo, Snapshot, make_policy, policy_names
from slurm_amoeba.sim.application import load_applications
from slurm_amoeba.sim.data import data_dir
from slurm_amoeba.sim.engine import (
    ARTIFACT_RESTART_COST_S,
    DEFAULT_SCALING_EXPONENT,
    RUNTIME_GROW_LAG_S,
    RUNTIME_RESIZE_COST_S,
    SimConfig,
    Simulator,
    trace_models,
)
from slurm_amoeba.sim.metrics import percentile
from slurm_amoeba.sim.report import plot
from slurm_amoeba.sim.runner import RunOutcome, RunSpec, load_jobs, run_many
from slurm_amoeba.sim.workload import load_philly, load_pollux_workload, make_elastic

LOADS = ("0.5", "1.0", "1.5", "2.0")

#: What every table of the study assumes, shown with its result.
STUDY_NOTE = (
    "Deterministic: one run per workload, the same figures on any machine; only wall times depend on the machine. "
    "Policies see exact throughput (and goodput) tables; the Pollux artifact's own runs fitted their model online "
    "and paid 30 s per reallocation. Rows marked 'runtime' pay the runtime's measured resize "
    f"({RUNTIME_RESIZE_COST_S:g} s pause + {RUNTIME_GROW_LAG_S:g} s grow lag); 'stop-resume' rows pay 30 s."
)

#: Pollux's mean average JCT over the 8 workloads at 1.0x (artifact README), checked against its summary.json.
POLLUX_MEAN_H = 0.764


@dataclasses.dataclass(frozen=True)
class Variant:
    """One line of the claims table: a policy with its settings."""

    label: str
    policy: str
    resize_cost: float
    grow_lag: float
    elastic_fraction: float = 1.0
    knobs: tuple[tuple[str, object], ...] = ()
    adaptive_fraction: float = 0.0

    @property
    def setting(self) -> str:
        """The resize setting, as the table shows it."""
        if self.grow_lag == 0:
            return f"stop-resume {self.resize_cost:g} s"
        return f"runtime {self.resize_cost:g} s + {self.grow_lag:g} s lag"


def _workloads(load: str) -> list[Path]:
    folder = data_dir() / "pollux" / ("workloads" if load == "1.0" else f"workloads-{load}")
    return sorted(folder.glob("workload-*.csv"), key=lambda path: int(path.stem.split("-")[1]))


def _reference(policy: str, load: str) -> dict[str, object]:
    path = data_dir() / "pollux" / "results-jobload" / f"{policy}-{load}" / "summary.json"
    loaded: dict[str, object] = json.loads(path.read_text())
    return loaded


def _mean_jct(outcomes: Sequence[RunOutcome]) -> float:
    return sum(outcome.summary["avg_jct_s"] for outcome in outcomes) / len(outcomes)


def fidelity(processes: int | None) -> str:
    """Markdown: our Tiresias beside the artifact's, per workload and load (hours)."""
    config = SimConfig(resize_cost=ARTIFACT_RESTART_COST_S, restart_cost=ARTIFACT_RESTART_COST_S, grow_lag=0.0)
    specs = [RunSpec("tiresias", path, config, elastic_fraction=0.0) for load in LOADS for path in _workloads(load)]
    outcomes = run_many(specs, processes)
    lines = [
        "| load | " + " | ".join(f"w{i}" for i in range(1, 9)) + " | mean (ours / artifact) | difference |",
        "|---|" + "---|" * 8 + "---|---|",
    ]
    for index, load in enumerate(LOADS):
        ours = outcomes[index * 8 : index * 8 + 8]
        avgs = _reference("tiresias", load)["avgs"]
        assert isinstance(avgs, dict)
        cells = [
            f"{outcome.summary['avg_jct_s'] / 3600:.3f} / {float(avgs[outcome.workload]) / 3600:.3f}"
            for outcome in ours
        ]
        mine = _mean_jct(ours) / 3600
        theirs = sum(float(value) for value in avgs.values()) / len(avgs) / 3600
        lines.append(
            f"| {load}x | "
            + " | ".join(cells)
            + f" | **{mine:.3f} / {theirs:.3f}** | {100 * (mine / theirs - 1):+.1f}% |"
        )
    return "\n".join(lines)


def isolated_mean_jct(files: Sequence[Path]) -> float:
    """Mean JCT (s) if every job had the cluster to itself at its requested size, start pause included."""
    apps = load_applications()
    models = trace_models(apps, SimConfig().gpus_per_node)
    total, count = 0.0, 0
    for path in files:
        for job in load_pollux_workload(path, apps):
            total += ARTIFACT_RESTART_COST_S + models(job).remaining_seconds(0, 0.0)
            count += 1
    return total / count


def claims(processes: int | None, plot_path: Path | None) -> str:
    """Markdown: each policy against Tiresias and Pollux at 1.0x, with both resize costs."""
    files = _workloads("1.0")
    variants: list[Variant] = []
    for cost, lag in ((ARTIFACT_RESTART_COST_S, 0.0), (RUNTIME_RESIZE_COST_S, RUNTIME_GROW_LAG_S)):
        variants += [
            Variant("slurm (baseline)", "slurm", cost, lag, 0.0),
            Variant("slurm + elastic backfill", "amoebad", cost, lag, 1.0),
            Variant("tiresias", "tiresias", cost, lag, 0.0),
            Variant("e-tiresias", "e-tiresias", cost, lag),
            Variant("elastic-backfill", "elastic-backfill", cost, lag),
            Variant("backfill without elastic jobs", "elastic-backfill", cost, lag, 0.0),
            Variant("sjf-bsbf", "sjf-bsbf", cost, lag, 0.0),
            Variant("sjf-ffs", "sjf-ffs", cost, lag, 0.0),
            Variant("srtf (oracle)", "srtf", cost, lag, 0.0),
            Variant("fifo", "fifo", cost, lag, 0.0),
            Variant("goodput, fixed batches", "goodput", cost, lag),
            Variant("goodput, adaptive batches", "goodput", cost, lag, adaptive_fraction=1.0),
        ]
    specs = [
        RunSpec(
            v.policy,
            path,
            SimConfig(resize_cost=v.resize_cost, grow_lag=v.grow_lag),
            elastic_fraction=v.elastic_fraction,
            knobs=v.knobs,
            adaptive_fraction=v.adaptive_fraction,
        )
        for v in variants
        for path in files
    ]
    outcomes = run_many(specs, processes)
    pollux = _reference("pollux", "1.0")["mean"]
    assert isinstance(pollux, float)
    lines = [
        "| resize setting | policy | mean avg JCT (h) | vs slurm | vs Tiresias | vs Pollux (0.764 h) | p99 JCT (h) "
        "| avg queue (h) | GPU util | resizes / workload |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    means = [_mean_jct(outcomes[i * len(files) : (i + 1) * len(files)]) for i in range(len(variants))]
    slurm = tiresias_mean = 0.0
    for index, variant in enumerate(variants):
        runs = outcomes[index * len(files) : (index + 1) * len(files)]
        mean = means[index]
        if variant.label == "slurm (baseline)":
            slurm = mean
            tiresias_mean = means[index + 2]

        def avg(key: str, runs: Sequence[RunOutcome] = runs) -> float:
            return sum(run.summary[key] for run in runs) / len(runs)

        lines.append(
            f"| {variant.setting} | {variant.label} | {mean / 3600:.3f} | {100 * (mean / slurm - 1):+.1f}% "
            f"| {100 * (mean / tiresias_mean - 1):+.1f}% "
            f"| {100 * (mean / pollux - 1):+.1f}% | {avg('p99_jct_s') / 3600:.2f} | {avg('avg_queue_s') / 3600:.3f} "
            f"| {avg('gpu_util'):.3f} | {avg('resizes'):.0f} |"
        )
    tiresias = outcomes[2 * len(files) : 3 * len(files)]
    jcts = sorted((jct for run in tiresias for jct in run.jcts), reverse=True)
    top = sum(jcts[: len(jcts) // 20]) / sum(jcts)
    lines.append(
        f"\nWith every job alone on the cluster at its requested size (30 s start included), the mean JCT would be "
        f"{isolated_mean_jct(files) / 3600:.3f} h. Under Tiresias the longest 5% of the jobs make {100 * top:.0f}% of "
        f"the summed JCT."
    )
    if plot_path is not None:
        shown = [
            outcome
            for variant, start in zip(variants, range(0, len(outcomes), len(files)), strict=True)
            if variant.grow_lag > 0
            and variant.label not in ("backfill without elastic jobs", "slurm + elastic backfill")
            and variant.policy != "goodput"  # the figure of docs/simulator.md predates it; see its Goodput section
            for outcome in outcomes[start : start + len(files)]
        ]
        title = (
            f"Pollux workloads at 1.0x, 16 x 4 GPUs, runtime resize: {RUNTIME_RESIZE_COST_S:g} s pause, "
            f"{RUNTIME_GROW_LAG_S:g} s grow lag"
        )
        plot(shown, plot_path, title=title)
    return "\n".join(lines)


#: A row's policy: a registered name and its knobs (``make_policy(name, **dict(knobs))``).
Setup = tuple[str, tuple[tuple[str, object], ...]]

#: The ``slurm`` baseline alone.
SLURM_SETUP: Setup = ("slurm", ())
#: The daemon as shipped (``configs/amoebad.yaml``, read by the daemon's own loader and turned into the ``amoebad``
#: policy's knobs as ``amoeba-sim --daemon-config`` does): admission at the requested size with the holds made by
#: the jobs' owners (no Slurm rights), every satellite Slurm's to take as live.
SHIPPED_SETUP: Setup = (
    "amoebad",
    tuple(sorted(daemon_run(Path(__file__).resolve().parents[1] / "configs" / "amoebad.yaml").knobs.items())),
)
#: The plain daemon on top of the ``slurm`` baseline: the ``amoebad`` policy without admission.
DEFAULT_SETUP: Setup = ("amoebad", ())
#: The daemon with operator rights: elastic jobs held until their requested size is available (the admission layer).
ADMIT_SETUP: Setup = ("amoebad", (("admission", True),))
#: The what-if of a daemon that also orders Slurm's queue by attained service (Tiresias's 16 GPU-hour threshold).
LAS_SETUP: Setup = ("amoebad", (*ADMIT_SETUP[1], ("las_order", True), ("las_order.thresholds_gpu_s", (16 * 3600.0,))))
#: Admission with the what-if of regrowing jobs below and behind their request first.
RESTORE_SETUP: Setup = ("amoebad", (*ADMIT_SETUP[1], ("elastic.restore_requests", True)))
#: Admission with the simulator's what-ifs that the live daemon lacks: whole-node starts that may move an elastic
#: job at its minimum, and arrivals started smaller to spare long jobs.
WHATIF_SETUP: Setup = (
    "amoebad",
    (
        *ADMIT_SETUP[1],
        ("whole_node", True),
        ("whole_node.moves_minimum", True),
        ("admission.spare_tail_factor", 5.0),
    ),
)
#: The plain daemon that submits elastic jobs at their requested size and only lends idle GPUs above requests.
SUBMIT_SETUP: Setup = ("amoebad", (("elastic.submitted_at", "request"),))

#: The GraceTime the rigid jobs' added wait is read against: the local cluster's elastic partition (10 s), where
#: the daemon's extras live; the Pollux runs model no partition, so a lent GPU goes back in the same round.
GRACE_TIME_S = 10.0


#: The default section's rows: label, share of the jobs elastic, policy and knobs.
DEFAULT_ROWS: tuple[tuple[str, float, Setup], ...] = (
    ("slurm (baseline)", 0.0, SLURM_SETUP),
    ("daemon as shipped (admission, holds by the jobs' owners)", 1.0, SHIPPED_SETUP),
    ("plain daemon", 1.0, DEFAULT_SETUP),
    ("plain daemon, submitted at request", 1.0, SUBMIT_SETUP),
    ("+ admission at request", 1.0, ADMIT_SETUP),
    ("+ admission + simulator-only rules (what-if)", 1.0, WHATIF_SETUP),
    ("+ admission, elastic.restore_requests (what-if)", 1.0, RESTORE_SETUP),
    ("+ admission + LAS order", 1.0, LAS_SETUP),
)


def pooled_p99(runs: Sequence[Sequence[float]]) -> float:
    """The p99 of the jobs of several workloads taken together (one family at one load): the workload family's tail,
    which the mean of the workloads' p99s is not (a workload of 160 jobs has its p99 among its two longest)."""
    return percentile([jct for run in runs for jct in run], 0.99)


def _versus(runs: Sequence[RunOutcome], base: Sequence[RunOutcome]) -> str:
    """Table cells of a row against the baseline's runs of the same workloads (a workload is worse above +0.5%):
    mean avg JCT, mean p99 JCT, the p99 of the workloads' jobs pooled, and the workloads that are worse."""
    cells = []
    for key in ("avg_jct_s", "p99_jct_s"):
        mean, reference = (sum(run.summary[key] for run in side) / len(side) for side in (runs, base))
        cells.append(f"{mean / 3600:.3f} ({100 * (mean / reference - 1):+.1f}%)")
    pooled, reference = (pooled_p99([run.jcts for run in side]) for side in (runs, base))
    cells.append(f"{pooled / 3600:.3f} ({100 * (pooled / reference - 1):+.1f}%)")
    for key in ("avg_jct_s", "p99_jct_s"):
        ratios = [run.summary[key] / ref.summary[key] - 1 for run, ref in zip(runs, base, strict=True)]
        worse = sum(1 for ratio in ratios if ratio > 0.005)
        per = " ".join(f"{100 * ratio:+.0f}" for ratio in ratios)
        cells.append(f"{worse} of {len(ratios)} ({per})")
    return " | ".join(cells)


def _half_elastic(path: Path, setup: Setup, fraction: float) -> tuple[float, float, float, list[float]]:
    """A workload with ``fraction`` of its jobs elastic: average JCT, p99 JCT, the rigid jobs' average wait and the
    finished jobs' JCTs."""
    policy, knobs = setup
    spec = RunSpec(policy, path, SimConfig(), elastic_fraction=fraction, knobs=knobs)
    jobs = load_jobs(spec)
    apps = load_applications()
    result = Simulator(jobs, make_policy(policy, **dict(knobs)), spec.config, trace_models(apps, 4)).run()
    rigid = {job.name for job in jobs if job.min_workers == job.max_workers}
    waits = [r.first_start - r.submit_time for r in result.jobs if r.name in rigid and r.first_start is not None]
    summary = result.summary()
    return summary["avg_jct_s"], summary["p99_jct_s"], sum(waits) / len(waits), result.jcts()


def default_policy(processes: int | None, with_philly: bool = True, with_pollux: bool = True) -> str:
    """Markdown: the daemon's default on top of the ``slurm`` baseline, per workload family and load (``with_philly``:
    the two Philly families too, about half an hour on this machine; ``with_pollux``: the Pollux families)."""
    if not with_pollux:
        return _philly_families(DEFAULT_ROWS, processes) if with_philly else ""
    lines = [
        "| workloads | row | avg JCT h (vs slurm) | p99 JCT h (vs slurm) | pooled p99 JCT h (vs slurm) "
        "| worse avg JCT (per workload, %) | worse p99 JCT (per workload, %) |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = DEFAULT_ROWS
    for load in LOADS:
        files = _workloads(load)
        specs = [
            RunSpec(policy, path, SimConfig(), elastic_fraction=f, knobs=k)
            for _, f, (policy, k) in rows
            for path in files
        ]
        outcomes = run_many(specs, processes)
        base = outcomes[: len(files)]
        for index, (label, _, _) in enumerate(rows):
            runs = outcomes[index * len(files) : (index + 1) * len(files)]
            lines.append(f"| Pollux {load}x, every job elastic | {label} | {_versus(runs, base)} |")
    lines.append("")
    lines += _rigid_waits(rows)
    if with_philly:
        lines.append(_philly_families(rows, processes))
    return "\n".join(lines)


def _philly_families(rows: Sequence[tuple[str, float, Setup]], processes: int | None) -> str:
    """Lines: the rigid Philly family and the half-elastic one, for the rows named in ``PHILLY_ROWS`` (all runs in
    ``processes`` processes). The rigid trace has no elastic job: every row but one with the LAS order equals the
    baseline by construction, so only those run."""
    shown = [row for row in rows if row[0] in PHILLY_ROWS]
    ordered = [(label, setup) for label, _, setup in shown if dict(setup[1]).get("las_order")]
    tasks: list[tuple[str, float, Setup]] = [("rigid", 0.0, SLURM_SETUP)]
    tasks += [("rigid", 0.0, setup) for _, setup in ordered] + [("half", f, setup) for _, f, setup in shown]
    count = min(processes or len(os.sched_getaffinity(0)), len(tasks))
    if count > 1:
        with multiprocessing.get_context("fork").Pool(count) as pool:
            runs = pool.map(_philly_run, tasks)
    else:
        runs = [_philly_run(task) for task in tasks]
    rigid, half = runs[: 1 + len(ordered)], runs[1 + len(ordered) :]
    cells = ", ".join(
        f"{label} {run['avg'] / 3600:.3f} h (p99 {run['p99'] / 3600:.2f} h)"
        for (label, _), run in zip(ordered, rigid[1:], strict=True)
    )
    lines = [
        f"Philly, first {PHILLY_RIGID} jobs (rigid) on 64 x 8 GPUs: avg JCT {rigid[0]['avg'] / 3600:.3f} h under the "
        f"baseline (p99 {rigid[0]['p99'] / 3600:.2f} h), and so under every row without the LAS order (no elastic "
        f"job: nothing else changes)" + (f"; {cells}." if cells else ".")
    ]
    cells_half = []
    for (label, _, _), figures in zip(shown, half, strict=True):
        base = half[0]
        cells_half.append(
            f"{label}: avg {figures['avg'] / 3600:.3f} h ({100 * (figures['avg'] / base['avg'] - 1):+.1f}%), p99 "
            f"{figures['p99'] / 3600:.2f} h ({100 * (figures['p99'] / base['p99'] - 1):+.1f}%), rigid jobs' wait "
            f"{figures['wait'] / 60:.1f} min ({(figures['wait'] - base['wait']) / 60:+.1f})"
        )
    lines.append(
        f"Philly, first {PHILLY_ELASTIC} jobs, half of them elastic (range requested/2..2x, speed (GPUs/requested)^"
        f"{DEFAULT_SCALING_EXPONENT:g}), {PHILLY_ELASTIC_NODES} x 8 GPUs: " + "; ".join(cells_half) + "."
    )
    return "\n".join(lines)


def _philly_run(task: tuple[str, float, Setup]) -> dict[str, float]:
    """One run of a Philly family (``rigid``: the first ``PHILLY_RIGID`` jobs on 64 x 8 GPUs; ``half``: the first
    ``PHILLY_ELASTIC`` with half of them elastic when the fraction is not 0): average and p99 JCT, and the rigid
    jobs' average wait (s) in the half-elastic family."""
    family, fraction, (policy, knobs) = task
    trace = data_dir() / "pollux" / "traces" / "philly.csv"
    if family == "rigid":
        spec = RunSpec(policy, trace, SimConfig(nodes=64, gpus_per_node=8), philly_limit=PHILLY_RIGID, knobs=knobs)
        (outcome,) = run_many([spec], 1)
        return {"avg": outcome.summary["avg_jct_s"], "p99": outcome.summary["p99_jct_s"], "wait": math.nan}
    config = SimConfig(nodes=PHILLY_ELASTIC_NODES, gpus_per_node=8)
    jobs = load_philly(trace, PHILLY_ELASTIC)
    elastic = make_elastic(jobs, {}, 0.5, 2.0, config.total_gpus, duration_jobs=True)
    rigid = {job.name for job in elastic if job.min_workers == job.max_workers}
    models = trace_models({}, config.gpus_per_node, DEFAULT_SCALING_EXPONENT)
    result = Simulator(elastic if fraction else jobs, make_policy(policy, **dict(knobs)), config, models).run()
    summary = result.summary()
    waits = [r.first_start - r.submit_time for r in result.jobs if r.name in rigid and r.first_start is not None]
    return {"avg": summary["avg_jct_s"], "p99": summary["p99_jct_s"], "wait": sum(waits) / len(waits)}


def _rigid_waits(rows: Sequence[tuple[str, float, Setup]]) -> list[str]:
    """Lines: per load, half the jobs elastic: each row's avg and p99 JCT against the baseline (per workload, %), the
    p99 of the 8 workloads' jobs pooled, and the rigid jobs' added wait per workload (their mean wait minus theirs
    under the baseline, minutes), read against ``GRACE_TIME_S``."""
    lines = []
    for load in LOADS:
        half = _workloads(load)
        runs = [[_half_elastic(path, setup, 0.5) for path in half] for _, _, setup in rows]
        base = runs[0]
        pooled = pooled_p99([r[3] for r in base])
        lines.append(
            f"Half the jobs elastic ({load}x): under the baseline avg JCT "
            f"{sum(r[0] for r in base) / len(half) / 3600:.3f} h, p99 "
            f"{sum(r[1] for r in base) / len(half) / 3600:.3f} h (pooled {pooled / 3600:.3f} h), the rigid jobs' "
            f"average wait {sum(r[2] for r in base) / len(half) / 60:.1f} min;"
        )
        for (label, _, _), row in zip(rows[1:], runs[1:], strict=True):
            cells = []
            for name, mines, refs in (
                ("avg", [r[0] for r in row], [r[0] for r in base]),
                ("p99", [r[1] for r in row], [r[1] for r in base]),
            ):
                ratios = [mine / ref - 1 for mine, ref in zip(mines, refs, strict=True)]
                per = " ".join(f"{100 * ratio:+.0f}" for ratio in ratios)
                mean = sum(mines) / sum(refs) - 1
                cells.append(
                    f"{name} {100 * mean:+.1f}% ({sum(1 for r in ratios if r > 0.005)} of {len(half)} worse: {per})"
                )
            delays = [mine[2] - ref[2] for mine, ref in zip(row, base, strict=True)]
            over = sum(1 for delay in delays if delay > GRACE_TIME_S)
            per = " ".join(f"{delay / 60:+.0f}" for delay in delays)
            cells.append(f"pooled p99 {100 * (pooled_p99([r[3] for r in row]) / pooled - 1):+.1f}%")
            lines.append(
                f"{label}: {cells[0]}, {cells[1]}, {cells[2]}; rigid jobs' added wait "
                f"{sum(delays) / len(half) / 60:+.1f} min (per workload {per}; above GraceTime {GRACE_TIME_S:g} s on "
                f"{over} of {len(half)});"
            )
    return lines


#: The default section's rows run on the Philly families (each Philly run takes minutes).
PHILLY_ROWS = (
    "slurm (baseline)",
    "daemon as shipped (admission, holds by the jobs' owners)",
    "plain daemon",
    "+ admission at request",
    "+ admission + simulator-only rules (what-if)",
    "+ admission + LAS order",
)

#: Jobs of philly.csv in the rigid family's run.
PHILLY_RIGID = 2000

#: Jobs of philly.csv in the half-elastic family's run (fewer: the ``slurm`` policy's backfill profile makes long
#: overloaded traces slow, and this family runs four times).
PHILLY_ELASTIC = 1000

#: Nodes of 8 GPUs for that run: its jobs keep about 230 GPUs busy on average (112,000 GPU-hours over 492 hours of
#: submissions), so 256 GPUs make it queue (on 512 the rigid jobs wait half a minute on average).
PHILLY_ELASTIC_NODES = 32

#: The goodput study's rows: label, policy, share of adaptive jobs, share of elastic jobs (runtime resize setting).
GOODPUT_ROWS: tuple[tuple[str, str, float, float], ...] = (
    ("slurm (baseline)", "slurm", 0.0, 0.0),
    ("tiresias", "tiresias", 0.0, 0.0),
    ("goodput, fixed batches", "goodput", 0.0, 1.0),
    ("goodput, half the batches adaptive", "goodput", 0.5, 1.0),
    ("goodput, adaptive batches", "goodput", 1.0, 1.0),
)


def _artifact_figures(load: str, files: Sequence[Path]) -> tuple[list[float], list[float], list[float]]:
    """The artifact's Pollux per workload: average JCT, p99 JCT and makespan (s), from its per-job JCTs."""
    jcts = _reference("pollux", load)["jcts"]
    assert isinstance(jcts, dict)
    avgs, p99s, spans = [], [], []
    for path in files:
        per_job = {str(name): float(value) for name, value in jcts[path.stem].items()}
        submits = {job.name: job.submit_time for job in load_pollux_workload(path)}
        values = sorted(per_job.values())
        avgs.append(sum(values) / len(values))
        p99s.append(percentile(values, 0.99))
        spans.append(max(submits[name] + jct for name, jct in per_job.items()) - min(submits.values()))
    return avgs, p99s, spans


def goodput_study(processes: int | None) -> str:
    """Markdown: the goodput policy beside Pollux's artifact result, Tiresias and the ``slurm`` baseline, per load.

    Every row runs the runtime's resize setting (``RUNTIME_RESIZE_COST_S`` per resize, ``RUNTIME_GROW_LAG_S`` lag,
    30 s per start or resume); the artifact's Pollux paid 30 s for every reallocation. Means over the 8 workloads
    of a load, with the range over workloads.
    """
    lines = [
        "| load | row | mean avg JCT h [min..max] | vs Pollux (artifact) | p99 JCT h | makespan h | resizes / wl |",
        "|---|---|---|---|---|---|---|",
    ]
    for load in LOADS:
        files = _workloads(load)
        specs = [
            RunSpec(policy, path, SimConfig(), elastic_fraction=elastic, adaptive_fraction=adaptive)
            for _, policy, adaptive, elastic in GOODPUT_ROWS
            for path in files
        ]
        outcomes = run_many(specs, processes)
        avgs, p99s, spans = _artifact_figures(load, files)
        pollux = sum(avgs) / len(avgs)
        rows = [("Pollux (artifact, 30 s per reallocation)", avgs, p99s, spans, math.nan)]
        for index, (label, *_rest) in enumerate(GOODPUT_ROWS):
            runs = outcomes[index * len(files) : (index + 1) * len(files)]
            rows.append(
                (
                    label,
                    [run.summary["avg_jct_s"] for run in runs],
                    [run.summary["p99_jct_s"] for run in runs],
                    [run.summary["makespan_s"] for run in runs],
                    sum(run.summary["resizes"] for run in runs) / len(runs),
                )
            )
        for label, row_avgs, row_p99, row_span, resizes in rows:
            mean = sum(row_avgs) / len(row_avgs)
            lines.append(
                f"| {load}x | {label} | {mean / 3600:.3f} [{min(row_avgs) / 3600:.3f}..{max(row_avgs) / 3600:.3f}] | "
                f"{100 * (mean / pollux - 1):+.1f}% | {sum(row_p99) / len(row_p99) / 3600:.2f} | "
                f"{sum(row_span) / len(row_span) / 3600:.2f} | {'-' if math.isnan(resizes) else f'{resizes:.0f}'} |"
            )
    return "\n".join(lines) + "\n\n" + goodput_ablation(processes)


#: One setting changed at a time from the goodput policy's defaults (1.0x, adaptive batches): label, knobs, config.
GOODPUT_ABLATION: tuple[tuple[str, tuple[tuple[str, object], ...], SimConfig], ...] = (
    ("defaults", (), SimConfig()),
    ("Pollux's fairness exponent (fairness=-1)", (("fairness", -1.0),), SimConfig()),
    ("no LAS weight (service_weight=0)", (("service_weight", 0.0),), SimConfig()),
    ("packed placements with moves, a simulator-only what-if (pack=true)", (("pack", True),), SimConfig()),
    ("no look-ahead over dips (lookahead=1)", (("lookahead", 1),), SimConfig()),
    (
        "the artifact's stop-resume (30 s per resize, no lag)",
        (),
        SimConfig(resize_cost=ARTIFACT_RESTART_COST_S, grow_lag=0.0),
    ),
)


def goodput_ablation(processes: int | None) -> str:
    """Markdown: the goodput policy at 1.0x with adaptive batches, one default changed at a time."""
    files = _workloads("1.0")
    specs = [
        RunSpec("goodput", path, config, knobs=knobs, adaptive_fraction=1.0)
        for _, knobs, config in GOODPUT_ABLATION
        for path in files
    ]
    outcomes = run_many(specs, processes)
    pollux = sum(_artifact_figures("1.0", files)[0]) / len(files)
    lines = ["| 1.0x, adaptive batches | mean avg JCT h | vs Pollux (artifact) | p99 JCT h |", "|---|---|---|---|"]
    for index, (label, _, _) in enumerate(GOODPUT_ABLATION):
        runs = outcomes[index * len(files) : (index + 1) * len(files)]
        mean = _mean_jct(runs)
        p99 = sum(run.summary["p99_jct_s"] for run in runs) / len(runs)
        lines.append(f"| {label} | {mean / 3600:.3f} | {100 * (mean / pollux - 1):+.1f}% | {p99 / 3600:.2f} |")
    return "\n".join(lines)


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def speed(processes: int | None, philly: bool) -> str:
    """Markdown: wall-clock and CPU seconds of the speed targets on this machine, and decision times."""
    files = _workloads("1.0")
    specs = [RunSpec(policy, path) for policy in policy_names() for path in files]
    started, cpu = time.perf_counter(), _cpu_seconds()
    run_many(specs, processes)
    batch, batch_cpu = time.perf_counter() - started, _cpu_seconds() - cpu
    lines = [
        "| run | wall time | CPU time |",
        "|---|---|---|",
        f"| all {len(files)} workloads x {len(policy_names())} policies at 1.0x ({len(specs)} runs) | {batch:.1f} s "
        f"| {batch_cpu:.1f} s |",
    ]
    big = synthetic_snapshot(1000, 8, 2000)
    for name, seconds in decision_times(big).items():
        role = " (daemon role, start_pending=False)" if name == "elastic-backfill" else ""
        lines.append(
            f"| one decision of {name}{role}, 1,000 nodes x 8 GPUs, 2,000 jobs (median of 5) "
            f"| {1000 * seconds:.1f} ms | |"
        )
    if philly:
        trace = data_dir() / "pollux" / "traces" / "philly.csv"
        spec = RunSpec("fifo", trace, SimConfig(nodes=128, gpus_per_node=8))
        started, cpu = time.perf_counter(), _cpu_seconds()
        (outcome,) = run_many([spec], 1)
        elapsed, used = time.perf_counter() - started, _cpu_seconds() - cpu
        jobs = int(outcome.summary["jobs"])
        lines.append(f"| FIFO over philly.csv ({jobs} jobs, 128 x 8 GPUs) | {elapsed:.1f} s | {used:.1f} s |")
    load = os.getloadavg()[0]
    lines.append(f"\nLoad average when measured: {load:.1f} on {os.cpu_count()} CPUs.")
    return "\n".join(lines)


def synthetic_snapshot(nodes: int, gpus_per_node: int, jobs: int, seed: int = 1) -> Snapshot:
    """A large random snapshot for timing decisions: 60% of the jobs running where they fit, elastic ranges.

    Args:
        nodes: node count.
        gpus_per_node: GPUs per node.
        jobs: job count.
        seed: random seed (the same seed gives the same snapshot).

    Returns:
        The snapshot.
    """
    rng = random.Random(seed)
    names = [f"node{i:04d}" for i in range(nodes)]
    free = dict.fromkeys(names, gpus_per_node)
    infos = []
    for index in range(jobs):
        low = rng.randint(1, 4)
        high = low + rng.randint(0, 8)
        placement: dict[str, int] = {}
        if rng.random() < 0.6:
            need = rng.randint(low, high)
            for name in rng.sample(names, min(20, nodes)):
                take = min(free[name], need)
                if take:
                    placement[name] = take
                    need -= take
                if need == 0:
                    break
            if need:
                placement = {}
            for name, count in placement.items():
                free[name] -= count
        infos.append(
            JobInfo(
                job_id=str(index),
                state=JobPhase.RUNNING if placement else JobPhase.PENDING,
                submit_time=float(index),
                requested_workers=rng.randint(low, high),
                min_workers=low,
                max_workers=high,
                workers=sum(placement.values()),
                placement=placement,
                throughput={size: size**0.8 for size in range(low, high + 1)},
                remaining_work=rng.uniform(60, 1e5),
                attained_service=rng.uniform(0, 1e5),
            )
        )
    node_infos = tuple(NodeInfo(name, gpus_per_node, free[name]) for name in names)
    return Snapshot(node_infos, tuple(infos))


def decision_times(snapshot: Snapshot, repeats: int = 5) -> dict[str, float]:
    """Median seconds per decision of every policy on a snapshot (elastic backfill in its daemon role)."""
    times: dict[str, float] = {}
    for name in policy_names():
        policy = make_policy(name, start_pending=False) if name == "elastic-backfill" else make_policy(name)
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            policy.decide(snapshot, 1e5)
            samples.append(time.perf_counter() - started)
        times[name] = statistics.median(samples)
    return times


def main(argv: Sequence[str] | None = None) -> int:
    """Print the document's tables as Markdown; write the plot.

    Args:
        argv: ``[--plot PNG] [--processes N] [--no-philly] [--philly-only]
            [--only fidelity|claims|default|goodput|speed]``.

    Returns:
        0.
    """
    parser = argparse.ArgumentParser(prog="sim-report", description=__doc__.splitlines()[0])
    parser.add_argument("--plot", type=Path, default=Path("docs/img/sim-jobload-1.0.png"))
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument(
        "--no-philly", action="store_true", help="skip the Philly speed run and the default section's Philly families"
    )
    parser.add_argument(
        "--philly-only", action="store_true", help="the default section's Philly families only (no Pollux family)"
    )
    parser.add_argument("--only", choices=("fidelity", "claims", "default", "goodput", "speed"), default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the tables with their conditions here")
    args = parser.parse_args(argv)
    recording = Recording("sim-study" if args.only is None else f"sim-{args.only}", vars(args))
    sections: dict[str, Callable[[], str]] = {
        "fidelity": lambda: fidelity(args.processes),
        "claims": lambda: claims(args.processes, args.plot),
        "default": lambda: default_policy(args.processes, not args.no_philly, not args.philly_only),
        "goodput": lambda: goodput_study(args.processes),
        "speed": lambda: speed(args.processes, not args.no_philly),
    }
    tables: dict[str, str] = {}
    for name, section in sections.items():
        if args.only in (None, name):
            tables[name] = section()
            print(f"## {name}\n")
            print(tables[name])
            print()
            sys.stdout.flush()
    if args.json is not None:
        figures = {"sections": list(tables), "loads": list(LOADS), "pollux_mean_h": POLLUX_MEAN_H}
        recording.write(args.json, figures, tables=tables, notes=[STUDY_NOTE])
    return 0


if __name__ == "__main__":
    sys.exit(main())
