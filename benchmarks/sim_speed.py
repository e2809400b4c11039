"""How fast the simulator's event loop is on a big overloaded trace: the whole ``philly.csv`` on 64 x 8 GPUs.

``scripts/bench-sim`` runs :func:`main`: FIFO and Tiresias over growing prefixes of the trace and over all of it
(82,247 jobs), timing wall-clock and CPU seconds of the engine alone (loading the trace is not counted), with the
policy's answers checked as ``amoeba-sim`` checks them. Every run is exact: FIFO sees the 500 oldest pending jobs
(:data:`QUEUE_DEPTH`, which changes nothing for FIFO: a job behind jobs asking for more GPUs than the cluster has
cannot start), Tiresias the part of its own order that can matter (the engine's ``ORDERED_WINDOW``); ``--queue-depth
N`` sets the depth of every run (``amoeba-sim --queue-depth``, an approximation for Tiresias). It prints a table and
writes the figures as JSON.

The target (issue 14): the whole trace under FIFO and under Tiresias within 120 s each on this 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.record import Recording
from slurm_amoeba.policy import make_policy
from slurm_amoeba.sim.data import data_dir
from slurm_amoeba.sim.engine import SimConfig, Simulator, trace_models
from slurm_amoeba.sim.workload import JobSpec, load_philly

#: The cluster of the target.
NODES, GPUS_PER_NODE = 64, 8

#: The engine's queue depth for the timed runs, per policy (0: every pending job the policy needs; exact for both).
QUEUE_DEPTH = {"fifo": 500, "tiresias": 0}


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def timed_run(jobs: Sequence[JobSpec], policy: str, queue_depth: int = 0) -> dict[str, float]:
    """One run of the engine, timed.

    Args:
        jobs: the workload.
        policy: a registered policy name.
        queue_depth: the engine's queue depth (0: every pending job).

    Returns:
        The run's summary plus ``wall_s``, ``cpu_s`` and ``rounds`` (times the policy was asked).
    """
    config = SimConfig(nodes=NODES, gpus_per_node=GPUS_PER_NODE, queue_depth=queue_depth)
    simulator = Simulator(jobs, make_policy(policy), config, trace_models({}, GPUS_PER_NODE))
    started, cpu = time.perf_counter(), _cpu_seconds()
    result = simulator.run()
    figures = result.summary()
    figures.update(wall_s=time.perf_counter() - started, cpu_s=_cpu_seconds() - cpu, rounds=float(result.decisions))
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the table, write the JSON.

    Args:
        argv: ``[--sizes 10000,20000,40000] [--policies fifo,tiresias] [--queue-depth N] [--json PATH]``.

    Returns:
        0 when every full-trace run took at most 120 s of wall-clock time, 1 otherwise.
    """
    parser = argparse.ArgumentParser(prog="bench-sim", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,20000,40000", help="trace prefixes to time before the whole trace")
    parser.add_argument("--policies", default="fifo,tiresias")
    parser.add_argument("--queue-depth", type=int, default=None, help="pending jobs shown (0: every one)")
    parser.add_argument("--json", type=Path, default=Path("bench-sim.json"))
    parser.add_argument("--short", action="store_true", help="the trace prefixes only, not the whole trace")
    args = parser.parse_args(argv)
    recording = Recording("philly-speed", vars(args))
    trace = data_dir() / "pollux" / "traces" / "philly.csv"
    everything = load_philly(trace)
    sizes = [int(size) for size in args.sizes.split(",") if size] + ([] if args.short else [len(everything)])
    rows: list[dict[str, object]] = []
    print(f"{'policy':<9} {'jobs':>7} {'depth':>6} {'rounds':>8} {'wall s':>7} {'CPU s':>7} {'avg JCT h':>10}")
    for policy in args.policies.split(","):
        depth = QUEUE_DEPTH.get(policy, 0) if args.queue_depth is None else args.queue_depth
        for size in sizes:
            figures = timed_run(everything[:size], policy, depth)
            rows.append({"policy": policy, "jobs": size, "queue_depth": depth, **figures})
            print(
                f"{policy:<9} {size:>7} {depth if depth else 'all':>6} {figures['rounds']:>8.0f} "
                f"{figures['wall_s']:>7.1f} {figures['cpu_s']:>7.1f} {figures['avg_jct_s'] / 3600:>10.3f}",
                flush=True,
            )
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs; cluster {NODES} x {GPUS_PER_NODE} GPUs")
    document = {"cluster": [NODES, GPUS_PER_NODE], "load_average": load, "runs": rows}
    recording.write(args.json, document)
    full = [row for row in rows if row["jobs"] == len(everything)]
    return 0 if all(float(str(row["wall_s"])) <= 120.0 for row in full) else 1


if __name__ == "__main__":
    sys.exit(main())
