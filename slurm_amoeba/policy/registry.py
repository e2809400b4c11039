"""The policies by name, for configuration files and command lines.

``make_policy("e-tiresias", min_gain=0.2)`` builds a policy; an unknown name or an unknown knob fails loudly with
the valid names or knobs (and their defaults). ``amoebad`` (Slurm's baseline with the daemon on top) takes layered
knobs: ``make_policy("amoebad", admission=True, **{"admission.max_hold_s": 0.0})`` (:mod:`slurm_amoeba.policy.amoebad`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from slurm_amoeba.core.errors import unknown_key_message
from slurm_amoeba.policy.amoebad import amoebad_knobs, make_amoebad
from slurm_amoeba.policy.backfill import ElasticBackfillPolicy
from slurm_amoeba.policy.fifo import FifoPolicy
from slurm_amoeba.policy.goodput import GoodputPolicy
from slurm_amoeba.policy.pairing import ShareMode
from slurm_amoeba.policy.sharing import PairingPolicy, SjfSharingPolicy
from slurm_amoeba.policy.slurm_baseline import SlurmBaselinePolicy
from slurm_amoeba.policy.srtf import SrtfPolicy
from slurm_amoeba.policy.tiresias import ElasticTiresiasPolicy, TiresiasPolicy
from slurm_amoeba.policy.types import Policy, PolicyError


def _sjf_bsbf(**knobs: Any) -> Policy:
    return PairingPolicy(ShareMode.BENEFIT, **knobs)


def _antman(**knobs: Any) -> Policy:
    return PairingPolicy(ShareMode.OPPORTUNISTIC, **knobs)


def _bsbf_knobs() -> dict[str, object]:
    """SJF-BSBF takes no knobs (the pace bound is AntMan's)."""
    return {}


def _fields(cls: type) -> Callable[[], dict[str, object]]:
    """The knobs of a policy dataclass: its init fields with their defaults."""

    def knobs() -> dict[str, object]:
        return {field.name: field.default for field in dataclasses.fields(cls) if field.init and field.name != "mode"}

    return knobs


#: name -> (factory, the knobs it takes with their defaults).
_FACTORIES: dict[str, tuple[Callable[..., Policy], Callable[[], dict[str, object]]]] = {
    "fifo": (FifoPolicy, _fields(FifoPolicy)),
    "srtf": (SrtfPolicy, _fields(SrtfPolicy)),
    "tiresias": (TiresiasPolicy, _fields(TiresiasPolicy)),
    "e-tiresias": (ElasticTiresiasPolicy, _fields(ElasticTiresiasPolicy)),
    "elastic-backfill": (ElasticBackfillPolicy, _fields(ElasticBackfillPolicy)),
    "sjf-ffs": (SjfSharingPolicy, _fields(SjfSharingPolicy)),
    "sjf-bsbf": (_sjf_bsbf, _bsbf_knobs),
    "antman": (_antman, _fields(PairingPolicy)),
    "slurm": (SlurmBaselinePolicy, _fields(SlurmBaselinePolicy)),
    "amoebad": (make_amoebad, amoebad_knobs),
    "goodput": (GoodputPolicy, _fields(GoodputPolicy)),
}

#: The policy the daemon uses when its configuration names none.
DEFAULT_POLICY = "elastic-backfill"


def policy_names() -> list[str]:
    """The names :func:`make_policy` accepts, in registration order."""
    return list(_FACTORIES)


def policy_knobs(name: str) -> dict[str, object]:
    """The knobs a policy takes, with their defaults.

    Args:
        name: a registered policy name.

    Returns:
        knob -> default.

    Raises:
        PolicyError: the name is not registered.
    """
    _, knobs = _lookup(name)
    return knobs()


def make_policy(name: str, **knobs: Any) -> Policy:
    """Build a policy by its registered name.

    Args:
        name: one of :func:`policy_names`.
        **knobs: the policy's settings (see :func:`policy_knobs`).

    Returns:
        The policy.

    Raises:
        PolicyError: unknown name, unknown knob, or a knob with an invalid value.
    """
    factory, _ = _lookup(name)
    valid = policy_knobs(name)
    unknown = sorted(set(knobs) - set(valid))
    if unknown:
        raise PolicyError(unknown_key_message(f"policy {name!r}", ", ".join(unknown), valid))
    return factory(**knobs)


def _lookup(name: str) -> tuple[Callable[..., Policy], Callable[[], dict[str, object]]]:
    try:
        return _FACTORIES[name]
    except KeyError:
        raise PolicyError(f"policy {name!r} is not registered; valid policies are: {', '.join(_FACTORIES)}") from None
