"""Fixtures for the simulator tests: the shared reference data (``../shared/data`` or ``$AMOEBA_DATA_DIR``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_amoeba.sim.data import DATA_DIR_ENV


@pytest.fixture(scope="session")
def data_dir() -> Iterator[Path]:
    """The data folder; also exported as ``AMOEBA_DATA_DIR`` so that the code under test finds it."""
    path = Path(os.environ.get(DATA_DIR_ENV) or Path(__file__).parents[3] / ".." / "shared" / "data").resolve()
    assert (path / "pollux" / "workloads").is_dir(), f"no reference data at {path}; set {DATA_DIR_ENV}"
    previous = os.environ.get(DATA_DIR_ENV)
    os.environ[DATA_DIR_ENV] = str(path)
    yield path
    if previous is None:
        os.environ.pop(DATA_DIR_ENV, None)
    else:
        os.environ[DATA_DIR_ENV] = previous


@pytest.fixture(scope="session")
def pollux(data_dir: Path) -> Path:
    """The Pollux artifact's folder."""
    return data_dir / "pollux"
