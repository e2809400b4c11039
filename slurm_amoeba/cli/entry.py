"""The console scripts' entry points (pyproject's ``[project.scripts]``), in front of each command's ``main``.

Each entry answers ``--version`` (the installed distribution's version) and, before importing anything heavy, checks
that the pip extra its command needs is installed, so that ``amoebad`` on a host installed without the extra says in
one line how to add it (:func:`install_command`: from the wheel, repository or checkout the package was installed
from, since the project is not on a public package index) instead of a traceback. The
extras are pyproject's: ``daemon`` (amoebad), ``train`` (amoeba-run, amoeba-local, ElasticExecutor: torch), ``sim``
(amoeba-sim --plot). amoebactl, amoeba-sbatch and amoeba-sim need only the base install. This module imports
nothing beyond the standard library, so ``--help`` of the light commands stays light.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

import slurm_amoeba
from slurm_amoeba.core.install import DISTRIBUTION, install_command

__all__ = ["DISTRIBUTION", "EXTRA_MODULES", "add_version_flag", "extra_missing", "install_command", "version_line"]


#: The top-level modules each pip extra brings (keep in step with pyproject's [project.optional-dependencies]).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "daemon": ("yaml", "prometheus_client"),
    "train": ("torch", "submitit", "cloudpickle"),
    "sim": ("matplotlib",),
}


def version_line(prog: str) -> str:
    """What ``PROG --version`` prints, e.g. ``amoebactl (slurm-amoeba) 0.1.0`` (the installed package's version)."""
    return f"{prog} ({DISTRIBUTION}) {slurm_amoeba.__version__}"


def add_version_flag(parser: argparse.ArgumentParser, prog: str) -> None:
    """Give ``parser`` a ``--version`` flag that prints :func:`version_line` and exits."""
    parser.add_argument("--version", action="version", version=version_line(prog), help="print the version and exit")


def extra_missing(extra: str, what: str) -> str | None:
    """Say which modules of the pip extra ``extra`` are missing, if any.

    Args:
        extra: a key of :data:`EXTRA_MODULES`.
        what: what needs them, for the message (a command, a flag).

    Returns:
        None when every module of the extra is importable, else a one-line message naming the missing modules and the
        ``pip install`` command that brings them.
    """
    missing = [name for name in EXTRA_MODULES[extra] if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    verb = "comes" if len(missing) == 1 else "come"
    return f"{what} needs {', '.join(missing)}, which {verb} with the '{extra}' extra: {install_command(extra)}"


def _launch(prog: str, extra: str | None, module: str, argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--version"]:  # first, so that e.g. `amoeba-run python train.py --version` reaches the program
        print(version_line(prog))
        return 0
    if extra is not None and (message := extra_missing(extra, prog)):
        print(message, file=sys.stderr)
        return 1
    main = importlib.import_module(module).main
    return int(main(args))


def amoeba_sim(argv: Sequence[str] | None = None) -> int:
    """``amoeba-sim`` (base install; ``--plot`` needs the ``sim`` extra, checked by the command)."""
    return _launch("amoeba-sim", None, "slurm_amoeba.cli.sim", argv)


def amoebad(argv: Sequence[str] | None = None) -> int:
    """``amoebad`` (the ``daemon`` extra)."""
    return _launch("amoebad", "daemon", "slurm_amoeba.cli.amoebad", argv)


def amoebactl(argv: Sequence[str] | None = None) -> int:
    """``amoebactl`` (base install)."""
    return _launch("amoebactl", None, "slurm_amoeba.cli.amoebactl", argv)


def amoeba_sbatch(argv: Sequence[str] | None = None) -> int:
    """``amoeba-sbatch`` (base install: it only renders and submits the job)."""
    return _launch("amoeba-sbatch", None, "slurm_amoeba.launcher.sbatch", argv)


def amoeba_run(argv: Sequence[str] | None = None) -> int:
    """``amoeba-run`` (the ``train`` extra: the agent hosts torch's rendezvous store)."""
    return _launch("amoeba-run", "train", "slurm_amoeba.launcher.run", argv)


def amoeba_local(argv: Sequence[str] | None = None) -> int:
    """``amoeba-local`` (the ``train`` extra)."""
    return _launch("amoeba-local", "train", "slurm_amoeba.local.cli", argv)
