"""Render ``docs/results.md`` from the result documents in ``docs/results/`` (``scripts/render-results``).

Every figure the README and the manuals quote is a result here: one section per benchmark, anchored by its name
(``docs/results.md#grow``), with the command that produced it, the machine, the load average before and after, the
parameters and the figures with their spread. The benchmarks write the documents (:mod:`benchmarks.record`); this
module only reads them. A benchmark whose document is missing is shown as *not measured in this build*, with the
command that measures it; where an earlier run's figures are on record, they are shown beside it, marked as such
and with the conditions stated when they were measured, never as this build's.

``--check`` renders into memory and fails when ``docs/results.md`` differs (the test command runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.record import SCHEMA

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
PAGE = REPO / "docs" / "results.md"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One benchmark's section of the results page.

    Attributes:
        name: the result's name: its file (``docs/results/<name>.json``) and its anchor (``results.md#<name>``).
        title: what the result is, in a few words.
        what: what it measures and under which conditions (sentences).
        command: the command that writes the document, from the repository root.
        needs: what the command needs besides the package (``nothing``, the local Slurm cluster, munged).
        recorded: an earlier run's figures with the conditions stated then, shown while the document is missing.
    """

    name: str
    title: str
    what: str
    command: str
    needs: str = "nothing but the package (no Slurm)"
    recorded: str = ""


CLUSTER = "the local Slurm cluster (`scripts/slurm-cluster up`, root)"
PRIVATE = "a private Slurm cluster instance, started by the script (root); about 12 minutes"

