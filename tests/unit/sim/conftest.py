"""Fixtures for the simulator tests: the reference data shipped in the package (or ``$AMOEBA_DATA_DIR``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_amoeba.sim import data


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The data folder the code under test reads too."""
    path = data.data_dir()
    assert (path / "pollux" / "workloads").is_dir(), f"no reference data at {path}; unset {data.DATA_DIR_ENV}"
    return path


@pytest.fixture(scope="session")
def pollux(data_dir: Path) -> Path:
    """The Pollux artifact's folder."""
    return data_dir / "pollux"
