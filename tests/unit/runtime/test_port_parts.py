"""The pieces of the five-line port that need no job: the DistributedSampler-compatible order, the restart-mode
batch split from the environment, the chained SIGTERM handler, the JSON form of a run's result, and DCP's
silenced single-process warning."""

from __future__ import annotations

import json
import signal
import warnings
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.utils.data import DistributedSampler, TensorDataset

from slurm_amoeba.runtime.checkpoint import silence_single_process_warning
from slurm_amoeba.runtime.errors import BatchPlanError, StateError
from slurm_amoeba.runtime.port import seeded_position
from slurm_amoeba.runtime.restart_data import StepBatchSampler, allowed_sizes_from_environ
from slurm_amoeba.runtime.result import GenerationTiming, RunResult, RunStatus
from slurm_amoeba.runtime.sampler import ElasticSampler
from slurm_amoeba.runtime.sigterm import SigtermChain


def _distributed_steps(size: int, world: int, local_batch: int, epoch: int) -> list[set[int]]:
    ranks = []
    for rank in range(world):
        dataset = TensorDataset(torch.arange(size))
        sampler: DistributedSampler[int] = DistributedSampler(dataset, num_replicas=world, rank=rank, seed=7)
        sampler.set_epoch(epoch)
        order = list(sampler)
        ranks.append([order[i : i + local_batch] for i in range(0, len(order), local_batch)])
    return [set().union(*(steps[i] for steps in ranks)) for i in range(len(ranks[0]))]


def test_the_distributed_order_gives_each_step_the_samples_of_distributedsampler_at_any_divisor() -> None:
    sampler = ElasticSampler(96, 12, seed=7, order="distributed")
    perm = sampler.permutation(1)
    mine = [set(perm[i : i + 12]) for i in range(0, 96, 12)]
    assert mine == _distributed_steps(96, 2, 6, 1) == _distributed_steps(96, 3, 4, 1)
    assert ElasticSampler(96, 12, seed=7).permutation(1) != perm  # the default order is the runtime's own


def test_an_unknown_order_and_a_foreign_epoch_are_refused() -> None:
    with pytest.raises(BatchPlanError, match=r"order='torch' is not one of elastic, distributed"):
        ElasticSampler(96, 12, order="torch")
    sampler = ElasticSampler(96, 12)
    sampler.set_epoch(0)
    with pytest.raises(StateError, match=r"set_epoch\(2\) while the training state is in epoch 0"):
        sampler.set_epoch(2)


def _env(world: int, rank: int, **extra: str) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "AMOEBA_GLOBAL_BATCH": "64", **extra}


def test_step_batch_sampler_gives_step_i_the_same_samples_at_every_world_size() -> None:
    def steps(world: int) -> list[list[int]]:
        per_rank = [list(StepBatchSampler(1000, _env(world, r), seed=3, order="distributed")) for r in range(world)]
        return [sorted(i for rank in per_rank for i in rank[step]) for step in range(len(per_rank[0]))]

    two, three = steps(2), steps(3)
    assert two == three and len(two) == 16 and sorted(i for step in two for i in step) == list(range(1000))
    sampler = StepBatchSampler(1000, _env(3, 1), seed=3)
    sampler.set_epoch(0, step_in_epoch=5)
    assert len(sampler) == 11 and next(iter(sampler)) == list(StepBatchSampler(1000, _env(3, 1), seed=3))[5]


def test_restart_mode_offers_only_the_sizes_that_split_the_global_batch() -> None:
    assert allowed_sizes_from_environ({}) == ()
    assert allowed_sizes_from_environ({"AMOEBA_GLOBAL_BATCH": "24", "AMOEBA_EVEN_BATCH": "1"}, limit=12) == (
        1,
        2,
        3,
        4,
        6,
        8,
        12,
    )
    assert allowed_sizes_from_environ({"AMOEBA_GLOBAL_BATCH": "24"}, limit=30) == tuple(range(1, 25))
    with pytest.raises(BatchPlanError, match=r"AMOEBA_GLOBAL_BATCH='x': give a whole number"):
        allowed_sizes_from_environ({"AMOEBA_GLOBAL_BATCH": "x"})
    with pytest.raises(BatchPlanError):
        StepBatchSampler(100, _env(3, 0, AMOEBA_EVEN_BATCH="1"))


def test_the_scripts_sigterm_handler_runs_once_when_the_worker_leaves_not_when_the_signal_comes() -> None:
    calls: list[str] = []
    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, lambda s, f: calls.append("user-before-init"))
        chain = SigtermChain(lambda: calls.append("leave"))
        signal.signal(signal.SIGTERM, lambda s, f: calls.append("user"))  # installed after init: taken over
        chain.adopt()
        chain.leaving()
        assert calls == []  # no SIGTERM yet: a leave the coordinator asked for does not call it
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        handler(signal.SIGTERM, None)
        assert calls == ["leave"]
        chain.leaving()
        chain.leaving()
        assert calls == ["leave", "user"]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_run_result_and_its_timeline_are_json_data() -> None:
    timing = GenerationTiming(2, 1, 3, 40, 0.012, 0.015, "scale-out")
    result = RunResult(RunStatus.FINISHED, value=object(), generations=(1, 2), rank=1, world_size=3, timeline=(timing,))
    data = json.loads(json.dumps(result.to_dict()))
    assert data["status"] == "finished" and data["generations"] == [1, 2] and data["rank"] == 1
    assert data["timeline"] == [
        {
            "generation": 2,
            "rank": 1,
            "world_size": 3,
            "start_step": 40,
            "group_s": 0.012,
            "state_s": 0.015,
            "reason": "scale-out",
        }
    ]


def _dcp_warnings(tmp_path: Path, *, silenced: bool) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter("always")
        if silenced:
            silence_single_process_warning()
        dcp_save({"t0": torch.ones(2)}, storage_writer=FileSystemWriter(tmp_path / "s"), no_dist=True)
        dcp_load({"t0": torch.zeros(2)}, storage_reader=FileSystemReader(tmp_path / "s"), no_dist=True)
    return [str(w.message) for w in caught if "torch.distributed is disabled" in str(w.message)]


def test_checkpoint_writes_and_reads_print_no_single_process_warning(tmp_path: Path) -> None:
    assert len(_dcp_warnings(tmp_path / "plain", silenced=False)) == 2  # what DCP prints on its own
    assert _dcp_warnings(tmp_path / "runtime", silenced=True) == []


def test_a_scripts_checkpoint_position_at_the_end_of_an_epoch_seeds_the_next_epochs_start() -> None:
    sampler = ElasticSampler(96, 12)  # 8 steps per epoch
    assert seeded_position(sampler, 2, 8) == {"epoch": 3, "cursor": 0, "step": 24}
    assert seeded_position(sampler, 1, 3) == {"epoch": 1, "cursor": 36, "step": 11}
    sampler.load_state_dict(seeded_position(sampler, 2, 8))
