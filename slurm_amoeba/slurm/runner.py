"""Run one Slurm command: an argv list, a timeout, never a shell.

Every Slurm command slurm_amoeba runs goes through :func:`run_command`; a failure of any kind (missing binary,
non-zero exit, timeout) becomes a :class:`SlurmCommandError` that carries the argv, the exit code and stderr, so
the caller can tell the user what went wrong and what to do next.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
from collections.abc import Mapping, Sequence

from slurm_amoeba.core.errors import AmoebaError, SpecError

logger = logging.getLogger(__name__)

#: Seconds one Slurm command may run before it is killed and reported: the one default of every program.
DEFAULT_TIMEOUT_S = 30.0
#: The environment variable that overrides :data:`DEFAULT_TIMEOUT_S` for a program (amoebad's own setting is
#: ``slurm.timeout_s`` in its configuration).
ENV_SLURM_TIMEOUT = "AMOEBA_SLURM_TIMEOUT_S"
#: The longest timeout :func:`timeout_from` takes.
MAX_TIMEOUT_S = 600.0


class SlurmCommandError(AmoebaError):
    """A Slurm command could not be run, failed, or did not finish in time.

    Attributes:
        argv: the command as run.
        returncode: its exit code, or None when it never ran or was killed at its timeout.
        stderr: what it wrote to standard error (stripped).
        timed_out: whether it was killed at its timeout.
    """

    def __init__(
        self,
        argv: Sequence[str],
        returncode: int | None,
        stderr: str,
        *,
        timed_out: bool = False,
        hint: str = "",
    ) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        self.timed_out = timed_out
        command = " ".join(self.argv)
        if timed_out:
            what = f"`{command}` did not finish in time"
        elif returncode is None:
            what = f"`{command}` could not be run"
        else:
            what = f"`{command}` failed with exit code {returncode}"
        message = what + (f": {self.stderr}" if self.stderr else "")
        if hint:
            message += f" ({hint})"
        super().__init__(message)


def timeout_from(env: Mapping[str, str]) -> float:
    """The timeout of every Slurm command of a program: ``AMOEBA_SLURM_TIMEOUT_S`` in ``env``, else the default.

    Raises:
        SpecError: the variable is not a number of seconds above 0 and at most :data:`MAX_TIMEOUT_S`.
    """
    text = env.get(ENV_SLURM_TIMEOUT, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_TIMEOUT_S:
        raise SpecError(
            f"{ENV_SLURM_TIMEOUT}={text!r} is not a timeout: give seconds above 0 and at most {MAX_TIMEOUT_S:g}, "
            f"or unset it for the default of {DEFAULT_TIMEOUT_S:g}"
        )
    return value


@dataclasses.dataclass(frozen=True)
class CommandResult:
    """What a successful command printed."""

    argv: list[str]
    stdout: str
    stderr: str


def run_command(
    argv: Sequence[str],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    input_text: str | None = None,
    cwd: str | None = None,
) -> CommandResult:
    """Run ``argv`` and return its output, or raise.

    Args:
        argv: the program and its arguments (no shell is involved: no quoting, no expansion).
        timeout: seconds before the command is killed.
        env: the complete environment of the command (None: this process's).
        input_text: text fed to its standard input (None: no input).
        cwd: working directory (None: this process's).

    Returns:
        The command's standard output and standard error.

    Raises:
        SlurmCommandError: the program is missing, exits non-zero, or runs past ``timeout``.
    """
    args = [str(a) for a in argv]
    if not args:
        raise SlurmCommandError(args, None, "", hint="empty argv: name the program to run")
    logger.debug("[slurm/runner] running %s", args)
    try:
        proc = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            input=input_text,
            stdin=None if input_text is not None else subprocess.DEVNULL,
            cwd=cwd,
            check=False,
        )
    except FileNotFoundError as exc:
        raise SlurmCommandError(
            args,
            None,
            str(exc),
            hint="is Slurm's client installed and on PATH? scripts/bootstrap installs it",
        ) from None
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise SlurmCommandError(
            args,
            None,
            err,
            timed_out=True,
            hint=f"killed after {timeout:g} s; is slurmctld up? `scontrol ping` tells",
        ) from None
    if proc.returncode != 0:
        raise SlurmCommandError(args, proc.returncode, proc.stderr)
    return CommandResult(argv=args, stdout=proc.stdout, stderr=proc.stderr)
