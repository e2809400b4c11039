"""The elastic job of the elastic fidelity replay (:mod:`benchmarks.sim_fidelity_elastic`): known work, known scaling.

Each worker trains a tiny model through slurm_amoeba's runtime (so grows and shrinks take the real path: satellites,
warm-up, membership at a step boundary, the data position re-split) for ``--steps`` steps of the global batch, and
every step sleeps ``t1 / n ** alpha`` seconds (``--t1``, ``--alpha``; ``n`` the job's workers at that step): the
step time the simulator is given for the job, with next to no CPU used. Rank 0 prints a line ``REPLAY <unix time>
<workers> <step>`` as each step begins, and ``REPLAY-DONE <unix time>`` at the
end, from which the harness measures the start latency and each grow's lag.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import TensorDataset

from slurm_amoeba import runtime as amoeba

#: Global batch (samples per step, whatever the size).
GLOBAL_BATCH = 8


def train(steps: int, t1: float, alpha: float) -> str:
    """Run ``steps`` steps through the elastic runtime; returns how it ended on this worker."""
    runtime = amoeba.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(steps * GLOBAL_BATCH, 4, generator=generator)
    dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
    sampler = amoeba.ElasticSampler(len(dataset), GLOBAL_BATCH, seed=1)
    loader = amoeba.ElasticDataLoader(dataset, sampler)
    state = amoeba.TorchState(model, optimizer, sampler)
    loss_fn = torch.nn.MSELoss()

    def loop(state: amoeba.TorchState) -> None:
        while state.epoch < 1:
            for step in loader:
                workers = runtime.world_size
                if runtime.rank == 0:
                    print(f"REPLAY {time.time():.3f} {workers} {step.index}", flush=True)
                for (inputs, targets), weight in step:
                    (loss_fn(model(inputs), targets) * weight).backward()
                time.sleep(t1 / max(workers, 1) ** alpha)
                state.step()
                if state.step_index % 20 == 0:
                    state.commit()

    result = amoeba.run(loop, state)
    if result.rank == 0:
        print(f"REPLAY-DONE {time.time():.3f}", flush=True)
    return result.status.value


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, required=True, help="work units (steps of the global batch)")
    parser.add_argument("--t1", type=float, required=True, help="seconds per step on one worker")
    parser.add_argument("--alpha", type=float, required=True, help="step time at n workers is t1 / n ** alpha")
    args = parser.parse_args(argv)
    train(args.steps, args.t1, args.alpha)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
