"""``amoeba-run``: the in-job entry that runs an elastic job's agent (see :mod:`slurm_amoeba.launcher.run`)."""

from slurm_amoeba.launcher.run import main

__all__ = ["main"]
