"""Fixtures of the runtime tests: the fixed-size reference run that elastic runs are compared with, and a
one-process gloo group for the tests that reduce gradients in this process."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore

from slurm_amoeba.local import LocalJobResult
from tests.unit.runtime.jobs import ToyJob, final_params


@dataclass(frozen=True)
class ReferenceRun:
    """A finished fixed-size run of the toy job (2 workers, no resize)."""

    out: Path
    result: LocalJobResult
    params: dict[str, torch.Tensor]


@pytest.fixture(scope="session")
def fixed_run(tmp_path_factory: pytest.TempPathFactory) -> ReferenceRun:
    """The toy job at a fixed size of 2 workers, run once per session."""
    out = tmp_path_factory.mktemp("fixed")
    with ToyJob(out, workers=2, hold=False) as fixed:
        result = fixed.finish()
    assert result.phase.value == "finished", result
    assert len(result.view.history) == 1
    params = final_params(out)
    assert len(params) == 2
    return ReferenceRun(out=out, result=result, params=next(iter(params.values())))


@pytest.fixture
def single_process_group() -> Iterator[None]:
    """The default process group: gloo, this process alone (rank 0 of 1)."""
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(seconds=10))
    try:
        yield
    finally:
        dist.destroy_process_group()
