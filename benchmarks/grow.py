#!/usr/bin/env python3
"""bench-grow: how long an elastic job takes to grow and shrink on the local Slurm cluster.

For each round, on a running job of examples/elastic_mlp.py (each worker a whole node's 4 GPUs):
  grow   resize(2 -> 4): request -> satellites submitted -> satellites running (Slurm's part) -> the generation with
         the new workers formed (the runtime's part: start, warm-up, join at a step boundary);
  shrink resize(4 -> 2): request -> the generation without the satellites' workers formed (they left at a step
         boundary; their allocations are released right after).
Prints a table of the median and every round, writes JSON with --json FILE (keys grow_total_s, slurm_s, runtime_s,
shrink_total_s, plus the rounds). Needs the local cluster (it starts it if needed and stops it if it did) and root.
Leaves no job behind in squeue.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from examples.elastic_mlp import train  # noqa: E402
from slurm_amoeba.launcher import ElasticExecutor, ElasticJob  # noqa: E402
from slurm_amoeba.slurm import CliSlurmClient  # noqa: E402


def wait(what: str, predicate: Any, timeout: float) -> None:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"bench-grow: timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def generation_with(job: ElasticJob[Any], size: int, after: float) -> dict[str, Any] | None:
    for g in job.history()["generations"]:
        if g["size"] == size and (g["formed_at"] or 0) > after:
            return dict(g)
    return None


def one_round(job: ElasticJob[Any], low: int, high: int) -> dict[str, float]:
    state = job.state_dir
    before = {p.name for p in state.glob("satellite-*.started")}
    t_request = time.time()
    job.resize(high, reason="bench-grow")
    wait(f"{high} workers", lambda: generation_with(job, high, t_request) is not None, 120)
    formed = generation_with(job, high, t_request)
    assert formed is not None
    started = [float(p.read_text()) for p in state.glob("satellite-*.started") if p.name not in before]
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
    args = parser.parse_args()
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    script = str(REPO / "scripts" / "slurm-cluster")
    was_up = subprocess.run([script, "status"], capture_output=True, check=False).returncode == 0
    up = subprocess.run([script, "up"], capture_output=True, text=True, check=False)
    if up.returncode != 0:
        print(up.stderr, file=sys.stderr)
        return 1
    os.environ["SLURM_CONF"] = next(x.split("=", 1)[1] for x in up.stdout.splitlines() if x.startswith("SLURM_CONF="))
    client = CliSlurmClient.from_environment()
    gpus = max(n.gpus_total for n in client.nodes())
    rounds: list[dict[str, float]] = []
    job: ElasticJob[Any] | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-grow-") as tmp:
            executor = ElasticExecutor(folder=Path(tmp) / "%j")
            executor.update_parameters(min_workers=2, max_workers=4, gpus_per_worker=gpus, job_name="bench-grow")
            job = executor.submit(train, epochs=1000, dataset_size=4096, global_batch=128, sample_delay=0.002)
            wait("the first generation", lambda: job is not None and job.workers() == 2, 120)
            for i in range(args.rounds):
                rounds.append(one_round(job, 2, 4))
                r = rounds[-1]
                print(
                    f"round {i + 1}: grow {r['grow_total_s']:.2f} s (Slurm {r['slurm_s']:.2f} s, runtime "
                    f"{r['runtime_s']:.2f} s), shrink {r['shrink_total_s']:.2f} s",
                    flush=True,
                )
            job.cancel()
            wait("no job in squeue", lambda: not [j for j in client.jobs() if j.state.is_active()], 60)
    finally:
        if job is not None and not job.done(force_check=True):
            job.cancel(check=False)
        if not was_up:
            subprocess.run([script, "down"], capture_output=True, check=False)
    keys = ["grow_total_s", "slurm_s", "runtime_s", "agent_s", "shrink_total_s", "pause_s"]
    median = {k: statistics.median(r[k] for r in rounds) for k in keys}
    print(f"\n{'measure':<16}{'median':>9}" + "".join(f"{'#' + str(i + 1):>9}" for i in range(len(rounds))))
    for k in keys:
        print(f"{k:<16}{median[k]:>9.3f}" + "".join(f"{r[k]:>9.3f}" for r in rounds))
    print(
        "\ngrow: resize() -> the generation with the new workers formed; slurm_s: satellite submitted -> its batch"
        "\nscript running; runtime_s: satellite running -> workers joined (process start, imports, model, join);"
        "\npause_s: what the training workers lose at the switch. shrink: resize() -> generation without them."
    )
    if args.json:
        args.json.write_text(
            json.dumps({**median, "rounds": rounds, "workers": "2 <-> 4", "gpus_per_worker": gpus}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
