"""The interference model for jobs that share GPUs, from Gavel's measured co-location throughputs.

The table is read by :mod:`slurm_amoeba.policy.colocation`, which the daemon reads it with too (its default prior);
this module finds it in the simulator's data folder (``AMOEBA_DATA_DIR`` or the packaged data) and reports a bad
file as a :class:`~slurm_amoeba.sim.data.SimError`.
"""

from __future__ import annotations

from pathlib import Path

from slurm_amoeba.policy.colocation import GAVEL_GPU, GAVEL_TYPES, read_colocation
from slurm_amoeba.policy.types import PolicyError
from slurm_amoeba.sim.data import SimError, data_dir

__all__ = ["GAVEL_GPU", "GAVEL_TYPES", "load_colocation"]


def load_colocation(path: Path | None = None, gpu: str = GAVEL_GPU) -> dict[tuple[str, str], float]:
    """:func:`~slurm_amoeba.policy.colocation.read_colocation` of ``path`` (the data folder's copy by default), its
    errors raised as :class:`~slurm_amoeba.sim.data.SimError`."""
    try:
        return read_colocation(path or data_dir() / "gavel" / "simulation_throughputs.json", gpu)
    except PolicyError as exc:
        raise SimError(str(exc)) from None
