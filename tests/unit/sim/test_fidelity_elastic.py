"""The elastic replay's measurements and comparison (benchmarks/sim_fidelity_elastic.py) on hand-made records."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.sim_fidelity_elastic import (
    LiveJob,
    ReplayJob,
    ReplayWorkModel,
    compare,
    costs_from,
    daemon_decisions,
    daemon_registrations,
    draw_workload,
    measure,
    simulate,
)

CONF = Path(__file__).parent / "data" / "slurm-local.conf"

LOG = """\
2026-11-26 02:12:04,749 INFO    [daemon/api] listening on tcp://10.78.0.1:6840 (policy elastic-backfill)
2026-11-26 02:12:19,140 INFO    [daemon/api] job 13 (user root) registered: 1..4 workers of 1 GPU(s), directives to 'x'
2026-11-26 02:12:34,799 INFO    [daemon/actuator] job 13: grow 1 -> 4 workers (elastic-backfill: idle GPUs)
2026-11-26 02:13:40,000 INFO    [daemon/actuator] job 13: shrink 4 -> 2 workers (elastic-backfill: a job needs GPUs)
"""


def _t(clock: str) -> float:
    """Unix time of 2026-11-26 at ``clock`` (HH:MM:SS.fff, UTC)."""
    hours, minutes, seconds = clock.split(":")
    return 1795651200.0 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def test_the_daemon_log_gives_directives_and_registrations_in_unix_time(tmp_path: Path) -> None:
    log = tmp_path / "amoebad.log"
    log.write_text(LOG)
    decisions = daemon_decisions(log)
    assert [decision[1:] for decision in decisions] == [("13", "grow", 1, 4), ("13", "shrink", 4, 2)]
    assert [decision[0] for decision in decisions] == pytest.approx([_t("02:12:34.799"), _t("02:13:40.000")])
    assert daemon_registrations(log) == {"13": pytest.approx(_t("02:12:19.140"))}


def test_costs_are_measured_from_the_steps_the_job_printed() -> None:
    workload = [ReplayJob("e0", 0.0, 1, 5, steps=40, alpha=1.0), ReplayJob("r0", 1.0, 2, 1, sleep_s=20)]
    steps = [(_t("02:12:20") + i, 1) for i in range(20)]  # one worker, 1 s a step, until 02:12:39
    steps += [(_t("02:12:40.1") + 0.25 * i, 4) for i in range(20)]  # four workers from 02:12:40.1
    live = {
        "e0": LiveJob("13", _t("02:12:00"), _t("02:12:05"), _t("02:12:50"), steps, _t("02:12:45.1")),
        "r0": LiveJob("14", _t("02:12:01"), _t("02:12:01"), _t("02:12:22")),
    }
    decisions = [(_t("02:12:34.799"), "13", "grow", 1, 4)]
    measured = measure(workload, live, decisions, {"13": _t("02:12:20")})
    assert measured["rigid_overhead_s"] == [pytest.approx(1.0)]
    assert measured["start_latency_s"] == [pytest.approx(15.0)]
    assert measured["exit_latency_s"] == [pytest.approx(4.9)]
    assert measured["registration_s"] == [pytest.approx(15.0)]
    assert measured["grow_lag_s"] == [pytest.approx(40.1 - 34.799)]
    assert measured["switch_pause_s"] == [pytest.approx(0.1)]  # the gap of 1.1 s less the 1 s step at one worker
    assert measured["size_changes"] == [1.0]
    costs = costs_from(measured)
    assert (costs["start_latency_s"], costs["exit_latency_s"]) == pytest.approx((15.0, 4.9))
    assert costs["grow_lag_s"] == pytest.approx(40.1 - 34.799 + 2.5)  # plus half the daemon's 5 s interval
    # From the first step: registered 15 s after the start, half an interval, the grow lag, less the 15 s start.
    assert costs["start_grow_lag_s"] == pytest.approx(15.0 + 2.5 + 40.1 - 34.799 - 15.0)


def test_a_simulation_of_the_live_costs_compares_per_job_and_counts_the_grow() -> None:
    workload = draw_workload(4, 2, seed=3, spread_s=30.0)
    assert [job.elastic for job in workload].count(True) == 2
    assert workload == draw_workload(4, 2, seed=3, spread_s=30.0)
    costs = {"rigid_overhead_s": 1.0, "start_latency_s": 15.0, "exit_latency_s": 5.0, "switch_pause_s": 0.1}
    costs.update({"grow_lag_s": 10.0, "start_grow_lag_s": 30.0})
    submits = {job.name: job.offset - workload[0].offset for job in workload}
    rigid = simulate(workload, submits, costs, CONF, elastic=False)
    elastic = simulate(workload, submits, costs, CONF, elastic=True)
    assert sum(record.resizes for record in rigid.jobs) == 0
    assert sum(record.resizes for record in elastic.jobs) >= 1
    # The live records are the simulated ones shifted by a second: every job's JCT equal, every start 1 s off.
    live = {
        record.name: LiveJob(
            record.name,
            1000.0 + record.submit_time,
            1001.0 + (record.first_start or 0.0),
            1000.0 + (record.completion or 0.0),
        )
        for record in elastic.jobs
    }
    figures = compare(workload, live, elastic)
    assert figures["jobs"] == 6
    assert figures["mean_jct_error"] == pytest.approx(0.0, abs=0.05)
    assert figures["pairs_agreeing"] == pytest.approx(1.0)
    assert figures["start_abs_error_max_s"] <= 1.0 + 1e-6


def test_an_elastic_job_s_start_and_exit_take_the_same_time_at_any_size() -> None:
    model = ReplayWorkModel(start_s=15.0, work_s=100.0, exit_s=5.0, alpha=0.5)
    assert model.epoch_ends == [15.0, 115.0, 120.0]
    assert [model.rate((4,), epoch, False) for epoch in range(3)] == [1.0, 2.0, 1.0]
    assert model.rate((1,), 1, False) == 1.0
