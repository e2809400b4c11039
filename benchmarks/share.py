"""``scripts/bench-share``: two jobs on one device, AntMan's way, with CPU cores standing in for the GPU.

A guaranteed job (it owns the device) and an opportunistic one (a sharer: memory-capped, computing in the guaranteed
job's idle time, paced by its step times) run as local processes (``amoeba-local``'s
:class:`~slurm_amoeba.local.LocalJob`, no Slurm), every worker pinned to the same cores
(:mod:`benchmarks.share_worker`). The guaranteed job waits, each step, a share of its compute time without computing
(``--idle``: its input pipeline or communication), which is what a sharer can use. The run:

1. the guaranteed job alone: its exclusive throughput; and alone again beside a neighbour process that only keeps
   the cores awake (1 ms of work every 20 ms): on a virtual machine a core that goes idle between the guaranteed
   job's steps wakes slowly, so a job that idles runs faster beside any neighbour that keeps the core busy, the
   sharer included; ``guaranteed_ratio_vs_warm`` compares with that baseline;
2. the sharer alone, under its memory cap, unpaced: its own throughput;
3. both together: the guaranteed job writes its status and activity files, the sharer computes its micro-batches
   only in the guaranteed job's idle time (the gate) and paces itself by its step times
   (:class:`~slurm_amoeba.runtime.pacing.Pacer`, the safety net); half-way the owner "grows back": the sharer's cap
   is lowered (a smaller micro-batch, more accumulation, the same global batch) and it applies it at a step
   boundary; when the guaranteed job ends the sharer is made guaranteed and finishes unpaced.

The document (:mod:`benchmarks.record`) holds, as medians over ``--rounds`` rounds with their spread,
``guaranteed_ratio`` (the guaranteed job's throughput while the sharer ran, up to the sharer's last step, over its
exclusive one), ``guaranteed_ratio_vs_warm`` (the same over the warm baseline), ``guaranteed_ratio_seen_by_pacer``
(the sharer's controller's own mean estimate), ``pair_gain`` (each job's throughput together over its own alone,
summed), and ``guaranteed_failures`` (its workers that did not finish), ``exactly_once`` (every sample of both jobs
once per epoch, from their ledgers), the sharer's micro-batch before and after the cap was lowered (the cap's; the
one it ran while shared: ``sharer_micro_while_shared``) and the steps it took to apply it (counted from the
harness's call; the loader plans one step ahead), each round's figures. On a CPU the memory cap bounds only the
micro-batch the runtime plans (a prediction from the probed bytes); nothing stops a process from allocating more.
Run: ``scripts/bench-share --json docs/results/share.json`` (``--short``: the integration test's size, one round).
``--live`` runs the same two jobs on the local Slurm cluster instead, placed together by amoebad's policy
(:mod:`benchmarks.share_live`; ``--json docs/results/share-live.json``).
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

from benchmarks import share_live
from benchmarks.backfill import BenchError
from benchmarks.plans import exactly_once
from benchmarks.record import Recording, spread
from slurm_amoeba.core.sharing import ShareRole
from slurm_amoeba.local import LocalJob
from slurm_amoeba.runtime.share import ShareDirective, largest_micro_batch, need_bytes
from slurm_amoeba.runtime.shared_device import CUDA_ALLOWANCE_BYTES
from slurm_amoeba.runtime.view import CoordinatorView

WORKER = Path(__file__).with_name("share_worker.py")
DEADLINE_S = 900.0


def start_job(out: Path, job_id: str, args: argparse.Namespace, steps: int, idle: float) -> LocalJob:
    """A one-worker local job of the benchmark worker, pinned to ``args.cores``, writing into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, str(WORKER), "--out", str(out), "--cores", args.cores, "--width", str(args.width),
        "--global-batch", str(args.global_batch), "--dataset-size", str(steps * args.global_batch),
        "--idle-per-step", str(idle),
    ]  # fmt: skip
    job = LocalJob(
        command,
        initial_workers=1,
        job_id=job_id,
        log_dir=out / "logs",
        env={"PYTHONPATH": str(WORKER.parent.parent), "AMOEBA_DEVICE": args.device},
        collective_timeout_s=120,
        report_timeout_s=60,
        heartbeat_timeout_s=60,
        poll_s=0.02,
    )
    job.start()
    return job


def ledger(out: Path) -> list[dict[str, Any]]:
    """The job's applied steps, in order of their end."""
    entries = [json.loads(line) for path in out.glob("ledger-*.jsonl") for line in path.read_text().splitlines()]
    return sorted(entries, key=lambda e: e["end"])


