"""The pairing rules of the sharing policies (policy/pairing.py) and SJF-BSBF and AntMan built on them, by tables."""

from __future__ import annotations

import pytest

from slurm_amoeba.policy import (
    MicroBatch,
    NodeInfo,
    PairingPolicy,
    Place,
    Preempt,
    Share,
    ShareMode,
    Snapshot,
    Start,
    check_actions,
    make_policy,
)
from slurm_amoeba.policy.pairing import (
    fitting_micro_batches,
    kept_fraction,
    paced_fractions,
    plan_pair,
    reclaims,
    remaining_seconds,
    sharing_benefit,
)
from slurm_amoeba.policy.types import JobInfo, PolicyError

from .helpers import job

#: A sharer's micro-batches: (speed, memory GiB, accumulation) for 32, 16 and 8 samples per step.
PROFILE = {32: MicroBatch(1.0, 8.0, 1), 16: MicroBatch(0.9, 4.0, 2), 8: MicroBatch(0.7, 2.0, 4)}


def _nodes(memory: float | None, free: int = 0) -> tuple[NodeInfo, ...]:
    return (NodeInfo("n0", 4, free, gpu_memory_gib=memory),)


def _host(memory: float | None = 6.0, remaining: float = 300.0, **extra: object) -> JobInfo:
    return job(
        "host",
        4,
        placement={"n0": 4},
        throughput={4: 1.0},
        remaining_work=remaining,
        job_type="x",
        memory_gib=memory,
        **extra,  # type: ignore[arg-type]
    )


def _guest(remaining: float = 1000.0, **extra: object) -> JobInfo:
    return job(
        "guest",
        2,
        submit=5,
        throughput={2: 1.0},
        remaining_work=remaining,
        job_type="y",
        micro_batches=PROFILE,
        **extra,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("mine", "partner", "keep_mine", "keep_partner", "expected"),
    [
        (100.0, 100.0, 1.0, 1.0, 100.0),  # free sharing: both finish at 100 instead of 100 and 200
        (100.0, 100.0, 0.5, 0.5, -100.0),  # time slicing: both finish at 200 instead of 100 and 200
        (100.0, 100.0, 0.75, 0.75, 100.0 / 3.0),  # both finish at 133.3 instead of 100 and 200
        (1000.0, 300.0, 0.9, 0.9, 700.0 / 3.0),  # 333.3 and 1033.3 instead of 300 and 1300
    ],
)
def test_the_benefit_compares_together_with_one_after_the_other(
    mine: float, partner: float, keep_mine: float, keep_partner: float, expected: float
) -> None:
    assert sharing_benefit(mine, partner, keep_mine, keep_partner) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("solo", "shared", "prior", "expected"),
    [
        (None, {}, {("y", "x"): 0.6}, 0.6),  # nothing measured: Gavel's table is the prior
        (10.0, {"x": 8.0}, {("y", "x"): 0.6}, 0.8),  # measured solo and beside an x: the measurement wins
        (10.0, {"z": 8.0}, {("y", "x"): 0.6}, 0.6),  # measured beside another type only: the prior
        (None, {"x": 8.0}, {("y", "x"): 0.6}, 0.6),  # a shared rate without a solo rate is no ratio
        (10.0, {"x": 12.0}, {}, 1.0),  # faster together than alone (noise) is capped at its solo speed
        (None, {}, {}, None),  # nothing at all: unknown
    ],
)
def test_measured_speeds_override_the_prior(
    solo: float | None, shared: dict[str, float], prior: dict[tuple[str, str], float], expected: float | None
) -> None:
    guest = _guest(solo_rate=solo, shared_rates=shared)
    assert kept_fraction(guest, "x", prior) == (None if expected is None else pytest.approx(expected))


def test_refuses_a_prior_outside_zero_to_one() -> None:
    with pytest.raises(PolicyError, match=r"co-location factor 1.5 for y beside x must lie in \(0, 1\]"):
        kept_fraction(_guest(), "x", {("y", "x"): 1.5})


@pytest.mark.parametrize(
    ("left", "expected"),
    [
        (None, [32, 16, 8]),  # memory unknown: nothing bounds the sharer
        (10.0, [32, 16, 8]),
        (5.0, [16, 8]),
        (2.0, [8]),
        (1.0, []),  # nothing fits: no share
    ],
)
def test_the_sub_batch_search_keeps_what_fits_the_memory_left(left: float | None, expected: list[int]) -> None:
    assert [size for size, _ in fitting_micro_batches(_guest(), left)] == expected


