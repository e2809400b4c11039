"""The sharer's pacing controller (``runtime/pacing.py``): tables of decisions, a closed loop against a model of
interference, and the gate that lets a sharer compute only in the guaranteed job's idle time."""

from __future__ import annotations

import statistics

import pytest

from slurm_amoeba.runtime import pacing
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


def test_the_owners_log_publishes_transitions_with_its_mean_busy_and_short_idle_spell() -> None:
    log = pacing.ActivityLog(pid=7, keep=2)
    assert log.mark(False, 0.0) is None, "idle before it ever computed: nothing published"
    assert log.mark(True, 1.0) == pacing.OwnerActivity(True, 1.0, 0.0, 0.0, 7)
    assert log.mark(True, 1.5) is None, "no transition"
    assert log.mark(False, 3.0) == pacing.OwnerActivity(False, 3.0, 2.0, 0.0, 7)
    assert log.mark(True, 3.5) == pacing.OwnerActivity(True, 3.5, 2.0, 0.5, 7)
    assert log.mark(False, 4.5) == pacing.OwnerActivity(False, 4.5, 1.5, 0.5, 7), "busy spells 2 and 1"
    log.mark(True, 5.5)
    log.mark(False, 6.5)
    assert log.mark(True, 8.5) == pacing.OwnerActivity(True, 8.5, 1.0, 1.0, 7), "only the last two spells of each count"


def test_one_unusually_short_idle_spell_does_not_set_the_room_once_there_are_four() -> None:
    log = pacing.ActivityLog(pid=7)
    now = 0.0
    for idle in (0.5, 0.1, 0.5, 0.4):
        log.mark(True, now)
        log.mark(False, now + 1.0)
        now += 1.0 + idle
    published = log.mark(True, now)
    assert published is not None and published.idle_s == pytest.approx(0.4), "the second shortest of 0.5, 0.1, 0.5, 0.4"


CONFIG = PacingConfig(poll_s=0.001, long_idle_s=0.05, stale_s=1.0)


@pytest.mark.parametrize(
    ("activity", "now", "chunk_s", "allowed"),
    [
        (None, 10.0, 0.5, True),  # the owner publishes nothing: the duty alone paces
        (pacing.OwnerActivity(True, 10.0, 0.02, 0.02), 10.001, 0.001, False),  # computing: never
        (pacing.OwnerActivity(True, 10.0, 0.02, 0.02), 10.5, 0.001, False),  # a long step, not a stale flag yet
        (pacing.OwnerActivity(True, 10.0, 0.02, 0.02), 11.01, 0.001, True),  # busy for over 1 s and 10 steps: stale
        (pacing.OwnerActivity(True, 10.0, 0.5, 0.02), 11.01, 0.001, False),  # ... but not 10 of its own long spells
        (pacing.OwnerActivity(False, 10.0, 0.02, 0.02), 10.005, 0.010, True),  # 15 ms of room for a 10 ms chunk
        (pacing.OwnerActivity(False, 10.0, 0.02, 0.02), 10.015, 0.010, False),  # 5 ms left: wait for the next spell
        (pacing.OwnerActivity(False, 10.0, 0.02, 0.02), 10.09, 0.010, True),  # idle over 4 spells and 50 ms: it stopped
        (pacing.OwnerActivity(False, 10.0, 0.02, 0.02), 10.009, 0.030, True),  # longer than any spell: its first half
        (pacing.OwnerActivity(False, 10.0, 0.02, 0.02), 10.011, 0.030, False),
        (pacing.OwnerActivity(False, 10.0, 0.0, 0.0), 10.01, 0.010, False),  # its first idle spell: no room known
        (pacing.OwnerActivity(False, 10.0, 0.0, 0.0), 10.06, 0.010, True),
    ],
)
def test_the_gate_opens_only_in_the_owners_idle_time_with_room_for_the_chunk(
    activity: pacing.OwnerActivity | None, now: float, chunk_s: float, allowed: bool
) -> None:
    assert pacing.may_compute(activity, now, chunk_s, CONFIG) is allowed


@pytest.mark.parametrize(
    ("activity", "now", "expected"),
    [
        (None, 10.0, 0.001),
        (pacing.OwnerActivity(True, 10.0, 0.010, 0.010), 10.002, 0.007),  # its mean busy spell ends, one poll early
        (pacing.OwnerActivity(True, 10.0, 0.010, 0.010), 10.5, 0.001),  # overdue: poll
        (pacing.OwnerActivity(True, 10.0, 0.5, 0.010), 10.0, 0.020),  # never longer than 20 polls
        (pacing.OwnerActivity(False, 10.0, 0.010, 0.004), 10.003, 0.010),  # a spell too short: the next one
    ],
)
def test_a_refused_sharer_sleeps_until_the_owner_is_expected_to_idle(
    activity: pacing.OwnerActivity | None, now: float, expected: float
) -> None:
    assert pacing.wait_s(activity, now, CONFIG) == pytest.approx(expected)


