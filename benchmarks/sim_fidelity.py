"""Does the simulator's ``slurm`` baseline speak about Slurm? A workload replayed on the real cluster and simulated.

``scripts/bench-sim-fidelity`` runs :func:`main`: it draws a scaled-down workload (``--jobs`` sleep jobs of 1-4
GPUs, durations of ``--min-s``..``--max-s`` seconds, time limits of one to three minutes, arrivals spread over
``--spread-s`` seconds; a seed fixes it), submits each job at its time to the local Slurm cluster (``sbatch`` in the
cluster's default partition, ``--gres=gpu:N``, ``-t``), waits for all of them, exports their accounting
(``sacct --json``) and replays that same history through the simulator's ``slurm`` policy with the cluster's own
slurm.conf and a one-second scheduling interval (its ``bf_interval``). It reports, per job, the error of the start
time and of the JCT, the mean JCT of both, and on how many pairs of jobs the two agree about which started first
(the backfill decisions). Goal (issue 14): mean JCT within 10%, pairs agreeing >= 90%.

The cluster is shared with other engineers' tests: jobs of others that hold GPUs make the recorded run differ from
the simulated one, which knows only this workload. The script names its jobs ``fidelity-<tag>`` and counts only
those.

``--elastic`` (first argument) runs the elastic replay instead: :mod:`benchmarks.sim_fidelity_elastic` (amoebad on
a private cluster against the simulator's run of the same policy; its own options follow).
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.record import Recording
from slurm_amoeba.policy import make_policy
from slurm_amoeba.sim.accounting import load_history
from slurm_amoeba.sim.engine import SimConfig, Simulator, trace_models
from slurm_amoeba.sim.slurmconf import read_slurm_conf
from slurm_amoeba.slurm.runner import run_command

#: Where ``scripts/slurm-cluster`` keeps the local cluster's configuration.
DEFAULT_CONF = Path("/tmp/slurm-amoeba-cluster/etc/slurm.conf")


def draw_workload(jobs: int, seed: int, min_s: int, max_s: int, spread_s: float) -> list[tuple[float, int, int, int]]:
    """(submit offset s, GPUs, duration s, time limit min) per job, in submit order."""
    rng = random.Random(seed)
    drawn = []
    for _ in range(jobs):
        duration = rng.randint(min_s, max_s)
        limit = max(1, -(-duration * rng.choice((1, 2, 3)) // 60))
        drawn.append((rng.uniform(0, spread_s), rng.choice((1, 1, 2, 2, 3, 4)), duration, limit))
    return sorted(drawn)


def submit_all(workload: Sequence[tuple[float, int, int, int]], name: str, env: dict[str, str]) -> list[str]:
    """Submit every job at its offset from now; returns the job ids."""
    started = time.monotonic()
    ids = []
    for offset, gpus, duration, limit in workload:
        time.sleep(max(0.0, offset - (time.monotonic() - started)))
        argv = ["sbatch", "--parsable", "-J", name, f"--gres=gpu:{gpus}", "-t", str(limit), "-o", "/dev/null"]
        result = run_command([*argv, "--wrap", f"sleep {duration}"], env=env, timeout=30)
        ids.append(result.stdout.strip().split(";")[0])
    return ids


def wait_for(ids: Sequence[str], env: dict[str, str], timeout_s: float) -> list[str]:
    """Wait until none of the jobs is pending or running.

    Returns:
        The other jobs that held GPUs meanwhile (``JOBID:gres``): the replay shared the cluster with them.
    """
    deadline = time.monotonic() + timeout_s
    ours = set(ids)
    others: set[str] = set()
    while time.monotonic() < deadline:
        listed = run_command(["squeue", "-h", "-t", "R", "-o", "%i %b"], env=env, timeout=30).stdout.splitlines()
        others.update(
            f"{job}:{gres}"
            for job, _, gres in (line.partition(" ") for line in listed)
            if job not in ours and "gpu" in gres
        )
        pending = run_command(["squeue", "-h", "-j", ",".join(ids), "-o", "%i"], env=env, timeout=30).stdout.split()
        if not pending:
            return sorted(others)
        time.sleep(2)
    raise TimeoutError(f"jobs {','.join(ids)} still queued or running after {timeout_s:.0f} s")


def record(workload: Sequence[tuple[float, int, int, int]], conf: Path, export: Path) -> tuple[Path, list[str]]:
    """Replay a workload on the cluster and export its accounting.

    Args:
        workload: from :func:`draw_workload`.
        conf: the cluster's slurm.conf.
        export: where the ``sacct --json`` export goes.

    Returns:
        The export, and the other jobs that held GPUs meanwhile (:func:`wait_for`).
    """
    env = {**os.environ, "SLURM_CONF": str(conf)}
    ids = submit_all(workload, f"fidelity-{os.getpid()}", env)
    others = wait_for(
        ids, env, timeout_s=max(offset for offset, *_ in workload) + sum(job[2] for job in workload) + 600
    )
    time.sleep(3)  # let slurmdbd record the last ends
    export.write_text(run_command(["sacct", "--json", "-a", "-j", ",".join(ids)], env=env, timeout=60).stdout)
    return export, others


def compare(export: Path, conf: Path) -> dict[str, object]:
    """Replay an export through the ``slurm`` policy with the cluster's settings; the errors against the record."""
    history = load_history(export)
    site = read_slurm_conf(conf)
    config = SimConfig(
        nodes=site.nodes or 4,
        gpus_per_node=site.gpus_per_node or 4,
        interval=1.0,
        restart_cost=0.0,
        grace_time=site.grace_time,
    )
    result = Simulator(history.jobs, make_policy("slurm", **site.knobs), config, trace_models({}, 4)).run()
    simulated = {record.name: record for record in result.jobs}
    starts = []
    jct_errors = []
    for job, recorded_jct, recorded_wait in zip(
        history.jobs, history.recorded_jcts, history.recorded_waits, strict=True
    ):
        record = simulated[job.name]
        if record.first_start is None or record.jct is None:
            continue
        starts.append((job.name, job.submit_time + recorded_wait, record.first_start))
        jct_errors.append(record.jct - recorded_jct)
    pairs = list(itertools.combinations(starts, 2))
    agree = sum(1 for a, b in pairs if (a[1] - b[1]) * (a[2] - b[2]) > 0 or (a[1] == b[1] and a[2] == b[2]))
    recorded_mean = sum(history.recorded_jcts) / len(history.recorded_jcts)
    simulated_mean = sum(result.jcts()) / len(result.jcts())
    start_errors = sorted(abs(sim - rec) for _, rec, sim in starts)
    return {
        "jobs": len(history.jobs),
        "recorded_mean_jct_s": recorded_mean,
        "simulated_mean_jct_s": simulated_mean,
        "mean_jct_error": simulated_mean / recorded_mean - 1,
        "mean_abs_start_error_s": sum(start_errors) / len(start_errors),
        "median_abs_start_error_s": start_errors[len(start_errors) // 2],
        "max_abs_start_error_s": start_errors[-1],
        "mean_abs_jct_error_s": sum(abs(error) for error in jct_errors) / len(jct_errors),
        "pairs": len(pairs),
        "pairs_agreeing": agree / len(pairs) if pairs else 1.0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the replay on the cluster (or, with ``--export``, only the comparison), print and write the figures.

    Returns:
        0 when both goals are met, 1 otherwise.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["--elastic"]:
        from benchmarks import sim_fidelity_elastic

        return sim_fidelity_elastic.main(args_list[1:])
    parser = argparse.ArgumentParser(prog="bench-sim-fidelity", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--min-s", type=int, default=5)
    parser.add_argument("--max-s", type=int, default=60)
    parser.add_argument("--spread-s", type=float, default=120.0)
    parser.add_argument("--slurm-conf", type=Path, default=DEFAULT_CONF)
    parser.add_argument("--export", type=Path, default=None, help="compare a recorded export instead of running")
    parser.add_argument("--json", type=Path, default=Path("bench-sim-fidelity.json"))
    args = parser.parse_args(args_list)
    recording = Recording("replay-rigid", vars(args))
    export = args.export
    others: list[str] = []
    if export is None:
        workload = draw_workload(args.jobs, args.seed, args.min_s, args.max_s, args.spread_s)
        export, others = record(workload, args.slurm_conf, args.json.with_suffix(".sacct.json"))
        if others:
            print(f"other jobs held GPUs during the replay (the simulation knows nothing of them): {' '.join(others)}")
    figures = compare(export, args.slurm_conf)
    figures["other_gpu_jobs"] = len(others)
    for key, value in figures.items():
        print(f"{key:<24} {value:.3f}" if isinstance(value, float) else f"{key:<24} {value}")
    recording.write(args.json, {"export": str(export), **figures})
    good = abs(float(str(figures["mean_jct_error"]))) <= 0.10 and float(str(figures["pairs_agreeing"])) >= 0.90
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
