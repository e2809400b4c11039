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
    """Fractions of solo speed kept by each application next to each other application
    (:func:`~slurm_amoeba.policy.colocation.read_colocation`).

    Args:
        path: Gavel's ``simulation_throughputs.json``; the data folder's copy by default.
        gpu: the GPU table to read.

    Returns:
        ``(application, partner application)`` -> fraction kept, in (0, 1].

    Raises:
        SimError: the file, the GPU table or a mapped job type is missing, or the file is not JSON.
    """
    try:
        return read_colocation(path or data_dir() / "gavel" / "simulation_throughputs.json", gpu)
    except PolicyError as exc:
        raise SimError(str(exc)) from None
