"""How users start elastic jobs (DESIGN.md, layer ``launcher/``): :class:`ElasticExecutor` (Python, on submitit),
``amoeba-sbatch`` (shell), and ``amoeba-run`` (inside the job, like torchrun).

The names are imported on first use (PEP 562), so that ``amoeba-sbatch``, which imports this package, needs neither
submitit nor cloudpickle (the ``train`` extra) and starts fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurm_amoeba.launcher.executor import ElasticExecutor, ElasticJob
    from slurm_amoeba.launcher.parameters import ElasticParameters
    from slurm_amoeba.launcher.submission import ElasticJobShape

__all__ = ["ElasticExecutor", "ElasticJob", "ElasticJobShape", "ElasticParameters"]

_HOMES = {
    "ElasticExecutor": "slurm_amoeba.launcher.executor",
    "ElasticJob": "slurm_amoeba.launcher.executor",
    "ElasticParameters": "slurm_amoeba.launcher.parameters",
    "ElasticJobShape": "slurm_amoeba.launcher.submission",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
