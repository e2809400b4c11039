"""The runtime's shape: no import circle, no import hidden in a function, worker side and coordinator side apart."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).parents[3] / "slurm_amoeba" / "runtime"
WORKER_SIDE = {"worker", "group", "transfer", "state", "sampler", "loader", "gradients", "topology", "result", "fsdp"}
WORKER_SIDE |= {"checkpoint"}  # disk checkpoints of the worker's commit
WORKER_SIDE |= {"adaptive", "gns"}  # adaptive batch: the goodput choice and the gradient noise scale
WORKER_SIDE |= {"caught"}  # the class of an exception a worker caught (needs torch)
WORKER_SIDE |= {"port", "port_model", "bridge", "sigterm"}  # a ported torchrun loop (docs/port.md)
WORKER_SIDE |= {"restart_data"}  # restart-mode scripts' sampler and batch split
WORKER_SIDE |= {"planned", "plan_probe"}  # the plan per size, chosen and measured in the workers (docs/plans.md)
WORKER_SIDE |= {"shared_device"}  # a worker sharing a device: its memory cap and pacing (docs/runtime.md)
COORDINATOR_SIDE = {"coordinator", "membership", "view"}
SHARED = {"protocol", "errors", "planner"}
SHARED |= {"failures"}  # failure classes: the worker classifies, the coordinator and agent decide
SHARED |= {"plans"}  # plans, their prediction and the frontier: pure, read by the agent's reports too
SHARED |= {"share", "pacing"}  # the share directive and status files, the pacer: torch-free, coordinator and workers
SHARED |= {"auth"}  # the job's secret: the coordinator seals assignments, workers seal events, each opens the other's


def runtime_imports(module: str) -> tuple[set[str], list[str]]:
    """The runtime modules ``module`` imports at run time at top level, and those it imports inside functions.

    Imports under ``if TYPE_CHECKING:`` are for annotations only and count as neither.
    """
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    top: set[str] = set()
    hidden: list[str] = []
    for statement in tree.body:
        if isinstance(statement, ast.If) and ast.unparse(statement.test) == "TYPE_CHECKING":
            continue
        for node in ast.walk(statement):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("slurm_amoeba.runtime."):
                target = (node.module or "").rsplit(".", 1)[1]
                if node is statement:
                    top.add(target)
                else:
                    hidden.append(f"{module} -> {target} (line {node.lineno})")
    return top, hidden


def test_every_runtime_module_is_on_one_side_or_shared() -> None:
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == WORKER_SIDE | COORDINATOR_SIDE | SHARED


def test_runtime_modules_import_each_other_at_top_level_only_and_without_a_circle() -> None:
    graph: dict[str, set[str]] = {}
    hidden: list[str] = []
    for module in WORKER_SIDE | COORDINATOR_SIDE | SHARED:
        graph[module], inside = runtime_imports(module)
        hidden.extend(inside)
    assert hidden == [], "imports inside functions hide a circle"
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module in done:
            return
        for target in graph[module]:
            visit(target, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())


def test_worker_side_and_coordinator_side_share_only_the_protocol_errors_and_planner() -> None:
    for module in COORDINATOR_SIDE:
        crossing = runtime_imports(module)[0] & WORKER_SIDE
        assert not crossing, f"{module} imports worker-side {crossing}"
    for module in WORKER_SIDE:
        crossing = runtime_imports(module)[0] & COORDINATOR_SIDE
        assert not crossing, f"{module} imports coordinator-side {crossing}"


def test_the_coordinator_side_loads_without_the_worker_side() -> None:
    code = (
        "import sys\n"
        "import slurm_amoeba.runtime.coordinator\n"
        "from slurm_amoeba.runtime import Coordinator, Phase\n"
        "print(' '.join(m for m in sys.modules if m.startswith('slurm_amoeba.runtime.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = {name.rsplit(".", 1)[1] for name in done.stdout.split()}
    assert "coordinator" in loaded
    assert not loaded & WORKER_SIDE, f"the coordinator side pulled in {sorted(loaded & WORKER_SIDE)}"
