"""``scripts/bench-plans``: the fastest plan that fits, at every size, on a job resized 4 -> 2 -> 1 -> 4.

``examples/tiny_lm.py``'s model (by default 4 blocks of width 128, context 64, global batch 32) trains under
:class:`~slurm_amoeba.runtime.planned.PlannedState` with a per-worker memory budget chosen so that plain data
parallelism (replicated state, the whole share of the global batch in one pass) fits only at 4 workers. The job
runs locally (``amoeba-local``'s :class:`~slurm_amoeba.local.LocalJob`, no Slurm) at 4 workers, shrinks to 2 and
1 and grows back to 4, each after a few steps; a second job runs at 4 workers throughout. The JSON holds the
budget, the plan chosen per generation with its predicted and measured peak per worker and step time,
``peak_over_budget`` (the largest measured peak over the budget, any worker, any generation), ``exactly_once``
(every sample once per epoch), ``param_max_abs_diff`` against the fixed-size run, ``min_feasible_workers`` and the
frontier per size; ``--png`` draws the frontier (memory against step time per size) with the plans chosen.

Run: ``scripts/bench-plans --json docs/results/plans.json --png docs/img/plans-frontier.png`` (``--small`` for
the unit test's size; ``--device cuda`` trains each worker on its own GPU over NCCL, with ``--sizes`` fitting the
GPUs there are). The JSON is a result document (:mod:`benchmarks.record`) rendered into ``docs/results.md#plans``.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.record import Recording
from slurm_amoeba.core.runtime_env import ENV_DEVICE
from slurm_amoeba.local import LocalJob
from slurm_amoeba.runtime.plans import Layout, Linear, ModelProfile, Plan, PlanSpace
from slurm_amoeba.runtime.view import CoordinatorView

WORKER = Path(__file__).with_name("plans_worker.py")
#: The small version (the unit test's): 2 blocks of width 64, context 32, global batch 16.
SMALL = ["--width", "64", "--layers", "2", "--context", "32", "--global-batch", "16", "--sequences", "512"]
FULL = ["--width", "128", "--layers", "4", "--context", "64", "--global-batch", "32", "--sequences", "1024"]
#: The sizes the job moves through.
SIZES = (4, 2, 1, 4)


def start_job(out: Path, model_args: list[str], workers: int, extra: list[str], device: str = "cpu") -> LocalJob:
    """A local job of the benchmark worker writing into ``out`` (``device="cuda"``: one GPU per worker, NCCL)."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(WORKER), "--out", str(out), *model_args, *extra]
    return LocalJob(
        command,
        initial_workers=workers,
        job_id="plans",
        log_dir=out / "logs",
        env={"PYTHONPATH": str(WORKER.parent.parent), ENV_DEVICE: device},
        cuda_devices=list(range(torch.cuda.device_count())) if device == "cuda" else None,
        collective_timeout_s=60,
        report_timeout_s=30,
        heartbeat_timeout_s=30,
        poll_s=0.01,
    )


def _at_step(view: CoordinatorView, step: int) -> bool:
    return int(view.progress.get("step", 0)) >= step


def _at_size_or_over(view: CoordinatorView, size: int) -> bool:
    return view.world_size == size or view.phase.is_over()


def _step(job: LocalJob) -> int:
    return int(job.view().progress.get("step", 0))


def run_resized(
    out: Path, model_args: list[str], extra: list[str], sizes: list[int], every: int, device: str = "cpu"
) -> list[int]:
    """Run at ``sizes[0]`` workers, then move to each next size after ``every`` more steps; return the sizes of
    the generations formed."""
    with start_job(out, model_args, sizes[0], extra, device) as job:
        for size in sizes[1:]:
            view = job.wait_for(lambda v: v.world_size > 0, 300, "the first generation")
            if size < view.world_size:  # a shrink after a few steps; joiners warm up while the job trains anyway
                target = _step(job) + every
                view = job.wait_for(partial(_at_step, step=target), 300, f"step {target}")
            assert view.plan is not None
            current = list(view.plan.members)
            if size < len(current):
                for worker in current[size:]:
                    job.remove(worker)
            else:
                job.add(size - len(current))
            view = job.wait_for(partial(_at_size_or_over, size=size), 300, f"{size} members")
            if view.world_size != size:
                raise RuntimeError(f"the job ended before it reached {size} workers; pace it with --step-delay")
        result = job.wait(600)
    if result.phase.value != "finished":
        raise RuntimeError(f"the job ended {result.phase.value}; logs in {out / 'logs'}")
    return [record.plan.world_size for record in result.view.history]


def run_fixed(out: Path, model_args: list[str], extra: list[str], workers: int, device: str = "cpu") -> None:
    """Run at ``workers`` throughout."""
    with start_job(out, model_args, workers, extra, device) as job:
        result = job.wait(600)
    if result.phase.value != "finished":
        raise RuntimeError(f"the fixed-size job ended {result.phase.value}; logs in {out / 'logs'}")


