"""Every action type against both executors: applied by the simulator's and the daemon's, or refused live with a
reason, and then every policy that can emit it is refused by the daemon's configuration (DESIGN.md, the control and
simulation flows; policy/actions.py)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from slurm_amoeba.daemon import ConfigError, DaemonConfig, compose_policy
from slurm_amoeba.daemon.config import Sharing
from slurm_amoeba.daemon.executor import APPLIED, REFUSED
from slurm_amoeba.policy import ACTION_TYPES, Action, action_name, make_policy, policy_names
from slurm_amoeba.policy.actions import Share
from slurm_amoeba.sim.executor import SimCluster, SimExecutor

#: Knobs that make a registered policy emit more action types than its defaults (each is configured as well).
WIDER: list[tuple[str, dict[str, Any]]] = [("amoebad", {"admission": True, "whole_node": True})]


@pytest.mark.parametrize("kind", ACTION_TYPES, ids=[action_name(kind) for kind in ACTION_TYPES])
def test_every_action_type_is_applied_by_both_executors_or_refused_live_with_a_reason(kind: type[Action]) -> None:
    assert kind in SimExecutor(cast(SimCluster, object())).applies
    assert (kind in APPLIED) != (kind in REFUSED)
    assert (APPLIED.get(kind) or REFUSED[kind]).strip()


@pytest.mark.parametrize(
    ("name", "knobs"), [*((name, {}) for name in policy_names()), *WIDER], ids=lambda value: str(value or "")
)
def test_every_policy_that_can_emit_a_refused_action_is_refused_by_the_daemons_configuration(
    name: str, knobs: dict[str, Any]
) -> None:
    config = DaemonConfig(policy=name, policy_knobs=knobs)
    off_here = set(REFUSED) | {Share}  # sharing is off unless the site switches it on
    refused = sorted(action_name(kind) for kind in make_policy(name, **config.effective_knobs()).emits & off_here)
    if not refused:
        assert not compose_policy(config).emits & off_here
        return
    with pytest.raises(ConfigError, match=f"policy {name!r} cannot run in amoebad") as caught:
        compose_policy(config)
    assert all(f"its {kind} actions cannot be applied live" in str(caught.value) for kind in refused)


@pytest.mark.parametrize("name", [name for name in policy_names() if Share in make_policy(name).emits])
def test_a_sharing_policy_runs_in_amoebad_once_the_site_switches_sharing_on(name: str) -> None:
    config = DaemonConfig(policy=name, sharing=Sharing(enabled=True, partitions={"share": 1}))
    emits = make_policy(name, **config.effective_knobs()).emits
    if emits & set(REFUSED):
        with pytest.raises(ConfigError, match="cannot run in amoebad"):
            compose_policy(config)
        return
    assert Share in compose_policy(config).emits