@pytest.mark.parametrize(
    ("host_memory", "node_memory", "sub_batch"),
    [
        (6.0, 16.0, 32),  # 10 GiB left: the full micro-batch fits and pays most
        (10.0, 16.0, 16),  # 6 GiB left: 16 per step with two accumulation steps
        (13.0, 16.0, 8),  # 3 GiB left: 8 per step
        (15.0, 16.0, None),  # 1 GiB left: no micro-batch fits
        (None, 16.0, None),  # the host's use unknown on a device of known size: never shared
        (None, None, 32),  # no memory known anywhere: unbounded
    ],
)
def test_the_sharer_gets_the_largest_micro_batch_that_fits_beside_the_host(
    host_memory: float | None, node_memory: float | None, sub_batch: int | None
) -> None:
    snap = Snapshot(_nodes(node_memory), (_host(host_memory), _guest()), {("x", "y"): 0.9, ("y", "x"): 0.9})
    plan = plan_pair(_guest(), [_host(host_memory)], snap, ShareMode.BENEFIT)
    assert (plan.sub_batch if plan else None) == sub_batch
    if plan is not None:
        assert plan.sub_batch is not None, "a sharer with profiles gets one of them"
        assert plan.accumulation == PROFILE[plan.sub_batch].accumulation
        assert plan.keep_sharer == pytest.approx(0.9 * PROFILE[plan.sub_batch].speed)


@pytest.mark.parametrize(
    ("keep", "shares"),
    [(0.9, True), (0.7, True), (0.5, False), (0.3, False)],
)
def test_bsbf_shares_only_when_the_summed_completion_time_falls(keep: float, shares: bool) -> None:
    snap = Snapshot(_nodes(16.0), (_host(), _guest()), {("x", "y"): keep, ("y", "x"): keep})
    decisions = make_policy("sjf-bsbf").decide(snap, 0.0)
    check_actions(snap, decisions)
    assert [type(action) for action in decisions] == ([Share] if shares else [])
    if shares:
        share = decisions[0]
        assert isinstance(share, Share)
        assert (share.host, share.sub_batch, share.accumulation, share.pace_bound) == ("host", 32, 1, None)
        assert sharing_benefit(1000.0, 300.0, keep, keep) > 0


def test_bsbf_picks_the_host_of_largest_benefit_not_the_first() -> None:
    near = _host(remaining=100.0)  # first in the hosts' order; saves 78 s
    far = job("long", 4, placement={"n1": 4}, throughput={4: 1.0}, remaining_work=5000.0, job_type="z", memory_gib=6.0)
    nodes = (NodeInfo("n0", 4, 0, gpu_memory_gib=16.0), NodeInfo("n1", 4, 0, gpu_memory_gib=16.0))
    prior = {("x", "y"): 0.9, ("y", "x"): 0.9, ("z", "y"): 0.6, ("y", "z"): 0.6}
    snap = Snapshot(nodes, (far, near, _guest()), prior)
    decisions = make_policy("sjf-bsbf").decide(snap, 0.0)
    assert [(type(a), getattr(a, "host", None)) for a in decisions] == [(Share, "long")]  # saves 3,667 s


def test_bsbf_never_preempts_a_running_job_for_a_shorter_one() -> None:
    long_host = _host(remaining=100_000.0)
    short = job("short", 4, submit=5, throughput={4: 1.0}, remaining_work=10.0, job_type="y")
    snap = Snapshot(_nodes(16.0), (long_host, short), {})
    for name in ("sjf-bsbf", "antman"):
        decisions = make_policy(name).decide(snap, 0.0)
        check_actions(snap, decisions)
        assert decisions == [], f"{name} must leave the long job alone and let the short one wait"


def test_bsbf_starts_the_shortest_pending_job_that_fits_first() -> None:
    jobs = (
        job("long", 2, throughput={2: 1.0}, remaining_work=900.0),
        job("short", 2, submit=3, throughput={2: 1.0}, remaining_work=10.0),
        job("big", 8, submit=1, throughput={8: 1.0}, remaining_work=1.0),
    )
    snap = Snapshot((NodeInfo("n0", 4, 2),), jobs, {})
    decisions = make_policy("sjf-bsbf").decide(snap, 0.0)
    check_actions(snap, decisions)
    assert [(type(a), a.job_id) for a in decisions] == [(Start, "short")]


@pytest.mark.parametrize(
    ("keep_host", "keep_sharer", "bound", "expected"),
    [
        (0.99, 0.8, 0.05, (0.99, 0.8)),  # the pair already keeps the host within its bound: no pacing
        (0.6, 0.8, 0.05, (0.95, 0.1)),  # paced to 1/8 of the time: the host keeps 95%
        (0.5, 0.5, 0.1, (0.9, 0.1)),
        (0.5, 0.5, 0.0, (1.0, 0.0)),  # no slowdown allowed: the sharer stops
    ],
)
def test_pacing_keeps_the_host_within_its_bound_and_charges_the_sharer(
    keep_host: float, keep_sharer: float, bound: float, expected: tuple[float, float]
) -> None:
    assert paced_fractions(keep_host, keep_sharer, bound) == pytest.approx(expected)


def test_antman_places_a_paced_sharer_where_bsbf_would_not() -> None:
    prior = {("x", "y"): 0.5, ("y", "x"): 0.5}
    snap = Snapshot(_nodes(16.0), (_host(), _guest()), prior)
    assert make_policy("sjf-bsbf").decide(snap, 0.0) == []
    decisions = make_policy("antman", pace_bound=0.1).decide(snap, 0.0)
    check_actions(snap, decisions)
    assert len(decisions) == 1 and isinstance(decisions[0], Share)
    assert (decisions[0].host, decisions[0].pace_bound, decisions[0].sub_batch) == ("host", 0.1, 32)


