"""System users for runs on the local cluster: the replay's unprivileged daemon user, and the tests' users.

The cluster's nodes share the host's ``/etc/passwd`` (each node is a network, UTS and mount namespace of the same
root file system), so a user created here exists on every node. Such users own nothing and may log in nowhere; they
are left for later runs. The tests import this module too (``tests/integration/test_daemon_two_users.py``), and turn
its error into a skip.
"""

from __future__ import annotations

import pwd
import subprocess

#: useradd's exit code for a user that exists already (made meanwhile by a run beside this one).
USERADD_EXISTS = 9


class SystemUserError(RuntimeError):
    """A missing system user could not be created (not root, no ``useradd``, an invalid name)."""


def system_user(name: str) -> int:
    """The uid of ``name``, created as a system user without a home or a login shell when missing.

    Raises:
        SystemUserError: it is missing and cannot be created (the sentence names the user and useradd's message).
    """
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        pass
    try:
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SystemUserError(f"cannot create the system user {name}: {exc}") from None
    if made.returncode not in (0, USERADD_EXISTS):
        raise SystemUserError(f"cannot create the system user {name}: {made.stderr.strip() or made.returncode}")
    return pwd.getpwnam(name).pw_uid
