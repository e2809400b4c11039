"""The training process of ``scripts/bench-runtime``: one small model, four ways to run it.

``--mode amoeba`` trains through the elastic runtime; ``--mode ddp`` is a plain ``DistributedDataParallel`` loop
(the baseline for the step-time overhead); ``--mode torchrun`` is the same DDP loop written for torchrun's elastic
restarts (resume from a checkpoint file on every start); ``--mode stopresume`` is the DDP loop that writes a
checkpoint on SIGTERM and exits, to be relaunched at a new size. Every mode records the wall-clock end of each
step with the world size, so the harness (:mod:`benchmarks.runtime`) can measure pauses the same way for all.

The model is an MLP of 1.06 M parameters on synthetic data, global batch 64, as in docs/TORCH-FACTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

GLOBAL_BATCH = 64
#: Set to 1 by ``bench-runtime --warm-up``: the runtime's workers pass ``TorchState(warm_up=...)``.
WARM_UP_VARIABLE = "AMOEBA_BENCH_WARM_UP"
DATASET = 8192
FEATURES = 512
CLASSES = 10


def build_model() -> torch.nn.Module:
    """The benchmark MLP (1.06 M parameters), the same in every process."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, CLASSES),
    )


def build_dataset() -> TensorDataset:
    """Synthetic classification data, seeded."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(DATASET, FEATURES, generator=generator)
    y = torch.randint(0, CLASSES, (DATASET,), generator=generator)
    return TensorDataset(x, y)


class StepLog:
    """Step end times and the process's CPU time then, kept in memory (dumped at exit) or also written per step
    (``flush``)."""

    def __init__(self, path: Path, flush: bool) -> None:
        self.path = path
        self.records: list[list[float]] = []
        self.stream: TextIO | None = open(path, "a") if flush else None  # noqa: SIM115 - closed in dump()

    def record(self, step: float, world_size: int, generation: int = 0, working: int | None = None) -> None:
        # Then the process's CPU time: what the step cost in work, whatever the machine's scheduling added to it;
        # last the ranks that took samples in the step (fewer than the world in a joiner's idle first step).
        entry = [time.time(), float(step), float(world_size), float(generation), time.process_time()]
        entry.append(float(world_size if working is None else working))
        self.records.append(entry)
        if self.stream is not None:
            self.stream.write(json.dumps(entry) + "\n")
            self.stream.flush()

    def dump(self) -> None:
        if self.stream is not None:
            self.stream.close()
            return
        with open(self.path, "a") as out:
            for entry in self.records:
                out.write(json.dumps(entry) + "\n")


def run_amoeba(args: argparse.Namespace) -> None:
    """Train through the elastic runtime until ``--steps`` global steps or the store's ``bench/stop_at``."""
    from slurm_amoeba import runtime as amoeba

    runtime = amoeba.init()
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataset = build_dataset()
    sampler = amoeba.ElasticSampler(len(dataset), GLOBAL_BATCH, seed=1)
    loader = amoeba.ElasticDataLoader(dataset, sampler)
    loss_fn = torch.nn.CrossEntropyLoss()
    x0, y0 = dataset[: GLOBAL_BATCH // 2]  # a joiner's local batch at 2 workers

    def warm_up(net: torch.nn.Module) -> None:
        loss_fn(net(x0), y0).backward()

    rehearse = os.environ.get(WARM_UP_VARIABLE) == "1"
    state = amoeba.TorchState(model, optimizer, sampler, warm_up=warm_up if rehearse else None)
    log = StepLog(args.out / f"steps-amoeba-{runtime.worker_id}.jsonl", args.flush)
    limit = [args.steps]

    block = args.compare_ddp
    ddp_log = StepLog(args.out / f"steps-ddpblock-{runtime.worker_id}.jsonl", False)

    def ddp_block(count: int) -> None:
        """``count`` steps of a plain DDP loop on a copy of the model, in the same processes and process group."""
        twin = build_model()
        twin.load_state_dict(model.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(twin)
        twin_optimizer = torch.optim.SGD(twin.parameters(), lr=0.01, momentum=0.9)
        world, rank = runtime.world_size, runtime.rank
        ddp_sampler: DistributedSampler[Any] = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=2)
        batches = iter(DataLoader(dataset, batch_size=GLOBAL_BATCH // world, sampler=ddp_sampler))
        for _ in range(count):
            x, y = next(batches)
            twin_optimizer.zero_grad()
            loss_fn(ddp(x), y).backward()
            twin_optimizer.step()
            ddp_log.record(state.step_index, world, runtime.generation)

    def train(state: amoeba.TorchState) -> None:
        while state.step_index < limit[0]:
            for step in loader:
                for (x, y), weight in step:
                    (loss_fn(model(x), y) * weight).backward()
                state.step()
                idle = runtime.idle_ranks(state.step_index - 1)  # the step just ended (the index has advanced)
                log.record(state.step_index, runtime.world_size, runtime.generation, runtime.world_size - len(idle))
                if block and state.step_index % block == 0:
                    ddp_block(block)
                    log.record(-1.0, runtime.world_size, runtime.generation)  # marks the end of a DDP block
                if args.commit_every and state.step_index % args.commit_every == 0:
                    state.commit()
                if state.step_index % 10 == 0 and runtime.store.check(["bench/stop_at"]):
                    limit[0] = min(limit[0], int(runtime.store.get("bench/stop_at")))
                if state.step_index >= limit[0]:
                    return

    result = amoeba.run(train, state)
    log.dump()
    ddp_log.dump()
    timeline = [dataclasses.asdict(row) for row in result.timeline]  # where a switch's time went, per generation
    (args.out / f"timeline-{runtime.worker_id}.json").write_text(json.dumps(timeline))
    marks = getattr(runtime, "switch_marks", [])  # absent in a runtime without the marks (a baseline tree)
    (args.out / f"marks-{runtime.worker_id}.json").write_text(json.dumps(marks))


def _checkpoint_path(args: argparse.Namespace) -> Path:
    out: Path = args.out
    return out / "checkpoint.pt"


def run_ddp(args: argparse.Namespace) -> None:
    """A plain DDP loop (``ddp``), or the same loop restarted by torchrun or relaunched after a stop."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    start = 0
    checkpoint = _checkpoint_path(args)
    if args.mode != "ddp" and checkpoint.exists():
        saved = torch.load(checkpoint, weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start = int(saved["step"])
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    dataset = build_dataset()
    sampler: DistributedSampler[Any] = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world, sampler=sampler)
    stop = [False]
    if args.mode == "stopresume":
        signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    tag = f"{args.mode}-rank{rank}-{os.getpid()}"
    log = StepLog(args.out / f"steps-{tag}.jsonl", args.flush)
    loss_fn = torch.nn.CrossEntropyLoss()
    step = start
    epoch = 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(ddp(x), y).backward()
            optimizer.step()
            step += 1
            log.record(step, world)
            should_stop = args.mode == "stopresume" and stop[0]
            if args.mode == "stopresume":
                flag = torch.tensor([1.0 if should_stop else 0.0])
                dist.all_reduce(flag)
                should_stop = bool(flag.item() > 0)
            periodic = args.mode == "torchrun" and step % args.checkpoint_every == 0
            if rank == 0 and (should_stop or periodic):
                tmp = checkpoint.with_suffix(".tmp")
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
                tmp.replace(checkpoint)
            if should_stop:
                dist.barrier()
                log.dump()
                dist.destroy_process_group()
                return
            if step >= args.steps:
                break
        epoch += 1
    log.dump()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=["amoeba", "ddp", "torchrun", "stopresume"], required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=10**9)
    parser.add_argument("--flush", action="store_true", help="write each step's time at once")
    parser.add_argument("--commit-every", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument(
        "--compare-ddp", type=int, default=0, metavar="N", help="amoeba: after every N steps, N plain DDP steps"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.mode == "amoeba":
        run_amoeba(args)
    else:
        run_ddp(args)
    return 0


def read_steps(path: Path) -> list[list[float]]:
    """The step records of one file (tolerates a torn last line of a killed process)."""
    records: list[list[Any]] = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


if __name__ == "__main__":
    sys.exit(main())