def exactly_once(out: Path, dataset: int, epochs: int) -> bool:
    """Whether every sample was applied once per epoch (from the workers' ledgers)."""
    seen: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for path in out.glob("ledger-*.jsonl"):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            seen[entry["epoch"]].update(entry["indices"])
    return sorted(seen) == list(range(epochs)) and all(
        sorted(counter) == list(range(dataset)) and set(counter.values()) == {1} for counter in seen.values()
    )


def generations(out: Path) -> dict[int, list[dict[str, Any]]]:
    """Every worker's record per generation."""
    records: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for path in sorted(out.glob("plans-*.json")):
        report = json.loads(path.read_text())
        for record in report["generations"]:
            records[record["generation"]].append({"worker": report["worker"], **record})
    return dict(sorted(records.items()))


def profile_of(out: Path) -> ModelProfile:
    """The profile one worker probed (for the frontier)."""
    raw = json.loads(next(iter(sorted(out.glob("plans-*.json")))).read_text())["profile"]
    return ModelProfile(
        param_bytes=int(raw["param_bytes"]),
        optimizer_bytes=int(raw["optimizer_bytes"]),
        largest_unit_bytes=int(raw["largest_unit_bytes"]),
        units=int(raw["units"]),
        memory=Linear(*raw["memory"]),
        memory_checkpointed=Linear(*raw["memory_checkpointed"]),
        compute=Linear(*raw["compute"]),
        compute_checkpointed=Linear(*raw["compute_checkpointed"]),
        optimizer_s=float(raw["optimizer_s"]),
        link_bytes_per_s=float(raw["link_bytes_per_s"]),
        latency_s=float(raw["latency_s"]),
    )


def probe_here(model_args: list[str], device: str = "cpu") -> ModelProfile:
    """The profile of the benchmark's model, probed in this process on ``device`` as each worker probes it."""
    from examples.tiny_lm import LMConfig, blocks_of, build_placed, lm_loss, markov_text
    from slurm_amoeba.runtime.plan_probe import probe_model
    from slurm_amoeba.runtime.planned import Placement

    def value(flag: str) -> int:
        return int(model_args[model_args.index(flag) + 1])

    config = LMConfig(context=value("--context"), width=value("--width"), layers=value("--layers"))
    rows = markov_text(config, value("--sequences"))

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        built = build_placed(Placement(device=where), config, 100, 3e-3)
        return built.model, built.optimizer

    where = torch.device(device)
    return probe_model(make, lambda m, n: lm_loss(m, rows[:n, :-1], rows[:n, 1:], where), blocks_of)


