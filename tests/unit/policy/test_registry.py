"""The registry builds every policy by name and fails loudly on unknown names and knobs."""

from __future__ import annotations

import pytest

from slurm_amoeba.policy import DEFAULT_POLICY, Policy, PolicyError, make_policy, policy_knobs, policy_names


def test_every_registered_name_builds_a_policy_with_that_name() -> None:
    for name in policy_names():
        policy = make_policy(name)
        assert isinstance(policy, Policy)
        assert policy.name == name
    assert DEFAULT_POLICY in policy_names()


def test_an_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(PolicyError, match="'lottery' is not registered; valid policies are: fifo, srtf"):
        make_policy("lottery")


def test_an_unknown_knob_lists_the_valid_knobs_with_defaults() -> None:
    expected = r"policy 'e-tiresias': unknown key 'speed'; valid keys \(with their defaults\) are: .*min_gain=0.1"
    with pytest.raises(PolicyError, match=expected):
        make_policy("e-tiresias", speed=3)


def test_knobs_are_passed_and_validated() -> None:
    assert policy_knobs("tiresias") == {"threshold_gpu_s": 57600.0}
    with pytest.raises(PolicyError, match="threshold_gpu_s=-1"):
        make_policy("tiresias", threshold_gpu_s=-1)
    with pytest.raises(PolicyError, match="min_gain=-0.5"):
        make_policy("elastic-backfill", min_gain=-0.5)
