"""The round's decide step as a plain function: the composed policy's checked actions, the drain, a broken invariant;
and what the daemon's composition holds (the layers the configuration turns on, a policy it cannot run refused)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from slurm_amoeba.daemon import ConfigError, DaemonConfig, compose_policy
from slurm_amoeba.daemon.config import Admission, Sharing
from slurm_amoeba.daemon.executor import SHARING_OFF
from slurm_amoeba.daemon.observer import Observation
from slurm_amoeba.daemon.rounds import decide
from slurm_amoeba.policy import Action, DrainPolicy, JobInfo, Move, Place, Resize, Share, Snapshot, Start
from slurm_amoeba.policy.drain import DRAIN_REASON
from slurm_amoeba.policy.moves import WholeNodeMoves
from tests.unit.policy.helpers import job, snapshot


class Fixed:
    """A policy that answers with fixed actions."""

    name = "fixed"
    decides_on_events_only = True
    emits = frozenset({Start, Resize})

    def __init__(self, *actions: Action) -> None:
        self.actions = list(actions)
        self.asked = 0

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        self.asked += 1
        return self.actions


def observation(jobs: Sequence[JobInfo], managed: Sequence[str]) -> Observation:
    snap = snapshot([4, 4], jobs)
    return Observation(
        snapshot=snap,
        managed={info.job_id: info for info in jobs if info.job_id in managed},
        orphans=(),
        unclaimed=(),
        gone=(),
        regular_running=0,
        regular_pending=0,
    )


ELASTIC = job("e", 1, placement={"n0": 2}, low=1, high=4)


def test_the_policys_actions_become_the_plan() -> None:
    plan = decide(DrainPolicy(Fixed(Resize("e", 4, reason="grow")), False), observation([ELASTIC], ["e"]), 0.0)
    assert (plan.actions, plan.source, plan.error) == ((Resize("e", 4, reason="grow"),), "policy", "")


def test_an_action_without_a_reason_carries_the_policys_name() -> None:
    plan = decide(DrainPolicy(Fixed(Resize("e", 3)), False), observation([ELASTIC], ["e"]), 0.0)
    assert plan.actions == (Resize("e", 3, reason="fixed"),)


def test_a_drain_plans_every_managed_job_to_its_minimum_without_asking_the_policy() -> None:
    big = job("e", 1, placement={"n0": 3}, low=1, high=4)
    inner = Fixed(Resize("e", 4))
    plan = decide(DrainPolicy(inner, True), observation([big], ["e"]), 0.0)
    assert (plan.actions, plan.source, inner.asked) == ((Resize("e", 1, reason=DRAIN_REASON),), "drain", 0)


def test_actions_that_break_an_invariant_plan_nothing_and_say_why() -> None:
    plan = decide(DrainPolicy(Fixed(Resize("e", 9)), False), observation([ELASTIC], ["e"]), 0.0)
    assert plan.actions == () and plan.error.startswith("policy error: job e: 9 workers lies outside its range")


def test_the_composition_puts_the_drain_outermost_and_moves_only_where_configured() -> None:
    plain = compose_policy(DaemonConfig(policy="elastic-backfill"))
    assert isinstance(plain, DrainPolicy) and not plain.draining and Move not in plain.emits
    moving = compose_policy(
        DaemonConfig(policy="elastic-backfill", whole_node_starts=True, admission=Admission(enabled=False)), {"7"}
    )
    assert isinstance(moving.inner, WholeNodeMoves) and moving.inner.recent == {"7"} and Move in moving.emits


@pytest.mark.parametrize("name", ["sjf-ffs", "sjf-bsbf"])
def test_a_policy_that_shares_gpus_is_refused_at_configuration_unless_the_site_switches_sharing_on(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"policy {name!r} cannot run in amoebad") as caught:
        compose_policy(DaemonConfig(policy=name))
    assert SHARING_OFF in str(caught.value)
    sharing = Sharing(enabled=True, partitions={"share": 4})
    assert Share in compose_policy(DaemonConfig(policy=name, sharing=sharing)).emits


def test_the_amoebad_policys_whole_node_places_are_refused_and_its_plain_form_is_not() -> None:
    knobs = {"admission": True, "whole_node": True}
    with pytest.raises(ConfigError, match="its place actions cannot be applied live"):
        compose_policy(DaemonConfig(policy="amoebad", policy_knobs=knobs))
    assert Place not in compose_policy(DaemonConfig(policy="amoebad")).emits
