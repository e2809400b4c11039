"""Satellites: how an elastic job's extra allocations are named and linked to their parent, as Slurm shows them.

A satellite is an ordinary job in the preemptible elastic partition. Its job name is ``amoeba-sat-<parent>-<group>``
and its comment ``amoeba-parent=<parent>``, so that ``squeue`` shows anyone which job it belongs to. The agent names
its satellites with these rules and the daemon's observer reads them back; both import them from here.
"""

from __future__ import annotations

import re

SATELLITE_PREFIX = "amoeba-sat-"
PARENT_COMMENT_PREFIX = "amoeba-parent="
_SATELLITE_NAME = re.compile(r"^amoeba-sat-(\d+)-(g\d+)$")


def satellite_name(parent_job: str, group: str) -> str:
    """The Slurm job name of a satellite (visible in ``squeue``)."""
    return f"{SATELLITE_PREFIX}{parent_job}-{group}"


def parent_comment(parent_job: str) -> str:
    """The Slurm comment that links a satellite to its parent job."""
    return f"{PARENT_COMMENT_PREFIX}{parent_job}"


def parse_satellite_name(name: str) -> tuple[str, str] | None:
    """``(parent job, group)`` of a satellite's job name, or None for any other job."""
    match = _SATELLITE_NAME.match(name)
    return (match.group(1), match.group(2)) if match else None
