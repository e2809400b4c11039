"""The steady-state overhead's interval in ``scripts/bench-runtime --overhead-only`` (benchmarks/runtime.py)."""

from __future__ import annotations

import random

from benchmarks.runtime import format_overhead, median_interval


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
    }
    assert "95 % interval of the median -3.50..+0.70 %" in format_overhead(overhead)
