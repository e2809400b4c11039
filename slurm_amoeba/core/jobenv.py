"""The job environment contract: the variables that carry an elastic job's settings from submission to its agent.

Whoever submits an elastic job — ``amoeba-sbatch``, :class:`~slurm_amoeba.launcher.executor.ElasticExecutor`, or
plain ``sbatch`` with the SPANK plugin's ``--elastic`` (which sets the first three) — puts these variables into the
job's environment; ``amoeba-run`` reads them in the batch script to start the job's agent (DESIGN.md, job flow), and
the agent hands ``AMOEBA_PARENT_JOB`` on to every worker. :class:`JobEnv` is the one place that spells them and their
defaults; ``spank/src/amoeba_env.h`` mirrors the names for the C plugin, and a test checks both lists are the same.

============================ ===================================================================================
variable                     meaning (default)
============================ ===================================================================================
``AMOEBA_ELASTIC_MIN``       the fewest workers the job runs with (none: the job is not elastic)
``AMOEBA_ELASTIC_MAX``       the most workers it grows to (``AMOEBA_ELASTIC_MIN``: a fixed size)
``AMOEBA_ELASTIC_PARTITION`` partition of the satellites that grow the job (``elastic``)
``AMOEBA_GPUS_PER_WORKER``   GPUs of each worker (1)
``AMOEBA_CPUS_PER_WORKER``   CPUs of each worker (1)
``AMOEBA_DAEMON_ENDPOINT``   the ``amoebad`` the agent registers with, ``tcp://host:port`` (none: no daemon)
``AMOEBA_DAEMON_UID``        the uid ``amoebad`` runs as, from the site's plugstack line (SPANK ``daemon_uid=`` or
                             ``daemon_user=``); the agent trusts only this uid's directives and replies (none: the
                             site file ``/etc/slurm-amoeba/daemon.conf``, else only a daemon of the job's own uid)
``AMOEBA_STATE_DIR``         the agent's status file and the workers' logs (``./amoeba-<job id>``)
``AMOEBA_SHARE``             the job opted in to GPU sharing (docs/admin.md, "Sharing GPUs"): ``guaranteed`` (its
                             GPUs may host another opted-in job's worker, which yields to it) or ``opportunistic``
                             (besides, its own extra workers may be placed beside another job's); none: never shared
``AMOEBA_SHARE_PARTITION``   the partition of the sharing nodes, where such a job's minimum workers hold shards
                             (``share``)
``AMOEBA_PARENT_JOB``        set by the agent for its workers: the elastic job's id, also inside satellites
``AMOEBA_JOB_FOLDER``        set by the executor: the submitit job folder holding the pickled function
============================ ===================================================================================

An empty value means the same as an unset one. The worker side of the contract (store address, worker id, ...) is
:mod:`slurm_amoeba.core.runtime_env`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.core.sharing import SHARE_MODES, share_mode_error
from slurm_amoeba.core.spec import ElasticSpec

ENV_ELASTIC_MIN = "AMOEBA_ELASTIC_MIN"
ENV_ELASTIC_MAX = "AMOEBA_ELASTIC_MAX"
ENV_ELASTIC_PARTITION = "AMOEBA_ELASTIC_PARTITION"
ENV_GPUS_PER_WORKER = "AMOEBA_GPUS_PER_WORKER"
ENV_CPUS_PER_WORKER = "AMOEBA_CPUS_PER_WORKER"
ENV_DAEMON_ENDPOINT = "AMOEBA_DAEMON_ENDPOINT"
ENV_DAEMON_UID = "AMOEBA_DAEMON_UID"
ENV_STATE_DIR = "AMOEBA_STATE_DIR"
ENV_SHARE = "AMOEBA_SHARE"
ENV_SHARE_PARTITION = "AMOEBA_SHARE_PARTITION"
ENV_PARENT_JOB = "AMOEBA_PARENT_JOB"
ENV_JOB_FOLDER = "AMOEBA_JOB_FOLDER"

#: Partition of the satellites when nobody names one (the SPANK plugin's ``default_partition`` default too).
DEFAULT_ELASTIC_PARTITION = "elastic"
#: GPUs per worker when nobody says: a worker of elastic deep-learning training is one process on one GPU (torchrun's
#: convention and :class:`ElasticSpec`'s default), and the daemon grows jobs into idle GPUs and refuses to register a
#: job whose workers hold none. ``amoeba-run`` and the executor used 0 and ``amoeba-sbatch`` 1; a CPU-only job says
#: ``--gpus-per-worker 0``.
DEFAULT_GPUS_PER_WORKER = 1
#: CPUs per worker when nobody says.
DEFAULT_CPUS_PER_WORKER = 1


def _env(name: str, minimum: int | None = None) -> dict[str, Any]:
    return {"env": name, "minimum": minimum}


@dataclasses.dataclass(frozen=True)
class JobEnv:
    """An elastic job's settings as its environment carries them (see the module docstring for each variable).

    Attributes:
        min_workers: ``AMOEBA_ELASTIC_MIN``; None: not an elastic job (or the range comes from elsewhere).
        max_workers: ``AMOEBA_ELASTIC_MAX``; None: the same as ``min_workers``.
        elastic_partition: ``AMOEBA_ELASTIC_PARTITION``.
        gpus_per_worker: ``AMOEBA_GPUS_PER_WORKER``.
        cpus_per_worker: ``AMOEBA_CPUS_PER_WORKER``.
        daemon_endpoint: ``AMOEBA_DAEMON_ENDPOINT``; None: no daemon.
        daemon_uid: ``AMOEBA_DAEMON_UID``; None: not configured by the site's plugstack line.
        state_dir: ``AMOEBA_STATE_DIR``; None: ``./amoeba-<job id>``.
        share: ``AMOEBA_SHARE``, one of :data:`SHARE_MODES`; None: the job never shares a GPU.
        share_partition: ``AMOEBA_SHARE_PARTITION``; None: ``share``
            (:data:`~slurm_amoeba.core.sharing.DEFAULT_SHARE_PARTITION`).
        parent_job: ``AMOEBA_PARENT_JOB``; None outside a worker.
        job_folder: ``AMOEBA_JOB_FOLDER``; None outside an executor's job.

    Raises:
        SpecError: (on construction) a count below its minimum, MAX without MIN or below it, an empty name, or a
            sharing mode that is not one of :data:`SHARE_MODES`.
    """

    min_workers: int | None = dataclasses.field(default=None, metadata=_env(ENV_ELASTIC_MIN, 1))
    max_workers: int | None = dataclasses.field(default=None, metadata=_env(ENV_ELASTIC_MAX, 1))
    elastic_partition: str = dataclasses.field(default=DEFAULT_ELASTIC_PARTITION, metadata=_env(ENV_ELASTIC_PARTITION))
    gpus_per_worker: int = dataclasses.field(default=DEFAULT_GPUS_PER_WORKER, metadata=_env(ENV_GPUS_PER_WORKER, 0))
    cpus_per_worker: int = dataclasses.field(default=DEFAULT_CPUS_PER_WORKER, metadata=_env(ENV_CPUS_PER_WORKER, 1))
    daemon_endpoint: str | None = dataclasses.field(default=None, metadata=_env(ENV_DAEMON_ENDPOINT))
    daemon_uid: int | None = dataclasses.field(default=None, metadata=_env(ENV_DAEMON_UID, 0))
    state_dir: str | None = dataclasses.field(default=None, metadata=_env(ENV_STATE_DIR))
    share: str | None = dataclasses.field(default=None, metadata=_env(ENV_SHARE))
    share_partition: str | None = dataclasses.field(default=None, metadata=_env(ENV_SHARE_PARTITION))
    parent_job: str | None = dataclasses.field(default=None, metadata=_env(ENV_PARENT_JOB))
    job_folder: str | None = dataclasses.field(default=None, metadata=_env(ENV_JOB_FOLDER))

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            name, minimum = field.metadata["env"], field.metadata["minimum"]
            if value is None:
                continue
            if minimum is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                    raise SpecError(f"{name}={value!r} is invalid: give a whole number of at least {minimum}")
            elif not isinstance(value, str) or not value or "\n" in value or "\0" in value:
                raise SpecError(f"{name}={value!r} is invalid: give a non-empty value on one line")
        if self.share is not None and self.share not in SHARE_MODES:
            raise SpecError(share_mode_error(self.share, ENV_SHARE))
        if self.max_workers is not None:
            if self.min_workers is None:
                raise SpecError(
                    f"{ENV_ELASTIC_MAX}={self.max_workers} is set but {ENV_ELASTIC_MIN} is not: set both "
                    f"(e.g. {ENV_ELASTIC_MIN}=2 {ENV_ELASTIC_MAX}={self.max_workers}) or pass --elastic MIN:MAX"
                )
            if self.max_workers < self.min_workers:
                raise SpecError(
                    f"{ENV_ELASTIC_MAX}={self.max_workers} is below {ENV_ELASTIC_MIN}={self.min_workers}: "
                    "MAX must be at least MIN"
                )

    @staticmethod
    def names() -> tuple[str, ...]:
        """Every variable of the contract, in the order of the fields."""
        return tuple(str(f.metadata["env"]) for f in dataclasses.fields(JobEnv))

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> JobEnv:
        """Read the contract from an environment (unset or empty variables take their defaults).

        Args:
            env: e.g. ``os.environ``.

        Returns:
            The job's settings.

        Raises:
            SpecError: a value that is not what its variable takes; the message names the variable and the value.
        """
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            name = str(field.metadata["env"])
            text = env.get(name, "")
            if text == "":
                continue
            if field.metadata["minimum"] is None:
                values[field.name] = text
                continue
            if not (text.isascii() and text.isdigit()):
                raise SpecError(
                    f"{name}={text!r} is not a whole number: set it to e.g. {name}={field.metadata['minimum'] or 1} "
                    "or unset it"
                )
            values[field.name] = int(text)
        return cls(**values)

    def to_environ(self) -> dict[str, str]:
        """The variables to set for these settings (fields that are None are left out).

        Returns:
            Variable name -> value, ready to merge into a job's environment.
        """
        out: dict[str, str] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                out[str(field.metadata["env"])] = str(value)
        return out

    @classmethod
    def for_spec(
        cls,
        spec: ElasticSpec,
        *,
        elastic_partition: str = DEFAULT_ELASTIC_PARTITION,
        daemon_endpoint: str | None = None,
        state_dir: str | None = None,
        share: str | None = None,
        share_partition: str | None = None,
    ) -> JobEnv:
        """The settings of a job of ``spec``: its range and per-worker resources, and where it grows and reports.

        Raises:
            SpecError: a setting is invalid (an empty partition name, a value with a newline).
        """
        return cls(
            min_workers=spec.min_workers,
            max_workers=spec.max_workers,
            elastic_partition=elastic_partition,
            gpus_per_worker=spec.gpus_per_worker,
            cpus_per_worker=spec.cpus_per_worker,
            daemon_endpoint=daemon_endpoint,
            state_dir=state_dir,
            share=share,
            share_partition=share_partition,
        )

    @property
    def elastic_range(self) -> str | None:
        """The worker range as ``--elastic`` takes it (``MIN:MAX``), or None when ``AMOEBA_ELASTIC_MIN`` is unset."""
        if self.min_workers is None:
            return None
        return f"{self.min_workers}:{self.max_workers if self.max_workers is not None else self.min_workers}"
