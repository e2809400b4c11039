"""The shape of the house: which layer may import which, and no import circle.

The layer table is the one of docs/architecture.md; a new package must be added here and there together. Imports are
read from the source (every ``import`` and ``from ... import`` anywhere in a module, function-level ones included),
so a lazy import cannot hide an upward dependency. No two modules import each other, not even for annotations only
(under ``if TYPE_CHECKING:``): such a circle says that code sits away from the object it belongs to. Sizes are not
checked: a long class is a prompt to look for a second concept, not a number to cut to.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "slurm_amoeba"

LAYERS: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "slurm": frozenset({"core"}),
    "transport": frozenset({"core"}),
    "policy": frozenset({"core"}),
    "runtime": frozenset({"core"}),
    "agent": frozenset({"core", "slurm", "transport", "runtime"}),
    "launcher": frozenset({"core", "slurm", "transport", "runtime", "agent"}),
    "daemon": frozenset({"core", "slurm", "transport", "policy"}),
    "sim": frozenset({"core", "slurm", "policy"}),
    "local": frozenset({"core", "runtime"}),
    "cli": frozenset({"core", "slurm", "transport", "policy", "launcher", "daemon", "sim", "local"}),
}
"""Package -> the packages of slurm_amoeba it may import (besides itself)."""

FORBIDDEN_THIRD_PARTY: dict[str, frozenset[str]] = {
    "core": frozenset({"torch", "zmq", "submitit", "cloudpickle", "matplotlib", "yaml", "prometheus_client"}),
    "slurm": frozenset({"torch", "zmq", "submitit", "cloudpickle", "matplotlib"}),
    "transport": frozenset({"torch", "submitit", "cloudpickle", "matplotlib"}),
    "policy": frozenset({"torch", "zmq", "submitit", "cloudpickle", "matplotlib", "yaml"}),
    "daemon": frozenset({"torch", "submitit", "cloudpickle", "matplotlib"}),
    "sim": frozenset({"torch", "zmq", "submitit", "cloudpickle"}),
}
"""Package -> third-party modules it must not import (a daemon host or the simulator installs no torch)."""


def _modules() -> Iterator[tuple[str, Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        layer = parts[0] if len(parts) > 1 else ""
        yield layer, path, ast.parse(path.read_text(), filename=str(path))


def _imported(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages == set(LAYERS), f"add {sorted(packages - set(LAYERS))} to LAYERS and docs/architecture.md"


def test_no_package_imports_a_layer_it_may_not() -> None:
    wrong: list[str] = []
    for layer, path, tree in _modules():
        if not layer:
            continue
        for line, module in _imported(tree):
            top, _, rest = module.partition(".")
            if top == "slurm_amoeba":
                target = rest.split(".")[0]
                if target and target != layer and target not in LAYERS[layer]:
                    wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {layer} imports {module}")
            elif top in FORBIDDEN_THIRD_PARTY.get(layer, frozenset()):
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {layer} imports {module}")
    assert not wrong, "imports against the layer table:\n" + "\n".join(wrong)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere, under ``if TYPE_CHECKING:`` included."""
    trees = {_module_name(path): tree for _, path, tree in _modules()}
    graph: dict[str, set[str]] = {name: set() for name in trees}
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            graph[name].update(t for t in targets if t in trees and t != name)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected set of modules (Tarjan), as the sorted names of its modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == module:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_modules_import_each_other_not_even_for_annotations() -> None:
    circles = _circles(_import_graph())
    assert not circles, "import circles (type-only imports count):\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_sees_a_type_only_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("source", ["import slurm_amoeba.agent.x", "from slurm_amoeba.agent import x"])
def test_the_import_reader_sees_both_forms(source: str) -> None:
    assert [m for _, m in _imported(ast.parse(source))] == [source.split()[1]]
