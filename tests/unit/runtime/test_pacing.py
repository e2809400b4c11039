"""The sharer's pacing controller (``runtime/pacing.py``): tables of decisions, and a closed loop against a model of
interference."""

from __future__ import annotations

import statistics

import pytest

from slurm_amoeba.runtime.errors import RuntimeConfigError
from slurm_amoeba.runtime.pacing import Pacer, PacingConfig, StepRecord, exclusive_step_times


def steps(*pairs: tuple[float, float]) -> list[StepRecord]:
    return [StepRecord(end, seconds) for end, seconds in pairs]


@pytest.mark.parametrize(
    ("records", "first_compute", "quiet", "expected"),
    [
        (steps((1, 0.5), (2, 0.6)), None, [], [0.5, 0.6]),  # the sharer has not computed yet: every step counts
        (steps((1, 0.5), (2, 0.6), (3, 0.9)), 2.0, [], [0.5, 0.6]),  # steps that ended before its first step
        # a pause from 4 to 6, steps of typically 0.5 s: those ending from 5 (4 + 2 x 0.5) to 6 count
        (steps((4.8, 0.5), (5.3, 0.5), (5.9, 0.6), (6.4, 0.5)), 2.0, [(4.0, 6.0)], [0.5, 0.6]),
        # a slow step counts as well as a fast one: only where it ends decides, not how long it took
        (steps((5.1, 0.5), (5.4, 0.3), (5.9, 0.5), (9.0, 0.5)), 2.0, [(4.0, 6.0)], [0.5, 0.3, 0.5]),
        (steps((5, 0.5)), 2.0, [(4.6, 5.1)], []),  # ended too soon after the pause began
        ([], 2.0, [(4.0, 6.0)], []),
    ],
)
def test_only_steps_the_sharer_cannot_have_slowed_count_as_exclusive(
    records: list[StepRecord], first_compute: float | None, quiet: list[tuple[float, float]], expected: list[float]
) -> None:
    assert exclusive_step_times(records, first_compute, quiet) == expected


def _pacer(duty: float = 0.4) -> Pacer:
    pacer = Pacer(PacingConfig(window=2, backoff=0.5, increase=0.1, min_duty=0.05, margin=0.02), duty=duty)
    pacer.learn_baseline([1.0, 1.0, 1.0])
    return pacer


@pytest.mark.parametrize(
    ("seconds", "duty", "violations"),
    [
        ((1.0, 1.0), 0.5, 0),  # the guaranteed job keeps its speed: the sharer takes a little more
        ((1.0, 1.02), 0.5, 0),  # 0.99 of its speed, above target + margin
        ((1.04, 1.04), 0.2, 0),  # 0.96: inside the margin, under target + margin: back off, not a violation
        ((1.2, 1.2), 0.2, 1),  # 0.83: a violation: the duty halves
    ],
)
def test_the_duty_backs_off_multiplicatively_and_grows_additively(
    seconds: tuple[float, float], duty: float, violations: int
) -> None:
    pacer = _pacer()
    assert pacer.decide(steps((1.0, seconds[0]), (2.0, seconds[1]))) == pytest.approx(duty)
    assert pacer.violations == violations


def test_the_duty_stays_between_its_least_value_and_one() -> None:
    pacer = _pacer(duty=0.06)
    assert pacer.decide(steps((1, 2.0), (2, 2.0))) == 0.05, "never below min_duty"
    pacer = _pacer(duty=0.95)
    assert pacer.decide(steps((1, 1.0), (2, 1.0))) == 1.0, "never above 1"


def test_no_decision_without_a_baseline_or_enough_new_steps() -> None:
    pacer = Pacer(PacingConfig(window=2), duty=0.4)
    assert pacer.decide(steps((1, 5.0), (2, 5.0))) == 0.4, "no baseline yet"
    pacer.learn_baseline([1.0])
    assert pacer.decide(steps((1, 5.0))) == 0.4, "one new step, the window is two"
    assert pacer.decide(steps((1, 5.0), (2, 5.0))) == 0.2
    assert pacer.decide(steps((1, 5.0), (2, 5.0))) == 0.2, "the same steps are not judged twice"
    pacer.learn_baseline([])
    assert pacer.baseline_s == 1.0, "no exclusive step: the baseline stays"


def test_the_baseline_is_a_mean_like_the_speed_it_is_compared_with() -> None:
    """Step times skewed by other load (one long step in five) on both sides read as no slowdown: a median baseline
    against a mean would read 0.7 here and throttle a sharer that slows nothing."""
    skewed = [1.0, 1.0, 1.0, 1.0, 3.0]
    pacer = Pacer(PacingConfig(window=5), duty=0.4)
    pacer.learn_baseline(skewed)
    pacer.decide([StepRecord(float(i), s) for i, s in enumerate(skewed, start=1)])
    assert pacer.ratio == pytest.approx(1.0) and pacer.duty == pytest.approx(0.5)


@pytest.mark.parametrize(("duty", "busy", "pause"), [(0.25, 1.0, 3.0), (1.0, 1.0, 0.0), (0.25, 0.0, 0.0)])
def test_the_pause_makes_computing_the_duty_share_of_the_time(duty: float, busy: float, pause: float) -> None:
    assert Pacer(PacingConfig(max_pause_s=10.0), duty=duty).pause_s(busy) == pytest.approx(pause)


def test_a_pause_is_never_longer_than_max_pause() -> None:
    assert Pacer(PacingConfig(max_pause_s=0.5, min_duty=0.01), duty=0.01).pause_s(1.0) == 0.5


@pytest.mark.parametrize(
    ("field", "value"),
    [("target", 0.0), ("target", 1.5), ("backoff", 1.0), ("increase", 0.0), ("min_duty", 0.0), ("window", 0)],
)
def test_invalid_settings_are_refused_with_their_name(field: str, value: float) -> None:
    with pytest.raises(RuntimeConfigError, match=field):
        PacingConfig(**{field: value})  # type: ignore[arg-type]


def test_in_closed_loop_the_guaranteed_job_keeps_its_target_while_the_sharer_uses_the_room() -> None:
    """A model of a shared device: the guaranteed job's step takes ``1 + slowdown * duty`` of its exclusive time
    (with noise), so it keeps 0.95 of its speed only while the duty is at most about 0.26 for ``slowdown=0.2``."""
    slowdown, exclusive = 0.2, 0.1
    pacer = Pacer(PacingConfig(window=10))
    pacer.learn_baseline([exclusive] * 10)
    now, history, duties, ratios = 0.0, [], [], []
    for step in range(4000):
        noise = 1.0 + 0.02 * ((step * 7919) % 11 - 5) / 5  # deterministic +-2 %
        seconds = exclusive * (1 + slowdown * pacer.duty) * noise
        now += seconds
        history.append(StepRecord(now, seconds))
        ratios.append(exclusive / seconds)
        if step % 10 == 9:
            duties.append(pacer.decide(history[-20:]))
    settled = slice(len(ratios) // 4, None)
    assert statistics.fmean(exclusive / r for r in ratios[settled]) <= exclusive / 0.95, "mean step time in bound"
    assert statistics.fmean(duties[len(duties) // 4 :]) > 0.1, "the sharer uses a fair part of the room it has"
