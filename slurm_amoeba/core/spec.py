"""The elastic specification of a job: how many workers it may run with and what each worker needs.

``ElasticSpec.parse("2:8")`` reads the worker range the way users write it on the command line
(``--elastic 2:8``); the SPANK plugin, ``amoeba-sbatch`` and the executor all end up with one of these.
"""

from __future__ import annotations

import dataclasses
import re

from slurm_amoeba.core.errors import SpecError

_RANGE = re.compile(r"^\s*(\d+)\s*(?::\s*(\d+)\s*)?$")


@dataclasses.dataclass(frozen=True)
class ElasticSpec:
    """How many workers a job may run with, and the resources of one worker.

    Attributes:
        min_workers: the job never runs with fewer workers (its first allocation holds exactly these).
        max_workers: the job never grows beyond this many workers.
        gpus_per_worker: GPUs each worker process gets (0 for a CPU-only worker).
        cpus_per_worker: CPUs each worker process gets.
        mem_per_worker_mb: memory per worker in MiB, or 0 for Slurm's default.
    """

    min_workers: int
    max_workers: int
    gpus_per_worker: int = 1
    cpus_per_worker: int = 1
    mem_per_worker_mb: int = 0

    def __post_init__(self) -> None:
        if self.min_workers < 1:
            raise SpecError(f"min_workers={self.min_workers} is invalid: an elastic job needs at least 1 worker")
        if self.max_workers < self.min_workers:
            raise SpecError(
                f"max_workers={self.max_workers} is below min_workers={self.min_workers}: "
                f"write the range as MIN:MAX, e.g. {self.max_workers}:{self.min_workers}"
            )
        for name in ("gpus_per_worker", "mem_per_worker_mb"):
            if getattr(self, name) < 0:
                raise SpecError(f"{name}={getattr(self, name)} is invalid: it must be 0 or more")
        if self.cpus_per_worker < 1:
            raise SpecError(f"cpus_per_worker={self.cpus_per_worker} is invalid: it must be at least 1")

    @classmethod
    def parse(cls, text: str, **resources: int) -> ElasticSpec:
        """Read a worker range written ``MIN`` or ``MIN:MAX``.

        ``MIN`` alone means a fixed size (``MAX = MIN``).

        Args:
            text: the range as the user wrote it, e.g. ``"2:8"``.
            **resources: the per-worker fields of :class:`ElasticSpec`.

        Returns:
            The specification.

        Raises:
            SpecError: the text is not ``MIN[:MAX]`` with ``1 <= MIN <= MAX``.
        """
        match = _RANGE.match(text)
        if match is None:
            raise SpecError(f"--elastic {text!r} is not MIN[:MAX] with whole numbers, e.g. --elastic 2:8")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        try:
            return cls(min_workers=low, max_workers=high, **resources)
        except SpecError as exc:
            raise SpecError(f"--elastic {text!r}: {exc}") from None

    @property
    def is_elastic(self) -> bool:
        """Whether the job may change size at all."""
        return self.max_workers > self.min_workers
