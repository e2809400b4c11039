"""Read a site's scheduling settings from a slurm.conf (or a file of the same syntax) for the ``slurm`` baseline.

Simulation flow (DESIGN.md): the ``slurm`` policy of ``slurm_amoeba.policy.slurm_baseline`` takes Slurm's settings
as knobs; this module turns the lines of a slurm.conf into those knobs, the simulator's grace time and, when every
GPU node is alike, the cluster's shape. It reads:

- ``PriorityType`` (``priority/basic``, Slurm's default, orders by submit time: every weight 0),
  ``PriorityWeightAge``, ``PriorityWeightJobSize``, ``PriorityWeightFairshare``, ``PriorityWeightPartition``,
  ``PriorityMaxAge`` and ``PriorityFavorSmall``;
- ``SchedulerParameters``: ``bf_window`` (minutes) and ``bf_max_job_test``;
- ``PreemptType`` (anything but ``preempt/partition_prio`` switches preemption off), the cluster's ``PreemptMode``
  and every ``PartitionName=`` line's ``PriorityTier``, ``PreemptMode``, ``GraceTime`` and ``DefaultTime``;
- ``NodeName=`` lines with ``Gres=gpu:N`` (the cluster's nodes and GPUs per node).

Every other key is ignored (a real slurm.conf has dozens); a value that cannot be read fails with the file and line.
Times use Slurm's formats: ``minutes``, ``minutes:seconds``, ``hours:minutes:seconds``, ``days-hours``,
``days-hours:minutes``, ``days-hours:minutes:seconds``, ``UNLIMITED``/``INFINITE``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.policy.slurm_baseline import UNLIMITED_S, SlurmPartition
from slurm_amoeba.slurm.nodelist import expand_nodelist
from slurm_amoeba.slurm.parsers import parse_gres_count

_WEIGHTS = {
    "priorityweightage": "weight_age",
    "priorityweightjobsize": "weight_job_size",
    "priorityweightfairshare": "weight_fairshare",
    "priorityweightpartition": "weight_partition",
}


def parse_slurm_time(text: str) -> float:
    """Seconds in one of Slurm's time formats (see the module); ``UNLIMITED``/``INFINITE`` give a year.

    Raises:
        ValueError: the text is in none of those formats.
    """
    value = text.strip()
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return UNLIMITED_S
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", value)
    if match is None:
        raise ValueError(f"{text!r} is not a Slurm time (minutes, hh:mm:ss, d-hh[:mm[:ss]] or UNLIMITED)")
    days, first, second, third = match.groups()
    parts = [int(part) for part in (first, second, third) if part is not None]
    if days is not None:
        hours, minutes, seconds = [*parts, 0, 0][:3]
        return float(((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds)
    if len(parts) == 1:
        return parts[0] * 60.0
    if len(parts) == 2:
        return parts[0] * 60.0 + parts[1]
    return parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]


@dataclasses.dataclass(frozen=True)
class SlurmSite:
    """What a slurm.conf says about scheduling.

    Attributes:
        knobs: the ``slurm`` policy's knobs (``make_policy("slurm", **knobs)``; the ``amoebad`` policy takes the
            same ones beside its layers).
        grace_time: the longest ``GraceTime`` of a preemptible partition (the simulator's ``grace_time``).
        nodes: GPU nodes, or ``None`` when the file names none or they differ in GPUs.
        gpus_per_node: GPUs of each of them, or ``None``.
    """

    knobs: dict[str, object]
    grace_time: float
    nodes: int | None
    gpus_per_node: int | None


def _pairs(text: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep:
            pairs[key.lower()] = value
    return pairs


def read_slurm_conf(path: Path) -> SlurmSite:
    """Read the scheduling settings of a slurm.conf.

    Args:
        path: the file.

    Returns:
        The settings.

    Raises:
        ParseError: the file cannot be read, or a known key has a value that cannot be read (with the line).
    """
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ParseError(f"cannot read the slurm.conf ({exc.strerror}); check the path", source=str(path)) from None
    knobs: dict[str, object] = {}
    partitions: list[SlurmPartition] = []
    gpus: list[int] = []
    basic = True
    preempting = False
    default_mode = "off"
    for number, raw in enumerate(lines, start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        pairs = _pairs(text)
        try:
            if "partitionname" in pairs:
                partitions.append(_partition(pairs, default_mode))
                continue
            if "nodename" in pairs:
                count = parse_gres_count(pairs.get("gres", ""), source=f"{path} line {number}")
                if count:
                    gpus.extend([count] * len(expand_nodelist(pairs["nodename"])))
                continue
            for key, value in pairs.items():
                if key == "prioritytype":
                    basic = value.strip().lower() != "priority/multifactor"
                elif key in _WEIGHTS:
                    knobs[_WEIGHTS[key]] = float(int(value))
                elif key == "prioritymaxage":
                    knobs["max_age_s"] = parse_slurm_time(value)
                elif key == "priorityfavorsmall":
                    knobs["favor_small"] = _yes(value)
                elif key == "schedulerparameters":
                    knobs.update(_scheduler_parameters(value))
                elif key == "preempttype":
                    preempting = value.strip().lower() == "preempt/partition_prio"
                elif key == "preemptmode":
                    default_mode = _mode(value)
        except (ValueError, KeyError) as exc:
            raise ParseError(f"line {number}: {exc} in {text!r}", source=str(path)) from None
    if basic:
        for knob in _WEIGHTS.values():
            knobs[knob] = 0.0
    if not preempting:
        partitions = [dataclasses.replace(partition, preempt_mode="off") for partition in partitions]
    knobs["partitions"] = tuple(partitions)
    grace = max((part.grace_time for part in partitions if part.preempt_mode != "off"), default=0.0)
    uniform = bool(gpus) and len(set(gpus)) == 1
    return SlurmSite(knobs, grace, len(gpus) if uniform else None, gpus[0] if uniform else None)


def _partition(pairs: dict[str, str], default_mode: str) -> SlurmPartition:
    mode = _mode(pairs["preemptmode"]) if "preemptmode" in pairs else default_mode
    return SlurmPartition(
        name=pairs["partitionname"],
        priority_tier=int(pairs.get("prioritytier", "1")),
        preempt_mode=mode,
        grace_time=float(int(pairs.get("gracetime", "0"))),
    )


def _mode(value: str) -> str:
    first = value.split(",")[0].strip().lower()
    if first not in ("off", "requeue", "cancel"):
        raise ValueError(f"PreemptMode={value} is not modelled (use OFF, REQUEUE or CANCEL)")
    return first


def _yes(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("yes", "no"):
        raise ValueError(f"{value!r} is neither YES nor NO")
    return lowered == "yes"


def _scheduler_parameters(value: str) -> dict[str, object]:
    knobs: dict[str, object] = {}
    for item in value.split(","):
        key, _, setting = item.partition("=")
        if key == "bf_window":
            knobs["bf_window_s"] = int(setting) * 60.0
        elif key == "bf_max_job_test":
            knobs["bf_max_job_test"] = int(setting)
    return knobs
