"""A small decoder-only language model trained with DDP, in two forms: plain.py (torchrun) and elastic.py (amoeba).

    torchrun --nproc-per-node 2 examples/port/plain.py --out /tmp/plain
    amoeba-local -n 2 --at 8:add --at '14:remove w0' -- python examples/port/elastic.py --out /tmp/elastic

The two differ only in the lines docs/port.md lists. Each process appends one JSON
line per step to OUT/steps-PID.jsonl (epoch, global step, rank, world size, loss, the samples it took); rank 0 writes
the final parameters to OUT/final.json and its checkpoint to OUT/checkpoint.pt (loaded again at a restart).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from slurm_amoeba import runtime as amoeba

stop = False


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    global stop
    stop = True


class Tokens(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """Sequences of a noisy counting language: each token is the previous one plus a per-sequence stride."""

    def __init__(self, size: int, length: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(1234)
        start = torch.randint(vocab, (size, 1), generator=generator)
        stride = torch.randint(1, 4, (size, 1), generator=generator)
        clean = (start + stride * torch.arange(length + 1)) % vocab
        noise = torch.rand(size, length + 1, generator=generator) < 0.1
        self.data = torch.where(noise, torch.randint(vocab, (size, length + 1), generator=generator), clean)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.data[index, :-1], self.data[index, 1:], index


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        causal = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, length: int, width: int = 32, heads: int = 2, depth: int = 2) -> None:
        super().__init__()
        self.embed, self.position = torch.nn.Embedding(vocab, width), torch.nn.Parameter(torch.zeros(length, width))
        self.blocks = torch.nn.Sequential(*[Block(width, heads) for _ in range(depth)])
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens) + self.position))


def schedule(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warm-up over ``warmup`` steps, then a cosine decay to 0 at step ``total``."""
    return lambda step: (
        (step + 1) / warmup
        if step < warmup
        else 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1920)
    parser.add_argument("--global-batch", type=int, default=48)
    parser.add_argument("--save-every", type=int, default=20)
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds of extra work per step")
    parser.add_argument("--hold-file", type=Path, help="while this file exists, wait before each step (demos, tests)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, on_sigterm)
    job = amoeba.init_process_group("gloo")
    torch.manual_seed(0)
    dataset = Tokens(args.samples, length=16, vocab=32)
    model = TinyLM(vocab=32, length=16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sampler = amoeba.ElasticSampler(len(dataset), args.global_batch, shuffle=True, seed=7, order="distributed")
    loader = job.data_loader(dataset, sampler)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(10, args.epochs * len(loader)))
    scaler = torch.amp.GradScaler("cpu", enabled=False)  # bf16 needs no loss scaling; fp16 would
    checkpoint, start_epoch, step_in_epoch = args.out / "checkpoint.pt", 0, 0
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        start_epoch, step_in_epoch = saved["epoch"], saved["step_in_epoch"]
    model = job.wrap(model, optimizer, schedulers=[scheduler], scaler=scaler)
    log = (args.out / f"steps-{os.getpid()}.jsonl").open("a")
    for epoch in job.remaining_epochs(args.epochs, start_epoch=start_epoch, step_in_epoch=step_in_epoch):
        sampler.set_epoch(epoch)
        for x, y, index in loader:
            while args.hold_file is not None and args.hold_file.exists():
                time.sleep(0.02)
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            time.sleep(args.step_sleep)
            stats = torch.stack([loss.detach(), torch.tensor(float(stop))])
            dist.all_reduce(stats)  # the global loss for the log, and whether any rank must stop
            step, world = scheduler.last_epoch, dist.get_world_size()
            entry = {
                "epoch": epoch,
                "step": step,
                "rank": dist.get_rank(),
                "world": world,
                "loss": stats[0].item() / world,
            }
            log.write(json.dumps({**entry, "indices": index.tolist(), "time": time.time()}) + "\n")
            if stats[1] > 0 or (step % args.save_every == 0 and dist.get_rank() == 0):
                if dist.get_rank() == 0:
                    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
                    torch.save(
                        {
                            **state,
                            "scheduler": scheduler.state_dict(),
                            "epoch": epoch,
                            "step_in_epoch": step - epoch * len(loader),
                        },
                        checkpoint,
                    )
                if stats[1] > 0:
                    return 0
    if dist.get_rank() == 0:
        params = {name: p.detach().flatten().tolist() for name, p in model.module.named_parameters()}
        (args.out / "final.json").write_text(json.dumps({"step": scheduler.last_epoch, "params": params}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
