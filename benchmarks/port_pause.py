"""The pause a ported script's own clock sees at a resize, with a logging all-reduce in every step.

Runs examples/port/elastic.py (whose step all-reduces the loss for its log, as most scripts do) as a local job of
2 workers, grows it to 3 with a warm joiner (held until the joiner is ready, then released) and shrinks it back to 2
(``remove``), ``--cycles`` times, and reads the script's own per-step timestamps (``steps-*.jsonl``, rank 0): the
pause of a switch is the step interval across it minus the median interval at the new size. Prints a table and
writes JSON (``--json``). Usage: ``python benchmarks/port_pause.py [--cycles 3] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from slurm_amoeba.local import LocalJob
from slurm_amoeba.runtime import Phase

ROOT = Path(__file__).resolve().parents[1]
ELASTIC = ROOT / "examples" / "port" / "elastic.py"


def _members(job: LocalJob, world: int, after: int) -> int:
    view = job.wait_for(
        lambda v: v.phase is Phase.RUNNING and v.world_size == world and v.generation > after, 120, f"{world} members"
    )
    return view.generation


def _wait_ready(job: LocalJob, worker: str) -> None:
    job.wait_for(lambda v: v.workers.get(worker) is not None and v.workers[worker].status.value == "ready", 120, worker)


def _run(out: Path, cycles: int) -> list[dict[str, Any]]:
    hold = out / "hold"
    command = [sys.executable, str(ELASTIC), "--out", str(out), "--hold-file", str(hold), "--epochs", "50"]
    env = {"AMOEBA_DEVICE": "cpu", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    job = LocalJob(command, initial_workers=2, job_id="pause", env=env, log_dir=out / "logs", poll_s=0.01)
    with job:
        generation = _members(job, 2, 0)
        for _ in range(cycles):
            hold.touch()
            (joiner,) = job.add(1)
            _wait_ready(job, joiner)
            hold.unlink()
            generation = _members(job, 3, generation)
            job.wait_for(
                lambda v: int(v.progress.get("step", 0)) >= int(v.plan.start_step or 0) + 20 if v.plan else False,
                120,
                "20 steps",
            )
            job.remove(joiner)
            generation = _members(job, 2, generation)
            job.wait_for(
                lambda v: int(v.progress.get("step", 0)) >= int(v.plan.start_step or 0) + 20 if v.plan else False,
                120,
                "20 steps",
            )
        for worker in list(job.view().workers):
            if job.view().workers[worker].status.value == "member":
                job.terminate(worker)
        job.wait(120)
    return [json.loads(line) for path in out.glob("steps-*.jsonl") for line in path.read_text().splitlines()]


def pauses(entries: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Pauses (ms) at each switch by kind (``grow``, ``shrink``), beyond the median step of the new size."""
    rank0 = sorted((e for e in entries if e["rank"] == 0), key=lambda e: e["step"])
    steps = {e["step"]: e for e in rank0}
    intervals = {s: (steps[s]["time"] - steps[s - 1]["time"], steps[s]["world"]) for s in steps if s - 1 in steps}
    ordinary: dict[int, list[float]] = {}
    for s, (interval, world) in intervals.items():
        if s - 2 in steps and steps[s - 2]["world"] == world and steps[s - 1]["world"] == world:
            ordinary.setdefault(world, []).append(interval)
    median = {world: statistics.median(values) for world, values in ordinary.items()}
    out: dict[str, list[float]] = {"grow": [], "shrink": []}
    for s, (interval, world) in intervals.items():
        before = steps[s - 1]["world"]
        if before != world:
            out["grow" if world > before else "shrink"].append(1000 * (interval - median[world]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--out", type=Path, help="keep the job's logs and step files here (default: a temporary dir)")
    args = parser.parse_args()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        entries = _run(args.out, args.cycles)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            entries = _run(Path(tmp), args.cycles)
    found = pauses(entries)
    print(f"{'switch':>8} {'n':>3} {'median ms':>10} {'max ms':>8}  (beyond a step of the new size, user clock)")
    for kind, values in found.items():
        if values:
            print(f"{kind:>8} {len(values):>3} {statistics.median(values):>10.1f} {max(values):>8.1f}")
    if args.json:
        args.json.write_text(json.dumps({"pauses_ms": found, "load": os.getloadavg()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
