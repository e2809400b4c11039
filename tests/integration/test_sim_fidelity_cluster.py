"""The ``slurm`` policy against the real local cluster: a short seeded replay (``scripts/bench-sim-fidelity``).

Eight sleep jobs of 1-4 GPUs over 16 GPUs, arriving within 8 s, so that some wait and some backfill; the same jobs
are then simulated with the cluster's own slurm.conf. The cluster is shared with other tests: only this test's
jobs are counted, and a run during which other jobs held GPUs is repeated (the simulation knows nothing of them).
The bounds are looser than the study's goals (10% and 90%, met by the 60-job replays in docs/simulator.md)
because eight jobs leave little room to average out Slurm's scheduling latency: one job that waits for a later
scheduling pass (seen: 8 s, a third of the mean JCT) moves the mean by more than the bound. So one replay outside
the bounds is repeated once; two clean replays outside them fail the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.sim_fidelity import compare, draw_workload, record
from tests.conftest import ClusterHandle

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]


def test_a_short_replay_agrees_with_the_simulated_slurm(slurm_cluster: ClusterHandle, tmp_path: Path) -> None:
    workload = draw_workload(8, seed=18, min_s=4, max_s=12, spread_s=8.0)
    assert sum(gpus for _, gpus, _, _ in workload) > 16  # more than the cluster: some jobs must wait
    tried: list[tuple[dict[str, object], list[object]]] = []
    for attempt in range(3):
        export, others = record(workload, slurm_cluster.conf, tmp_path / f"replay-{attempt}.json")
        figures = compare(export, slurm_cluster.conf)
        tried.append((figures, list(others)))
        if not others and agrees(figures):
            break
        if len(tried) == 2 and not any(seen for _, seen in tried):
            break  # two clean replays, both outside the bounds: the simulator is off, not Slurm's timing
    assert any(agrees(figures) and not seen for figures, seen in tried), f"replays (figures, others' jobs): {tried}"


def agrees(figures: dict[str, object]) -> bool:
    """Eight jobs, the mean JCT within 25 % of the recorded one, and at least 80 % of job pairs in the same order."""
    return (
        figures["jobs"] == 8
        and abs(float(str(figures["mean_jct_error"]))) <= 0.25
        and float(str(figures["pairs_agreeing"])) >= 0.8
    )
