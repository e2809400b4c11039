"""Chaos: seeded random grows, shrinks, SIGTERM, SIGKILL (also at a switch and while the state goes to a joiner)
and SIGSTOP/SIGCONT on real local workers never hang the job, keep every sample exactly once per epoch and end with
the fixed-size run's parameters, or lose the job only when every holder of the state was killed
(``tests/unit/runtime/chaos.py``; ``scripts/chaos-runtime`` runs hundreds of seeds).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.unit.runtime.chaos import chaos_run, run_reference

SEEDS = [7, 10, 15]  # kill at a switch and in transfer, grow, SIGSTOP short and long, SIGTERM, remove


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The chaos job's fixed-size run (2 workers)."""
    return run_reference(tmp_path_factory.mktemp("chaos-fixed"))


@pytest.mark.timeout(110)
@pytest.mark.parametrize("seed", SEEDS)
def test_seeded_chaos_run_ends_exactly_once_with_the_fixed_size_parameters_or_documented_loss(
    tmp_path: Path, reference: dict[str, torch.Tensor], seed: int
) -> None:
    outcome = chaos_run(seed, tmp_path / "job", reference)
    assert outcome.ok, f"seed {seed}: {outcome.outcome} after {outcome.operations}: {outcome.detail}"
    assert outcome.seconds < 100
