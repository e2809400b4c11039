"""GPU sharing as Slurm allocates it: the modes a job opts in with and the shards each role holds.

A site offers sharing on nodes of their own (docs/admin.md, "Sharing GPUs"), whose GPUs Slurm also counts as
:data:`SHARDS_PER_GPU` ``gres/shard`` each. A job that opted in (``--share`` on ``amoeba-sbatch``, the SPANK plugin
and :class:`~slurm_amoeba.launcher.executor.ElasticExecutor`; ``AMOEBA_SHARE`` in :mod:`.jobenv`) runs its minimum
workers there, each holding :data:`HOST_SHARDS` shards of one GPU: no other job's worker of that size fits beside
it, so Slurm never pairs two such jobs by itself. The daemon's ``Share`` action (DESIGN.md, control flow) has the
sharer's agent start a worker in a satellite of :data:`SHARER_SHARDS` shard on the host's node: the one shard left
of a host's GPU. Slurm fences nothing between them (no memory limit, no compute priority); the runtime's memory cap
and pacing do.

The host's workers write their recent step times to a node-local status file whose place both sides derive from the
host's job id alone (:func:`host_status_path`); the daemon sends it, with the host's uid, in the sharer's directive,
and the sharer's workers read it only when that uid owns it (:mod:`slurm_amoeba.runtime.share`).
"""

from __future__ import annotations

import enum
import re
from pathlib import Path

#: The sharing modes a job opts in with (``--share=MODE``; ``--share`` alone is the first).
SHARE_MODES = ("guaranteed", "opportunistic")
#: Shards Slurm counts per GPU of a sharing node (gres.conf ``Name=shard Count=<GPUs x 3>``).
SHARDS_PER_GPU = 3
#: Shards an opted-in job's own worker holds: all but one of its GPU's, so that only a sharer fits beside it.
HOST_SHARDS = 2
#: Shards a worker placed beside another job's holds: the one its host left.
SHARER_SHARDS = SHARDS_PER_GPU - HOST_SHARDS
#: The partition of the sharing nodes when nobody names one (the test cluster's).
DEFAULT_SHARE_PARTITION = "share"
#: Set by the agent for a worker placed beside another job: its :class:`ShareRole` value, and the host's job id
#: (the runtime's memory cap and pacing read them).
ENV_SHARE_ROLE = "AMOEBA_SHARE_ROLE"
ENV_SHARE_HOST = "AMOEBA_SHARE_HOST"


#: The node-local directory of the hosts' status files: memory-backed, on every node, world-writable with the sticky
#: bit (a user may replace only their own files there).
STATUS_DIR = Path("/dev/shm")
_HOST_JOB_ID = re.compile(r"[A-Za-z0-9_]{1,32}")


def host_status_path(host_job_id: str, directory: Path = STATUS_DIR) -> Path:
    """Where the workers of the guaranteed job ``host_job_id`` write their status on each of its nodes
    (``/dev/shm/amoeba-share-<job id>.json``), and where the workers placed beside it read it.

    Raises:
        ValueError: ``host_job_id`` is not a job id (letters, digits and ``_``, at most 32: no path in it).
    """
    if _HOST_JOB_ID.fullmatch(host_job_id) is None:
        raise ValueError(f"host job id {host_job_id!r:.40} is not a job id: give the id Slurm assigned (its digits)")
    return directory / f"amoeba-share-{host_job_id}.json"


class ShareRole(str, enum.Enum):
    """A worker's part in a pair of jobs on one GPU (AntMan's two kinds of job).

    ``GUARANTEED``: the host, whose speed and memory come first. ``OPPORTUNISTIC``: the sharer, which takes what the
    host leaves and yields (shrinks its memory, paces its steps, leaves) when the host needs it back.
    """

    GUARANTEED = "guaranteed"
    OPPORTUNISTIC = "opportunistic"


def share_mode_error(value: object, where: str) -> str:
    """The sentence that refuses a sharing mode, naming ``where`` it was given and the modes to give instead."""
    return f"{where}={value!r} is not a sharing mode: give one of {', '.join(SHARE_MODES)} (or leave it unset)"
