"""Decision time of the goodput policy (``scripts/bench-goodput``).

A synthetic busy cluster, deterministic for a seed: 1,000 nodes x 8 GPUs and 2,000 jobs by default, of which 40 %
elastic with an adaptive batch (their rate tables are :func:`~slurm_amoeba.policy.goodput.goodput_rates` of a random
:class:`~slurm_amoeba.policy.goodput.GoodputModel`), 20 % elastic with a fixed batch (``w^0.9``) and 40 % regular;
about 85 % of the GPUs held. Measured, as medians over repetitions with the spread beside them:

- ``decide_s``: ``GoodputPolicy.decide`` (the daemon's budget is 50 ms); ``decide_cpu_s`` its process CPU time
  (less sensitive to other work on the machine than the wall time);
- ``check_s``: :func:`~slurm_amoeba.policy.check_actions` on its answer;
- ``reference_s``: another registered policy's ``decide`` on the same snapshot (``--reference``, E-Tiresias by
  default), measured interleaved with it, so that a loaded machine slows both alike; ``reference_cpu_s`` its CPU
  time (the ratio of the two CPU times is printed);
- ``rates_s``: building the adaptive jobs' rate tables (the caller's side: done when a job's report changes, not
  every round; reported for all of them at once).

Prints a table (or ``--json``) and writes the JSON to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.record import Recording
from slurm_amoeba.policy import JobInfo, JobPhase, NodeInfo, Snapshot, check_actions, make_policy
from slurm_amoeba.policy.goodput import GoodputModel, GoodputPolicy, goodput_rates


def synthetic(nodes: int, gpus_per_node: int, jobs: int, seed: int) -> tuple[Snapshot, list[GoodputModel]]:
    """The cluster and the adaptive jobs' models (see the module docstring)."""
    rng = random.Random(seed)
    free = {f"n{i:04d}": gpus_per_node for i in range(nodes)}
    names = list(free)
    budget = int(nodes * gpus_per_node * 0.85)
    infos: list[JobInfo] = []
    models: list[GoodputModel] = []
    cursor = 0
    for index in range(jobs):
        kind = rng.random()
        high = rng.choice((4, 8, 16))
        low = rng.choice((1, 2))
        if kind < 0.4:
            model = GoodputModel(
                base_batch=rng.choice((32, 64, 128)),
                max_batch=4096,
                noise_scale=rng.uniform(100, 20_000),
                sample_s=rng.uniform(2e-4, 2e-3),
                fixed_s=rng.uniform(0.005, 0.05),
                sync_s=rng.uniform(0.01, 0.1),
            )
            models.append(model)
            table = goodput_rates(model, high)
        elif kind < 0.6:
            table = {w: 100.0 * w**0.9 for w in range(1, high + 1)}
        else:
            low = high = rng.choice((1, 2, 4, 8))
            table = {}
        size = rng.randint(low, high)
        placement: dict[str, int] = {}
        if budget >= size:
            left = size
            while left:
                name = names[cursor % len(names)]
                take = min(free[name], left)
                if take:
                    placement[name] = take
                    free[name] -= take
                    left -= take
                if free[name] == 0:
                    cursor += 1
            budget -= size
        running = bool(placement)
        infos.append(
            JobInfo(
                job_id=f"j{index}",
                state=JobPhase.RUNNING if running else JobPhase.PENDING,
                submit_time=float(rng.randrange(0, 86_400)),
                requested_workers=size,
                min_workers=low,
                max_workers=high,
                workers=size if running else 0,
                placement=placement,
                throughput=table,
                attained_service=rng.uniform(0, 30 * 3600) if running else 0.0,
            )
        )
    node_infos = tuple(NodeInfo(name, gpus_per_node, free[name]) for name in names)
    return Snapshot(node_infos, tuple(infos)), models


def _timed(repeats: int, action: Callable[[], object], cpu: list[float] | None = None) -> list[float]:
    """Wall times of ``repeats`` calls; with ``cpu``, the process CPU times are appended to it too."""
    times = []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        action()
        times.append(time.perf_counter() - start)
        if cpu is not None:
            cpu.append(time.process_time() - start_cpu)
    return times


def run(nodes: int, gpus_per_node: int, jobs: int, repeats: int, seed: int, reference: str) -> dict[str, Any]:
    """Measure; see the module docstring."""
    snapshot, models = synthetic(nodes, gpus_per_node, jobs, seed)
    policy = GoodputPolicy()
    other = make_policy(reference)
    decisions = policy.decide(snapshot, now=0.0)
    decide: list[float] = []
    versus: list[float] = []
    decide_cpu: list[float] = []
    versus_cpu: list[float] = []
    for _ in range(repeats):
        decide += _timed(1, lambda: policy.decide(snapshot, now=0.0), decide_cpu)
        versus += _timed(1, lambda: other.decide(snapshot, now=0.0), versus_cpu)
    check = _timed(repeats, lambda: check_actions(snapshot, decisions))
    rates = _timed(max(1, repeats // 3), lambda: [goodput_rates(m, 16) for m in models])
    result: dict[str, Any] = {
        "nodes": nodes,
        "gpus": nodes * gpus_per_node,
        "jobs": jobs,
        "adaptive_jobs": len(models),
        "running": len(snapshot.running()),
        "decisions": len(decisions),
        "repeats": repeats,
        "reference": reference,
    }
    measured = (
        ("decide_s", decide),
        ("reference_s", versus),
        ("decide_cpu_s", decide_cpu),
        ("reference_cpu_s", versus_cpu),
        ("check_s", check),
        ("rates_s", rates),
    )
    for key, times in measured:
        result[key] = statistics.median(times)
        result[key.replace("_s", "_min_s")] = min(times)
        result[key.replace("_s", "_max_s")] = max(times)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reference", default="e-tiresias", help="a registered policy timed on the same snapshot")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    recording = Recording("goodput-decision", vars(args))
    result = run(args.nodes, args.gpus_per_node, args.jobs, args.repeats, args.seed, args.reference)
    text = json.dumps(result, indent=2, sort_keys=True)
    if args.out is not None:
        recording.write(args.out, result)
    if args.json:
        print(text)
        return 0
    print(
        f"goodput policy on {result['nodes']} nodes ({result['gpus']} GPUs), {result['jobs']} jobs "
        f"({result['adaptive_jobs']} adaptive, {result['running']} running), {result['decisions']} decisions"
    )
    print(f"{'measure':<16} {'median ms':>10} {'min ms':>8} {'max ms':>8}")
    rows = (
        ("decide_s", "decide"),
        ("reference_s", result["reference"]),
        ("decide_cpu_s", "decide CPU"),
        ("reference_cpu_s", f"{result['reference']} CPU"),
        ("check_s", "check"),
        ("rates_s", "rate tables"),
    )
    for key, label in rows:
        low, high = key.replace("_s", "_min_s"), key.replace("_s", "_max_s")
        print(f"{label:<16} {result[key] * 1e3:>10.1f} {result[low] * 1e3:>8.1f} {result[high] * 1e3:>8.1f}")
    verdict = "meets" if result["decide_s"] <= 0.05 else "misses"
    ratio = result["decide_cpu_s"] / result["reference_cpu_s"]
    print(f"decide {verdict} the daemon's 50 ms budget; {ratio:.2f}x {result['reference']} in CPU time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