def test_a_gated_pacer_starts_at_full_duty_and_probes_for_the_baseline_first() -> None:
    pacer = Pacer(PacingConfig(max_pause_s=2.0))
    pacer.engage_gate()
    assert pacer.duty == 1.0 and pacer.pause_s(0.1) == 2.0, "a probe until the owner's exclusive speed is known"
    pacer.learn_baseline([0.1])
    assert pacer.pause_s(0.1) == 0.0, "the gate keeps it out of the owner's compute: no pause"
    pacer.decide(steps(*((i, 0.2) for i in range(10))))
    assert pacer.duty == 0.5 and pacer.pause_s(0.1) == pytest.approx(0.1), "still slowed: the safety net cuts"
    pacer.engage_gate()
    assert pacer.duty == 0.5, "engaging again changes nothing"


def test_a_gated_pacer_probes_again_when_its_baseline_is_stale_and_every_so_many_decisions() -> None:
    pacer = Pacer(PacingConfig(window=2, reprobe_ratio=1.25, reprobe_every=3))
    pacer.engage_gate()
    pacer.learn_baseline([0.3])  # learned from the owner's warm-up steps
    pacer.decide(steps((1, 0.1), (2, 0.1)))
    assert pacer.baseline_s is None and pacer.duty == 1.0, "3 x its exclusive speed: the baseline is stale"
    pacer.learn_baseline([0.1])
    pacer.decide(steps((3, 0.1), (4, 0.1)))
    assert pacer.baseline_s == 0.1
    pacer.decide(steps((5, 0.1), (6, 0.1)))
    assert pacer.baseline_s is None and pacer.decisions == 3, "the third decision probes again"


def test_a_gated_pacer_judges_the_typical_step_so_a_few_steps_delayed_by_others_do_not_cut_its_duty() -> None:
    delayed = steps(*((i, 0.1) for i in range(8)), (8, 0.6), (9, 0.6))  # two steps 6 x long: the mean is 0.2
    ungated, gated = Pacer(PacingConfig(window=10), duty=1.0), Pacer(PacingConfig(window=10))
    gated.engage_gate()
    for pacer in (ungated, gated):
        pacer.learn_baseline([0.1] * 10)
        pacer.decide(delayed)
    assert ungated.duty == 0.5 and gated.duty == 1.0
    gated.decide(steps(*((10 + i, 0.12) for i in range(10))))
    assert gated.duty == 0.5, "a slower typical step still cuts it"


def test_a_gated_pacer_cuts_only_under_the_target_itself() -> None:
    ungated, gated = Pacer(PacingConfig(window=10), duty=1.0), Pacer(PacingConfig(window=10))
    gated.engage_gate()
    for pacer in (ungated, gated):
        pacer.learn_baseline([0.1] * 10)
        pacer.decide(steps(*((i, 0.1 / 0.96) for i in range(10))))  # 0.96: above 0.95, under 0.95 + the margin
    assert ungated.duty == 0.5 and gated.duty == 1.0


def test_a_gated_pacer_cuts_at_once_on_a_deep_slowdown_but_on_a_shallow_one_only_when_it_comes_twice_in_a_row() -> None:
    pacer = Pacer(PacingConfig(window=2))
    pacer.engage_gate()
    pacer.learn_baseline([0.1])
    shallow, kept, deep = 0.1 / 0.94, 0.1, 0.1 / 0.90  # 0.94: under 0.95, within the 0.02 margin; 0.90: below it
    pacer.decide(steps((1, shallow), (2, shallow)))
    assert pacer.duty == 1.0 and pacer.violations == 1, "one shallow dip is the machine's noise"
    pacer.decide(steps((3, kept), (4, kept)))
    pacer.decide(steps((5, shallow), (6, shallow)))
    assert pacer.duty == 1.0, "dips apart are still noise"
    pacer.decide(steps((7, shallow), (8, shallow)))
    assert pacer.duty == 0.5 and pacer.violations == 3, "the second in a row cuts"
    pacer.decide(steps((9, deep), (10, deep)))
    assert pacer.duty == 0.25, "a deep one cuts at once"
