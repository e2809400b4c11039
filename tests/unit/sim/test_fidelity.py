"""Fidelity: our Tiresias, in the artifact's setting, against the Pollux artifact's own simulated JCTs (1.0x load).

One compact run over the 8 workloads (about a second); the per-load tables live in ``docs/simulator.md``
(``scripts/sim-report``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_amoeba.sim.engine import ARTIFACT_RESTART_COST_S, SimConfig
from slurm_amoeba.sim.runner import RunSpec, run_many


def test_tiresias_matches_the_artifact_within_ten_percent(pollux: Path) -> None:
    reference = json.loads((pollux / "results-jobload" / "tiresias-1.0" / "summary.json").read_text())
    config = SimConfig(resize_cost=ARTIFACT_RESTART_COST_S, restart_cost=ARTIFACT_RESTART_COST_S, grow_lag=0.0)
    files = sorted((pollux / "workloads").glob("workload-*.csv"))
    specs = [RunSpec("tiresias", path, config, elastic_fraction=0.0) for path in files]
    outcomes = run_many(specs, processes=1)
    ours = {outcome.workload: outcome.summary["avg_jct_s"] for outcome in outcomes}
    mean = sum(ours.values()) / len(ours)
    assert mean == pytest.approx(reference["mean"], rel=0.10)
    for workload, avg in ours.items():
        assert avg == pytest.approx(reference["avgs"][workload], rel=0.10), workload