def rate(entries: list[dict[str, Any]], skip: int = 3) -> float:
    """Samples per second over consecutive steps (the first ``skip`` left out: warm-up)."""
    kept = entries[skip:]
    if len(kept) < 2:
        return 0.0
    samples = sum(int(e["samples"]) for e in kept[1:])
    return samples / max(1e-9, float(kept[-1]["end"]) - float(kept[0]["end"]))


def _at_step(view: CoordinatorView, step: int) -> bool:
    return int(view.progress.get("step", 0)) >= step or view.phase.is_over()


def run_alone(out: Path, job_id: str, args: argparse.Namespace, steps: int, idle: float, cap: int) -> float:
    """Run one job alone (capped at ``cap`` bytes when positive, as in the shared run); its throughput."""
    job = start_job(out, job_id, args, steps, idle)
    try:
        role = ShareRole.GUARANTEED if cap == 0 else ShareRole.OPPORTUNISTIC
        job.coordinator.set_share(ShareDirective(role, memory_cap_bytes=cap))
        result = job.wait(DEADLINE_S)
    finally:
        job.close()
    if result.phase.value != "finished":
        raise RuntimeError(f"job {job_id} ended {result.phase.value}; logs in {out / 'logs'}")
    return rate(ledger(out))


def run_together(work: Path, args: argparse.Namespace, caps: tuple[int, int]) -> dict[str, Any]:
    """Both jobs on the same cores; the sharer paced, capped at ``caps[0]``, lowered to ``caps[1]`` half-way."""
    status = work / "status"
    status.mkdir(parents=True, exist_ok=True)
    owner_status = str(status / "guaranteed-{worker}.json")
    owner: LocalJob | None = None
    sharer = start_job(work / "sharer", "sharer", args, args.sharer_steps, 0.0)
    try:
        # The owner's worker will be w0 (its coordinator's first id): the sharer is told its status file at once.
        partner = owner_status.replace("{worker}", "w0")
        sharer.coordinator.set_share(ShareDirective(ShareRole.OPPORTUNISTIC, caps[0], partner_status_path=partner))
        sharer.wait_for(lambda v: _at_step(v, 1), DEADLINE_S, "the sharer's first step")
        owner = start_job(work / "guaranteed", "guaranteed", args, args.steps, args.idle)
        owner.coordinator.set_share(ShareDirective(ShareRole.GUARANTEED, status_path=owner_status))
        half = args.steps // 2
        owner.wait_for(lambda v: _at_step(v, half), DEADLINE_S, f"the guaranteed job's step {half}")
        lowered_at = time.time()
        sharer.coordinator.set_share(ShareDirective(ShareRole.OPPORTUNISTIC, caps[1], partner_status_path=partner))
        owner_result = owner.wait(DEADLINE_S)
        owner_end = time.time()
        sharer.coordinator.set_share(ShareDirective(ShareRole.GUARANTEED, memory_cap_bytes=caps[1]))
        sharer_result = sharer.wait(DEADLINE_S)
    finally:
        sharer.close()
        if owner is not None:
            owner.close()
    owner_steps, sharer_steps = ledger(work / "guaranteed"), ledger(work / "sharer")
    owner_started = owner_steps[0]["end"] if owner_steps else owner_end
    overlap_sharer = [e for e in sharer_steps if owner_started < e["end"] <= owner_end]
    # The owner's speed while shared: its steps up to the sharer's last one (a sharer that ends first leaves the
    # owner alone for the rest, which is not a shared speed).
    sharer_end = sharer_steps[-1]["end"] if sharer_steps else owner_end
    overlap_owner = [e for e in owner_steps if e["end"] <= sharer_end]
    # The sharer's micro-batch under the first cap: its last step before the cap was lowered (paced while the owner
    # runs, it may finish none between the owner's start and the lowering on a loaded machine).
    # The memory cap's micro-batch (cap_micro), as the worker applied it.
    before = [e for e in sharer_steps if e["end"] <= lowered_at]
    after = [e for e in sharer_steps if e["end"] > lowered_at]
    micro_after = after[-1]["cap_micro"] if after else 0
    applied = next((i for i, e in enumerate(after) if max(e["micro"]) <= micro_after), None)
    reports = [json.loads(p.read_text()) for p in (work / "sharer").glob("report-*.json")]
    return {
        "owner_rate": rate(overlap_owner),
        "owner_steps_while_shared": len(overlap_owner),
        "sharer_rate": rate(overlap_sharer, skip=1),
        "guaranteed_failures": sum(1 for code in owner_result.returncodes.values() if code != 0)
        + (owner_result.phase.value != "finished"),
        "sharer_finished": sharer_result.phase.value == "finished",
        "sharer_micro_before": before[-1]["cap_micro"] if before else 0,
        "sharer_micro_while_shared": statistics.median(max(e["micro"]) for e in overlap_sharer)
        if overlap_sharer
        else 0,
        "sharer_micro_after": micro_after,
        "sharer_steps_to_apply_lower_cap": applied,
        "sharer_steps_while_shared": len(overlap_sharer),
        "sharer_report": reports[0]["share"] if reports else {},
    }


