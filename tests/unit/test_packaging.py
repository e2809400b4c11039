"""The package's dependencies: the base is what every command needs without torch, each extra brings one role's
modules, and every third-party module the package imports is declared (numpy is not: nothing uses it)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys

from slurm_amoeba.cli.entry import EXTRA_MODULES
from tests.conftest import REPO

#: Distribution name (as pyproject spells it, lower case) -> the top-level module it installs.
MODULE_OF = {
    "pyzmq": "zmq",
    "pyyaml": "yaml",
    "prometheus_client": "prometheus_client",
    "torch": "torch",
    "submitit": "submitit",
    "cloudpickle": "cloudpickle",
    "matplotlib": "matplotlib",
}


def declared() -> dict[str, set[str]]:
    """Extra ("" for the base) -> the modules its requirements install (extras of extras left out)."""
    result: dict[str, set[str]] = {}
    for requirement in importlib.metadata.requires("slurm-amoeba") or []:
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()
        extra = re.search(r'extra == "([^"]+)"', requirement)
        if name != "slurm-amoeba" and (extra is None or extra.group(1) != "dev"):
            result.setdefault(extra.group(1) if extra else "", set()).add(MODULE_OF[name])
    return result


def test_the_base_install_is_pyzmq_alone_and_each_extra_matches_what_the_commands_check() -> None:
    extras = declared()
    assert extras.pop("") == {"zmq"}
    assert extras == {name: set(modules) for name, modules in EXTRA_MODULES.items()}


def test_every_third_party_module_the_package_imports_is_declared() -> None:
    modules: set[str] = set()
    for path in (REPO / "slurm_amoeba").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    third_party = modules - set(sys.stdlib_module_names) - {"slurm_amoeba", "__future__"}
    everything = set().union(*declared().values())
    assert third_party == everything, (
        f"imported but not declared: {third_party - everything}; declared but unused: {everything - third_party}"
    )
    assert "numpy" not in third_party
