"""Submission options and batch-script rendering (plain and heterogeneous jobs).

:class:`SubmitOptions` is one job (or one heterogeneous component) as sbatch options; it renders either as
command-line arguments or as ``#SBATCH`` lines. :func:`render_batch_script` writes a whole script, with
``#SBATCH hetjob`` between components (the shape of every batch script the project submits), and
:func:`sbatch_argv` the sbatch command that submits one. Values are validated here so that a bad value
fails before anything is submitted, with the option and the value in the message.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Sequence

from slurm_amoeba.core.errors import SpecError

_SAFE_VALUE = re.compile(r"^[^\n\r\0]*$")
_DEPENDENCY = re.compile(r"^(after|afterany|afterok|afternotok|aftercorr|singleton|expand)(:[0-9+:_]+)?([,?].*)?$")


@dataclasses.dataclass(frozen=True)
class SubmitOptions:
    """sbatch options for one job or one heterogeneous component.

    Attributes are sbatch's options under readable names; None (or 0 where noted) leaves an option out so that
    Slurm's defaults apply. ``extra`` passes further options through as they are (each one argv item).
    """

    name: str | None = None
    comment: str | None = None
    partition: str | None = None
    nodes: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    gpus_per_node: int = 0
    mem_mb: int | None = None
    time_min: int | None = None
    dependency: str | None = None
    nodelist: str | None = None
    exclude: str | None = None
    output: str | None = None
    error: str | None = None
    chdir: str | None = None
    hold: bool = False
    no_kill: bool = False
    signal: str | None = None
    export: str | None = None
    extra: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for field in ("nodes", "ntasks", "ntasks_per_node", "cpus_per_task", "mem_mb", "time_min"):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise SpecError(f"SubmitOptions.{field}={value!r} is invalid: give a whole number of at least 1")
        if self.gpus_per_node < 0:
            raise SpecError(f"SubmitOptions.gpus_per_node={self.gpus_per_node} is invalid: give 0 or more")
        for field in (
            "name",
            "comment",
            "partition",
            "dependency",
            "nodelist",
            "exclude",
            "output",
            "error",
            "chdir",
            "signal",
            "export",
        ):
            value = getattr(self, field)
            if value is not None and not _SAFE_VALUE.match(value):
                raise SpecError(f"SubmitOptions.{field}={value!r} is invalid: it may not hold a newline or NUL")
        if self.dependency is not None and not _DEPENDENCY.match(self.dependency):
            raise SpecError(
                f"SubmitOptions.dependency={self.dependency!r} is not a Slurm dependency, e.g. 'afterok:123'"
            )
        for item in self.extra:
            if not _SAFE_VALUE.match(item):
                raise SpecError(f"SubmitOptions.extra item {item!r} may not hold a newline or NUL")

    def to_args(self) -> list[str]:
        """These options as sbatch arguments (``--name=value`` items)."""
        pairs: list[tuple[str, str | None]] = [
            ("job-name", self.name),
            ("comment", self.comment),
            ("partition", self.partition),
            ("nodes", _opt(self.nodes)),
            ("ntasks", _opt(self.ntasks)),
            ("ntasks-per-node", _opt(self.ntasks_per_node)),
            ("cpus-per-task", _opt(self.cpus_per_task)),
            ("gres", f"gpu:{self.gpus_per_node}" if self.gpus_per_node else None),
            ("mem", f"{self.mem_mb}M" if self.mem_mb else None),
            ("time", _opt(self.time_min)),
            ("dependency", self.dependency),
            ("nodelist", self.nodelist),
            ("exclude", self.exclude),
            ("output", self.output),
            ("error", self.error),
            ("chdir", self.chdir),
            ("signal", self.signal),
            ("export", self.export),
        ]
        args = [f"--{key}={value}" for key, value in pairs if value is not None]
        if self.hold:
            args.append("--hold")
        if self.no_kill:
            args.append("--no-kill")
        args.extend(self.extra)
        return args


def _directive(arg: str) -> str:
    """One sbatch argument as the text after ``#SBATCH``; sbatch reads double quotes there, not backslashes."""
    if not any(c.isspace() for c in arg):
        return arg
    if '"' in arg:
        raise SpecError(f"sbatch option {arg!r} holds both a space and a double quote; #SBATCH cannot carry it")
    key, sep, value = arg.partition("=")
    return f'{key}="{value}"' if sep else f'"{arg}"'


def _opt(value: int | None) -> str | None:
    return None if value is None else str(value)


def het_submit_args(components: Sequence[SubmitOptions]) -> list[str]:
    """sbatch arguments for a job of one or more components (``:`` between heterogeneous components).

    Raises:
        SpecError: no component was given.
    """
    if not components:
        raise SpecError("a job needs at least one component of SubmitOptions")
    args: list[str] = []
    for i, comp in enumerate(components):
        if i:
            args.append(":")
        args.extend(comp.to_args())
    return args


def sbatch_argv(
    components: Sequence[SubmitOptions], script: str, script_args: Sequence[str] = (), *, test_only: bool = False
) -> list[str]:
    """The sbatch command that submits ``script``.

    Args:
        components: the job's components as options (``:`` between heterogeneous ones); none: the script's own
            ``#SBATCH`` lines say everything.
        script: the batch script's path.
        script_args: the script's arguments.
        test_only: ``--test-only`` (Slurm says when and where the job would start, and submits nothing) instead of
            ``--parsable`` (sbatch prints the job id).
    """
    options = het_submit_args(components) if components else []
    return ["sbatch", "--test-only" if test_only else "--parsable", *options, script, *script_args]


def render_batch_script(
    components: Sequence[SubmitOptions], commands: Sequence[Sequence[str]], preamble: Sequence[str] = ()
) -> str:
    """Write a batch script: ``#SBATCH`` lines per component (``#SBATCH hetjob`` between), ``set -euo pipefail``,
    the preamble, then the commands.

    Each command is an argv list; it is quoted for the shell, so no word of it is expanded.

    Args:
        components: the job's components (one for an ordinary job).
        commands: the argv lists the script runs, one line each.
        preamble: shell lines run before the commands, as written (e.g. ``export`` lines whose values expand
            ``$SLURM_JOB_ID``); the caller quotes what must not expand.

    Returns:
        The script text.

    Raises:
        SpecError: no component, or no command.
    """
    if not components:
        raise SpecError("a batch script needs at least one component of SubmitOptions")
    if not commands:
        raise SpecError("a batch script needs at least one command to run")
    lines = ["#!/bin/bash", "# Written by slurm_amoeba."]
    for i, comp in enumerate(components):
        if i:
            lines.append("#SBATCH hetjob")
        lines.extend(f"#SBATCH {_directive(arg)}" for arg in comp.to_args())
    lines.append("set -euo pipefail")
    lines.extend(preamble)
    lines.extend(shlex.join(list(cmd)) for cmd in commands)
    return "\n".join(lines) + "\n"