#: Every result the docs may cite, in the page's order.
CATALOG: tuple[Entry, ...] = (
    Entry(
        "sim-fidelity",
        "Simulator fidelity: our Tiresias against the Pollux artifact's",
        "Tiresias in the artifact's setting (30 s per reallocation, requested sizes, 16 x 4 GPUs, 60 s interval) "
        "against the artifact's own Tiresias results, per workload, at the four loads (average JCT, hours).",
        "scripts/sim-report --only fidelity --json docs/results/sim-fidelity.json",
    ),
    Entry(
        "sim-claims",
        "Every policy against the `slurm` baseline, Tiresias and Pollux (1.0x)",
        "Each policy on the 8 shared Pollux workloads at 1.0x load, once with the artifact's stop-resume cost "
        "(30 s per resize) and once with the runtime's measured resize (0.01 s pause, 6.7 s grow lag).",
        "scripts/sim-report --only claims --json docs/results/sim-claims.json",
    ),
    Entry(
        "sim-default",
        "The daemon's default against the `slurm` baseline",
        "The `slurm` baseline (multifactor priority, backfill with reservations, preemption with GraceTime) alone, "
        "and with the daemon on top (the `amoebad` policy): the daemon as shipped (`configs/amoebad.yaml`, read as "
        "`amoeba-sim --daemon-config` reads it: admission with the holds made by the jobs' owners, no Slurm rights, "
        "every satellite Slurm's to take as live), the plain daemon (admission off), and admission as the simulator "
        "modelled it before (Slurm takes only the loans above requests, not built live), per load, every job elastic "
        "and half of them elastic. The Philly families (`--philly-only`, about half an hour) are a separate run.",
        "scripts/sim-report --only default --no-philly --json docs/results/sim-default.json",
    ),
    Entry(
        "sim-goodput",
        "The `goodput` policy with adaptive batches beside Pollux",
        "The goodput policy (exact goodput tables, the runtime's 6.7 s resize) beside the Pollux artifact's own "
        "results (a goodput model fitted online, 30 s per reallocation), Tiresias and the `slurm` baseline, at "
        "every load; then one default changed at a time at 1.0x, including the artifact's 30 s per resize.",
        "scripts/sim-report --only goodput --json docs/results/sim-goodput.json",
    ),
    Entry(
        "sim-share",
        "GPU sharing: SJF-BSBF and AntMan's opportunistic mode against the daemon's default",
        "The live pairing code (`policy/pairing.py`: the benefit rule, the sub-batch searched in the memory a host "
        "leaves, AntMan's pacing) on the 8 shared Pollux workloads at every load, 16 x 4 GPUs, Gavel's co-location "
        "throughputs as the pairs' slowdowns: mean average JCT of `sjf-bsbf` and `antman` against `amoebad` (the "
        "daemon's default, without sharing; jobs rigid as the sharers', and every job elastic) and against the "
        "same shortest-first admission that never pairs, beside SJF-BSBF's published gain.",
        "scripts/bench-share-sim --json docs/results/sim-share.json",
    ),
    Entry(
        "sim-speed",
        "Simulator speed and one decision of each policy",
        "Wall and CPU time of all workloads x all policies at 1.0x, FIFO over the whole philly.csv, and one "
        "decision of each policy on a synthetic snapshot of 1,000 nodes x 8 GPUs and 2,000 jobs.",
        "scripts/sim-report --only speed --json docs/results/sim-speed.json",
    ),
    Entry(
        "philly-speed",
        "The whole philly.csv on 64 x 8 GPUs",
        "The simulator's engine time on prefixes of philly.csv and on the whole trace (FIFO, Tiresias).",
        "scripts/bench-sim --json docs/results/philly-speed.json",
    ),
    Entry(
        "goodput-decision",
        "Decision time of the `goodput` policy",
        "One decision of the goodput policy on 1,000 nodes x 8 GPUs and 2,000 jobs, interleaved with e-tiresias on "
        "the same snapshot (wall and CPU time, median with min and max).",
        "scripts/bench-goodput --out docs/results/goodput-decision.json",
    ),
    Entry(
        "policy-decision",
        "Decision time of the daemon's policy",
        "Snapshot, decision and invariant check of the daemon's default policy on a synthetic 1,000-node cluster.",
        "scripts/bench-policy --skip-loop --out docs/results/policy-decision.json",
    ),
    Entry(
        "scaling",
        "How the daemon's round grows with the cluster",
        "Reading `squeue --json` (parsed whole, and the daemon's incremental read that decodes only the jobs that "
        "changed), the service book, the snapshot (the first one built from nothing, then incremental) and every "
        "live policy's decision on synthetic clusters of 1,000, 10,000 and 50,000 nodes x 8 GPUs, twice as many jobs "
        "as nodes (5 % of them elastic with a registered agent), over successive rounds in which 0.5 % of the jobs "
        "change, the collector set as amoebad sets it: medians in wall-clock time and, beside them, in CPU time of "
        "the measuring thread (the figure a machine shared with other work inflates least), on this 2-core machine "
        "under the load stated on each row. A control beside them: one pass over every job and node record of a "
        "round (each read once and filed by its id), the least any round does, whose growth is what this machine's "
        "caches make of a linear algorithm. Then each CPU figure's growth from one size to the next beside n log n, "
        "and the snapshot's and each decision's growth over the control's beside log n: an algorithm that grows no "
        "faster than n log n stays at or under it. Plotted in docs/img/bench-scaling.png.",
        "scripts/bench-policy --scaling --rounds 3 --json docs/results/scaling.json --plot docs/img/bench-scaling.png",
        needs="nothing but the package (no Slurm); matplotlib for the plot",
    ),
    Entry(
        "policy-loop",
        "The daemon's loop under thousands of reporting agents",
        "The real daemon loop (`elastic-backfill`, a 5 s interval; with `--front`, its credential checks and reply "
        "signing in its front process) on a ZeroMQ socket over a synthetic Slurm, with every elastic job's agent "
        "simulated, signing its messages with munge and following the daemon's orders: run as root, the agents "
        "belong to many uids (`--agents-per-uid` each, one forked process per uid) and report every 5 s; the run "
        "raises "
        "`limits.agents_per_uid`, `limits.requests_per_s` and `limits.burst` where the load needs it and names "
        "what it raised. It measures the round time (median and worst), how late rounds started, the reports "
        "answered per second and their reply time, and `amoebactl status`'s reply time meanwhile; the simulated "
        "agents, munged and the daemon share this 2-core machine.",
        "scripts/bench-policy --nodes 10000 --jobs 20000 --agents 10000 --agents-per-uid 250 --front "
        "--out docs/results/policy-loop.json (as root)",
        needs="munged running (the local cluster's); root for the many uids",
    ),
    Entry(
        "grow",
        "Grow and shrink times of an elastic job",
        "An elastic job of 2 <-> 4 workers on the local cluster (`--workers-per-satellite 4 --satellites 1`: 2 <-> 6, "
        "four workers in one satellite): `resize()` to the generation with the new workers (Slurm's part: satellite "
        "submitted to running; the runtime's part: running to joined), and the shrink; beside them, measured in the "
        'same run, one `python -c "import torch"` (`import_torch_s`, the yardstick of the runtime\'s part), how the '
        "satellites started their workers (`start`: warm, forked by agent/warm.py; cold, an srun step, with `--cold`) "
        "and the warm start's imports before its fork (`warm_preload_s`).",
        "scripts/bench-grow --json docs/results/grow.json",
        needs=CLUSTER,
        recorded="Grow 6.7 s (Slurm 0.68 s, runtime 5.8 s, mostly starting Python and importing torch), shrink "
        "0.03 s; median of 3 rounds, 2 <-> 4 workers of 4 GPUs each, while other test jobs shared the 2 cores.",
    ),
    Entry(
        "backfill",
        "GPU utilization and regular jobs' waits without and with amoebad",
        "The same stream of regular jobs beside elastic jobs on the local cluster, without and with the daemon.",
        "scripts/bench-backfill --out docs/results/backfill.json",
        needs=CLUSTER,
        recorded="GPU utilization 0.652 without the daemon and 0.952 with it; regular jobs waited 2.0 s on average "
        "(3 s at most) with it against 0 s without, within the GraceTime of 10 s.",
    ),
    Entry(
        "runtime",
        "The runtime against plain DDP, stop-resume and torchrun",
        "One MLP of 1.06 M parameters, global batch 64, gloo on CPU: the steady step time against plain DDP, the "
        "pause of a running worker at a scale-out (1 -> 2) and a scale-in (2 -> 1), and the same resize by "
        "stop-resume and by torchrun's elastic restart.",
        "scripts/bench-runtime --json docs/results/runtime.json",
        needs="nothing but the package and torch (no Slurm); about 15 minutes on 2 cores",
        recorded="Scale-in 8.4 ms [7.0..9.7] beyond the worker's own step; scale-out 17.5 ms [15.3..20.7] in its "
        "first step and 23.6 ms [18.8..27.8] over three (medians [quartiles] over 80 switches, 1 <-> 2 workers, "
        "a 2-core machine with nothing else running, load 0.6-3.0); steady-state step time against plain DDP "
        "+0.04 % (95 % interval of the median -0.39..+0.51 %, 4752 block pairs, load 2.4); stop-resume 3.19 s and "
        "torchrun's restart 3.89 s against the runtime's 0.055 s at 1 -> 2.",
    ),
    Entry(
        "checkpoint",
        "What a background disk checkpoint costs the training steps",
        "The `bench-runtime` model with 2 workers, a commit every 30 steps and a checkpoint at every second "
        "commit; the 30-step blocks with a write against their neighbours in the same processes.",
        "scripts/bench-checkpoint --json docs/results/checkpoint.json",
        needs="nothing but the package and torch (no Slurm); about 5 minutes",
        recorded="Below the noise of a 30-step block: at most 0.06 s per checkpoint (worst of 3 repetitions), "
        "0.02 % at the default 300 s interval; the write itself 0.10 s in a background thread (8.5 MB, 2 shards, "
        "fsync); 2 cores shared with other test runs, load 7-8.",
    ),
    Entry(
        "plans",
        "The fastest plan that fits, at every size",
        "examples/tiny_lm.py's model (4 blocks of width 128, context 64, global batch 32) under `PlannedState`, "
        "with a per-worker memory budget that plain data parallelism fits only at 4 workers, resized 4 -> 2 -> 1 "
        "-> 4 with `amoeba-local` on CPU (gloo), against the same job at 4 workers throughout: the plan chosen per "
        "generation, predicted against measured peak memory per worker and step time, every sample once, the "
        "final parameters against the fixed-size run (docs/plans.md). The frontier is drawn in "
        "docs/img/plans-frontier.png.",
        "scripts/bench-plans --json docs/results/plans.json --png docs/img/plans-frontier.png",
        needs="nothing but the package and torch (no Slurm); a few minutes on 2 cores",
    ),
    Entry(
        "share",
        "Two jobs on one device: a guaranteed job and a paced, memory-capped sharer",
        "The CPU stand-in for a shared GPU: a guaranteed job (an MLP that idles as long as it computes each step, "
        "as for its input) and an opportunistic one, every worker pinned to the same core, with `amoeba-local`: "
        "each alone, then together, the sharer paced by the owner's step times and memory-capped, its cap lowered "
        "half-way (the owner grows back). The guaranteed job's throughput together over alone, the pair's summed "
        "normalised throughput, failures, every sample of both jobs once (docs/runtime.md section 13).",
        "scripts/bench-share --json docs/results/share.json",
        needs="nothing but the package and torch (no Slurm); about 10 minutes on 2 cores",
    ),
    Entry(
        "share-live",
        "Two jobs on one GPU of the live cluster, paired by amoebad",
        "Two opted-in elastic jobs on the local cluster's sharing partition under amoebad's `antman` policy (a site "
        "prior of 0.97): the host (one worker) alone, then the sharer (one worker of its own) placed by the policy "
        "with a second worker beside the host, then the host's owner growing it back. Fake GPUs stand in through "
        "cores (each worker pinned to its GPU's core); the host idles as long as it computes each step, the sharer "
        "3 x as long (their input pipelines). The host's "
        "throughput while shared over alone, the sharer's with its worker beside the host over its own alone, "
        "whether the daemon gave the place back because the sharer measurably trained slower, the memory cap it "
        "sent, every sample of both jobs once (docs/admin.md section 8e).",
        "scripts/bench-share --live --json docs/results/share-live.json",
        needs=CLUSTER + "; about 2 minutes",
    ),
    Entry(
        "plans-cuda",
        "The plan chosen on a GPU",
        "The `plans` benchmark's small model on one CUDA GPU (one NCCL worker, size 1, a budget of about 5 MB): "
        "the plan chosen, predicted against measured peak memory (torch's MemTracker) and step time, every sample "
        "once. With one GPU the resize itself is not exercised (NCCL runs one rank per GPU); the CPU run above is.",
        "scripts/device-check (its plans step: scripts/bench-plans --small --device cuda --sizes 1)",
        needs="a CUDA GPU",
    ),
    Entry(
        "replay-rigid",
        "The `slurm` baseline against the real cluster",
        "A scaled-down workload of sleep jobs submitted to the local 4 x 4-GPU cluster at its arrival times, then "
        "replayed through the simulator's `slurm` policy with the cluster's slurm.conf: mean JCT error and the "
        "share of job pairs started in the same order.",
        "scripts/bench-sim-fidelity --jobs 60 --seed 7 --json docs/results/replay-rigid.json",
        needs=CLUSTER,
        recorded="60 jobs over 120 s (seed 7): mean JCT 73.8 s live against 70.2 s simulated (-4.9 %), 96.9 % of "
        "1,770 pairs in the same order; seed 8: -5.8 %, 94.6 %; no other job held a GPU meanwhile.",
    ),
    *(
        Entry(
            f"replay-seed{seed}",
            f"The elastic replay, seed {seed}: amoebad live against the simulator",
            "20 rigid sleep jobs and 10 elastic jobs of known work on a private cluster, once without the daemon "
            "(rigid) and once with amoebad's default (elastic), each simulated with the costs measured on that run; "
            "the live gain of the elastic run over the rigid one beside the simulated one.",
            f"scripts/bench-sim-fidelity --elastic --seed {seed} --json docs/results/replay-seed{seed}.json",
            needs=PRIVATE,
            recorded=recorded,
        )
        for seed, recorded in (
            (
                1,
                "Average JCT of the elastic run against the rigid one: +14.0 % live (slower), +19.6 % simulated with "
                "each run's own costs; amoebad ran as root, load average 5-6 at the start and 6-13 at the end on "
                "the 2-core host, grow lag 63.5 s (median).",
            ),
            (
                2,
                "Average JCT of the elastic run against the rigid one: +12.1 % live (slower), +0.1 % simulated; "
                "load 5-13 on the 2-core host, grow lag 25.2 s (median).",
            ),
            (
                3,
                "Average JCT of the elastic run against the rigid one: -5.4 % live (faster), -2.2 % simulated; load "
                "5-13 on the 2-core host, grow lag 40.3 s (median).",
            ),
        )
    ),
    Entry(
        "replay-seed1-admission",
        "The elastic replay with admission, seed 1",
        "The elastic replay with a third run, amoebad with `admission.enabled` (the daemon's user needs "
        "`AdminLevel=Administrator`), the elastic jobs eligible 10 s after submission.",
        "scripts/bench-sim-fidelity --elastic --admission --seed 1 --json docs/results/replay-seed1-admission.json",
        needs=PRIVATE.replace("12 minutes", "18 minutes"),
        recorded="Admission was slower than the plain daemon on seeds 1 and 2 (+10.3 %, +7.2 % average JCT); the "
        "simulator's admission met its fidelity goals against the live one (mean JCT -5.1 % and +7.7 %).",
    ),
)


