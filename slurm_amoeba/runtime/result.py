"""What :func:`slurm_amoeba.runtime.run` returns, and the table of generations it prints at the end.

Pure data of the worker side (DESIGN.md, layer ``runtime/``): how the run ended for this worker, its final rank
(none for a worker that left: a ported ``if rank == 0: save()`` must not run in a leaver), and one
:class:`GenerationTiming` per generation it was a member of.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RunStatus(str, enum.Enum):
    """How :func:`slurm_amoeba.runtime.run` ended for this worker."""

    FINISHED = "finished"  # the training function returned in this worker
    LEFT = "left"  # the worker left gracefully (SIGTERM, a leave request, eviction) while the job goes on
    ENDED = "ended"  # the job ended (finished elsewhere or lost) while this worker waited for admission


@dataclasses.dataclass(frozen=True)
class GenerationTiming:
    """One generation this worker was a member of.

    Attributes:
        generation: its number.
        rank: this worker's rank in it.
        world_size: its members.
        start_step: the global step it started at.
        group_s: seconds to form its process group (including the wait for the other members).
        state_s: seconds to put the state in place (rollback, state transfer, auto-commit).
        reason: why the coordinator formed it.
    """

    generation: int
    rank: int
    world_size: int
    start_step: int
    group_s: float
    state_s: float
    reason: str

    def to_dict(self) -> dict[str, int | float | str]:
        """The row as JSON data (``json.dumps(timing.to_dict())``)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RunResult(Generic[T]):
    """The outcome of :func:`slurm_amoeba.runtime.run` in this worker.

    Attributes:
        status: how it ended.
        value: the training function's return value (``FINISHED`` only).
        generations: the generations this worker was a member of.
        rank: this worker's rank in the final generation when it finished; ``None`` when it left or the job ended
            without it (it holds no rank any more).
        world_size: the final generation's size when it finished, else 0.
        timeline: one entry per generation this worker was a member of.
    """

    status: RunStatus
    value: T | None = None
    generations: tuple[int, ...] = ()
    rank: int | None = None
    world_size: int = 0
    timeline: tuple[GenerationTiming, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The outcome as JSON data, without ``value`` (the training function's, of any type): ``status``, ``rank``,
        ``world_size``, ``generations`` and ``timeline`` (one :meth:`GenerationTiming.to_dict` per generation)."""
        return {
            "status": self.status.value,
            "rank": self.rank,
            "world_size": self.world_size,
            "generations": list(self.generations),
            "timeline": [timing.to_dict() for timing in self.timeline],
        }

    @property
    def is_rank0(self) -> bool:
        """Whether this worker finished the training as rank 0 (the one that should save, print, upload)."""
        return self.status is RunStatus.FINISHED and self.rank == 0


def generation_table(prefix: str, status: RunStatus, timeline: tuple[GenerationTiming, ...]) -> str:
    """The timeline as a text table, for the end of a run.

    Args:
        prefix: the log prefix (``[job/worker]``).
        status: how the run ended.
        timeline: the generations.

    Returns:
        The table, one line per generation under a header.
    """
    lines = [
        f"{prefix} run {status.value} after {len(timeline)} generation(s) as a member:",
        f"{prefix}   {'gen':>4} {'rank':>4} {'world':>5} {'start step':>10} {'group s':>8} {'state s':>8}  reason",
    ]
    for t in timeline:
        lines.append(
            f"{prefix}   {t.generation:>4} {t.rank:>4} {t.world_size:>5} {t.start_step:>10} "
            f"{t.group_s:>8.3f} {t.state_s:>8.3f}  {t.reason}"
        )
    return "\n".join(lines)
