"""The co-location model read from Gavel's measurements."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_amoeba.sim.data import SimError
from slurm_amoeba.sim.interference import GAVEL_TYPES, load_colocation


def test_factors_are_gavels_together_over_alone_ratios(data_dir: Path) -> None:
    path = data_dir / "gavel" / "simulation_throughputs.json"
    table = load_colocation(path)
    assert set(table) == {(a, b) for a in GAVEL_TYPES for b in GAVEL_TYPES}
    assert all(0.0 < value <= 1.0 for value in table.values())
    raw = json.loads(path.read_text())["v100"][str((GAVEL_TYPES["ncf"], 1))]
    expected = raw[str((GAVEL_TYPES["imagenet"], 1))][0] / raw["null"]
    assert table[("ncf", "imagenet")] == pytest.approx(expected)


def test_a_missing_gpu_table_is_named(data_dir: Path) -> None:
    with pytest.raises(SimError, match="no GPU table 'a100'; it has k80"):
        load_colocation(data_dir / "gavel" / "simulation_throughputs.json", gpu="a100")


def test_a_file_that_is_not_json_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text("{nope")
    with pytest.raises(SimError, match="is not JSON"):
        load_colocation(path)
