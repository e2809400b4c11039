"""How the daemon's round grows with the cluster (``scripts/bench-policy --scaling``).

For each cluster size (1,000, 10,000 and 50,000 nodes x 8 GPUs by default, twice as many jobs as nodes, 5% of them
elastic with a registered agent; :func:`benchmarks.policy.synthetic_cluster`) and each policy the daemon runs live,
it measures over successive rounds, as the daemon meets them:

- ``parse_full_s``: Slurm's reply parsed whole (``squeue --json`` text of that many jobs, a recorded job of Slurm
  24.11 repeated under new ids and indented as Slurm prints it, turned into records by
  :func:`~slurm_amoeba.slurm.parsers.parse_squeue_json`), of which ``json_s`` is the JSON decoding alone;
  ``parse_s`` (``parse_cpu_s`` in CPU time): the daemon's read of a round in which :data:`MOVED_SHARE` of the jobs
  changed, by the incremental reader that decodes only those (:class:`~slurm_amoeba.slurm.parsers.SqueueReader`);
- ``service_cpu_s``: the daemon's service book brought up to the round
  (:class:`~slurm_amoeba.daemon.observer.ServiceBook`, every job's attained GPU-seconds, the snapshot's input);
- ``snapshot_full_s``: the first round's snapshot, built from nothing;
- ``snapshot_s``: the median of the next rounds' snapshots, each from the records the incremental reader gives (the
  same objects for unchanged jobs, new ones for the :data:`MOVED_SHARE` that changed, new node records), the clock
  5 s later, with the round loop's :class:`~slurm_amoeba.daemon.snapshot.SnapshotCache` and the service book;
- ``decision_s``: the median of the policy's ``decide`` on those snapshots; ``check_s`` the invariant check;
- the collector set as amoebad sets it once started (``gc`` in the result says which: a tree without
  :func:`~slurm_amoeba.cli.amoebad.tune_gc` runs Python's defaults);
- ``snapshot_cpu_s`` and ``decision_cpu_s``: the same medians in CPU time of the measuring thread, which a machine
  shared with other work inflates far less than the wall-clock time; ``load_1m``: the 1-minute load average when
  the row was done;
- ``one_pass_cpu_s``, the control (:func:`bench_one_pass`): one pass over every job and node record of a round's
  view, each record read once and filed by its id, the least any round does. Its growth from one cluster size to
  the next is what this machine's memory makes of a linear algorithm over that many Python objects (a pass over
  five times as many records costs more than five times as much once they no longer fit the processor's caches),
  so each figure's growth divided by the pass's (``beyond_pass`` in :func:`growth`) is what its algorithm adds to
  linear: at most the growth of log n for an n log n algorithm.

It prints a table and each CPU figure's growth from one size to the next beside n log n (:func:`growth`), writes its
result document (``--json FILE``: :class:`benchmarks.record.Recording`, named
``scaling``, its rows as figures and the table in Markdown; ``docs/results.md#scaling``) and, with ``--plot FILE``,
a log-log plot of time against nodes per policy (matplotlib). ``--short`` measures small clusters in seconds (the
unit test's mode). A tree whose ``build_snapshot`` has no cache (an older checkout, on ``PYTHONPATH``) is measured
with full builds.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import inspect
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.policy import SyntheticCluster, agent_records, bench_policy, snapshot_of, synthetic_cluster
from benchmarks.record import Recording
from slurm_amoeba.daemon.observer import ClusterView, ServiceBook
from slurm_amoeba.daemon.snapshot import build_snapshot
from slurm_amoeba.policy import check_actions
from slurm_amoeba.slurm.parsers import parse_squeue_json

#: The policies the daemon can run live.
LIVE_POLICIES = ("elastic-backfill", "e-tiresias", "tiresias", "goodput", "fifo", "srtf")
#: Nodes of the clusters measured by default (jobs: twice as many).
DEFAULT_NODES = (1000, 10_000, 50_000)
#: The share of jobs whose record changes between two rounds.
MOVED_SHARE = 0.005
#: A recorded ``squeue --json`` whose first job is repeated to measure parsing.
SQUEUE_SAMPLE = (
    Path(__file__).resolve().parent.parent / "tests" / "data" / "slurm" / "releases" / "24.11" / "squeue.json"
)


def squeue_document(jobs: int) -> dict[str, Any]:
    """``squeue --json``'s document with ``jobs`` jobs: the sample's first job under ids 1, 2, ..."""
    doc: dict[str, Any] = json.loads(SQUEUE_SAMPLE.read_text())
    sample = doc["jobs"][0]
    doc["jobs"] = [{**sample, "job_id": index + 1} for index in range(jobs)]
    return doc


def bench_parse(jobs: int, repeats: int) -> dict[str, float]:
    """Median seconds to read ``squeue --json`` of ``jobs`` jobs, indented as Slurm prints it.

    Returns:
        ``json_s``: decoding the whole text; ``parse_full_s``: parsing it whole into records
        (:func:`~slurm_amoeba.slurm.parsers.parse_squeue_json`, decoding included); ``parse_s`` and ``parse_cpu_s``
        (CPU time): the daemon's read of a round in which :data:`MOVED_SHARE` of the jobs changed, with the reader
        that decodes only those (:class:`~slurm_amoeba.slurm.parsers.SqueueReader`; a tree without it: whole).
    """
    doc = squeue_document(jobs)
    rng = random.Random(2)
    texts = []
    for _ in range(repeats + 1):
        for index in rng.sample(range(jobs), max(1, int(jobs * MOVED_SHARE))):
            doc["jobs"][index] = {**doc["jobs"][index], "priority": {"set": True, "infinite": False, "number": index}}
        texts.append(json.dumps(doc, indent=2))
    try:
        from slurm_amoeba.slurm.parsers import SqueueReader
    except ImportError:  # an older checkout: every read parses the whole reply
        read = parse_squeue_json
    else:
        read = SqueueReader().parse
    read(texts[0])
    decode_t, full_t, parse_t, parse_cpu = [], [], [], []
    for text in texts[1:]:
        t0 = time.perf_counter()
        json.loads(text)
        t1 = time.perf_counter()
        parse_squeue_json(text)
        c2, t2 = time.thread_time(), time.perf_counter()
        read(text)
        c3, t3 = time.thread_time(), time.perf_counter()
        decode_t.append(t1 - t0)
        full_t.append(t2 - t1)
        parse_t.append(t3 - t2)
        parse_cpu.append(c3 - c2)
    figures = (decode_t, full_t, parse_t, parse_cpu)
    return {key: statistics.median(values) for key, values in zip(PARSE_FIGURES, figures, strict=True)}


#: What :func:`bench_parse` measures.
PARSE_FIGURES = ("json_s", "parse_full_s", "parse_s", "parse_cpu_s")


def next_view(cluster: SyntheticCluster, rng: random.Random, now: float) -> ClusterView:
    """Slurm's records as the daemon's next read gives them: :data:`MOVED_SHARE` of the jobs changed (new records),
    the others the same objects (the incremental reader keeps a job's record while its text stays the same), every
    node a new record (``sinfo --json`` is read whole)."""
    jobs = list(cluster.jobs)
    for index in rng.sample(range(len(jobs)), max(1, int(len(jobs) * MOVED_SHARE))):
        jobs[index] = dataclasses.replace(jobs[index], priority=jobs[index].priority + 1)
    return ClusterView(tuple(jobs), tuple(copy.copy(node) for node in cluster.nodes), now)


def bench_one_pass(cluster: SyntheticCluster, rounds: int) -> float:
    """The control: median CPU seconds of one pass over a round's view, every job and node record read once and
    filed by its id (:func:`next_view`'s views, ``rounds`` of them after one unmeasured)."""
    rng = random.Random(3)
    times = []
    for index in range(rounds + 1):
        view = next_view(cluster, rng, 5.0 * index)
        start = time.thread_time()
        jobs = {record.job_id: (record.state, record.gpus_per_node) for record in view.jobs}
        nodes = {record.name: record.state for record in view.nodes}
        spent = time.thread_time() - start
        if index and jobs and nodes:
            times.append(spent)
    return statistics.median(times)


def bench_rounds(cluster: SyntheticCluster, policy_name: str, rounds: int) -> dict[str, float]:
    """A policy's rounds on a cluster: the first snapshot, then ``rounds`` rounds of snapshot, decision and check.

    Returns:
        ``snapshot_full_s``, and the medians ``snapshot_s``, ``decision_s``, ``check_s``; ``decisions`` made last.
    """
    now = time.time()
    agents = agent_records(cluster, now)
    policy = bench_policy(policy_name)
    rng = random.Random(1)
    options: dict[str, Any] = {}
    if "reuse" in inspect.signature(build_snapshot).parameters:
        from slurm_amoeba.daemon.snapshot import SnapshotCache

        options["reuse"] = SnapshotCache()
    times: dict[str, list[float]] = {key: [] for key in ("snapshot_s", "decision_s", "check_s")}
    cpu: dict[str, list[float]] = {"snapshot_cpu_s": [], "decision_cpu_s": [], "service_cpu_s": []}
    book = ServiceBook()
    first = 0.0
    made = 0
    for index in range(rounds + 1):
        at = now + 5.0 * index
        view = next_view(cluster, rng, at)
        cs = time.thread_time()
        service = book.update(view, at)
        c0, t0 = time.thread_time(), time.perf_counter()
        obs = snapshot_of(view, agents, at, stale_after_s=3600.0, service=service, **options)
        c1, t1 = time.thread_time(), time.perf_counter()
        if index == 0:
            first = t1 - t0
            continue
        decisions = policy.decide(obs.snapshot, at)
        c2, t2 = time.thread_time(), time.perf_counter()
        check_actions(obs.snapshot, decisions)
        t3 = time.perf_counter()
        times["snapshot_s"].append(t1 - t0)
        times["decision_s"].append(t2 - t1)
        times["check_s"].append(t3 - t2)
        cpu["snapshot_cpu_s"].append(c1 - c0)
        cpu["service_cpu_s"].append(c0 - cs)
        cpu["decision_cpu_s"].append(c2 - c1)
        made = len(decisions)
    medians = {key: statistics.median(values) for key, values in {**times, **cpu}.items()}
    return {"snapshot_full_s": first, **medians, "decisions": made}


def _collect_as_the_daemon() -> str:
    """The collector as amoebad sets it once started (:func:`~slurm_amoeba.cli.amoebad.tune_gc`: what start-up
    built, here the synthetic cluster, frozen out of its scans, and a higher first threshold); Python's defaults in a
    tree without it. Returns which."""
    try:
        from slurm_amoeba.cli.amoebad import tune_gc
    except ImportError:
        return "Python's defaults"
    tune_gc()
    return "amoebad's (tune_gc)"


def run(nodes: Sequence[int], policies: Sequence[str], rounds: int, elastic_share: float) -> dict[str, Any]:
    """Every policy at every cluster size (see the module docstring); a JSON-ready result."""
    rows: list[dict[str, Any]] = []
    collector = ""
    for count in nodes:
        jobs = 2 * count
        gc.unfreeze()  # the last size's cluster becomes garbage like any other
        cluster = synthetic_cluster(count, 8, jobs, elastic_share)
        collector = _collect_as_the_daemon()
        parse = bench_parse(jobs, max(1, min(rounds, 3)))
        one_pass = bench_one_pass(cluster, max(rounds, 5))
        for name in policies:
            figures = bench_rounds(cluster, name, rounds)
            rows.append(
                {
                    "nodes": count,
                    "gpus": 8 * count,
                    "jobs": jobs,
                    "elastic": len(cluster.elastic),
                    "policy": name,
                    **parse,
                    "one_pass_cpu_s": one_pass,
                    **figures,
                    "load_1m": os.getloadavg()[0],
                }
            )
            print(f"{count} nodes, {name}: done", file=sys.stderr, flush=True)
    return {"rounds": rounds, "moved_share": MOVED_SHARE, "gc": collector, "rows": rows}


#: The table's columns: heading and the row's key (a key ending in ``_s`` is seconds, shown in milliseconds).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("nodes", "nodes"),
    ("jobs", "jobs"),
    ("policy", "policy"),
    ("parse whole", "parse_full_s"),
    ("json", "json_s"),
    ("parse", "parse_s"),
    ("snap 1st", "snapshot_full_s"),
    ("snapshot", "snapshot_s"),
    ("decision", "decision_s"),
    ("check", "check_s"),
    ("parse CPU", "parse_cpu_s"),
    ("snapshot CPU", "snapshot_cpu_s"),
    ("service CPU", "service_cpu_s"),
    ("decision CPU", "decision_cpu_s"),
    ("one pass CPU", "one_pass_cpu_s"),
    ("load", "load_1m"),
)


def _cells(row: dict[str, Any]) -> list[str]:
    """A row's cells in :data:`COLUMNS`' order: times in milliseconds, counts and names as they are."""
    return [_cell(key, row.get(key)) for _, key in COLUMNS]


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"  # a document of an earlier run, without that figure
    if key.endswith("_s"):
        return f"{value * 1e3:.1f}"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def title(result: dict[str, Any]) -> str:
    """What the table's figures are."""
    return (
        f"medians of {result['rounds']} rounds in milliseconds: wall clock, and in the columns marked CPU the CPU "
        "time of the measuring thread"
    )


def table(result: dict[str, Any]) -> str:
    """The result as a text table, in milliseconds."""
    widths = [max(len(heading), 7) for heading, _ in COLUMNS]
    widths[2] = 17
    lines = [
        title(result),
        " ".join(f"{heading:>{width}}" for (heading, _), width in zip(COLUMNS, widths, strict=True)),
    ]
    for row in result["rows"]:
        lines.append(" ".join(f"{cell:>{width}}" for cell, width in zip(_cells(row), widths, strict=True)))
    return "\n".join(lines)


def markdown_table(result: dict[str, Any]) -> str:
    """The result as the Markdown table of its document (``docs/results.md#scaling``), in milliseconds."""
    lines = ["| " + " | ".join(heading for heading, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in result["rows"]]
    return "\n".join(lines)


#: The figures :func:`growth_table` compares across sizes (CPU time: what load inflates least).
GROWTH_FIGURES = (
    ("one pass", "one_pass_cpu_s"),
    ("parse", "parse_cpu_s"),
    ("service", "service_cpu_s"),
    ("snapshot", "snapshot_cpu_s"),
    ("decision", "decision_cpu_s"),
)
#: The figures whose growth :func:`growth` also gives beyond the control pass's (``beyond_pass``).
BEYOND_PASS = ("parse", "service", "snapshot", "decision")


def growth(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per policy and size beyond the smallest: each of :data:`GROWTH_FIGURES` divided by its value at the next
    smaller size measured (``from``), beside what n log n growth would give (``nlogn``: (N log N) / (N0 log N0), N
    in nodes); ``logn`` (log N / log N0), what an n log n algorithm may add to the control pass's growth;
    ``beyond_pass``: the growth of each of :data:`BEYOND_PASS` divided by the pass's (NaN in a document without
    the pass)."""
    rows = result["rows"]
    sizes = sorted({row["nodes"] for row in rows})
    smaller = dict(zip(sizes[1:], sizes, strict=False))
    by_size = {(row["policy"], row["nodes"]): row for row in rows}
    out = []
    for row in rows:
        before = smaller.get(row["nodes"], 0)
        first = by_size.get((row["policy"], before))
        if first is None or before < 2:
            continue
        logn = math.log(row["nodes"]) / math.log(before)
        grown = {name: _ratio(row.get(key), first.get(key)) for name, key in GROWTH_FIGURES}
        beyond = {name: grown[name] / grown["one pass"] for name in BEYOND_PASS}
        out.append(
            {
                "policy": row["policy"],
                "nodes": row["nodes"],
                "from": before,
                "nlogn": row["nodes"] / before * logn,
                "logn": logn,
                **grown,
                "beyond_pass": beyond,
            }
        )
    return out


def _ratio(value: float | None, base: float | None) -> float:
    return value / base if value is not None and base else float("nan")


def growth_table(result: dict[str, Any]) -> str:
    """:func:`growth` as Markdown: a figure that grows by less than the n log n column grows no faster than that;
    the last columns, each figure's growth over the control pass's, beside log n."""
    names = [name for name, _ in GROWTH_FIGURES]
    lines = [
        "| policy | nodes | n log n | "
        + " | ".join(f"{name} CPU" for name in names)
        + " | log n | "
        + " | ".join(f"{name} / one pass" for name in BEYOND_PASS)
        + " |",
        "|" + "---|" * (4 + len(names) + len(BEYOND_PASS)),
    ]
    for row in growth(result):
        cells = [row["policy"], f"{row['from']} -> {row['nodes']}", f"x {row['nlogn']:.1f}"]
        cells += [f"x {row[name]:.1f}" for name in names]
        cells.append(f"x {row['logn']:.2f}")
        cells += [f"x {row['beyond_pass'][name]:.2f}" for name in BEYOND_PASS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def growth_title(result: dict[str, Any]) -> str:
    """What the growth table's figures are."""
    return (
        "growth from the next smaller cluster: each CPU-time median divided by its value there, beside n log n "
        "(N log N / N0 log N0, N in nodes); then each figure's growth divided by the control pass's (one read of "
        "every record), beside log n (log N / log N0): what the algorithm adds to a linear pass "
        "on this machine"
    )


def plot(result: dict[str, Any], path: Path) -> None:
    """A log-log plot of CPU time against nodes: decision (one line per policy), snapshot, service book and the
    incremental squeue read, with an n log n reference through the smallest snapshot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 5))
    rows = result["rows"]
    for name in dict.fromkeys(row["policy"] for row in rows):
        mine = [row for row in rows if row["policy"] == name]
        axes.plot([r["nodes"] for r in mine], [r["decision_cpu_s"] * 1e3 for r in mine], marker="o", label=name)
    first = [row for row in rows if row["policy"] == rows[0]["policy"]]
    xs = [r["nodes"] for r in first]
    axes.plot(xs, [r["snapshot_cpu_s"] * 1e3 for r in first], "k--", marker="s", label="snapshot (incremental)")
    axes.plot(xs, [r["parse_cpu_s"] * 1e3 for r in first], "k:", marker="^", label="squeue --json read (incremental)")
    if all("service_cpu_s" in r for r in first):
        axes.plot(xs, [r["service_cpu_s"] * 1e3 for r in first], "k-.", marker="d", label="service book")
    if all("one_pass_cpu_s" in r for r in first):
        axes.plot(
            xs, [r["one_pass_cpu_s"] * 1e3 for r in first], color="tab:gray", marker="x", label="one pass (control)"
        )
    if xs and xs[0] > 1:
        start = first[0]["snapshot_cpu_s"] * 1e3
        reference = [start * x / xs[0] * math.log(x) / math.log(xs[0]) for x in xs]
        axes.plot(xs, reference, color="silver", linewidth=4, zorder=0, label="n log n from the snapshot's start")
    axes.axhline(100, color="grey", linewidth=0.8)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("nodes (8 GPUs each; jobs = 2 x nodes)")
    axes.set_ylabel("CPU milliseconds per round (median)")
    axes.set_title("amoebad round: decision per policy, snapshot and parse")
    axes.legend(fontsize=8)
    axes.grid(True, which="both", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    """``scripts/bench-policy --scaling``: print the table; write JSON and the plot when asked."""
    parser = argparse.ArgumentParser(
        prog="bench-policy --scaling", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--scaling", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nodes", default=",".join(map(str, DEFAULT_NODES)), help="cluster sizes, comma-separated")
    parser.add_argument("--policies", default=",".join(LIVE_POLICIES), help="comma-separated")
    parser.add_argument("--rounds", type=int, default=5, help="rounds measured per policy and size (median)")
    parser.add_argument("--elastic-share", type=float, default=0.05, help="share of jobs that are elastic")
    parser.add_argument("--short", action="store_true", help="small clusters (100 and 300 nodes), 2 rounds")
    parser.add_argument(
        "--json", type=Path, default=None, metavar="FILE", help="write the result document (benchmarks/record.py)"
    )
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE", help="write a log-log plot (PNG)")
    args = parser.parse_args(argv)
    recording = Recording("scaling", vars(args))
    nodes = [100, 300] if args.short else [int(n) for n in args.nodes.split(",") if n]
    rounds = 2 if args.short else args.rounds
    result = run(nodes, [p for p in args.policies.split(",") if p], rounds, args.elastic_share)
    print(table(result))
    print(growth_title(result))
    print(growth_table(result))
    if args.json is not None:
        tables = {title(result): markdown_table(result), growth_title(result): growth_table(result)}
        recording.write(args.json, result, tables=tables)
        print(f"wrote {args.json}")
    if args.plot is not None:
        plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