def _number(value: float) -> str:
    if value == 0 or 1e-3 <= abs(value) < 1e6:
        return f"{value:.4g}"
    return f"{value:.3e}"


def _cell(value: Any) -> str:
    """A figure as the page shows it: a spread as ``median [q1..q3] (min..max), n=N``, lists shortened."""
    if isinstance(value, Mapping) and "median" in value:
        text = f"{_number(float(value['median']))}"
        if "q1" in value:
            text += f" [{_number(float(value['q1']))}..{_number(float(value['q3']))}]"
        if "min" in value:
            text += f" ({_number(float(value['min']))}..{_number(float(value['max']))})"
        if "n" in value:
            text += f", n={int(value['n'])}"
        return text
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, float)):
        return _number(float(value))
    if isinstance(value, (list, tuple)):
        if all(isinstance(item, (int, float)) and not isinstance(item, bool) for item in value) and len(value) <= 12:
            return ", ".join(_number(float(item)) for item in value)
        if all(isinstance(item, str) for item in value) and len(value) <= 6:
            return "; ".join(value) or "none"
        return f"({len(value)} entries in the JSON)"
    return str(value).replace("|", "\\|").replace("\n", " ")


def figure_rows(figures: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """The figures as (key, cell) rows: nested sections flattened with dots, spreads kept whole."""
    rows: list[tuple[str, str]] = []
    for key in sorted(figures):
        value = figures[key]
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and "median" not in value:
            rows += figure_rows(value, f"{name}.")
        else:
            rows.append((name, _cell(value)))
    return rows


def load_document(path: Path) -> dict[str, Any]:
    """A result document, checked for its format.

    Raises:
        ValueError: not JSON, or another format than :data:`benchmarks.record.SCHEMA`.
    """
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON ({exc}); run the benchmark again to rewrite it") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ValueError(
            f"{path} is not a result document of format {SCHEMA} (it has {document.get('schema')!r}); "
            "write it with the benchmark's --json/--out option"
        )
    return document


