"""The system-user helper shared by the replay and the two-user tests: an existing user's uid, a refusal as an error
that names the user (the tests turn it into a skip)."""

from __future__ import annotations

import os
import pwd

import pytest

from benchmarks.system_users import SystemUserError, system_user


def test_an_existing_user_is_found_without_useradd() -> None:
    me = pwd.getpwuid(os.getuid()).pw_name
    assert system_user(me) == os.getuid()


def test_a_user_that_cannot_be_made_is_an_error_naming_it() -> None:
    with pytest.raises(SystemUserError, match="cannot create the system user no/such user"):
        system_user("no/such user")  # not a valid name: useradd refuses it (or, not root, refuses anything)