def test_antman_gives_a_sharer_gpus_of_its_own_once_they_are_free() -> None:
    guest = job("guest", 2, submit=5, placement={"n0": 2}, shared_with="host", job_type="y", micro_batches=PROFILE)
    snap = Snapshot((NodeInfo("n0", 4, 0), NodeInfo("n1", 4, 4)), (_host(), guest), {})
    decisions = make_policy("antman", promote=True).decide(snap, 0.0)
    check_actions(snap, decisions)
    assert decisions == [Place("guest", {"n1": 2}, "antman: GPUs of its own are free, leaves its host")]
    assert make_policy("antman").decide(snap, 0.0) == [], "by default a sharer stays beside its host"
    assert make_policy("sjf-bsbf").decide(snap, 0.0) == []
    assert Place in make_policy("antman", promote=True).emits and Place not in make_policy("antman").emits


def _sharing(host_memory: float, sharer_memory: float, **host_extra: object) -> Snapshot:
    host = _host(host_memory, 300.0, **host_extra)
    guest = job(
        "guest",
        2,
        submit=5,
        placement={"n0": 2},
        shared_with="host",
        job_type="y",
        micro_batches=PROFILE,
        memory_gib=sharer_memory,
    )
    return Snapshot(_nodes(16.0), (host, guest), {})


@pytest.mark.parametrize(
    ("host_memory", "expected"),
    [
        (6.0, None),  # 10 GiB left for the sharer's 8: nothing to do
        (10.0, ("share", 16)),  # the host grew to 10 GiB: the sharer shrinks to 16 per step
        (13.5, ("share", 8)),
        (15.0, ("evict", None)),  # no micro-batch fits the 1 GiB left: the sharer leaves
    ],
)
def test_a_sharer_shrinks_or_leaves_when_its_host_needs_its_memory_back(
    host_memory: float, expected: tuple[str, int | None] | None
) -> None:
    snap = _sharing(host_memory, 8.0)
    actions = reclaims(snap, None)
    check_actions(snap, actions)
    if expected is None:
        assert actions == []
        return
    (action,) = actions
    kind, size = expected
    if kind == "evict":
        assert isinstance(action, Preempt) and action.job_id == "guest"
    else:
        assert isinstance(action, Share) and (action.host, action.sub_batch) == ("host", size)
        assert size is not None and action.accumulation == PROFILE[size].accumulation


@pytest.mark.parametrize(("measured", "evicted"), [(9.6, False), (9.4, True), (None, False)])
def test_antman_evicts_a_sharer_whose_host_measurably_lost_more_than_its_bound(
    measured: float | None, evicted: bool
) -> None:
    rates = {} if measured is None else {"y": measured}
    snap = _sharing(6.0, 8.0, solo_rate=10.0, shared_rates=rates)
    decisions = make_policy("antman", pace_bound=0.05).decide(snap, 0.0)
    check_actions(snap, decisions)
    assert [(type(a), a.job_id) for a in decisions] == ([(Preempt, "guest")] if evicted else [])


def test_an_eviction_is_never_followed_by_a_share_in_the_same_answer() -> None:
    snap = _sharing(15.0, 8.0)
    for policy in (make_policy("sjf-bsbf"), PairingPolicy(ShareMode.OPPORTUNISTIC)):
        decisions = policy.decide(snap, 0.0)
        check_actions(snap, decisions)
        assert [type(action) for action in decisions] == [Preempt]


def test_refuses_a_pace_bound_outside_zero_to_one() -> None:
    with pytest.raises(PolicyError, match=r"pace_bound=1.0 must lie in \[0, 1\)"):
        make_policy("antman", pace_bound=1.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sub_batch": 8}, "give both or neither"),
        ({"sub_batch": 0, "accumulation": 1}, "must be at least 1"),
        ({"pace_bound": 1.5}, r"pace_bound=1.5 must lie in \[0, 1\)"),
    ],
)
def test_check_refuses_a_share_with_an_inconsistent_plan(fields: dict[str, object], message: str) -> None:
    snap = Snapshot(_nodes(16.0), (_host(), _guest()), {})
    share = Share("guest", "host", 2, {"n0": 2}, "", **fields)  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match=message):
        check_actions(snap, [share])


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"throughput": {2: 2.0}, "remaining_work": 100.0, "time_limit": 3600.0}, 50.0),  # the estimate first
        ({"time_limit": 3600.0, "executed_time": 600.0}, 3000.0),  # no estimate (live): what the limit leaves
        ({"time_limit": 600.0, "executed_time": 900.0}, 0.0),  # past its limit: nothing left, never negative
        ({}, None),  # neither: unknown, and SJF-BSBF cannot weigh a pair with it
    ],
)
def test_remaining_time_falls_back_on_the_time_limit_without_an_estimate(
    extra: dict[str, object], expected: float | None
) -> None:
    assert remaining_seconds(job("j", 2, **extra)) == expected  # type: ignore[arg-type]
