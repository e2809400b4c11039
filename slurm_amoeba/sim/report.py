"""Reports of simulation batches: the JSON document, text tables, the artifact's reference numbers and plots.

JSON: ``{policy: {workload: {"avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "avg_queue_s", "gpu_util",
"resizes", ...}}}``. Plots (matplotlib, Agg backend, no display needed): the CDF of job completion times per
policy over all workloads, and GPU utilization over time per policy on one workload.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm_amoeba.sim.data import SimError
from slurm_amoeba.sim.runner import RunOutcome

#: The artifact's policies whose results ``results-jobload/<policy>-<load>/summary.json`` holds.
REFERENCE_POLICIES = ("tiresias", "pollux", "optimus")

_TABLE_KEYS = (
    ("avg_jct_s", "avg JCT h", 3600.0),
    ("p50_jct_s", "p50 JCT h", 3600.0),
    ("p99_jct_s", "p99 JCT h", 3600.0),
    ("makespan_s", "makespan h", 3600.0),
    ("avg_queue_s", "avg queue h", 3600.0),
    ("gpu_util", "GPU util", 1.0),
    ("resizes", "resizes", 1.0),
)


def results_document(outcomes: Sequence[RunOutcome]) -> dict[str, dict[str, dict[str, float]]]:
    """The JSON document: policy -> workload -> figures."""
    document: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for outcome in outcomes:
        document[outcome.policy][outcome.workload] = outcome.summary
    return dict(document)


def write_json(outcomes: Sequence[RunOutcome], path: Path) -> None:
    """Write :func:`results_document` to ``path`` (NaN, for no finished job, becomes null)."""
    document = results_document(outcomes)
    cleaned = {
        policy: {
            workload: {
                key: (None if isinstance(value, float) and math.isnan(value) else value)
                for key, value in figures.items()
            }
            for workload, figures in by_workload.items()
        }
        for policy, by_workload in document.items()
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cleaned, indent=2, sort_keys=True) + "\n")


def infer_load(workloads_dir: Path) -> str:
    """The job load of a Pollux workload folder: ``workloads`` -> ``"1.0"``, ``workloads-1.5`` -> ``"1.5"``."""
    match = re.search(r"-(\d+(?:\.\d+)?)$", workloads_dir.name)
    return match.group(1) if match else "1.0"


def load_reference(results_dir: Path, load: str) -> dict[str, dict[str, float]]:
    """The artifact's average JCT per workload, for each of its policies at a load.

    Args:
        results_dir: ``results-jobload`` (holding ``<policy>-<load>/summary.json``).
        load: ``"0.5"``, ``"1.0"``, ``"1.5"`` or ``"2.0"``.

    Returns:
        ``"<policy> (artifact)"`` -> workload -> average JCT in seconds.

    Raises:
        SimError: none of the artifact's summaries exists for that load, or one is not the expected JSON.
    """
    reference: dict[str, dict[str, float]] = {}
    for policy in REFERENCE_POLICIES:
        path = results_dir / f"{policy}-{load}" / "summary.json"
        if not path.is_file():
            continue
        try:
            avgs = json.loads(path.read_text())["avgs"]
            reference[f"{policy} (artifact)"] = {str(key): float(value) for key, value in avgs.items()}
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise SimError(f"{path} is not a summary with an 'avgs' table of average JCTs per workload") from None
    if not reference:
        raise SimError(
            f"no artifact summary for load {load} under {results_dir}; expected e.g. "
            f"{results_dir / ('tiresias-' + load) / 'summary.json'}"
        )
    return reference


def _mean(values: Sequence[float]) -> float:
    finite = [value for value in values if not math.isnan(value)]
    return sum(finite) / len(finite) if finite else math.nan


def summary_table(outcomes: Sequence[RunOutcome]) -> str:
    """One row per policy: each figure averaged over the workloads."""
    by_policy: dict[str, list[RunOutcome]] = defaultdict(list)
    for outcome in outcomes:
        by_policy[outcome.policy].append(outcome)
    header = ["policy", *[label for _, label, _ in _TABLE_KEYS]]
    rows = [header]
    for policy, runs in by_policy.items():
        row = [policy]
        for key, _, scale in _TABLE_KEYS:
            value = _mean([run.summary[key] for run in runs]) / scale
            row.append(f"{value:.0f}" if key == "resizes" else f"{value:.3f}")
        rows.append(row)
    return format_table(rows)


def workload_table(outcomes: Sequence[RunOutcome], reference: Mapping[str, Mapping[str, float]] | None = None) -> str:
    """Average JCT (hours) per workload and policy, with the artifact's numbers beside them when given."""
    policies = list(dict.fromkeys(outcome.policy for outcome in outcomes))
    workloads = sorted({outcome.workload for outcome in outcomes}, key=_natural)
    values = {(outcome.policy, outcome.workload): outcome.summary["avg_jct_s"] for outcome in outcomes}
    ref = dict(reference or {})
    header = ["workload", *policies, *ref]
    rows = [header]
    for workload in workloads:
        row = [workload]
        row += [_hours(values.get((policy, workload), math.nan)) for policy in policies]
        row += [_hours(ref[name].get(workload, math.nan)) for name in ref]
        rows.append(row)
    mean_row = ["mean"]
    mean_row += [_hours(_mean([values.get((p, w), math.nan) for w in workloads])) for p in policies]
    mean_row += [_hours(_mean([ref[name].get(w, math.nan) for w in workloads])) for name in ref]
    rows.append(mean_row)
    return format_table(rows)


