"""bench-runtime (benchmarks/runtime.py): the steady-state overhead's interval, the switch pause's arithmetic."""

from __future__ import annotations

import random

import pytest

from benchmarks.runtime import (
    _ms,
    _spread,
    _stepped,
    format_comparison,
    format_overhead,
    median_interval,
    steps_by_size,
    switch_pauses,
)
from slurm_amoeba.runtime.membership import Phase
from slurm_amoeba.runtime.protocol import GenerationPlan
from slurm_amoeba.runtime.view import CoordinatorView


def test_the_median_interval_holds_the_median_narrows_with_more_pairs_and_repeats() -> None:
    rng = random.Random(3)
    few = [1.0 + rng.gauss(0.0, 0.1) for _ in range(30)]
    many = [1.0 + rng.gauss(0.0, 0.1) for _ in range(600)]
    low, high = median_interval(few)
    assert low < sorted(few)[15] < high
    wide, narrow = high - low, median_interval(many)[1] - median_interval(many)[0]
    assert narrow < wide / 2
    assert median_interval(few) == (low, high), "seeded: the same data gives the same interval"


def test_the_overhead_line_says_the_interval() -> None:
    overhead = {
        "overhead_ratio": -0.02,
        "overhead_spread": {"q1": -0.1, "q3": 0.09},
        "overhead_interval": [-0.035, 0.007],
        "block_ratios": [1.0] * 297,
        "amoeba_step_s": 0.0114,
        "ddp_step_s": 0.01153,
        "load": 2.5,
        "overhead_cpu_ratio": 0.004,
        "overhead_cpu_interval": [0.001, 0.008],
        "amoeba_cpu_s": 0.0101,
        "ddp_cpu_s": 0.01006,
    }
    assert "95 % interval of the median -3.50..+0.70 %" in format_overhead(overhead)
    assert "CPU time of the worker process per step: +0.40 % (95 % interval +0.10..+0.80 %)" in format_overhead(
        overhead
    )


def test_a_switch_pause_counts_the_first_steps_of_the_new_generation() -> None:
    # [time, step, world size, generation]: 1 worker steps 10 ms, 2 workers 20 ms; a scale-out whose first new step
    # ends 25 ms after the last old one and whose second new step is 12 ms late; then a scale-in.
    records = [[0.01 * i, i, 1, 1] for i in range(6)]
    records += [[0.075, 6, 2, 2], [0.107, 7, 2, 2], [0.127, 8, 2, 2], [0.147, 9, 2, 2], [0.167, 10, 2, 2]]
    records += [[0.180, 11, 1, 3], [0.190, 12, 1, 3]]
    by_size = steps_by_size(records)
    assert by_size == {1: pytest.approx(0.01), 2: pytest.approx(0.02)}
    first = switch_pauses(records, by_size, 1)
    over = switch_pauses(records, by_size, 3)
    assert first["out"] == [pytest.approx(0.005)] and over["out"] == [pytest.approx(0.017)]
    assert first["in"] == [pytest.approx(0.003)]
    assert over["in"] == [], "a switch followed by fewer steps of its generation is left out"


def test_a_scale_outs_idle_first_step_counts_at_the_members_own_pace() -> None:
    # 1 worker steps 10 ms, 2 workers 20 ms. At the scale-out the joiner takes no samples in the first step (the
    # record's last field: 1 rank worked), which ends 25 ms after the last old step. Against the new size that is
    # 5 ms lost; at the step's own pace (one worker's step) 15 ms. A scale-in has no idle step: both agree.
    records = [[0.01 * i, i, 1, 1, 0.0, 1] for i in range(6)]
    records += [[0.075, 6, 2, 2, 0.0, 1], [0.095, 7, 2, 2, 0.0, 2], [0.115, 8, 2, 2, 0.0, 2], [0.135, 9, 2, 2, 0.0, 2]]
    records += [[0.148, 10, 1, 3, 0.0, 1], [0.158, 11, 1, 3, 0.0, 1], [0.168, 12, 1, 3, 0.0, 1]]
    by_size = steps_by_size(records)
    assert switch_pauses(records, by_size, 1)["out"] == [pytest.approx(0.005)]
    own = switch_pauses(records, by_size, 1, own_pace=True)
    assert own["out"] == [pytest.approx(0.015)]
    assert switch_pauses(records, by_size, 3, own_pace=True)["out"] == [pytest.approx(0.015)]
    assert own["in"] == switch_pauses(records, by_size, 1)["in"] == [pytest.approx(0.003)]


def test_a_comparison_says_when_a_trees_workers_do_not_record_their_idle_steps() -> None:
    spread = _spread([0.01, 0.02])
    pair = {"out": spread, "in": spread}
    report = {
        "rounds": [],
        "summary": {"old": pair, "new": pair},
        "summary_over": {"old": pair, "new": pair},
        "summary_own_pace": {"old": {"first": spread, "over": spread}, "new": {"first": spread, "over": spread}},
        "over_steps": 3,
        "own_pace_unknown": ["old"],
    }
    text = format_comparison(report)
    assert "first step   15.0 ms" in text
    assert "(old: its workers do not record which ranks took samples" in text
    assert "(new:" not in text
    report["own_pace_unknown"] = []
    assert "do not record" not in format_comparison(report)


def test_an_empty_sample_is_reported_as_none_instead_of_failing_the_run() -> None:
    assert _spread([]) == {"n": 0.0}
    assert _ms(_spread([])).strip() == "none, n=0"
    assert _ms(_spread([0.002, 0.004])).startswith("   3.0 ms")


def _view(generation: int, step: int, start: int | None) -> CoordinatorView:
    plan = GenerationPlan(generation, ("w0", "w1"), ("h", "h"), source="w0", start_step=start)
    return CoordinatorView(Phase.RUNNING, generation, plan, {}, (), {}, {"step": step}, "")


def test_steps_after_a_switch_count_from_the_generations_start_not_from_a_stale_progress_report() -> None:
    # The new size appeared while the coordinator still held the old generation's last report (step 90); the new
    # generation starts at step 100. Thirty steps into it is step 130, not 120.
    since = _view(4, 90, start=100)
    reached = _stepped(since, 30)
    assert not reached(_view(4, 120, start=100))
    assert reached(_view(4, 130, start=100))
    assert not reached(_view(5, 200, start=140)), "another generation"
    # Without a start step (a first generation), from the view's own progress.
    assert _stepped(_view(1, 10, start=None), 30)(_view(1, 40, start=None))