def run_warm_alone(work: Path, args: argparse.Namespace) -> float:
    """The guaranteed job alone beside a neighbour that only keeps the cores awake (about 5 % of them); its
    throughput (see the module docstring: an idle virtual core wakes slowly)."""
    neighbour = subprocess.Popen([sys.executable, str(WORKER), "--keep-warm", "--cores", args.cores])
    try:
        return run_alone(work / "guaranteed-warm", "guaranteed-warm", args, args.steps, args.idle, 0)
    finally:
        neighbour.kill()
        neighbour.wait()


def one_round(args: argparse.Namespace, work: Path, caps: tuple[int, int]) -> dict[str, Any]:
    """The three phases once (and the warm baseline); the round's figures."""
    owner_alone = run_alone(work / "guaranteed-alone", "guaranteed-alone", args, args.steps, args.idle, 0)
    owner_warm = run_warm_alone(work, args)
    sharer_alone = run_alone(work / "sharer-alone", "sharer-alone", args, args.sharer_steps, 0.0, caps[0])
    together = run_together(work / "together", args, caps)
    ratio = together["owner_rate"] / owner_alone if owner_alone else 0.0
    sharer_ratio = together["sharer_rate"] / sharer_alone if sharer_alone else 0.0
    once = all(
        exactly_once(work / run, steps * args.global_batch, 1)
        for run, steps in (
            ("guaranteed-alone", args.steps),
            ("guaranteed-warm", args.steps),
            ("sharer-alone", args.sharer_steps),
            ("together/guaranteed", args.steps),
            ("together/sharer", args.sharer_steps),
        )
    )
    report = together["sharer_report"]
    return {
        "guaranteed_ratio": ratio,
        "guaranteed_ratio_vs_warm": together["owner_rate"] / owner_warm if owner_warm else 0.0,
        "guaranteed_warm_samples_per_s": owner_warm,
        "pair_gain": ratio + sharer_ratio,
        "sharer_ratio": sharer_ratio,
        "guaranteed_ratio_seen_by_pacer": report.get("partner_ratio_mean"),
        "guaranteed_failures": together["guaranteed_failures"],
        "exactly_once": once,
        "guaranteed_alone_samples_per_s": owner_alone,
        "sharer_alone_samples_per_s": sharer_alone,
        "guaranteed_shared_samples_per_s": together["owner_rate"],
        "sharer_shared_samples_per_s": together["sharer_rate"],
        **{k: together[k] for k in ("sharer_micro_before", "sharer_micro_after", "sharer_steps_to_apply_lower_cap")},
        "sharer_steps_while_shared": together["sharer_steps_while_shared"],
        "guaranteed_steps_while_shared": together["owner_steps_while_shared"],
        "sharer_micro_while_shared": together["sharer_micro_while_shared"],
        "sharer_waited_s": report.get("waited_s"),
        "sharer_paused_s": report.get("paused_s"),
        "sharer_layer_yields": report.get("layer_yields"),
        "sharer_finished": together["sharer_finished"],
        "sharer_final_duty": report.get("duty"),
        "sharer_violations": report.get("violations"),
    }


def bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Run ``args.rounds`` rounds; the figures (medians with their spread where a round measures a number)."""
    from benchmarks.share_worker import probe

    profile = probe(args.width)
    share = args.global_batch
    # the sharer's cap: room for a quarter of its share in one pass, then an eighth once the owner grows back
    allowance = CUDA_ALLOWANCE_BYTES if args.device == "cuda" else 0  # what a CUDA worker keeps out of its cap
    base = need_bytes(profile, share, 1) + 1 + allowance
    low, lower = (int(base + profile.memory.per_sample * (share // k - 1)) for k in (4, 8))
    rounds = [one_round(args, work / f"round{i}", (low, lower)) for i in range(args.rounds)]
    figures: dict[str, Any] = {
        "guaranteed_failures": sum(r["guaranteed_failures"] for r in rounds),
        "exactly_once": all(r["exactly_once"] for r in rounds),
        "sharer_finished": all(r["sharer_finished"] for r in rounds),
        "sharer_caps_bytes": [low, lower],
        "sharer_micro_expected": [largest_micro_batch(profile, share, 1, cap - allowance) for cap in (low, lower)],
        "rounds": rounds,
    }
    for key in (
        "guaranteed_ratio",
        "guaranteed_ratio_vs_warm",
        "pair_gain",
        "sharer_ratio",
        "guaranteed_ratio_seen_by_pacer",
    ):
        values = [float(r[key]) for r in rounds if r[key] is not None]
        figures[key] = round(statistics.median(values), 4) if values else None
        figures[f"{key}_spread"] = spread(values)
    for key in ("sharer_micro_before", "sharer_micro_after", "sharer_steps_to_apply_lower_cap"):
        figures[key] = max((r[key] for r in rounds if r[key] is not None), default=None)
    return figures


def spread_note(figures: dict[str, Any], load: tuple[float, float, float], cores: int) -> str:
    """A sentence on how far the rounds agree, and the load they ran under (the alone and together phases run one
    after the other, so other users' load between them moves the ratios)."""

    def span(key: str) -> str:
        values = [r[key] for r in figures["rounds"] if r[key] is not None]
        return f"{min(values):.3f}..{max(values):.3f}" if values else "not measured"

    return (
        f"Over {len(figures['rounds'])} round(s): guaranteed_ratio {span('guaranteed_ratio')}, against the warm "
        f"baseline {span('guaranteed_ratio_vs_warm')}, as the sharer's controller measured it beside its own pauses "
        f"{span('guaranteed_ratio_seen_by_pacer')}; sharer_ratio {span('sharer_ratio')}. The load average was "
        f"{load[0]:.1f} on {cores} usable cores at the start: where the rounds spread wider than 5 %, these figures "
        "do not resolve the 0.95 bound; read the controller's own estimate and the spread with them."
    )


def live(args: argparse.Namespace) -> int:
    """``--live``: one run on the cluster (:func:`benchmarks.share_live.run_live`); exit status 1 when the host
    failed or a ledger does not hold, 3 when the run could not be made (a busy cluster, no sharing partition)."""
    if args.short:
        args.width, args.window, args.settle = 512, 5.0, 2.0
    recording = Recording("share-live", vars(args))
    try:
        figures = share_live.run_live(args)
    except BenchError as exc:
        print(f"bench-share --live: {exc}", file=sys.stderr)
        return 3
    notes = [
        "Local Slurm cluster: fake GPUs whose workers pin themselves to the core of their GPU index; the host's worker "
        "and the sharer's worker beside it share one core, the sharer's own worker another.",
        f"The host idles {args.idle:g} x its compute time per step (its input pipeline): the room on its GPU a sharer "
        "can use. The sharer's two workers split its batch evenly, so its worker beside the host sets the pace of "
        "both: it gains only when that worker gets more of the host's GPU than half of its own.",
    ]
    if args.json:
        recording.write(args.json, figures, notes=notes)
    print(json.dumps(figures, indent=1, sort_keys=True))
    return 0 if figures["guaranteed_failures"] == 0 and figures["exactly_once"] else 1


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit status 1 when the guaranteed job failed or a ledger does not hold."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the result document here")
    parser.add_argument("--short", action="store_true", help="a short run (the unit test's)")
    parser.add_argument("--cores", default=str(min(os.sched_getaffinity(0))), help="cores every worker is pinned to")
    parser.add_argument("--width", type=int, default=1024, help="the MLP's width")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: the jobs share pinned cores (the stand-in); cuda: they share GPU 0 (caps through torch's allocator)",
    )
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=300, help="the guaranteed job's steps (one epoch)")
    parser.add_argument("--sharer-steps", type=int, default=150, help="the sharer's steps (one epoch)")
    parser.add_argument("--idle", type=float, default=1.0, help="the guaranteed job's idle time per step / compute")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three phases (medians are reported)")
    parser.add_argument("--keep", type=Path, help="keep the runs' directories (ledgers, logs) under this one")
    parser.add_argument(
        "--live", action="store_true", help="two jobs on the local Slurm cluster, paired by amoebad (share_live.py)"
    )
    share_live.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.live:
        return live(args)
    if args.short:
        args.width, args.steps, args.sharer_steps, args.rounds = 512, 200, 60, 1
    recording = Recording("share", vars(args))
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        figures = bench(args, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-share-") as work:
            figures = bench(args, Path(work))
    notes = [
        "CPU stand-in: both jobs' workers pinned to the same cores; the memory cap bounds the micro-batch the "
        "runtime plans from the probed bytes, it does not limit what a process allocates (on a GPU the caching "
        "allocator is limited too).",
        f"The guaranteed job idles {args.idle:g} x its compute time per step (input pipeline, communication): the "
        "room a sharer can use.",
        spread_note(figures, recording.load_before, len(os.sched_getaffinity(0))),
    ]
    document = recording.document(figures, notes=notes)
    if args.json:
        recording.write(args.json, figures, notes=notes)
    print(json.dumps(document["figures"], indent=1, sort_keys=True))
    print(f"load before {document['load_before']}, after {document['load_after']}")
    return 0 if figures["guaranteed_failures"] == 0 and figures["exactly_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