def _load(values: Sequence[float]) -> str:
    return " / ".join(f"{value:.1f}" for value in values) or "not recorded"


def section(entry: Entry, document: Mapping[str, Any] | None) -> str:
    """The Markdown section of one result."""
    lines = [f"## {entry.name}", "", f"**{entry.title}.** {entry.what}", ""]
    lines += [f"- Command: `{entry.command}`", f"- Needs: {entry.needs}"]
    if document is None:
        lines += ["", "**Not measured in this build.**"]
        if entry.recorded:
            lines += [
                "",
                f"Recorded in an earlier build, under the conditions stated then (not from a document in "
                f"`docs/results/`): {entry.recorded}",
            ]
        return "\n".join(lines)
    machine = document["machine"]
    lines += [
        f"- Machine: {machine['cores']} cores ({machine['usable_cores']} usable), {machine['cpu_model']}, "
        f"{machine['memory_gib']} GiB; Python {machine['python']}, torch {machine['torch'] or 'not installed'}; "
        f"{machine['system']}",
        f"- Load average (1, 5, 15 min) before: {_load(document['load_before'])}; after: "
        f"{_load(document['load_after'])}; wall time "
        + (f"{document['wall_s']:g} s" if document["wall_s"] is not None else "not recorded"),
        "- Parameters: "
        + ", ".join(f"`{key}={value}`" for key, value in sorted(document["parameters"].items()) if value is not None),
    ]
    for note in document.get("notes", []):
        lines += ["", note]
    for name, table in document.get("tables", {}).items():
        lines += ["", f"**{name}**", "", table.strip()]
    rows = figure_rows(document["figures"])
    if rows and not document.get("tables"):
        lines += ["", "| figure | value: median [quartiles] (min..max) where measured repeatedly |", "|---|---|"]
        lines += [f"| `{key}` | {cell} |" for key, cell in rows]
    return "\n".join(lines)


