"""``amoeba-sim run|compare --daemon-config FILE``: an amoebad configuration as the simulator's ``amoebad`` policy.

Simulation flow (DESIGN.md): a site's ``amoebad`` YAML (``configs/amoebad.yaml``), read by the daemon's own loader
(:func:`slurm_amoeba.daemon.config.load_config`, so that a file the daemon refuses is refused here with the same
message) -> the knobs of the ``amoebad`` policy (:mod:`slurm_amoeba.policy.amoebad`: Slurm's baseline with that
daemon on top) -> a run of the simulator. It sits in ``cli/`` because ``sim/`` may not import the daemon.

What carries over: the policy's knobs (``elastic-backfill``'s ``min_gain`` and ``grow_by_service``; its
``start_pending`` is the simulator's Slurm model), ``admission.enabled`` with ``max_hold_s`` (the admission layer,
with every satellite Slurm's to take as live: ``admission.slurm_takes_loans_only=false``), ``whole_node_starts``
(the whole-node layer) and ``queue_order.enabled`` with its thresholds (the LAS order layer). What the simulator
does not model (which users and partitions admission and queue order apply to, the updates per round) is returned as
notes. A daemon policy the simulator cannot put on top of Slurm is refused with the reason.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from slurm_amoeba.daemon.config import DaemonConfig, load_config
from slurm_amoeba.sim.data import SimError

#: The daemon policies the simulator can put on top of Slurm's baseline.
ON_TOP_OF_SLURM = ("elastic-backfill",)

#: The daemon policy's knobs -> the ``amoebad`` policy's; ``None``: the simulator's Slurm model takes its place.
_POLICY_KNOBS: dict[str, str | None] = {
    "min_gain": "elastic.min_gain",
    "grow_by_service": "elastic.grow_by_service",
    "start_pending": None,
}


@dataclasses.dataclass(frozen=True)
class DaemonRun:
    """An amoebad configuration as a simulator run.

    Attributes:
        label: the row it is reported under: the file's stem.
        knobs: the ``amoebad`` policy's knobs (``make_policy("amoebad", **knobs)``).
        notes: what the file sets that the simulator does not model, one sentence each.
    """

    label: str
    knobs: dict[str, object]
    notes: tuple[str, ...]


def daemon_run(path: Path) -> DaemonRun:
    """Read an amoebad configuration and map it onto the ``amoebad`` policy.

    Args:
        path: the daemon's YAML file.

    Returns:
        The label, knobs and notes.

    Raises:
        ConfigError: the file cannot be read, is not YAML, or the daemon would refuse it.
        SimError: it runs a policy, or a combination of switches, that the simulator cannot put on top of Slurm.
    """
    config = load_config(path)
    return DaemonRun(path.stem or "amoebad", amoebad_knobs_of(config), _notes(config))


def amoebad_knobs_of(config: DaemonConfig) -> dict[str, object]:
    """The ``amoebad`` policy's knobs that simulate ``config`` on top of Slurm's baseline.

    Raises:
        SimError: a daemon policy other than those of :data:`ON_TOP_OF_SLURM`, or ``whole_node_starts`` without
            admission (the simulator models whole-node starts under admission only).
    """
    where = config.source
    if config.policy not in ON_TOP_OF_SLURM:
        raise SimError(
            f"{where}: policy.name {config.policy!r}: the simulator puts only {', '.join(ON_TOP_OF_SLURM)} on top of "
            f"Slurm's baseline (it models what amoebad adds to Slurm, not a policy that replaces Slurm's decisions); "
            f"simulate this policy alone with `amoeba-sim run --policy {config.policy}`, or set policy.name to "
            f"elastic-backfill"
        )
    knobs: dict[str, object] = {}
    for key, value in config.policy_knobs.items():
        target = _POLICY_KNOBS.get(key, "")
        if target == "":
            raise SimError(f"{where}: policy.knobs.{key} has no counterpart in the simulator's amoebad policy")
        if target is not None:
            knobs[target] = value
    if config.admission.enabled:
        knobs["admission"] = True
        knobs["admission.max_hold_s"] = config.admission.max_hold_s
        knobs["admission.slurm_takes_loans_only"] = False
    if config.whole_node_starts:
        if not config.admission.enabled:
            raise SimError(
                f"{where}: whole_node_starts is true while admission.enabled is false; the simulator models "
                f"whole-node starts under admission only: enable admission or set whole_node_starts to false"
            )
        knobs["whole_node"] = True
    if config.queue_order.enabled:
        knobs["las_order"] = True
        knobs["las_order.thresholds_gpu_s"] = tuple(config.queue_order.thresholds_gpu_s)
    return knobs


def _notes(config: DaemonConfig) -> tuple[str, ...]:
    notes = []
    for section, enabled, partitions, users in (
        ("admission", config.admission.enabled, config.admission.partitions, config.admission.users),
        ("queue_order", config.queue_order.enabled, config.queue_order.partitions, config.queue_order.users),
    ):
        if enabled and (partitions or users):
            notes.append(
                f"{section}.partitions and {section}.users are not modelled: the simulator applies it to every job"
            )
    if config.queue_order.enabled:
        notes.append("queue_order.max_updates_per_round is not modelled: every pending job is reordered each round")
    return tuple(notes)
