"""The runtime's data order and batch split for restart-mode scripts, through the environment (docs/port.md).

A torchrun script run by ``amoeba-run --restart`` / ``amoeba-local --restart`` is restarted at every resize with a
new ``WORLD_SIZE``. ``DistributedSampler`` with ``batch_size = global_batch // world_size`` keeps step ``i``'s samples
only when the world size divides the global batch and the dataset; :class:`StepBatchSampler` keeps them at every
size: it is the :class:`~slurm_amoeba.runtime.sampler.ElasticSampler`'s permutation and split (shares differ by at
most one sample), read from ``RANK``, ``WORLD_SIZE`` and ``AMOEBA_GLOBAL_BATCH``. The restart supervisor
(``launcher/restart.py``) reads the same ``AMOEBA_GLOBAL_BATCH`` (and ``AMOEBA_EVEN_BATCH=1``: equal shares only) and
offers the job only the world sizes that split it, so a script that cannot split its batch at a size is never
started at that size (DESIGN.md, layer ``runtime/``, worker side; it imports no worker or coordinator module).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from torch.utils.data import Sampler

from slurm_amoeba.runtime.errors import BatchPlanError
from slurm_amoeba.runtime.planner import GlobalBatchPlanner
from slurm_amoeba.runtime.sampler import ElasticSampler, Progress

ENV_GLOBAL_BATCH = "AMOEBA_GLOBAL_BATCH"
ENV_EVEN_BATCH = "AMOEBA_EVEN_BATCH"


def _whole(env: Mapping[str, str], name: str) -> int:
    text = env.get(name, "")
    if not text.isdigit() or int(text) < 1:
        raise BatchPlanError(f"{name}={text!r}: give a whole number of at least 1")
    return int(text)


def batch_planner_from_environ(env: Mapping[str, str]) -> GlobalBatchPlanner | None:
    """The job's global batch split from ``AMOEBA_GLOBAL_BATCH`` and ``AMOEBA_EVEN_BATCH`` (unset: ``None``).

    Raises:
        BatchPlanError: a variable is malformed.
    """
    if not env.get(ENV_GLOBAL_BATCH):
        return None
    even = env.get(ENV_EVEN_BATCH, "0") not in ("", "0")
    return GlobalBatchPlanner(global_batch=_whole(env, ENV_GLOBAL_BATCH), even=even)


def allowed_sizes_from_environ(env: Mapping[str, str], limit: int = 1024) -> tuple[int, ...]:
    """World sizes the environment's global batch accepts (empty: no global batch given, any size).

    Raises:
        BatchPlanError: a variable is malformed.
    """
    planner = batch_planner_from_environ(env)
    return () if planner is None else tuple(planner.allowed_world_sizes(limit))


class StepBatchSampler(Sampler[list[int]]):
    """This rank's batch of each step, the same global samples per step at every world size (``batch_sampler=``).

    Args:
        dataset_size: samples in the dataset.
        env: the torchrun contract (``RANK``, ``WORLD_SIZE``) and ``AMOEBA_GLOBAL_BATCH``; ``AMOEBA_EVEN_BATCH=1``
            refuses a size that does not divide the global batch.
        seed: permutation seed.
        shuffle: permute each epoch.
        order: ``"distributed"`` (DistributedSampler's permutation) or ``"elastic"``.

    Raises:
        BatchPlanError: a variable is missing or malformed, or the world size cannot take the batch.
    """

    def __init__(
        self, dataset_size: int, env: Mapping[str, str], *, seed: int = 0, shuffle: bool = True, order: str = "elastic"
    ) -> None:
        planner = batch_planner_from_environ(env)
        if planner is None:
            raise BatchPlanError(f"{ENV_GLOBAL_BATCH} is not set: set it to the global batch (samples per step)")
        self.rank, self.world_size = int(env.get("RANK", "0")), _whole(env, "WORLD_SIZE")
        planner.check_world_size(self.world_size)
        self.sampler = ElasticSampler(
            dataset_size, planner.global_batch, seed=seed, shuffle=shuffle, even=planner.even, order=order
        )
        self.epoch, self.first_step = 0, 0

    def set_epoch(self, epoch: int, step_in_epoch: int = 0) -> None:
        """Iterate epoch ``epoch`` from its step ``step_in_epoch`` on (the steps a restarted script has done)."""
        self.epoch, self.first_step = epoch, step_in_epoch

    def __len__(self) -> int:
        return self.sampler.steps_per_epoch - self.first_step

    def __iter__(self) -> Iterator[list[int]]:
        sampler = self.sampler
        where = Progress(epoch=self.epoch, cursor=min(self.first_step * sampler.global_batch, sampler.dataset_size))
        where.step = self.first_step
        while where.cursor < sampler.dataset_size:
            assignment = sampler.assignment(self.rank, self.world_size, where)
            yield assignment.indices
            where.cursor += assignment.plan.step_samples
            where.step += 1
