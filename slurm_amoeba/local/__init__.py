"""Local mode: run an elastic job as local processes, without Slurm (``amoeba-local``; DESIGN.md, issue 3).

:class:`LocalJob` hosts the job's coordinator in this process and starts workers as subprocesses with the worker
environment contract; it can add workers, remove them gracefully, send them SIGTERM or SIGKILL them.
"""

from slurm_amoeba.local.job import LocalJob, LocalJobResult, LocalWorker

__all__ = ["LocalJob", "LocalJobResult", "LocalWorker"]