def ddp_budget(space: PlanSpace, workers: int) -> int:
    """A budget that plain data parallelism (replicated, the whole share in one pass) fits at ``workers`` but not
    at ``workers // 2``: halfway between the two predictions (at one worker, 5 % above what it needs)."""
    at = space.estimate(Plan(Layout.REPLICATED, False, space.share(workers)), workers).peak_bytes
    if workers < 2:
        return int(at * 1.05)
    below = space.estimate(Plan(Layout.REPLICATED, False, space.share(workers // 2)), workers // 2).peak_bytes
    return int(at + (below - at) * 0.5)


def draw(space: PlanSpace, chosen: dict[int, str], path: Path, sizes: list[int]) -> None:
    """The frontier per size (memory against step time), the budget line and the chosen plans."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for n in sizes:
        front = space.frontier(n)
        axes.plot([e.step_time_s for e in front], [e.peak_bytes / 1e6 for e in front], "o-", label=f"{n} workers")
        best = space.best(n)
        if best is not None:
            axes.annotate(best.plan.describe(), (best.step_time_s, best.peak_bytes / 1e6), fontsize=7)
    if space.memory_budget is not None:
        axes.axhline(space.memory_budget / 1e6, color="grey", linestyle="--", label="budget")
    axes.set_xlabel("predicted step time (s)")
    axes.set_ylabel("predicted peak per worker (MB)")
    axes.set_title("plan frontier per worker count (chosen plan labelled)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def bench(
    work: Path,
    *,
    small: bool,
    every: int,
    delay: float,
    sizes: tuple[int, ...] = SIZES,
    device: str = "cpu",
    pins: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Probe, pick the budget, run the resized and the fixed job, and gather the figures.

    Args:
        work: where the jobs write.
        small: the small model (:data:`SMALL`) instead of :data:`FULL`.
        every: steps between resizes.
        delay: seconds each resized step waits (the pace that lets a resize land between steps).
        sizes: the sizes the resized job moves through; the fixed job runs at the first.
        device: ``cpu`` (gloo) or ``cuda`` (one GPU per worker, NCCL).
        pins: plans the resized job uses at given sizes instead of the fastest that fits (the worker's
            ``--pin``, e.g. ``"2=sharded+ckpt/mb4"``).
    """
    model_args = SMALL if small else FULL
    epochs = 2
    largest = max(sizes)
    dataset = int(model_args[model_args.index("--sequences") + 1])
    common = ["--epochs", str(epochs), "--max-workers", str(largest)]
    batch = int(model_args[model_args.index("--global-batch") + 1])
    budget = ddp_budget(PlanSpace(probe_here(model_args, device), batch), largest)
    extra = [*common, "--memory-budget", str(budget)]
    run_fixed(work / "fixed", model_args, extra, sizes[0], device)
    paced = [*extra, "--step-delay", str(delay), *(f"--pin={pin}" for pin in pins)]
    formed = run_resized(work / "resized", model_args, paced, list(sizes), every, device)
    records = generations(work / "resized")
    peaks = [r["peak_bytes"] for rs in records.values() for r in rs if r["peak_bytes"]]
    fixed = torch.load(work / "fixed" / "params.pt", weights_only=True)
    resized = torch.load(work / "resized" / "params.pt", weights_only=True)
    diff = max(float((fixed[k] - resized[k]).abs().max()) for k in fixed)
    space = PlanSpace(profile_of(work / "resized"), batch, budget)
    per_generation = []
    for generation, rs in records.items():
        times = [r["step_s"] - delay for r in rs if r["step_s"] is not None]  # less the harness's pace
        per_generation.append(
            {
                "generation": generation,
                "world_size": rs[0]["world_size"],
                "plan": rs[0]["plan"],
                "predicted_peak_bytes": rs[0]["predicted_peak_bytes"],
                "peak_bytes": max(r["peak_bytes"] for r in rs),
                "predicted_step_s": rs[0]["predicted_step_s"],
                "step_s": sorted(times)[len(times) // 2] if times else None,
            }
        )
    return {
        "budget_bytes": budget,
        "sizes": formed,
        "plans": per_generation,
        "peak_over_budget": max(peaks) / budget if peaks else None,
        "exactly_once": exactly_once(work / "resized", dataset, epochs)
        and exactly_once(work / "fixed", dataset, epochs),
        "param_max_abs_diff": diff,
        "min_feasible_workers": space.min_feasible_workers(largest),
        "ddp_fits_at": [
            n
            for n in sorted(set(sizes))
            if space.fits(space.estimate(Plan(Layout.REPLICATED, False, space.share(n)), n))
        ],
        "frontier": {str(n): [e.to_json() for e in space.frontier(n)] for n in sorted(set(sizes))},
        "profile": space.profile.to_json(),
        "_space": space,
    }


def generation_table(results: dict[str, Any]) -> str:
    """The plan chosen per generation, predicted against measured, as a Markdown table."""
    rows = [
        "| generation | workers | plan | predicted peak (MB) | measured peak (MB) | predicted step (s) "
        "| measured step (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in results["plans"]:
        measured = "-" if g["step_s"] is None else f"{g['step_s']:.3f}"
        rows.append(
            f"| {g['generation']} | {g['world_size']} | {g['plan']} | {g['predicted_peak_bytes'] / 1e6:.3f} | "
            f"{g['peak_bytes'] / 1e6:.3f} | {g['predicted_step_s']:.3f} | {measured} |"
        )
    return "\n".join(rows)


def summary_table(results: dict[str, Any]) -> str:
    """The run's figures (budget, peak over budget, exactly once, parameters against the fixed run) as a table."""
    keys = ["budget_bytes", "sizes", "peak_over_budget", "exactly_once", "param_max_abs_diff"]
    keys += ["min_feasible_workers", "ddp_fits_at"]
    return "\n".join(["| figure | value |", "|---|---|", *(f"| `{key}` | {results[key]} |" for key in keys)])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the tables; write the result document (and the PNG)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the result document here (docs/results/plans.json)")
    parser.add_argument("--png", type=Path, help="draw the frontier here")
    parser.add_argument("--small", action="store_true", help="the unit test's small model")
    parser.add_argument("--every", type=int, default=4, help="steps between resizes")
    parser.add_argument("--step-delay", type=float, default=0.2, help="seconds each resized step waits (pace)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: one GPU per worker, NCCL")
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="the sizes the job moves through (default 4,2,1,4)"
    )
    parser.add_argument("--work", type=Path, help="keep the jobs' files here (default: a temporary directory)")
    args = parser.parse_args(argv)
    sizes = tuple(int(size) for size in args.sizes.split(","))
    recording = Recording("plans", vars(args))
    with tempfile.TemporaryDirectory(prefix="bench-plans-") as tmp:
        results = bench(
            args.work or Path(tmp),
            small=args.small,
            every=args.every,
            delay=args.step_delay,
            sizes=sizes,
            device=args.device,
        )
    space: PlanSpace = results.pop("_space")
    tables = {"Plan per generation, predicted and measured": generation_table(results), "Run": summary_table(results)}
    for table in tables.values():
        print(table, end="\n\n")
    notes = [
        f"The resized job runs at {args.device} ({'one GPU per worker, NCCL' if args.device == 'cuda' else 'gloo'}) "
        f"with a pace of {args.step_delay} s per step, subtracted from the measured step times; the fixed-size job "
        f"runs at {sizes[0]} workers unpaced. Predicted step times come from one process's probe; on a CPU the "
        "workers share the machine's cores, which the probe does not see. Peaks are counted by torch's MemTracker "
        "over each generation's first two steps, the same counter the probe uses."
    ]
    if args.json:
        document = recording.write(args.json, results, tables=tables, notes=notes)
        print(json.dumps(document, indent=1))
    if args.png:
        draw(space, {}, args.png, sorted(set(sizes)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