def render(results: Path = RESULTS) -> str:
    """The whole page, from the documents in ``results``."""
    measured = {path.stem: load_document(path) for path in sorted(results.glob("*.json"))}
    unknown = sorted(set(measured) - {entry.name for entry in CATALOG})
    if unknown:
        raise ValueError(
            f"docs/results/ holds {unknown}, which benchmarks/render_results.py's CATALOG does not name; add an "
            "entry for each (or remove the file)"
        )
    lines = [
        "# Results",
        "",
        "<!-- Rendered by scripts/render-results from docs/results/*.json; edit those or the catalog in "
        "benchmarks/render_results.py, not this page. -->",
        "",
        "Every figure the README and the manuals quote is one of these results. Each benchmark writes a JSON "
        "document with its figures and the conditions it ran under (`benchmarks/record.py`); the documents kept "
        "in `docs/results/` are rendered here by `scripts/render-results`. A benchmark without a document is "
        "*not measured in this build*; where an earlier run's figures are on record they are shown, marked as "
        "such. Figures are medians with quartiles in brackets and the range in parentheses where a benchmark "
        "measures repeatedly; the simulator's studies are deterministic (one run per workload, the range over "
        "workloads).",
        "",
        "| result | what | in this build |",
        "|---|---|---|",
    ]
    for entry in CATALOG:
        status = "measured" if entry.name in measured else "not measured"
        if entry.name not in measured and entry.recorded:
            status += " (recorded earlier)"
        lines.append(f"| [{entry.name}](#{entry.name}) | {entry.title} | {status} |")
    for entry in CATALOG:
        lines += ["", section(entry, measured.get(entry.name))]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Write ``docs/results.md`` (or, with ``--check``, fail when it is not what the documents render)."""
    parser = argparse.ArgumentParser(prog="render-results", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when docs/results.md is out of date")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the folder of result documents")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page to write")
    args = parser.parse_args(argv)
    try:
        page = render(args.results)
    except ValueError as exc:
        print(f"render-results: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if not args.page.exists() or args.page.read_text() != page:
            print(f"render-results: {args.page} is out of date; run scripts/render-results", file=sys.stderr)
            return 1
        return 0
    args.page.write_text(page)
    print(f"render-results: wrote {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