def _hours(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds / 3600:.3f}"


def _natural(text: str) -> list[object]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def format_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows of cells as an aligned text table, a rule under the header (first column left, others right)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for index, row in enumerate(rows):
        cells = [cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def binned_utilization(
    usage: Sequence[tuple[float, int]], total_gpus: int, bin_s: float
) -> tuple[list[float], list[float]]:
    """Mean fraction of GPUs held in consecutive bins of ``bin_s`` seconds, from a (time, GPUs held) step function.

    Args:
        usage: (time, GPUs held from then on), in time order; the last entry holds until its own time.
        total_gpus: GPUs in the cluster.
        bin_s: bin width in seconds.

    Returns:
        (bin start times, mean utilization per bin).
    """
    if not usage:
        return [], []
    start, end = usage[0][0], usage[-1][0]
    count = max(1, math.ceil((end - start) / bin_s))
    held = [0.0] * count
    for (t0, used), (t1, _) in itertools.pairwise(usage):
        while t0 < t1:
            index = min(int((t0 - start) // bin_s), count - 1)
            edge = min(t1, start + (index + 1) * bin_s)
            held[index] += used * (edge - t0)
            if edge <= t0:
                break
            t0 = edge
    return [start + i * bin_s for i in range(count)], [value / (bin_s * total_gpus) for value in held]


def plot(
    outcomes: Sequence[RunOutcome],
    path: Path,
    title: str = "",
    timeline_workload: str | None = None,
    bin_s: float = 900.0,
) -> None:
    """Write a PNG: the JCT CDF per policy, and GPU utilization over time on one workload.

    Args:
        outcomes: the runs.
        path: the PNG to write.
        title: a title over both panels.
        timeline_workload: the workload whose utilization is drawn (the first one by name when ``None``).
        bin_s: width of the bins utilization is averaged over, in seconds.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(outcome.policy for outcome in outcomes))
    workloads = sorted({outcome.workload for outcome in outcomes}, key=_natural)
    chosen = timeline_workload or (workloads[0] if workloads else "")
    figure, (cdf_ax, util_ax) = plt.subplots(1, 2, figsize=(13, 4.8))
    for policy in policies:
        jcts = sorted(jct / 3600 for outcome in outcomes if outcome.policy == policy for jct in outcome.jcts)
        if jcts:
            fractions = [(i + 1) / len(jcts) for i in range(len(jcts))]
            cdf_ax.step(jcts, fractions, where="post", label=policy)
        for outcome in outcomes:
            if outcome.policy == policy and outcome.workload == chosen and outcome.usage:
                starts, means = binned_utilization(outcome.usage, outcome.total_gpus, bin_s)
                util_ax.plot([t / 3600 for t in starts], means, label=policy, linewidth=1.2)
    cdf_ax.set_xscale("log")
    cdf_ax.set_xlabel("job completion time (hours, log scale)")
    cdf_ax.set_ylabel("fraction of jobs")
    cdf_ax.set_title(f"JCT CDF over {len(workloads)} workload(s)")
    cdf_ax.grid(True, alpha=0.3)
    cdf_ax.legend(fontsize=8)
    util_ax.set_xlabel("time (hours)")
    util_ax.set_ylabel("GPUs held / GPUs")
    util_ax.set_ylim(0, 1.05)
    width = f"{bin_s / 60:.0f}-minute" if bin_s >= 60 else f"{bin_s:.0f}-second"
    util_ax.set_title(f"GPU utilization over time ({chosen}, {width} means)")
    util_ax.grid(True, alpha=0.3)
    util_ax.legend(fontsize=8)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
