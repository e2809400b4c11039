#!/usr/bin/env python3
"""bench-grow: how long an elastic job takes to grow and shrink on the local Slurm cluster.

For each round, on a running job of examples/elastic_mlp.py (by default each worker a whole node's 4 GPUs, one
worker per satellite; --workers-per-satellite N gives each worker 4/N GPUs and each satellite N workers):
  grow   resize(2 -> 2 + S x N), S = --satellites: request -> satellites submitted -> satellites running (Slurm's
         part) -> the generation with the new workers formed (the runtime's part: start, warm-up, join at a step
         boundary);
  shrink resize back to 2: request -> the generation without the satellites' workers formed (they left at a step
         boundary; their allocations are released right after).
Beside them, in the same run, the time of one `python -c "import torch"` on the machine (import_torch_s: the median
of one before the rounds and one after each), the yardstick of the runtime's part, and how the satellites started
their workers (warm: forked from one process per satellite, agent/warm.py, which first imports torch, what torch
imports at the first optimizer and the runtime: warm_preload_s; cold: an srun step; --cold asks for cold with
AMOEBA_WARM_START=0).
The runtime's part is split into its parts, from the satellites' and the agent's logs (the last satellite to fork
decides each): warm_s, satellite running -> its workers forked (the preloading, warm_preload_s, of which torch's
import is warm_torch_s; the fork itself); ready_s, forked -> every joiner warm and ready (the coordinator asks the
members to end their generation at the next step boundary: the workers' start, warm-up, registration; 0 when it
asked for an earlier satellite's joiners and the last one's were ready by that boundary); join_s, the later of the
two -> the generation formed (the members' step boundary, their reports, the plan). A cold start has no warm_s,
and ready_s counts from the satellite's start.
Prints a table of the median and every round, writes JSON with --json FILE (keys grow_total_s, slurm_s, runtime_s,
warm_s, ready_s, join_s, shrink_total_s, import_torch_s, warm_preload_s, warm_torch_s, runtime_per_import, start,
plus the rounds; import_torch_cpu_s, warm_preload_cpu_s and their ratio preload_cpu_per_import_cpu: the same imports
in CPU seconds, a yardstick that a loaded machine hardly moves). Needs the local cluster (it starts it if needed
and stops it if it did) and root. Leaves no job of its own behind in squeue.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.record import Recording, spread  # noqa: E402
from examples.elastic_mlp import train  # noqa: E402
from slurm_amoeba.launcher import ElasticExecutor, ElasticJob  # noqa: E402
from slurm_amoeba.slurm import CliSlurmClient, JobRecord  # noqa: E402


def wait(what: str, predicate: Any, timeout: float) -> None:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"bench-grow: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def _ours(record: JobRecord, parent: int) -> bool:
    """``record`` is still active and the benchmark's job (a component of it, or one of its satellites): others' jobs
    on a shared cluster are not waited for."""
    mine = parent in (record.job_id, record.het_job_id) or record.comment == f"amoeba-parent={parent}"
    return mine and record.state.is_active()


def generation_with(job: ElasticJob[Any], size: int, after: float) -> dict[str, Any] | None:
    for g in job.history()["generations"]:
        if g["size"] == size and (g["formed_at"] or 0) > after:
            return dict(g)
    return None


def import_torch() -> tuple[float, float]:
    """Seconds one `python -c "import torch"` takes now, with this benchmark's Python: wall-clock and CPU (the
    latter hardly depends on what else the machine runs)."""
    start, before = time.monotonic(), os.times()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    after = os.times()
    return (
        time.monotonic() - start,
        after.children_user + after.children_system - before.children_user - before.children_system,
    )


PRELOADING = re.compile(r"warm start: \d+ worker\(s\) forked \(preloading ([0-9.]+) s(?:, ([0-9.]+) s of CPU)?")
FORKED = re.compile(r"^(\S+ \S+) INFO .*warm start: \d+ worker\(s\) forked \(preloading ([0-9.]+) s.*$", re.MULTILINE)
TORCH_PART = re.compile(r"preloaded torch ([0-9.]+) s")
ASKED = re.compile(r"^(\S+ \S+) INFO .*asking generation \d+ to end at its next step boundary", re.MULTILINE)


def log_time(stamp: str) -> float:
    """The epoch time of a log line's ``asctime`` (``2026-11-28 22:10:28,440``, this machine's local time)."""
    day, ms = stamp.rsplit(",", 1)
    return time.mktime(time.strptime(day, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000


def runtime_parts(state: Path, agent_log: Path, groups: list[str], started: float, formed: float) -> dict[str, float]:
    """The runtime's part of one grow split as the module docstring says (``groups``: the round's satellites,
    ``started``: when the last one ran, ``formed``: when the generation with their workers formed)."""
    forks = [
        (
            log_time(m.group(1)),
            float(m.group(2)),
            float(part.group(1)) if (part := TORCH_PART.search(m.group(0))) else 0.0,
        )
        for g in groups
        if (path := state / f"satellite-{g}.log").exists()
        for m in FORKED.finditer(path.read_text(errors="replace"))
    ]
    forked = max((f[0] for f in forks), default=started)
    text = agent_log.read_text(errors="replace") if agent_log.exists() else ""
    asks = [t for m in ASKED.finditer(text) if started - 0.01 <= (t := log_time(m.group(1))) <= formed + 0.01]
    asked = max(asks, default=formed)  # the ask that ended the generation before the one formed
    last = max(forks, default=(started, 0.0, 0.0))
    return {
        "warm_s": forked - started,
        "ready_s": max(0.0, asked - forked),
        "join_s": formed - max(asked, forked),
        "preload_s": last[1],
        "preload_torch_s": last[2],
    }


def start_modes(state: Path) -> tuple[dict[str, int], list[float], list[float]]:
    """How many satellites started their workers warm (forked) and how many cold (srun), from their logs; and each
    warm one's preloading time (its imports before the fork), wall-clock and CPU."""
    logs = [p.read_text(errors="replace") for p in state.glob("satellite-g*.log")]
    found = [m for text in logs for m in PRELOADING.finditer(text)]
    modes = {
        "warm": sum("warm start:" in text for text in logs),
        "cold": sum("starting the workers cold" in text for text in logs),
    }
    return modes, [float(m.group(1)) for m in found], [float(m.group(2)) for m in found if m.group(2)]


