"""The interference model for jobs that share GPUs, from Gavel's measured co-location throughputs.

Gavel measured, for pairs of job types on one GPU, each job's throughput alone and next to the other. The fraction
``together / alone`` is how much of its speed a job keeps while sharing. Pollux's six applications are mapped to the
closest Gavel job type (same model family, a comparable per-GPU batch); the mapping is a modelling choice, listed in
:data:`GAVEL_TYPES` and in ``docs/simulator.md``. Factors come from the V100 table at scale factor 1.
"""

from __future__ import annotations

import json
from pathlib import Path

from slurm_amoeba.sim.data import SimError, data_dir

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


def load_colocation(path: Path | None = None, gpu: str = GAVEL_GPU) -> dict[tuple[str, str], float]:
    """Fractions of solo speed kept by each application next to each other application.

    Args:
        path: Gavel's ``simulation_throughputs.json``; the data folder's copy by default.
        gpu: the GPU table to read.

    Returns:
        ``(application, partner application)`` -> fraction kept, in (0, 1].

    Raises:
        SimError: the file, the GPU table or a mapped job type is missing, or the file is not JSON.
    """
    source = path or data_dir() / "gavel" / "simulation_throughputs.json"
    try:
        table = json.loads(source.read_text())
    except OSError as exc:
        raise SimError(f"cannot read Gavel's throughputs at {source}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SimError(f"{source} is not JSON ({exc.msg} at line {exc.lineno})") from None
    if gpu not in table:
        raise SimError(f"{source} has no GPU table {gpu!r}; it has {', '.join(sorted(table))}")
    rows = table[gpu]
    result: dict[tuple[str, str], float] = {}
    for app, kind in GAVEL_TYPES.items():
        key = str((kind, 1))
        if key not in rows:
            raise SimError(f"{source}: job type {key} (for {app}) is not in the {gpu} table")
        alone = float(rows[key]["null"])
        for partner, partner_kind in GAVEL_TYPES.items():
            pair = rows[key].get(str((partner_kind, 1)))
            if pair is None or alone <= 0.0:
                continue
            kept = float(pair[0]) / alone
            result[(app, partner)] = min(1.0, max(kept, 1e-3))
    return result
