"""``amoeba-sbatch``: submit a batch script as an elastic job (see :mod:`slurm_amoeba.launcher.sbatch`)."""

from slurm_amoeba.launcher.sbatch import main

__all__ = ["main"]
