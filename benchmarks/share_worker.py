"""The training process of ``scripts/bench-share``: an MLP on synthetic data, pinned to given cores, sharing them.

It pins itself to ``--cores`` first (``os.sched_setaffinity``, before torch starts threads: the CPU stand-in for a
shared GPU; ``--cores gpu``: the core of the GPU Slurm gave it, :func:`gpu_core`, so that workers of two jobs on one
fake GPU of the local cluster share one core, as ``bench-share --live`` runs them), probes its model's bytes
(:func:`~slurm_amoeba.runtime.plan_probe.probe_model`, so the memory cap turns into a micro-batch the same way the
harness predicts it) and trains under ``TorchState(..., sharing=SharedDevice)``: the directive comes from its
coordinator. ``--idle-per-step`` makes each step wait that share of its compute time
without computing, after the step (the next step's input pipeline a real job waits on; what leaves a device idle for
a sharer to use). Its micro-batches go through ``SharedDevice.micro_batches`` and its wait through
``SharedDevice.idle``: a guaranteed worker publishes there when it computes (on the CPU stand-in the runtime's own
work between steps is the "device's" too, so only the wait counts as idle), a sharer waits there for the owner's
idle time. It writes what :mod:`benchmarks.share` reads: a
ledger line per applied step (epoch, step, indices, micro-batches, the memory cap's micro-batch, wall-clock end)
and, at the end, its sharing report.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported only after the process pinned itself to its cores
    import torch
    from torch.utils.data import TensorDataset

    from slurm_amoeba.runtime.plans import ModelProfile


def build(width: int, size: int) -> tuple[torch.nn.Module, TensorDataset]:
    """The benchmark's model and dataset (seeded)."""
    import torch

    torch.manual_seed(5)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    )  # fmt: skip
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(size, 64, generator=generator)
    return model, torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))


def probe(width: int) -> ModelProfile:
    """The model's measured bytes per micro-batch (what the harness and the worker both use)."""
    import torch

    from slurm_amoeba.runtime.plan_probe import probe_model

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        model, _ = build(width, 16)
        return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def loss(model: torch.nn.Module, samples: int) -> torch.Tensor:
        value: torch.Tensor = model(torch.ones(samples, 64)).square().mean()
        return value

    rng = torch.get_rng_state()
    try:
        return probe_model(make, loss, lambda m: [m], repeats=1)
    finally:
        torch.set_rng_state(rng)


def gpu_core(env: dict[str, str] | None = None) -> int:
    """The core that stands in for this process's GPU: the first index of ``CUDA_VISIBLE_DEVICES`` (which Slurm sets
    for a ``gpu`` or ``shard`` allocation) modulo the cores this process may use, in their order.

    Raises:
        SystemExit: no GPU index in the environment (the job asked for no GPU or shard).
    """
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES", "")
    first = value.split(",")[0]
    if not first.isdigit():
        raise SystemExit(
            f"--cores gpu: CUDA_VISIBLE_DEVICES is {value!r}, not a GPU index; ask Slurm for a GPU or a shard"
        )
    cores = sorted(os.sched_getaffinity(0))
    return cores[int(first) % len(cores)]


def keep_warm(busy_s: float = 0.001, every_s: float = 0.02) -> None:
    """Compute ``busy_s`` every ``every_s``, forever: a neighbour that keeps a virtual core from going idle while using
    about 5 % of it (what the harness's warm exclusive baseline runs beside)."""
    while True:
        started = time.perf_counter()
        while time.perf_counter() - started < busy_s:
            pass
        time.sleep(every_s)


def main(argv: list[str] | None = None) -> int:
    """Train (or, with ``--keep-warm``, only keep the cores awake); see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep-warm", action="store_true", help="no training: run keep_warm() on the cores")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cores", default="0", help="comma-separated cores to pin to, or gpu (see gpu_core)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--dataset-size", type=int, default=2048)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--idle-per-step", type=float, default=0.0, help="idle time per step, as a share of compute")
    args = parser.parse_args(argv)
    cores = {gpu_core()} if args.cores == "gpu" else {int(c) for c in args.cores.split(",")}
    os.sched_setaffinity(0, cores)
    if args.keep_warm:
        keep_warm()
    if args.out is None:
        parser.error("--out is required to train")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("share_worker").info(
        "pinned to cores %s (CUDA_VISIBLE_DEVICES=%s)", sorted(cores), os.environ.get("CUDA_VISIBLE_DEVICES", "")
    )

    import torch

    from slurm_amoeba import runtime as amoeba
    from slurm_amoeba.runtime.shared_device import SharedDevice

    torch.set_num_threads(1)
    runtime = amoeba.init()
    profile = probe(args.width)
    model, data = build(args.width, args.dataset_size)
    device = runtime.device  # AMOEBA_DEVICE=cuda (bench-share --device cuda): both jobs on the one GPU
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sampler = amoeba.ElasticSampler(len(data), args.global_batch, seed=3)
    loader = amoeba.ElasticDataLoader(data, sampler)
    # a job that opted in through Slurm (AMOEBA_SHARE) starts as its agent says (a guaranteed job with its status
    # file for sharers beside it); the harness's local jobs get their directives from their coordinators
    sharing = SharedDevice.for_job(os.environ) or SharedDevice()
    sharing.profile = profile
    state = amoeba.TorchState(model, optimizer, sampler, sharing=sharing)
    ledger_path = args.out / f"ledger-{runtime.worker_id}.jsonl"
    loss_fn = torch.nn.MSELoss()

    def train(state: amoeba.TorchState) -> None:
        with open(ledger_path, "a") as ledger:
            while state.epoch < args.epochs:
                for step in loader:
                    started = time.perf_counter()
                    for (x, y), weight in sharing.micro_batches(step):  # the owner's activity; a sharer's gate
                        (loss_fn(model(x.to(device)), y.to(device)) * weight).backward()
                    if device.type == "cuda":
                        torch.cuda.synchronize()  # the step's compute is the device's, not the launch's
                    computed = time.perf_counter() - started
                    state.step()
                    entry = {
                        "generation": runtime.generation,
                        "step": step.index,
                        "epoch": step.epoch,
                        "indices": step.indices,
                        "samples": step.assignment.plan.step_samples,
                        "micro": [len(m) for m in step.assignment.micro_indices],
                        "cap_micro": sharing.micro_batch,  # the memory cap's (0: none)
                        "compute_s": computed,
                        "end": time.time(),
                    }
                    ledger.write(json.dumps(entry) + "\n")
                    ledger.flush()
                    if args.idle_per_step:  # the next step's input pipeline: the device idles, and says so
                        with sharing.idle():
                            time.sleep(args.idle_per_step * computed)

    result = amoeba.run(train, state)
    report = {"status": result.status.value, "share": sharing.report}
    (args.out / f"report-{runtime.worker_id}.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
