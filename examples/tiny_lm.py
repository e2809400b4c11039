"""A small transformer language model trained elastically with FSDP2, AdamW, warm-up + cosine, clipping and bf16.

The model is randomly initialised from :class:`LMConfig` (nothing is downloaded); the text is generated here: a
seeded order-2 Markov chain over a 64-token vocabulary, so the loss has something to learn (it falls from about
4.2 towards the chain's entropy). The loop keeps its ordinary shape — forward under ``torch.autocast``, backward,
then ``clip_grad_norm_``, ``optimizer.step()`` and ``scheduler.step()`` inside ``with state.sync():`` — and the model
is sharded with ``fully_shard`` over each generation's members by
:class:`~slurm_amoeba.runtime.fsdp.ShardedState`, which re-shards it in memory when workers join or leave.

Run it locally (2 workers, grow to 3 at 20 s, one leaves at 40 s)::

    amoeba-local -n 2 --max-workers 4 --at 20:add --at '40:remove w0' -- python examples/tiny_lm.py --epochs 4

Each worker prints its end; rank 0 prints the loss every 10 steps.

With ``--plans auto --memory-budget BYTES`` the state is a :class:`~slurm_amoeba.runtime.planned.PlannedState`:
each generation trains with the fastest plan (replicated or sharded, checkpointing on or off, micro-batch) that
fits the budget at its size (docs/plans.md)::

    amoeba-local -n 4 --at '30:remove w3' --at '30:remove w2' -- \
        python examples/tiny_lm.py --plans auto --memory-budget 12000000 --width 128 --layers 4
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from slurm_amoeba import runtime as amoeba
from slurm_amoeba.runtime.fsdp import Built, ShardedState
from slurm_amoeba.runtime.planned import Placement, PlannedState


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """The model's size."""

    vocab: int = 64
    context: int = 32
    width: int = 64
    heads: int = 4
    layers: int = 2


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.width)
        self.attention = nn.MultiheadAttention(config.width, config.heads, batch_first=True)
        self.norm2 = nn.LayerNorm(config.width)
        self.mlp = nn.Sequential(
            nn.Linear(config.width, 4 * config.width), nn.GELU(), nn.Linear(4 * config.width, config.width)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, attn_mask=mask, need_weights=False)[0]
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class TinyLM(nn.Module):
    """Token and position embeddings, a few blocks, a final norm and an output projection."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(config.vocab, config.width)
        self.positions = nn.Embedding(config.context, config.width)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        mask = torch.triu(torch.full((length, length), float("-inf"), device=tokens.device), diagonal=1)
        x = self.tokens(tokens) + self.positions(torch.arange(length, device=tokens.device))
        for block in self.blocks:
            x = block(x, mask)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def markov_text(config: LMConfig, sequences: int, seed: int = 0) -> torch.Tensor:
    """``sequences`` rows of ``context + 1`` tokens from a seeded order-2 Markov chain with sparse transitions."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(config.vocab, config.vocab, config.vocab, generator=generator) * 3.0
    table = torch.softmax(logits, dim=-1)
    rows = torch.empty(sequences, config.context + 1, dtype=torch.long)
    rows[:, :2] = torch.randint(config.vocab, (sequences, 2), generator=generator)
    for t in range(2, config.context + 1):
        probs = table[rows[:, t - 2], rows[:, t - 1]]
        rows[:, t] = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return rows


def build(mesh: DeviceMesh | None, config: LMConfig, total_steps: int, lr: float) -> Built:
    """The model (each block, then the root, sharded over ``mesh``), AdamW, and warm-up + cosine; seeded."""
    torch.manual_seed(0)
    model = TinyLM(config)
    if mesh is not None:
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return optimize(model, total_steps, lr)


def build_placed(placement: Placement, config: LMConfig, total_steps: int, lr: float) -> Built:
    """The model laid out as the generation's plan says (``--plans auto``), AdamW, and warm-up + cosine; seeded."""
    torch.manual_seed(0)
    model = TinyLM(config)
    placement.apply(model, model.blocks)
    return optimize(model, total_steps, lr)


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The model's transformer blocks (what a plan shards and checkpoints one at a time)."""
    return list(model.get_submodule("blocks").children())


def optimize(model: nn.Module, total_steps: int, lr: float) -> Built:
    """AdamW over ``model`` and its warm-up + cosine schedule."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, total_steps // 10)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return Built(model, optimizer, [torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)])


def lm_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The mean next-token cross-entropy of ``model`` on a micro-batch (forward under bf16 autocast)."""
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = model(inputs.to(device))
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.to(device).flatten())


def make_state(args: argparse.Namespace, config: LMConfig, rows: torch.Tensor, device: torch.device) -> ShardedState:
    """The state: FSDP2 at every size, or with ``--plans auto`` the fastest plan within ``--memory-budget``."""
    sampler = amoeba.ElasticSampler(len(rows), args.global_batch, seed=1, max_local_batch=args.max_local_batch)
    total_steps = args.epochs * -(-len(rows) // args.global_batch)
    if args.plans != "auto":
        return ShardedState(lambda mesh: build(mesh, config, total_steps, args.lr), sampler, extras={"loss": 0.0})
    return PlannedState(
        lambda placement: build_placed(placement, config, total_steps, args.lr),
        sampler,
        blocks=blocks_of,
        probe_loss=lambda model, n: lm_loss(model, rows[:n, :-1], rows[:n, 1:], device),
        extras={"loss": 0.0},
        memory_budget=args.memory_budget,
        max_workers=args.max_workers,
        device=device,
    )


def main(argv: list[str] | None = None) -> int:
    """Train; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--sequences", type=int, default=512, help="generated training sequences")
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--max-local-batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--plans", choices=["fsdp", "auto"], default="fsdp", help="auto: the fastest plan per size")
    parser.add_argument("--memory-budget", type=int, default=None, help="bytes per worker (with --plans auto)")
    parser.add_argument("--max-workers", type=int, default=8, help="the largest size --plans auto reports")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--context", type=int, default=32)
    args = parser.parse_args(argv)

    runtime = amoeba.init()
    config = LMConfig(context=args.context, width=args.width, layers=args.layers)
    rows = markov_text(config, args.sequences)
    data = torch.utils.data.TensorDataset(rows[:, :-1], rows[:, 1:])
    state = make_state(args, config, rows, runtime.device)
    loader = amoeba.ElasticDataLoader(data, state.sampler)

    def train(state: amoeba.TorchState) -> None:
        while state.epoch < args.epochs:
            for step in loader:
                model, loss_sum = state.model, 0.0
                for (inputs, targets), weight in step:
                    loss = lm_loss(model, inputs, targets, runtime.device)
                    torch.autograd.backward(loss * weight)
                    loss_sum += float(loss.detach()) * weight
                with state.sync():  # gradients are the global batch's here
                    nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                    state.optimizer.step()
                    state.schedulers[0].step()
                state.extras["loss"] = loss_sum  # this rank's share of the global mean loss
                if runtime.rank == 0 and state.step_index % 10 == 0:
                    print(
                        f"step {state.step_index} world {runtime.world_size} loss~{loss_sum * runtime.world_size:.3f}",
                        flush=True,
                    )
                if state.step_index % 20 == 0:
                    state.commit()

    result = amoeba.run(train, state)
    print(
        f"worker {runtime.worker_id}: {result.status.value}, generations {list(result.generations)}, "
        f"device {runtime.device}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