def one_round(job: ElasticJob[Any], low: int, high: int) -> dict[str, float]:
    state = job.state_dir
    before = {p.name for p in state.glob("satellite-*.started")}
    t_request = time.time()
    job.resize(high, reason="bench-grow")
    wait(f"{high} workers", lambda: generation_with(job, high, t_request) is not None, 300)
    formed = generation_with(job, high, t_request)
    assert formed is not None
    new = [p for p in state.glob("satellite-*.started") if p.name not in before]
    started = [float(p.read_text()) for p in new]
    submitted = [
        e["t"] for e in job.history()["history"] if e["event"] == "satellite_submitted" and e["t"] >= t_request - 0.01
    ]
    running = max(started)
    grow = {
        "grow_total_s": formed["formed_at"] - t_request,
        "slurm_s": running - min(submitted),
        "runtime_s": formed["formed_at"] - running,
        "agent_s": min(submitted) - t_request,
    }
    groups = [p.name.removeprefix("satellite-").removesuffix(".started") for p in new]
    grow.update(runtime_parts(state, job.agent_log_path, groups, running, formed["formed_at"]))
    time.sleep(2)
    t_shrink = time.time()
    job.resize(low, reason="bench-grow")
    wait(f"{low} workers", lambda: generation_with(job, low, t_shrink) is not None, 60)
    shrunk = generation_with(job, low, t_shrink)
    assert shrunk is not None
    grow["shrink_total_s"] = shrunk["formed_at"] - t_shrink
    grow["pause_s"] = float(formed["pause_s"] or 0.0)
    time.sleep(2)
    return grow


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--workers-per-satellite", type=int, default=1, choices=(1, 2, 4))
    parser.add_argument("--satellites", type=int, default=2)
    parser.add_argument("--cold", action="store_true", help="satellites start their workers cold (srun)")
    parser.add_argument("--keep", type=Path, default=None, help="copy the job's folder (its logs) here")
    args = parser.parse_args()
    if args.cold:
        os.environ["AMOEBA_WARM_START"] = "0"  # the job inherits the environment, its satellites too
    recording = Recording("grow", vars(args))
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    script = str(REPO / "scripts" / "slurm-cluster")
    was_up = subprocess.run([script, "status"], capture_output=True, check=False).returncode == 0
    up = subprocess.run([script, "up"], capture_output=True, text=True, check=False)
    if up.returncode != 0:
        print(up.stderr, file=sys.stderr)
        return 1
    os.environ["SLURM_CONF"] = next(x.split("=", 1)[1] for x in up.stdout.splitlines() if x.startswith("SLURM_CONF="))
    client = CliSlurmClient.from_environment()
    gpus = max(n.gpus_total for n in client.nodes()) // args.workers_per_satellite
    low, high = 2, 2 + args.satellites * args.workers_per_satellite
    wall, cpu = import_torch()
    imports, imports_cpu = [wall], [cpu]
    modes: dict[str, int] = {}
    preloads: list[float] = []
    preloads_cpu: list[float] = []
    rounds: list[dict[str, float]] = []
    job: ElasticJob[Any] | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-grow-") as tmp:
            executor = ElasticExecutor(folder=Path(tmp) / "%j")
            executor.update_parameters(min_workers=low, max_workers=high, gpus_per_worker=gpus, job_name="bench-grow")
            job = executor.submit(train, epochs=1000, dataset_size=4096, global_batch=128, sample_delay=0.002)
            try:
                wait("the first generation", lambda: job is not None and job.workers() == low, 120)
                for i in range(args.rounds):
                    rounds.append(one_round(job, low, high))
                    r = rounds[-1]
                    wall, cpu = import_torch()
                    imports.append(wall)
                    imports_cpu.append(cpu)
                    print(
                        f"round {i + 1}: grow {r['grow_total_s']:.2f} s (Slurm {r['slurm_s']:.2f} s, runtime "
                        f"{r['runtime_s']:.2f} s), shrink {r['shrink_total_s']:.2f} s; import torch "
                        f"{imports[-1]:.2f} s",
                        flush=True,
                    )
                modes, preloads, preloads_cpu = start_modes(job.state_dir)
            finally:
                if args.keep:  # the logs of a failed run too
                    shutil.copytree(tmp, args.keep, dirs_exist_ok=True)
            job.cancel()
            parent = int(job.job_id)
            wait("none of its jobs in squeue", lambda: not [j for j in client.jobs() if _ours(j, parent)], 60)
    finally:
        if job is not None and not job.done(force_check=True):
            job.cancel(check=False)
        if not was_up:
            subprocess.run([script, "down"], capture_output=True, check=False)
    keys = [
        "grow_total_s",
        "slurm_s",
        "runtime_s",
        "warm_s",
        "ready_s",
        "join_s",
        "agent_s",
        "shrink_total_s",
        "pause_s",
    ]
    median = {k: statistics.median(r[k] for r in rounds) for k in keys}
    median["import_torch_s"] = statistics.median(imports)
    median["warm_preload_s"] = statistics.median(preloads) if preloads else 0.0
    median["warm_torch_s"] = statistics.median(r["preload_torch_s"] for r in rounds)
    median["runtime_per_import"] = median["runtime_s"] / median["import_torch_s"]
    median["import_torch_cpu_s"] = statistics.median(imports_cpu)
    median["warm_preload_cpu_s"] = statistics.median(preloads_cpu) if preloads_cpu else 0.0
    median["preload_cpu_per_import_cpu"] = median["warm_preload_cpu_s"] / median["import_torch_cpu_s"]
    print(f"\n{'measure':<16}{'median':>9}" + "".join(f"{'#' + str(i + 1):>9}" for i in range(len(rounds))))
    for k in keys:
        print(f"{k:<16}{median[k]:>9.3f}" + "".join(f"{r[k]:>9.3f}" for r in rounds))
    print(
        "\ngrow: resize() -> the generation with the new workers formed; slurm_s: satellite submitted -> its batch"
        "\nscript running; runtime_s: satellite running -> workers joined (process start, imports, model, join)"
        "\n= warm_s (-> workers forked) + ready_s (-> every joiner ready) + join_s (-> generation formed);"
        "\npause_s: what the training workers lose at the switch. shrink: resize() -> generation without them."
        f"\nimport_torch_s (one `python -c 'import torch'`, median of {len(imports)}): {median['import_torch_s']:.3f}; "
        f"satellites started warm {modes.get('warm', 0)}, cold {modes.get('cold', 0)}; the warm ones' preloading "
        f"(imports before the fork, median): {median['warm_preload_s']:.3f}, torch's {median['warm_torch_s']:.3f}"
        f"\nruntime_s / import_torch_s: {median['runtime_per_import']:.2f}; in CPU seconds, which the machine's load "
        f"hardly changes, the preloading {median['warm_preload_cpu_s']:.3f} / the import "
        f"{median['import_torch_cpu_s']:.3f} = {median['preload_cpu_per_import_cpu']:.2f}"
    )
    if args.json:
        spread_of = {f"{k}_spread": spread([r[k] for r in rounds]) for k in keys}
        figures = {
            **median,
            **spread_of,
            "import_torch_s_all": imports,
            "warm_preload_s_all": preloads,
            "import_torch_cpu_s_all": imports_cpu,
            "warm_preload_cpu_s_all": preloads_cpu,
            "start": modes,
            "workers_per_satellite": args.workers_per_satellite,
            "rounds": rounds,
            "workers": f"{low} <-> {high}",
            "gpus_per_worker": gpus,
        }
        recording.write(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
