"""GPU sharing in the simulator: SJF-BSBF and AntMan-style opportunistic sharing against the daemon's default.

``scripts/bench-share-sim`` runs :func:`main`. Every run replays one of the shared Pollux workloads
(``slurm_amoeba/sim/datafiles/pollux``, 8 per load) on 16 x 4 GPUs with the runtime's resize costs, Gavel's measured
co-location throughputs as the pairs' slowdowns (``sim/interference.py``) and the simulator's memory model of a
16 GB GPU (``sim/engine.py``'s ``SIM_GPU_MEMORY_GIB``). The sharing policies are the live ones
(``policy/sharing.py`` on ``policy/pairing.py``), the code the daemon runs; the rows:

- ``amoebad, elastic``: the daemon's default policy (``amoebad``: Slurm's baseline with the daemon on top), every
  job elastic; ``amoebad, rigid``: the same with every job at its requested size, the jobs the sharing rows get.
- ``sjf, no sharing``: SJF-BSBF's non-preemptive shortest-first admission without a co-location table, so that it
  never pairs: what the sharing itself adds is the difference to the next two rows.
- ``sjf-bsbf``: SJF-BSBF (Ye et al., arXiv 2407.13088), which reports -27..-33 % JCT against schedulers without
  sharing; ``antman``: the opportunistic mode (hosts keep 95 % of their speed); ``antman, bound 0.2``: the same with
  hosts guaranteed 80 %.

The table gives, per load, each row's mean of the workloads' average JCT, its gain against both ``amoebad`` rows and
against ``sjf, no sharing``, and how many jobs shared a GPU. Deterministic: the same figures on any machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.record import Recording
from slurm_amoeba.policy import Action, Policy, Share, Snapshot, make_policy
from slurm_amoeba.sim.adaptive import adaptive_models
from slurm_amoeba.sim.application import load_applications
from slurm_amoeba.sim.data import data_dir
from slurm_amoeba.sim.engine import SIM_GPU_MEMORY_GIB, SimConfig, Simulator, trace_models
from slurm_amoeba.sim.interference import load_colocation
from slurm_amoeba.sim.runner import RunSpec, load_jobs

#: The loads of the shared Pollux workloads (each a family of 8 workloads).
LOADS = ("0.5", "1.0", "1.5", "2.0")

#: SJF-BSBF's reported gain in average JCT over schedulers without sharing (arXiv 2407.13088), as a range.
PAPER_GAIN = (-0.33, -0.27)


@dataclasses.dataclass(frozen=True)
class Row:
    """One policy of the table.

    Attributes:
        label: the row's name.
        build: builds a fresh policy.
        elastic_fraction: share of the jobs given a worker range.
        colocation: whether the policy sees Gavel's co-location table (without it a sharing policy never pairs).
    """

    label: str
    build: Callable[[], Policy]
    elastic_fraction: float = 0.0
    colocation: bool = True


#: The rows, in the table's order; the first two are the baselines.
ROWS: tuple[Row, ...] = (
    Row("amoebad, elastic", lambda: make_policy("amoebad"), elastic_fraction=1.0),
    Row("amoebad, rigid", lambda: make_policy("amoebad")),
    Row("sjf, no sharing", lambda: make_policy("sjf-bsbf"), colocation=False),
    Row("sjf-bsbf", lambda: make_policy("sjf-bsbf")),
    Row("antman", lambda: make_policy("antman")),
    Row("antman, bound 0.2", lambda: make_policy("antman", pace_bound=0.2)),
)

#: The rows every row is compared with: the daemon's default on the same jobs, on elastic jobs, and the control
#: without pairing.
BASES = ("amoebad, rigid", "amoebad, elastic", "sjf, no sharing")


class CountingShares:
    """A policy that counts the shares its inner policy decides (the jobs placed beside another), and their
    sub-batches' share of the sharer's own micro-batch."""

    def __init__(self, inner: Policy) -> None:
        """Wrap ``inner``."""
        self.inner = inner
        self.shared: set[str] = set()
        self.smaller = 0

    @property
    def name(self) -> str:
        """The inner policy's name."""
        return self.inner.name

    @property
    def decides_on_events_only(self) -> bool:
        """The inner policy's."""
        return self.inner.decides_on_events_only

    @property
    def emits(self) -> frozenset[type[Action]]:
        """The inner policy's."""
        return self.inner.emits

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        """The inner policy's answer, its shares counted."""
        actions = self.inner.decide(snapshot, now)
        for action in actions:
            if isinstance(action, Share) and action.job_id not in self.shared:
                self.shared.add(action.job_id)
                own = max(snapshot.job(action.job_id).micro_batches, default=None)
                if action.sub_batch is not None and own is not None and action.sub_batch < own:
                    self.smaller += 1
        return actions


