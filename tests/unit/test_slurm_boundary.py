"""Only ``slurm_amoeba/slurm/`` runs Slurm's programs (DESIGN.md, layer ``slurm/``).

The test reads every module of the package outside ``slurm/`` as a syntax tree and fails on a Slurm program name
(``sbatch``, ``srun``, ``squeue``, ... :data:`SLURM_PROGRAMS`) written as a string literal where a command is built:

- an element of a list or tuple display (``["squeue", "--json"]``, ``("scontrol", "hold", job)``), starred or not;
- an argument of a call that runs or spells a command: ``subprocess.*``, ``os.exec*``/``os.spawn*``/``os.system``/
  ``os.popen``, ``run_command``, ``start_step``, ``shlex.join``/``shlex.split`` (a string such as ``"srun -n 2"``
  counts by its first word), or any call's ``argv=``/``args=``/``cmd=``/``command=`` keyword.

Prose that names a program (docstrings, comments, log and error messages) is not a command and is not caught; a
command assembled from variables whose values come from elsewhere is not caught either: such values come from
``slurm/`` (e.g. :func:`~slurm_amoeba.slurm.script.sbatch_argv`) when the rest of the package keeps to the rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import slurm_amoeba

PACKAGE = Path(slurm_amoeba.__file__).parent
SLURM_LAYER = PACKAGE / "slurm"

#: Slurm's user and administrator programs (slurm.schedmd.com/man_index.html).
SLURM_PROGRAMS = frozenset(
    {
        "sacct",
        "sacctmgr",
        "salloc",
        "sattach",
        "sbatch",
        "sbcast",
        "scancel",
        "scontrol",
        "scrontab",
        "sdiag",
        "sh5util",
        "sinfo",
        "slurmrestd",
        "sprio",
        "squeue",
        "sreport",
        "srun",
        "sshare",
        "sstat",
        "strigger",
        "sview",
    }
)
#: Calls whose arguments are a command to run or to show.
_COMMAND_CALLS = frozenset({"run_command", "start_step", "Popen", "check_output", "check_call", "call", "run"})
_COMMAND_MODULES = frozenset({"subprocess", "shlex"})
_COMMAND_KEYWORDS = frozenset({"argv", "args", "cmd", "command"})


def _program(node: ast.AST) -> str | None:
    """The Slurm program a string literal starts with, if it does."""
    if isinstance(node, ast.Starred):
        node = node.value
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        words = node.value.split()
        if words and words[0] in SLURM_PROGRAMS:
            return words[0]
    return None


def _runs_commands(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else ""
        if owner in _COMMAND_MODULES:
            return True
        if owner == "os" and func.attr.startswith(("exec", "spawn", "system", "popen", "posix_spawn")):
            return True
        return func.attr in _COMMAND_CALLS - {"run", "call"}  # .run()/.call() of other objects are not commands
    return isinstance(func, ast.Name) and func.id in _COMMAND_CALLS - {"run", "call"}


def slurm_commands(source: str) -> list[tuple[int, str]]:
    """Where ``source`` builds a command of a Slurm program: (line, program) pairs, in order."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        candidates: list[ast.expr] = []
        if isinstance(node, ast.List | ast.Tuple):
            candidates = list(node.elts)
        elif isinstance(node, ast.Call):
            if _runs_commands(node):
                candidates = list(node.args)
            candidates += [kw.value for kw in node.keywords if kw.arg in _COMMAND_KEYWORDS]
        for candidate in candidates:
            program = _program(candidate)
            if program is not None:
                found.append((candidate.lineno, program))
    return sorted(set(found))


def test_the_check_finds_slurm_commands_in_every_form_it_names() -> None:
    source = """
import os, shlex, subprocess
a = ["squeue", "--json"]
b = ("scontrol", "hold", "12")
c = [*prefix, "sbatch"]
subprocess.run("sinfo")
os.execvp("srun", argv)
shlex.split("salloc -N 1")
run_command(command="sacctmgr show user")
"""
    assert slurm_commands(source) == [
        (3, "squeue"),
        (4, "scontrol"),
        (5, "sbatch"),
        (6, "sinfo"),
        (7, "srun"),
        (8, "salloc"),
        (9, "sacctmgr"),
    ]


def test_the_check_leaves_prose_about_slurm_programs_alone() -> None:
    source = '''
"""Runs squeue --json once a round."""
log.info("sbatch refused the job: %s", reason)
raise ValueError("srun is missing: install Slurm's client")
names = {"cpu": 1}
step.run("squeue")
'''
    assert slurm_commands(source) == []


def test_no_module_outside_the_slurm_layer_builds_a_slurm_command() -> None:
    leaks = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {program}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if SLURM_LAYER not in path.parents
        for line, program in slurm_commands(path.read_text())
    ]
    assert not leaks, (
        "Slurm commands built outside slurm_amoeba/slurm/ (run them through a SlurmClient method, or let slurm/ "
        "spell the argv):\n" + "\n".join(leaks)
    )
