"""Marks slurm_amoeba leaves on jobs where Slurm shows them to the daemon: the elastic mark and the admission hold.

**The elastic mark** (``--comment``): ``amoeba-sbatch`` and the executor start an elastic job's comment with
``amoeba-elastic=MIN:MAX``, followed by the user's own comment after one space, if any (``amoeba-elastic=2:8 my
note``). ``squeue --json`` shows it while the job is still pending, before any agent registers, so a daemon that
admits elastic jobs at their requested size (docs/admin.md, section 8c) can tell which pending jobs are elastic and
how large they ask to be. The job's owner can change the comment (``scontrol update``): the mark is a claim about the
job's own admission only, and the daemon takes the minimum from Slurm's record of the job and caps the rest.

**The hold mark** (``AdminComment``, which only operators can set): ``amoebad-held since=T priority=P: waiting for
N GPUs``. A job the daemon holds carries it, so that a daemon that crashed and starts again (or an admin) recognises
its holds without any state file, with when the hold began and the priority Slurm had given the job.
"""

from __future__ import annotations

import dataclasses
import re

ELASTIC_MARK = "amoeba-elastic="
HOLD_MARK = "amoebad-held"
_ELASTIC = re.compile(r"^amoeba-elastic=(?P<min>[0-9]{1,6}):(?P<max>[0-9]{1,6})(?:\s|$)")
_HOLD = re.compile(r"^amoebad-held since=(?P<since>[0-9]{1,12}) priority=(?P<priority>[0-9]{1,10})(?::|$)")


def elastic_comment(min_workers: int, max_workers: int, user_comment: str | None = None) -> str:
    """The comment of an elastic job: the mark, then the user's own comment (kept whole) after one space."""
    mark = f"{ELASTIC_MARK}{min_workers}:{max_workers}"
    return f"{mark} {user_comment}" if user_comment else mark


def parse_elastic_comment(comment: str) -> tuple[int, int] | None:
    """``(MIN, MAX)`` of a comment that starts with the elastic mark; None for any other comment (or a range that
    makes no sense: MIN below 1 or above MAX)."""
    match = _ELASTIC.match(comment)
    if match is None:
        return None
    low, high = int(match["min"]), int(match["max"])
    return (low, high) if 1 <= low <= high else None


def user_comment(comment: str) -> str:
    """The user's part of an elastic job's comment (everything after the mark); the whole comment otherwise."""
    if parse_elastic_comment(comment) is None:
        return comment
    return comment.partition(" ")[2]


@dataclasses.dataclass(frozen=True)
class HoldMark:
    """What the daemon wrote on a job it holds.

    Attributes:
        since: when the hold began (Unix seconds).
        priority: the priority Slurm had given the job before the hold (a hold and release under
            ``priority/basic`` would otherwise send it to the back of the queue).
        gpus: the GPUs it waits for.
    """

    since: int
    priority: int
    gpus: int

    def text(self) -> str:
        """The ``AdminComment`` that carries it."""
        return f"{HOLD_MARK} since={self.since} priority={self.priority}: waiting for {self.gpus} GPUs"


def parse_hold_mark(admin_comment: str) -> HoldMark | None:
    """The daemon's hold mark in a job's ``AdminComment``; None when the comment is anything else."""
    match = _HOLD.match(admin_comment)
    if match is None:
        return None
    gpus = re.search(r"waiting for ([0-9]{1,6}) GPUs", admin_comment)
    return HoldMark(int(match["since"]), int(match["priority"]), int(gpus.group(1)) if gpus else 0)
