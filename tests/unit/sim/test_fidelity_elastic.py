"""The elastic replay's measurements and comparison (benchmarks/sim_fidelity_elastic.py) on hand-made records."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.sim_fidelity_elastic import (
    ADMISSION_DELAY_S,
    ADMISSION_KNOBS,
    LiveJob,
    ReplayJob,
    ReplayWorkModel,
    admission_events,
    admission_summary,
    compare,
    costs_from,
    daemon_decisions,
    daemon_registrations,
    draw_workload,
    measure,
    run_stats,
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


ADMISSION_LOG = """\
2026-11-26 05:22:26,404 INFO    [daemon/admission] admitting elastic jobs at their requested size in batch (rights: x)
2026-11-26 05:22:31,455 INFO    [daemon/admission] job 1 (user root) admitted: its requested 4 GPUs are free
2026-11-26 05:22:36,455 INFO    [daemon/admission] job 3 (user root) held: waiting for 4 GPUs (2 free or lendable)
2026-11-26 05:22:46,455 INFO    [daemon/admission] job 3 (user root) released after 10 s: its requested 4 GPUs are free
2026-11-26 05:22:37,000 INFO    [daemon/admission] job 5 (user root) held: waiting for 4 GPUs (2 free or lendable)
2026-11-26 05:23:37,000 INFO    [daemon/admission] job 5 (user root) released after 60 s: held >= admission.max_hold_s
2026-11-26 05:22:38,000 INFO    [daemon/admission] job 7 (user root) held: waiting for 4 GPUs (2 free or lendable)
"""


def test_admission_decisions_are_read_from_the_log_and_summed_with_the_growth_after_release(tmp_path: Path) -> None:
    log = tmp_path / "amoebad.log"
    log.write_text(ADMISSION_LOG)
    events = admission_events(log)
    assert [event[1:] for event in events] == [
        ("1", "admitted"),
        ("3", "held"),
        ("3", "released"),
        ("5", "held"),
        ("5", "starved"),
        ("7", "held"),
    ]
    assert events[1][0] == pytest.approx(_t("05:22:36.455"))
    workload = [ReplayJob(f"e{i}", 0.0, 1, 5, steps=40) for i in range(4)] + [ReplayJob("r0", 0.0, 2, 1, sleep_s=9)]
    live = {
        # admitted unheld, grown to 4 workers 20 s after its start
        "e0": LiveJob("1", _t("05:22:30"), _t("05:22:40"), _t("05:24:00"), [(_t("05:22:55"), 1), (_t("05:23:00"), 4)]),
        # released at its request, never above 2 workers: not grown
        "e1": LiveJob("3", _t("05:22:30"), _t("05:22:50"), _t("05:24:00"), [(_t("05:23:05"), 1), (_t("05:23:10"), 2)]),
        # released by the bound: not counted among the jobs that should grow
        "e2": LiveJob("5", _t("05:22:30"), _t("05:23:40"), _t("05:25:00"), [(_t("05:23:55"), 1)]),
        "e3": LiveJob("7", _t("05:22:30")),  # held and never released
        "r0": LiveJob("8", _t("05:22:30"), _t("05:22:30"), _t("05:22:40")),
    }
    summary = admission_summary(workload, live, events)
    assert (summary["held"], summary["released"], summary["starved"], summary["admitted_unheld"]) == (3, 1, 1, 1)
    assert summary["never_released"] == ["7"]
    assert summary["hold_s"]["n"] == 2 and summary["hold_s"]["max"] == pytest.approx(60.0)
    assert (summary["let_go"], summary["grown_to_request"], summary["not_grown"]) == (2, 1, ["3"])
    assert summary["start_to_request_s"]["median"] == pytest.approx(20.0)


def test_run_stats_give_jct_percentiles_queueing_and_the_rigid_jobs_wait() -> None:
    rows = [
        {"elastic": False, "submit_s": 0.0, "live_start_s": 10.0, "live_jct_s": 30.0},
        {"elastic": False, "submit_s": 5.0, "live_start_s": 5.0, "live_jct_s": 20.0},
        {"elastic": True, "submit_s": 0.0, "live_start_s": 30.0, "live_jct_s": 100.0},
    ]
    stats = run_stats(rows, "live")
    assert stats["mean_jct_s"] == pytest.approx(50.0)
    assert stats["p50_jct_s"] == pytest.approx(30.0)
    assert 30.0 < stats["p99_jct_s"] <= 100.0
    assert stats["mean_queue_s"] == pytest.approx(40.0 / 3)
    assert stats["rigid_mean_wait_s"] == pytest.approx(5.0)


def test_the_simulated_admission_holds_an_elastic_job_until_its_request_fits_and_counts_the_delay() -> None:
    # 14 of 16 GPUs busy: three 4-GPU jobs for 60 s and a 2-GPU job for 30 s; an elastic job (1..4) arrives at 1 s.
    workload = [ReplayJob(f"r{i}", 0.0, 4, 2, sleep_s=60) for i in range(3)] + [ReplayJob("r3", 0.0, 2, 1, sleep_s=30)]
    workload.append(ReplayJob("e0", 1.0, 1, 5, steps=40, alpha=1.0))
    costs = {"rigid_overhead_s": 0.0, "start_latency_s": 5.0, "exit_latency_s": 1.0, "switch_pause_s": 0.0}
    costs.update({"grow_lag_s": 1.0, "start_grow_lag_s": 0.0})
    submits = {job.name: job.offset for job in workload}
    plain = {r.name: r for r in simulate(workload, submits, costs, CONF, elastic=True).jobs}
    held = {r.name: r for r in simulate(workload, submits, costs, CONF, elastic=True, admission=ADMISSION_KNOBS).jobs}
    assert (plain["e0"].first_start or 0.0) < 3.0  # Slurm starts its minimum at once
    # eligible 10 s after its submission, then held until r3 ends at 30 s frees 4 GPUs
    assert 30.0 <= (held["e0"].first_start or 0.0) <= 33.0
    assert held["e0"].submit_time == pytest.approx(1.0 + ADMISSION_DELAY_S)
    live = {
        r.name: LiveJob(r.name, 1000.0 + submits[r.name], 1000.0 + (r.first_start or 0.0), 1000.0 + (r.completion or 0))
        for r in held.values()
    }
    figures = compare(
        workload, live, simulate(workload, submits, costs, CONF, True, ADMISSION_KNOBS), ADMISSION_DELAY_S
    )
    assert figures["mean_jct_error"] == pytest.approx(0.0, abs=1e-9)  # JCT from the submission on both sides
    assert figures["sim"]["mean_queue_s"] == pytest.approx(figures["live"]["mean_queue_s"])
    assert figures["sim"]["rigid_mean_wait_s"] == pytest.approx(0.0)
