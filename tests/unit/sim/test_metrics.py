"""Summary figures of a run, and telling workload formats apart."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from slurm_amoeba.sim.data import SimError
from slurm_amoeba.sim.metrics import JobRecord, SimResult, percentile
from slurm_amoeba.sim.runner import detect_format


def test_percentiles_interpolate_between_order_statistics() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == pytest.approx(2.5)
    assert percentile([1.0, 2.0], 0.99) == pytest.approx(1.99)
    assert math.isnan(percentile([], 0.5))


def test_summary_of_a_small_run() -> None:
    jobs = [
        JobRecord("a", 0.0, 60.0, 160.0, 2, resizes=1),
        JobRecord("b", 30.0, 160.0, 230.0, 2, preemptions=2),
        JobRecord("c", 40.0, None, None, 1),
    ]
    result = SimResult("p", 4, jobs, usage=[(60.0, 2), (160.0, 2), (230.0, 0)])
    summary = result.summary()
    assert summary["avg_jct_s"] == pytest.approx((160 + 200) / 2)
    assert summary["makespan_s"] == pytest.approx(230)
    assert summary["avg_queue_s"] == pytest.approx((60 + 130) / 2)
    assert summary["gpu_util"] == pytest.approx(2 * 170 / (4 * 230))
    assert (summary["resizes"], summary["preemptions"], summary["unfinished"]) == (1, 2, 1)


def test_detect_format_reads_the_header(tmp_path: Path) -> None:
    pollux = tmp_path / "p.csv"
    pollux.write_text("name,time,application,num_replicas,batch_size\n")
    philly = tmp_path / "q.csv"
    philly.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n")
    other = tmp_path / "r.csv"
    other.write_text("a,b,c\n")
    assert detect_format(pollux) == "pollux"
    assert detect_format(philly) == "philly"
    with pytest.raises(SimError, match="neither a Pollux workload"):
        detect_format(other)
    with pytest.raises(SimError, match="cannot read the workload"):
        detect_format(tmp_path / "missing.csv")
