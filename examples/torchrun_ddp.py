"""A plain torchrun DDP training script: nothing in it knows slurm_amoeba.

It reads the torchrun environment (through ``init_process_group``'s default ``env://``), wraps its model in
``DistributedDataParallel``, splits the data with ``DistributedSampler`` and saves and loads its own checkpoint. It
runs as it is under ``torchrun --nproc-per-node 2 examples/torchrun_ddp.py`` and, elastically, under

    amoeba-local --restart -n 1 --at 10:add --at '20:remove w0' -- python examples/torchrun_ddp.py --checkpoint ck.pt
    amoeba-run --restart python examples/torchrun_ddp.py --checkpoint ck.pt        # in a Slurm batch script

which restart it at every resize with the new ``RANK``/``WORLD_SIZE``/``MASTER_*`` (docs/runtime.md, "Unmodified
torchrun scripts"). What makes it restartable is what a torchrun script on preemptible nodes already needs:

* SIGTERM (or the file named by ``AMOEBA_STOP_FILE``, when set) asks it to stop. Every rank gets the signal at about
  the same time but not at the same step, so the ranks agree on the step (an all-reduce of the flag) before rank 0
  saves the checkpoint and every rank exits 0.
* The checkpoint holds the global step within the epoch. The global batch is fixed (``--global-batch``; each rank
  takes its share), and ``DistributedSampler`` gives step ``i`` of an epoch the same global samples whatever the
  world size, so a restarted run skips the steps already done and goes on with exactly the samples that remain.

Rank 0 writes the final parameters, the loss and the history of restarts to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

_stop_requested = False


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _stop_requested
    _stop_requested = True


def build_dataset(size: int) -> TensorDataset:
    """y = tanh(x . w) + noise, in float64, the same on every rank."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(size, 8, generator=generator, dtype=torch.float64)
    w = torch.randn(8, 1, generator=generator, dtype=torch.float64)
    return TensorDataset(x, torch.tanh(x @ w) + 0.05 * torch.randn(size, 1, generator=generator, dtype=torch.float64))


def build_model() -> torch.nn.Module:
    """The same initial model on every rank."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).double()


def build_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """SGD with momentum (its state is part of the checkpoint)."""
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def stop_agreed() -> bool:
    """Whether any rank was asked to stop (SIGTERM or the stop file): a collective, called by every rank each step."""
    stop_file = os.environ.get("AMOEBA_STOP_FILE", "")
    wanted = _stop_requested or bool(stop_file and os.path.exists(stop_file))
    flag = torch.tensor([1.0 if wanted else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0


def save(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, progress: dict[str, Any]) -> None:
    """Write the checkpoint atomically (rank 0 only)."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), **progress}, tmp)
    os.replace(tmp, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True, help="checkpoint file (loaded when it exists)")
    parser.add_argument("--out", type=Path, default=None, help="rank 0 writes the result here (JSON)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--dataset-size", type=int, default=240)
    parser.add_argument("--global-batch", type=int, default=24)
    parser.add_argument("--save-every", type=int, default=10, help="steps between periodic checkpoints")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of extra work per step")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world:
        print(f"--global-batch {args.global_batch} does not split over {world} ranks", file=sys.stderr)
        return 2
    model = build_model()
    optimizer = build_optimizer(model)
    progress: dict[str, Any] = {"epoch": 0, "step_in_epoch": 0, "step": 0, "loss": 0.0, "history": [], "done": False}
    if args.checkpoint.exists():
        checkpoint = torch.load(args.checkpoint, map_location="cpu")
        model.load_state_dict(checkpoint.pop("model"))
        optimizer.load_state_dict(checkpoint.pop("optimizer"))
        progress.update(checkpoint)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    progress["history"].append([restart, world, progress["step"]])
    print(f"rank {rank}/{world}: restart {restart}, from step {progress['step']}", flush=True)
    ddp = DistributedDataParallel(model)
    loss_fn = torch.nn.MSELoss()
    dataset = build_dataset(args.dataset_size)
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=1, drop_last=True
    )
    loader = DataLoader(dataset, batch_size=args.global_batch // world, sampler=sampler, drop_last=True)
    while progress["epoch"] < args.epochs and not progress["done"]:
        sampler.set_epoch(progress["epoch"])
        for index, (x, y) in enumerate(loader):
            if index < progress["step_in_epoch"]:
                continue  # done before the restart
            optimizer.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            optimizer.step()
            progress.update(step_in_epoch=index + 1, step=progress["step"] + 1, loss=loss.item())
            time.sleep(args.step_sleep)
            if stop_agreed():
                if rank == 0:
                    save(args.checkpoint, model, optimizer, progress)
                print(f"rank {rank}/{world}: stopped at step {progress['step']}", flush=True)
                dist.destroy_process_group()
                return 0
            if rank == 0 and progress["step"] % args.save_every == 0:
                save(args.checkpoint, model, optimizer, progress)
        progress.update(epoch=progress["epoch"] + 1, step_in_epoch=0)
    progress["done"] = True
    if rank == 0:
        save(args.checkpoint, model, optimizer, progress)
        if args.out is not None:
            params = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
            result = {"params": params, **{k: progress[k] for k in ("step", "loss", "history")}}
            args.out.write_text(json.dumps(result))
    print(f"rank {rank}/{world}: finished at step {progress['step']}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
