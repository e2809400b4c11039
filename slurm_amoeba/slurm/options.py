"""sbatch's command line and ``#SBATCH`` lines as each supported sbatch (22.05 to 25.11) reads them, and Slurm's time
formats.

``amoeba-sbatch`` (DESIGN.md, job flow) takes sbatch's own options beside its own and must split them the way sbatch
would: which options take a value (``-t 30``, ``--time=30``, ``-t30``), which take one only with ``=``
(``--exclusive[=user]``), short flags in a cluster (``-Hv``), long options abbreviated to a unique prefix
(``--acc=x``, as getopt allows), where the script starts, and what the script's ``#SBATCH`` header says. This module
is that knowledge, from sbatch's manual page (Slurm 22.05) and each later release's option table
(``src/common/slurm_opt.c``); it parses and decides nothing about elastic jobs.

An option the table does not know (another SPANK plugin's) is passed to sbatch as written: ``--opt=value``, or
``--opt value`` when another word follows the value (the script must come after it), else ``--opt`` alone.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import shlex
from collections.abc import Iterable, Sequence

from slurm_amoeba.core.errors import SpecError
from slurm_amoeba.slurm.release import SUPPORTED_SERIES, SlurmRelease


class Arity(enum.Enum):
    """Whether an option takes a value."""

    NONE = "none"  # a flag
    REQUIRED = "required"  # --opt=value, --opt value, -ovalue, -o value
    OPTIONAL = "optional"  # only --opt=value (a following word is not its value)


_R, _O, _N = Arity.REQUIRED, Arity.OPTIONAL, Arity.NONE

#: Every sbatch option of Slurm 22.05 (``man sbatch``): long name -> (short letter or "", arity).
SBATCH_OPTIONS: dict[str, tuple[str, Arity]] = {
    "account": ("A", _R), "acctg-freq": ("", _R), "array": ("a", _R), "batch": ("", _R), "bb": ("", _R),
    "bbf": ("", _R), "begin": ("b", _R), "chdir": ("D", _R), "cluster-constraint": ("", _R), "clusters": ("M", _R),
    "comment": ("", _R), "constraint": ("C", _R), "container": ("", _R), "contiguous": ("", _N),
    "core-spec": ("S", _R), "cores-per-socket": ("", _R), "cpu-freq": ("", _R), "cpus-per-gpu": ("", _R),
    "cpus-per-task": ("c", _R), "deadline": ("", _R), "delay-boot": ("", _R), "dependency": ("d", _R),
    "distribution": ("m", _R), "error": ("e", _R), "exclude": ("x", _R), "exclusive": ("", _O), "export": ("", _R),
    "export-file": ("", _R), "extra-node-info": ("B", _R), "get-user-env": ("", _O), "gid": ("", _R),
    "gpu-bind": ("", _R), "gpu-freq": ("", _R), "gpus": ("G", _R), "gpus-per-node": ("", _R),
    "gpus-per-socket": ("", _R), "gpus-per-task": ("", _R), "gres": ("", _R), "gres-flags": ("", _R),
    "help": ("h", _N), "hint": ("", _R), "hold": ("H", _N), "ignore-pbs": ("", _N), "input": ("i", _R),
    "job-name": ("J", _R), "kill-on-invalid-dep": ("", _R), "licenses": ("L", _R), "mail-type": ("", _R),
    "mail-user": ("", _R), "mcs-label": ("", _R), "mem": ("", _R), "mem-bind": ("", _R), "mem-per-cpu": ("", _R),
    "mem-per-gpu": ("", _R), "mincpus": ("", _R), "network": ("", _R), "nice": ("", _O), "no-kill": ("k", _O),
    "no-requeue": ("", _N), "nodefile": ("F", _R), "nodelist": ("w", _R), "nodes": ("N", _R), "ntasks": ("n", _R),
    "ntasks-per-core": ("", _R), "ntasks-per-gpu": ("", _R), "ntasks-per-node": ("", _R),
    "ntasks-per-socket": ("", _R), "open-mode": ("", _R), "output": ("o", _R), "overcommit": ("O", _N),
    "oversubscribe": ("s", _N), "parsable": ("", _N), "partition": ("p", _R), "power": ("", _R), "prefer": ("", _R),
    "priority": ("", _R), "profile": ("", _R), "propagate": ("", _O), "qos": ("q", _R), "quiet": ("Q", _N),
    "reboot": ("", _N), "requeue": ("", _N), "reservation": ("", _R), "signal": ("", _R),
    "sockets-per-node": ("", _R), "spread-job": ("", _N), "switches": ("", _R), "test-only": ("", _N),
    "thread-spec": ("", _R), "threads-per-core": ("", _R), "time": ("t", _R), "time-min": ("", _R), "tmp": ("", _R),
    "uid": ("", _R), "usage": ("", _N), "use-min-nodes": ("", _N), "verbose": ("v", _N), "version": ("V", _N),
    "wait": ("W", _N), "wait-all-nodes": ("", _R), "wckey": ("", _R), "wrap": ("", _R),
}  # fmt: skip
#: The options this project's SPANK plugin adds to sbatch (``spank/src/options.c``), where a site installs it.
PLUGIN_OPTIONS: dict[str, tuple[str, Arity]] = {
    "elastic": ("", _R),
    "elastic-partition": ("", _R),
    "no-elastic": ("", _N),
    "share": ("", _O),
}
#: Where Slurm keeps a job's options of this plugin for the commands run inside it (``--elastic`` of an enclosing
#: job reaches an sbatch run in it this way; docs/spank.md, "Inheritance").
PLUGIN_OPTION_ENV_PREFIX = "SLURM_SPANK__SLURM_SPANK_OPTION_amoeba_"
#: How each later release's sbatch differs from 22.05's (``src/common/slurm_opt.c``, options sbatch takes): the
#: options it adds or whose arity changes, and the options it drops.
RELEASE_CHANGES: dict[str, tuple[dict[str, tuple[str, Arity]], frozenset[str]]] = {
    "23.02": (
        {"autocomplete": ("", _R), "container-id": ("", _R), "extra": ("", _R), "tres-per-task": ("", _R)},
        frozenset(),
    ),
    "23.11": ({"tres-bind": ("", _R)}, frozenset({"export-file"})),
    "24.05": (
        {"export-file": ("", _R), "resv-ports": ("", _O), "segment": ("", _R), "stepmgr": ("", _N)},
        frozenset({"power"}),
    ),
    "24.11": ({"oom-kill-step": ("", _O)}, frozenset()),
    "25.05": ({"external": ("", _N), "get-user-env": ("", _N)}, frozenset()),
    "25.11": (
        {"consolidate-segments": ("", _N), "resources": ("", _R), "spread-segments": ("", _N), "requeue": ("", _O)},
        frozenset(),
    ),
}


def sbatch_options(release: SlurmRelease | None = None) -> dict[str, tuple[str, Arity]]:
    """sbatch's options in ``release``: long name -> (short letter or "", arity).

    None, or a release outside 22.05-25.11: every option of any supported release, an option whose arity changed
    taking a value only with ``=`` (read either way).
    """
    series = release.series if release is not None and release.is_supported else None
    options = dict(SBATCH_OPTIONS)
    for name in SUPPORTED_SERIES[1:]:
        if series is not None and name > series:  # "YY.MM" strings sort as the releases do
            break
        added, dropped = RELEASE_CHANGES[name]
        for option, spec in added.items():
            if series is None and option in options and options[option][1] is not spec[1]:
                spec = (spec[0], Arity.OPTIONAL)
            options[option] = spec
        if series is not None:
            for option in dropped:
                options.pop(option, None)
    return options


def _all(release: SlurmRelease | None) -> dict[str, tuple[str, Arity]]:
    return {**sbatch_options(release), **PLUGIN_OPTIONS}


_SHORT = {short: name for name, (short, _) in SBATCH_OPTIONS.items() if short}

#: Options that say where and under whose name a job runs. sbatch copies most options of a heterogeneous job's first
#: component to the others, but not all (measured on 22.05: ``--partition`` and ``--exclusive`` are not copied), so
#: a launcher that builds components itself gives these to every component.
JOB_WIDE_OPTIONS = frozenset(
    {"account", "qos", "constraint", "cluster-constraint", "prefer", "reservation", "exclude", "wckey", "clusters"}
)
#: Options that size a job: its tasks, nodes, CPUs and GPUs.
SIZING_OPTIONS = frozenset(
    {
        "nodes", "ntasks", "cpus-per-task", "ntasks-per-node", "ntasks-per-core", "ntasks-per-socket",
        "ntasks-per-gpu", "gres", "gpus", "gpus-per-node", "gpus-per-socket", "gpus-per-task", "cpus-per-gpu",
        "mem-per-gpu", "extra-node-info", "sockets-per-node", "cores-per-socket", "threads-per-core", "mincpus",
    }
)  # fmt: skip


def wrap_script(command: str) -> str:
    """The batch script ``sbatch --wrap=COMMAND`` submits (sbatch 22.05 writes this one)."""
    return f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{command}\n"


@dataclasses.dataclass(frozen=True)
class SbatchOption:
    """One option as the user wrote it.

    Attributes:
        name: sbatch's long name (``"time"`` for ``-t``, ``--time`` or ``--ti``; ``"elastic"`` for this project's
            plugin), or the spelling without dashes of an option neither lists (another SPANK plugin's).
        value: its value, or None for a flag.
        words: the argv items it took, as written (``("-t", "30")``); passed on unchanged.
        known: whether the release's sbatch or this project's plugin lists it.
    """

    name: str
    value: str | None
    words: tuple[str, ...]
    known: bool = True


def resolve_long(spelling: str, release: SlurmRelease | None = None) -> str | None:
    """The long option a spelling means in ``release``'s sbatch (None: any supported one): itself, else the one
    option it is a unique prefix of (getopt's rule).

    Raises:
        SpecError: the spelling is a prefix of several options.
    """
    known = _all(release)
    if spelling in known:
        return spelling
    matches = sorted(name for name in known if name.startswith(spelling))
    if len(matches) > 1:
        raise SpecError(f"--{spelling} is ambiguous for sbatch: it could be --{', --'.join(matches)}; write it out")
    return matches[0] if matches else None


def _long(args: Sequence[str], i: int, release: SlurmRelease | None) -> tuple[SbatchOption, int]:
    spelling, eq, inline = args[i][2:].partition("=")
    name = resolve_long(spelling, release)
    if name is None:  # not sbatch's own: a plugin's, passed with its value (see the module's docstring)
        if not eq and i + 2 < len(args) and not args[i + 1].startswith("-"):
            return SbatchOption(spelling, args[i + 1], (args[i], args[i + 1]), known=False), i + 2
        return SbatchOption(spelling, inline if eq else None, (args[i],), known=False), i + 1
    arity = _all(release)[name][1]
    if eq:
        if arity is Arity.NONE:
            raise SpecError(f"sbatch option --{name} takes no value, but {args[i]!r} gives one")
        return SbatchOption(name, inline, (args[i],)), i + 1
    if arity is Arity.REQUIRED:
        if i + 1 >= len(args):
            raise SpecError(f"sbatch option {args[i]} needs a value, e.g. {args[i]}=VALUE")
        return SbatchOption(name, args[i + 1], (args[i], args[i + 1])), i + 2
    return SbatchOption(name, None, (args[i],)), i + 1


def _short(args: Sequence[str], i: int) -> tuple[list[SbatchOption], int]:
    word, found = args[i], []
    for pos in range(1, len(word)):
        letter = word[pos]
        name = _SHORT.get(letter)
        if name is None:
            raise SpecError(f"sbatch has no option -{letter} (in {word!r})")
        if SBATCH_OPTIONS[name][1] is not Arity.REQUIRED:
            found.append(SbatchOption(name, None, (f"-{letter}",)))
            continue
        if pos + 1 < len(word):  # -t30: the rest of the word is the value
            found.append(SbatchOption(name, word[pos + 1 :], (f"-{letter}{word[pos + 1 :]}",)))
            return found, i + 1
        if i + 1 >= len(args):
            raise SpecError(f"sbatch option -{letter} needs a value, e.g. -{letter} VALUE")
        found.append(SbatchOption(name, args[i + 1], (f"-{letter}", args[i + 1])))
        return found, i + 2
    return found, i + 1


def read_option(args: Sequence[str], i: int, release: SlurmRelease | None = None) -> tuple[list[SbatchOption], int]:
    """Read the sbatch option(s) starting at ``args[i]`` (several for a cluster of short flags such as ``-Hv``), as
    ``release``'s sbatch reads them (None: any supported release's).

    Returns:
        The options, and the index of the first word after them.

    Raises:
        SpecError: see :func:`split_command_line`.
    """
    if args[i].startswith("--"):
        option, after = _long(args, i, release)
        return [option], after
    return _short(args, i)


def split_command_line(
    args: Sequence[str], release: SlurmRelease | None = None
) -> tuple[list[SbatchOption], list[str]]:
    """Split ``[sbatch options] [script [script args]]`` the way ``release``'s sbatch does (None: any supported
    release's; options stop at the first non-option).

    Returns:
        The options, then the script and its arguments (empty: no script, e.g. with ``--wrap``).

    Raises:
        SpecError: an option without its value, a flag given a value, an ambiguous abbreviation, an unknown short
            option, or a heterogeneous separator (``:``).
    """
    options: list[SbatchOption] = []
    i = 0
    while i < len(args):
        word = args[i]
        if word == ":":
            raise SpecError("':' (heterogeneous components) is not for amoeba-sbatch: it makes the components itself")
        if word == "--":
            return options, list(args[i + 1 :])
        if not word.startswith("-") or word == "-":
            return options, list(args[i:])
        found, i = read_option(args, i, release)
        options.extend(found)
    return options, []


def read_directives(script_text: str, release: SlurmRelease | None = None) -> list[SbatchOption]:
    """The options of a batch script's ``#SBATCH`` header, as ``release``'s sbatch reads them (None: any).

    sbatch reads ``#SBATCH`` lines (at the very start of a line) until the first line that is neither blank nor a
    comment; words are split like a shell's, and an unquoted ``#`` starts a comment.

    Raises:
        SpecError: a directive sbatch would refuse (see :func:`split_command_line`), or ``#SBATCH hetjob``.
    """
    options: list[SbatchOption] = []
    for line in script_text.splitlines()[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if not line.startswith("#SBATCH"):
            continue
        words = shlex.split(line[len("#SBATCH") :], comments=True)
        if words[:1] in (["hetjob"], ["packjob"]):
            raise SpecError(f"#SBATCH {words[0]}: the script describes a heterogeneous job; amoeba-sbatch makes one")
        found, rest = split_command_line(words, release)
        if rest:
            raise SpecError(f"#SBATCH line {line.strip()!r}: {rest[0]!r} is not an option")
        options.extend(found)
    return options


def last_value(options: Iterable[SbatchOption], name: str) -> str | None:
    """The value of the last occurrence of option ``name`` (sbatch: the last one wins), or None."""
    value = None
    for option in options:
        if option.name == name:
            value = option.value
    return value


_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_time_minutes(text: str) -> int | None:
    """A Slurm time limit in whole minutes, rounded up as Slurm does; None for no limit.

    Slurm's formats: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``; ``0``, ``-1``, ``INFINITE`` and
    ``UNLIMITED`` mean no limit. Like sbatch 22.05 (measured), fields are not held to 59: ``1:75:00`` is 135 minutes,
    ``0:90`` is 2 (90 s rounded up).

    Raises:
        SpecError: the text is none of these formats.
    """
    if text.strip().upper() in ("INFINITE", "UNLIMITED", "-1"):
        return None
    match = _TIME.match(text.strip())
    if match is None:
        raise SpecError(
            f"time {text!r} is not a Slurm time: write MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS "
            "(e.g. -t 30, -t 1:00:00, -t 2-00:00:00)"
        )
    first = int(match.group(2))
    days, second, third = (int(g) if g is not None else None for g in match.group(1, 3, 4))
    if days is not None:  # D-H, D-H:M, D-H:M:S
        seconds = ((days * 24 + first) * 60 + (second or 0)) * 60 + (third or 0)
    elif third is not None:  # H:M:S
        seconds = (first * 60 + (second or 0)) * 60 + third
    elif second is not None:  # M:S
        seconds = first * 60 + second
    else:  # M
        seconds = first * 60
    return -(-seconds // 60) or None