def workloads(load: str) -> list[Path]:
    """The 8 shared Pollux workloads of a load, in number order."""
    folder = data_dir() / "pollux" / ("workloads" if load == "1.0" else f"workloads-{load}")
    return sorted(folder.glob("workload-*.csv"), key=lambda path: int(path.stem.split("-")[1]))


def run(item: tuple[int, str, str]) -> dict[str, float | str]:
    """One row on one workload: its average JCT, jobs, jobs that shared, and shares with a smaller sub-batch.

    Args:
        item: (index of the row in :data:`ROWS`, load, workload path).
    """
    index, load, path = item
    row = ROWS[index]
    config = SimConfig()
    jobs = load_jobs(RunSpec(row.label, Path(path), config, elastic_fraction=row.elastic_fraction))
    apps = load_applications()
    models = trace_models(apps, config.gpus_per_node)
    if any(job.adaptive for job in jobs):
        models = adaptive_models(apps, config.gpus_per_node, models)
    policy = CountingShares(row.build())
    colocation = load_colocation() if row.colocation else {}
    summary = Simulator(jobs, policy, config, models, colocation).run().summary()
    return {
        "row": row.label,
        "load": load,
        "workload": Path(path).stem,
        "avg_jct_s": summary["avg_jct_s"],
        "jobs": summary["jobs"],
        "shared_jobs": float(len(policy.shared)),
        "smaller_sub_batch": float(policy.smaller),
    }


def table(results: Sequence[dict[str, float | str]], loads: Sequence[str]) -> tuple[str, dict[str, object]]:
    """The Markdown table and the figures: per load and row, the mean average JCT, the gains against
    :data:`BASES` and the jobs that shared a GPU."""
    lines = [
        "| load | policy | mean avg JCT | " + " | ".join(f"vs {base}" for base in BASES) + " | jobs shared |",
        "|---|---|---|" + "---|" * len(BASES) + "---|",
    ]
    figures: dict[str, object] = {}
    for load in loads:
        mean: dict[str, float] = {}
        shared: dict[str, float] = {}
        for row in ROWS:
            mine = [result for result in results if result["row"] == row.label and result["load"] == load]
            mean[row.label] = sum(float(result["avg_jct_s"]) for result in mine) / len(mine)
            shared[row.label] = sum(float(result["shared_jobs"]) for result in mine)
        gains = {row.label: {base: mean[row.label] / mean[base] - 1.0 for base in BASES} for row in ROWS}
        figures[load] = {"mean_avg_jct_h": {k: v / 3600 for k, v in mean.items()}, "gain": gains, "shared": shared}
        for row in ROWS:
            cells = [f"{mean[row.label] / 3600:.3f} h"]
            cells += ["" if base == row.label else f"{gains[row.label][base] * 100:+.1f}%" for base in BASES]
            cells.append(f"{shared[row.label]:.0f}")
            lines.append(f"| {load}x | {row.label} | " + " | ".join(cells) + " |")
    paper = f"{PAPER_GAIN[0] * 100:+.0f}..{PAPER_GAIN[1] * 100:+.0f}%"
    lines.append(f"| paper | SJF-BSBF against schedulers without sharing | | {paper} | | | |")
    return "\n".join(lines), figures


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rows on the workloads, print the table, write the JSON.

    Args:
        argv: ``[--loads 0.5,1.0,1.5,2.0] [--short] [--processes N] [--json PATH]``.

    Returns:
        0.
    """
    parser = argparse.ArgumentParser(prog="bench-share-sim", description=__doc__.splitlines()[0])
    parser.add_argument("--loads", default=",".join(LOADS), help="loads of the Pollux workloads, comma-separated")
    parser.add_argument("--short", action="store_true", help="the first workload of each load only")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("share-sim.json"))
    args = parser.parse_args(argv)
    loads = [load for load in args.loads.split(",") if load]
    unknown = [load for load in loads if load not in LOADS]
    if unknown:
        parser.error(f"unknown loads {unknown}; the Pollux workloads come at {', '.join(LOADS)}")
    recording = Recording("sim-share", vars(args))
    items = [
        (index, load, str(path))
        for load in loads
        for path in workloads(load)[: 1 if args.short else None]
        for index in range(len(ROWS))
    ]
    if args.processes > 1:
        with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
            results = pool.map(run, items)
    else:
        results = [run(item) for item in items]
    markdown, figures = table(results, loads)
    print(markdown)
    notes = [
        "Mean over the workloads of each load of their average JCT; 16 x 4 GPUs, the runtime's resize costs, "
        f"Gavel's V100 co-location throughputs, a {SIM_GPU_MEMORY_GIB:g} GiB GPU whose memory a job fills in "
        "proportion to its micro-batch (its largest measured local batch fills it). The sharing rows run the "
        "policies the daemon runs; the paper's gain is against schedulers without sharing on its own traces."
    ]
    recording.write(args.json, {"runs": results, "by_load": figures}, tables={"sharing": markdown}, notes=notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
