"""The co-location prior of the sharing policies: Gavel's measured throughputs of two jobs on one GPU.

Gavel measured, for pairs of job types on one GPU, each job's throughput alone and next to the other. The fraction
``together / alone`` is how much of its speed a job keeps while sharing: ``Snapshot.colocation``, the prior that
:func:`~slurm_amoeba.policy.pairing.kept_fraction` falls back on where a job's own speeds were not measured. Both
worlds read it here (DESIGN.md, the control and simulation flows): the simulator for its Pollux workloads
(:mod:`slurm_amoeba.sim.interference`), the daemon as its default prior (``sharing`` in its configuration). Pollux's
six applications are mapped to the closest Gavel job type (same model family, a comparable per-GPU batch); the
mapping is a modelling choice, listed in :data:`GAVEL_TYPES` and in ``docs/simulator.md``. Factors come from the V100
table at scale factor 1. The table ships with the package (``sim/datafiles/gavel``, MIT; its ``SOURCES.md``).
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

from slurm_amoeba.policy.types import PolicyError

#: Pollux application -> the Gavel job type it is modelled by.
GAVEL_TYPES: dict[str, str] = {
    "cifar10": "ResNet-18 (batch size 128)",
    "imagenet": "ResNet-50 (batch size 64)",
    "bert": "Transformer (batch size 64)",
    "deepspeech2": "LM (batch size 20)",
    "ncf": "Recommendation (batch size 2048)",
    "yolov3": "ResNet-50 (batch size 32)",
}

#: The Gavel GPU table used.
GAVEL_GPU = "v100"

#: Where the packaged table lies, relative to the ``slurm_amoeba`` package (its package data).
GAVEL_TABLE = "sim/datafiles/gavel/simulation_throughputs.json"


def packaged_gavel_table() -> Path:
    """The Gavel throughputs file shipped with the package (it may be missing from an install without its data;
    :func:`read_colocation` then names it)."""
    return Path(str(importlib.resources.files("slurm_amoeba") / GAVEL_TABLE))


def read_colocation(path: Path, gpu: str = GAVEL_GPU) -> dict[tuple[str, str], float]:
    """Fractions of solo speed kept by each application next to each other application.

    Args:
        path: Gavel's ``simulation_throughputs.json``.
        gpu: the GPU table to read.

    Returns:
        ``(application, partner application)`` -> fraction kept, in (0, 1].

    Raises:
        PolicyError: the file, the GPU table or a mapped job type is missing, or the file is not JSON.
    """
    try:
        table = json.loads(path.read_text())
    except OSError as exc:
        raise PolicyError(f"cannot read Gavel's throughputs at {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise PolicyError(f"{path} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(table, dict) or gpu not in table:
        known = ", ".join(sorted(table)) if isinstance(table, dict) else "no tables"
        raise PolicyError(f"{path} has no GPU table {gpu!r}; it has {known}")
    rows = table[gpu]
    result: dict[tuple[str, str], float] = {}
    for app, kind in GAVEL_TYPES.items():
        key = str((kind, 1))
        if key not in rows:
            raise PolicyError(f"{path}: job type {key} (for {app}) is not in the {gpu} table")
        alone = float(rows[key]["null"])
        for partner, partner_kind in GAVEL_TYPES.items():
            pair = rows[key].get(str((partner_kind, 1)))
            if pair is None or alone <= 0.0:
                continue
            kept = float(pair[0]) / alone
            result[(app, partner)] = min(1.0, max(kept, 1e-3))
    return result
