"""How users start elastic jobs (DESIGN.md, layer ``launcher/``): :class:`ElasticExecutor` (Python, on submitit),
``amoeba-sbatch`` (shell), and ``amoeba-run`` (inside the job, like torchrun)."""

from slurm_amoeba.launcher.executor import ElasticExecutor, ElasticJob, ElasticParameters
from slurm_amoeba.launcher.submission import ElasticJobShape

__all__ = ["ElasticExecutor", "ElasticJob", "ElasticJobShape", "ElasticParameters"]
