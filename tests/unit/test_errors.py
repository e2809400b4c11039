"""The one unknown-key message: the key as written, then every valid key with its default."""

from __future__ import annotations

from slurm_amoeba.core.errors import unknown_key_message


def test_the_message_names_where_the_key_and_every_valid_key_with_its_default() -> None:
    message = unknown_key_message("site.yaml", "agents.timout_s", {"timeout_s": 3.0, "conf": None, "name": "x"})
    assert message == (
        "site.yaml: unknown key 'agents.timout_s'; valid keys (with their defaults) are: "
        "timeout_s=3.0, conf=None, name='x'"
    )


def test_a_place_without_valid_keys_says_none() -> None:
    assert unknown_key_message("policy 'fifo'", "speed", {}).endswith("are: none")
