"""What each policy decides in small, hand-checked situations."""

from __future__ import annotations

from slurm_amoeba.policy import (
    ElasticBackfillPolicy,
    ElasticTiresiasPolicy,
    FifoPolicy,
    MicroBatch,
    Share,
    SjfSharingPolicy,
    SrtfPolicy,
    TiresiasPolicy,
    check_actions,
    make_policy,
)
from slurm_amoeba.policy.tiresias import DEFAULT_QUEUE_THRESHOLD_GPU_S

from .helpers import job, sized, sizes, snapshot

LINEAR = {n: float(n) for n in range(1, 17)}


def test_fifo_starts_in_submit_order_and_the_head_blocks_the_rest() -> None:
    snap = snapshot([4, 4], [job("big", 6, submit=1), job("small", 1, submit=2), job("first", 4, submit=0)])
    decisions = FifoPolicy().decide(snap, 10)
    assert sizes(decisions) == {"first": 4}
    check_actions(snap, decisions)


def test_fifo_places_on_the_nodes_with_most_free_gpus() -> None:
    snap = snapshot([4, 4, 4], [job("run", 3, placement={"n0": 3}), job("new", 5, submit=1)])
    (decision,) = sized(FifoPolicy().decide(snap, 10))
    assert dict(decision.placement) == {"n1": 4, "n2": 1}


def test_srtf_preempts_a_longer_running_job_for_a_shorter_one() -> None:
    long_job = job("long", 4, placement={"n0": 4}, throughput={4: 1.0}, remaining_work=10_000.0)
    short_job = job("short", 4, submit=5, throughput={4: 1.0}, remaining_work=100.0)
    decisions = SrtfPolicy().decide(snapshot([4], [long_job, short_job]), 10)
    assert sizes(decisions) == {"long": 0, "short": 4}


def test_tiresias_demotes_at_16_gpu_hours_and_preempts_for_the_high_queue() -> None:
    old = job("old", 4, placement={"n0": 4}, attained_service=DEFAULT_QUEUE_THRESHOLD_GPU_S, submit=0)
    young = job("young", 4, placement={"n1": 4}, attained_service=DEFAULT_QUEUE_THRESHOLD_GPU_S - 1, submit=1)
    new = job("new", 4, submit=2)
    decisions = sized(TiresiasPolicy().decide(snapshot([4, 4], [old, young, new]), 100))
    assert sizes(decisions) == {"old": 0, "new": 4}
    assert dict(decisions[-1].placement) == {"n0": 4}


def test_tiresias_skips_a_job_that_does_not_fit_and_admits_the_next() -> None:
    snap = snapshot([4, 4], [job("run", 4, placement={"n0": 4}), job("wide", 8, submit=1), job("narrow", 2, submit=2)])
    assert sizes(TiresiasPolicy().decide(snap, 10)) == {"narrow": 2}


def test_e_tiresias_compacts_a_low_priority_elastic_job_before_preempting_it() -> None:
    low_priority = job("low", 4, low=2, high=8, placement={"n0": 4, "n1": 4}, attained_service=1e6, throughput=LINEAR)
    newcomer = job("new", 4, submit=10)
    decisions = ElasticTiresiasPolicy().decide(snapshot([4, 4], [low_priority, newcomer]), 100)
    assert sizes(decisions) == {"low": 4, "new": 4}
    check_actions(snapshot([4, 4], [low_priority, newcomer]), decisions)


def test_e_tiresias_gives_spare_gpus_to_the_largest_speedup_gain() -> None:
    flat = {1: 1.0, 2: 1.05, 3: 1.1, 4: 1.12}
    steep = {1: 1.0, 2: 1.9, 3: 2.8, 4: 3.6}
    a = job("flat", 1, low=1, high=4, placement={"n0": 1}, throughput=flat)
    b = job("steep", 1, low=1, high=4, placement={"n1": 1}, throughput=steep, submit=1)
    decisions = ElasticTiresiasPolicy().decide(snapshot([4, 4], [a, b]), 100)
    assert sizes(decisions) == {"steep": 4}


def test_e_tiresias_keeps_current_sizes_when_nothing_waits() -> None:
    a = job("a", 2, low=1, high=4, placement={"n0": 3}, throughput=LINEAR)
    assert ElasticTiresiasPolicy(min_gain=2.0).decide(snapshot([4], [a]), 100) == []


def test_backfill_grows_into_gpus_no_pending_job_can_use() -> None:
    elastic = job("el", 2, low=2, high=6, placement={"n0": 2}, throughput=LINEAR)
    blocked = job("wide", 12, submit=5)
    decisions = ElasticBackfillPolicy().decide(snapshot([4, 4], [elastic, blocked]), 10)
    assert sizes(decisions) == {"el": 6}


def test_backfill_leaves_gpus_for_a_pending_job_that_fits() -> None:
    elastic = job("el", 2, low=2, high=8, placement={"n0": 2}, throughput=LINEAR)
    waiting = job("reg", 4, submit=5)
    decisions = ElasticBackfillPolicy(start_pending=False).decide(snapshot([4, 4], [elastic, waiting]), 10)
    assert sizes(decisions) == {"el": 4}


def test_backfill_shrinks_elastic_extras_ahead_of_preemption() -> None:
    elastic = job("el", 2, low=2, high=8, placement={"n0": 4, "n1": 4}, throughput=LINEAR)
    regular = job("reg", 4, submit=5)
    decisions = ElasticBackfillPolicy().decide(snapshot([4, 4], [elastic, regular]), 10)
    assert sizes(decisions) == {"el": 4, "reg": 4}
    check_actions(snapshot([4, 4], [elastic, regular]), decisions)


def test_backfill_never_touches_a_pinned_job() -> None:
    pinned = job("el", 2, low=2, high=8, placement={"n0": 4, "n1": 4}, throughput=LINEAR, pinned=True)
    regular = job("reg", 4, submit=5)
    assert ElasticBackfillPolicy().decide(snapshot([4, 4], [pinned, regular]), 10) == []


def _sharing_case(keep: float) -> tuple[list[str], list[str | None]]:
    """(policy names, the partner each one picked or None) for a guest that may share a host's GPUs."""
    host = job("host", 4, placement={"n0": 4}, throughput={4: 1.0}, remaining_work=300.0, job_type="x")
    guest = job(
        "guest",
        2,
        submit=5,
        throughput={2: 1.0},
        remaining_work=1000.0,
        job_type="y",
        micro_batches={8: MicroBatch(1.0, 4.0, 1)},
    )
    colocation = {("x", "y"): keep, ("y", "x"): keep}
    snap = snapshot([4], [host, guest], colocation=colocation)
    policies = (make_policy("sjf-bsbf"), SjfSharingPolicy())
    results = []
    for policy in policies:
        decisions = policy.decide(snap, 10)
        check_actions(snap, decisions)
        shares = [action.host for action in decisions if isinstance(action, Share)]
        assert len(shares) == len(decisions), "a guest that waits on a full cluster can only share"
        results.append(shares[0] if shares else None)
    return [policy.name for policy in policies], results


def test_bsbf_shares_only_when_it_pays_and_ffs_shares_anyway() -> None:
    names, good = _sharing_case(0.9)
    assert names == ["sjf-bsbf", "sjf-ffs"]
    assert good == ["host", "host"]
    _, bad = _sharing_case(0.3)
    assert bad == [None, "host"]
