"""The ``slurm`` baseline on hand-built scenarios whose Slurm outcome is known."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_amoeba.policy import PolicyError, Snapshot, check_actions, make_policy
from slurm_amoeba.policy.amoebad import AdmissionLayer, AmoebadPolicy, ElasticLayer, LasOrderLayer, WholeNodeLayer
from slurm_amoeba.policy.slurm_baseline import Profile, SlurmBaselinePolicy, SlurmPartition

from .helpers import job, sized, sizes, snapshot
from .strategies import snapshots

# One node of 4 GPUs; R holds 2 of them until t=1000 (its time limit); the top job P needs all 4.
_BUSY = job("R", 2, placement={"n0": 2}, time_limit=1000.0)
_TOP = job("P", 4, submit=0.0, time_limit=3000.0)


def _age_only(**knobs: object) -> SlurmBaselinePolicy:
    return SlurmBaselinePolicy(weight_age=1000.0, weight_job_size=0.0, **knobs)  # type: ignore[arg-type]


def test_a_small_job_backfills_when_it_ends_before_the_reservation() -> None:
    short = job("S", 2, submit=10.0, time_limit=500.0)
    decisions = _age_only().decide(snapshot([4], [_BUSY, _TOP, short]), now=100.0)
    assert sizes(decisions) == {"S": 2}


def test_a_small_job_that_would_delay_the_reserved_one_waits() -> None:
    long = job("L", 2, submit=10.0, time_limit=2000.0)
    assert _age_only().decide(snapshot([4], [_BUSY, _TOP, long]), now=100.0) == []


def test_a_job_without_a_time_limit_never_backfills_in_front_of_a_reservation() -> None:
    unlimited = job("U", 2, submit=10.0)
    assert _age_only().decide(snapshot([4], [_BUSY, _TOP, unlimited]), now=100.0) == []
    # ... unless the site's default time limit is short enough.
    assert sizes(_age_only(default_time_s=600.0).decide(snapshot([4], [_BUSY, _TOP, unlimited]), now=100.0)) == {"U": 2}


def test_the_reservation_uses_the_time_limit_not_the_real_remaining_time() -> None:
    # R will really end in 10 s, but Slurm only knows its limit (t=1000); S (limit 500) still backfills.
    busy = job("R", 2, placement={"n0": 2}, time_limit=1000.0, remaining_work=10.0, throughput={2: 1.0})
    short = job("S", 2, submit=10.0, time_limit=500.0)
    assert sizes(_age_only().decide(snapshot([4], [busy, _TOP, short]), now=0.0)) == {"S": 2}


def test_every_tested_job_holds_a_reservation_and_easy_protects_only_the_first() -> None:
    # 4 GPUs; R holds 3 until t=1000. P1 (3 GPUs) is reserved for [1000, 2000), P2 (4 GPUs) for [2000, 3000).
    # Z (1 GPU until t=2500) fits beside R and beside P1 but would delay P2.
    busy = job("R", 3, placement={"n0": 3}, time_limit=1000.0)
    first = job("P1", 3, submit=0.0, time_limit=1000.0)
    second = job("P2", 4, submit=1.0, time_limit=1000.0)
    z = job("Z", 1, submit=2.0, time_limit=2500.0)
    cluster = snapshot([4], [busy, first, second, z])
    assert _age_only().decide(cluster, now=0.0) == []
    assert sizes(_age_only(bf_reservations=1).decide(cluster, now=0.0)) == {"Z": 1}


def test_a_job_whose_start_lies_beyond_bf_window_holds_no_reservation() -> None:
    busy = job("R", 2, placement={"n0": 2}, time_limit=5000.0)
    blocked = job("P", 4, submit=0.0, time_limit=1000.0)
    y = job("Y", 2, submit=5.0, time_limit=10_000.0)
    cluster = snapshot([4], [busy, blocked, y])
    assert _age_only().decide(cluster, now=100.0) == []
    assert sizes(_age_only(bf_window_s=1000.0).decide(cluster, now=100.0)) == {"Y": 2}


def test_priority_orders_by_age_then_by_size() -> None:
    old_small = job("old-small", 1, submit=0.0)
    new_big = job("new-big", 4, submit=3600.0)
    cluster = snapshot([4], [old_small, new_big])
    now = 7200.0
    by_age = SlurmBaselinePolicy(weight_age=1000.0, weight_job_size=0.0).queue_order(cluster, now)
    assert [info.job_id for info in by_age] == ["old-small", "new-big"]
    by_size = SlurmBaselinePolicy(weight_age=0.0, weight_job_size=1000.0).queue_order(cluster, now)
    assert [info.job_id for info in by_size] == ["new-big", "old-small"]
    small_first = SlurmBaselinePolicy(weight_age=0.0, weight_job_size=1000.0, favor_small=True)
    assert [info.job_id for info in small_first.queue_order(cluster, now)] == ["old-small", "new-big"]


def test_priority_caps_age_at_max_age() -> None:
    policy = SlurmBaselinePolicy(weight_age=1000.0, weight_job_size=0.0, max_age_s=3600.0)
    cluster = snapshot([4], [job("a", 1, submit=0.0), job("b", 1, submit=5000.0)])
    assert policy.priorities(cluster, now=100_000.0) == {"a": 1000.0, "b": 1000.0}
    assert policy.priorities(cluster, now=5000.0 + 1800.0)["b"] == pytest.approx(500.0)


def test_fair_share_ranks_the_user_with_less_usage_first() -> None:
    heavy = job("heavy-run", 1, placement={"n0": 1}, owner="alice", attained_service=10_000.0)
    alice = job("alice-2", 1, submit=0.0, owner="alice")
    bob = job("bob-1", 1, submit=100.0, owner="bob")
    cluster = snapshot([1], [heavy, alice, bob])
    policy = SlurmBaselinePolicy(weight_age=0.0, weight_job_size=0.0, weight_fairshare=1000.0)
    assert [info.job_id for info in policy.queue_order(cluster, now=200.0)] == ["bob-1", "alice-2"]


_TIERS = (
    SlurmPartition("gpu", priority_tier=2),
    SlurmPartition("elastic", priority_tier=1, preempt_mode="requeue", grace_time=120.0),
)


def test_a_higher_tier_job_preempts_and_waits_out_the_grace_time() -> None:
    low = job("low", 4, placement={"n0": 4}, partition="elastic", time_limit=10_000.0)
    high = job("high", 4, submit=50.0, partition="gpu", time_limit=1000.0)
    cluster = snapshot([4], [low, high])
    decisions = SlurmBaselinePolicy(partitions=_TIERS).decide(cluster, now=60.0)
    assert sizes(decisions) == {"low": 0}  # told to leave; the high job starts once the grace time is over
    check_actions(cluster, decisions)


def test_without_grace_time_the_preemptor_starts_in_the_same_round() -> None:
    tiers = (SlurmPartition("gpu", priority_tier=2), SlurmPartition("elastic", 1, "cancel", 0.0))
    low = job("low", 4, placement={"n0": 4}, partition="elastic", time_limit=10_000.0)
    high = job("high", 4, submit=50.0, partition="gpu", time_limit=1000.0)
    cluster = snapshot([4], [low, high])
    decisions = SlurmBaselinePolicy(partitions=tiers).decide(cluster, now=60.0)
    assert sizes(decisions) == {"low": 0, "high": 4}
    check_actions(cluster, decisions)


def test_jobs_of_a_partition_without_preemption_are_never_preempted() -> None:
    tiers = (SlurmPartition("gpu", priority_tier=2), SlurmPartition("batch", priority_tier=1))
    low = job("low", 4, placement={"n0": 4}, partition="batch", time_limit=10_000.0)
    high = job("high", 4, submit=50.0, partition="gpu", time_limit=1000.0)
    assert SlurmBaselinePolicy(partitions=tiers).decide(snapshot([4], [low, high]), now=60.0) == []


def test_preemption_takes_only_as_many_victims_as_needed() -> None:
    first = job("v1", 2, placement={"n0": 2}, partition="elastic", time_limit=10_000.0, executed_time=10.0)
    second = job("v2", 2, placement={"n1": 2}, partition="elastic", time_limit=10_000.0, executed_time=500.0)
    high = job("high", 3, submit=50.0, partition="gpu", time_limit=1000.0)
    cluster = snapshot([3, 2], [first, second, high])  # one GPU of n0 is free
    decisions = SlurmBaselinePolicy(partitions=_TIERS).decide(cluster, now=60.0)
    assert sizes(decisions) == {"v1": 0}  # the youngest victim is enough with the free GPU


def test_amoebad_starts_elastic_jobs_at_their_minimum_and_grows_them_into_idle_gpus() -> None:
    elastic = job("e", 2, low=1, high=4, submit=0.0, time_limit=1000.0)
    decisions = AmoebadPolicy().decide(snapshot([4], [elastic]), now=0.0)
    assert sizes(decisions) == {"e": 4}


def test_amoebad_gives_extras_back_for_a_job_slurm_starts() -> None:
    # e asked for 2 and holds 4: two loans, which Slurm may take for the rigid job.
    elastic = job("e", 2, low=1, high=4, placement={"n0": 4}, time_limit=10_000.0)
    rigid = job("r", 2, submit=10.0, time_limit=100.0)
    cluster = snapshot([4], [elastic, rigid])
    decisions = AmoebadPolicy().decide(cluster, now=20.0)
    assert sizes(decisions) == {"e": 2, "r": 2}
    check_actions(cluster, decisions)
    # Slurm alone would make the rigid job wait for the elastic job's end.
    assert SlurmBaselinePolicy().decide(cluster, now=20.0) == []


def test_slurm_takes_only_the_loans_above_an_elastic_jobs_request() -> None:
    # e asked for 4 and holds 4: its workers above its minimum lie below its request.
    elastic = job("e", 4, low=1, high=4, placement={"n0": 4}, time_limit=10_000.0)
    rigid = job("r", 2, submit=10.0, time_limit=100.0)
    cluster = snapshot([4], [elastic, rigid])
    admit = AmoebadPolicy(admission=AdmissionLayer())
    assert admit.decide(cluster, now=20.0) == []
    # The rule before (and the plain daemon's): Slurm took them and left e at half its request.
    loose = AmoebadPolicy(admission=AdmissionLayer(slurm_takes_loans_only=False))
    assert sizes(loose.decide(cluster, now=20.0)) == {"e": 2, "r": 2}
    assert sizes(AmoebadPolicy().decide(cluster, now=20.0)) == {"e": 2, "r": 2}
    # The daemon's own admission at request may still take them (an elastic job admitted at its request).
    arrival = job("p", 2, low=1, high=4, submit=10.0, time_limit=100.0)
    assert sizes(admit.decide(snapshot([4], [elastic, arrival]), now=20.0)) == {"e": 2, "p": 2}


def test_a_job_larger_than_the_cluster_is_skipped_and_the_rest_still_start() -> None:
    decisions = SlurmBaselinePolicy().decide(snapshot([4], [job("huge", 8), job("ok", 2, submit=5.0)]), now=10.0)
    assert sizes(decisions) == {"ok": 2}


def test_bad_settings_are_refused_with_the_knob_named() -> None:
    with pytest.raises(PolicyError, match="bf_max_job_test=0"):
        make_policy("slurm", bf_max_job_test=0)
    with pytest.raises(PolicyError, match="PreemptMode='suspend'"):
        SlurmPartition("x", preempt_mode="suspend")
    with pytest.raises(PolicyError, match="max_age_s=-1"):
        SlurmBaselinePolicy(max_age_s=-1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshot=snapshots(), now=st.floats(0, 100_000), easy=st.booleans(), admit=st.booleans())
def test_with_elastic_backfill_and_partitions_no_invariant_breaks(
    snapshot: Snapshot, now: float, easy: bool, admit: bool
) -> None:
    tiers = (SlurmPartition("", 2), SlurmPartition("low", 1, "requeue", 30.0))
    admission = AdmissionLayer() if admit else None
    for grow in (False, True):
        policy = (
            AmoebadPolicy(partitions=tiers, bf_reservations=int(easy), admission=admission)
            if grow
            else SlurmBaselinePolicy(partitions=tiers, bf_reservations=int(easy))
        )
        decisions = sized(policy.decide(snapshot, now))
        check_actions(snapshot, decisions)
        jobs = {job.job_id: job for job in snapshot.jobs}
        for decision in decisions:
            if decision.workers and jobs[decision.job_id].workers and not grow:
                raise AssertionError(f"Slurm alone resized {decision.job_id}")


def test_amoebad_gives_idle_gpus_to_the_least_attained_service_first() -> None:
    linear = {size: float(size) for size in range(1, 9)}
    old = job("old", 2, low=2, high=4, placement={"n1": 2}, throughput=linear, attained_service=50_000.0)
    young = job("young", 2, low=2, high=4, placement={"n0": 2}, throughput=linear, attained_service=600.0, submit=9.0)
    cluster = snapshot([4, 2], [old, young])
    assert sizes(AmoebadPolicy().decide(cluster, now=10.0)) == {"young": 4}
    # By speedup gain the two tie and the first listed grows.
    by_gain = AmoebadPolicy(elastic=ElasticLayer(grow_by_service=False, compact_growth=False))
    assert sizes(by_gain.decide(cluster, now=10.0)) == {"old": 4}


def test_the_las_order_layer_tests_pending_jobs_by_attained_service_then_submit_time() -> None:
    demoted = job("demoted", 4, submit=0.0, attained_service=10_000.0, time_limit=600.0)
    fresh = job("fresh", 4, submit=5.0, time_limit=600.0)
    cluster = snapshot([4], [demoted, fresh])
    assert sizes(SlurmBaselinePolicy().decide(cluster, now=10.0)) == {"demoted": 4}
    assert sizes(AmoebadPolicy(las_order=LasOrderLayer((3600.0,))).decide(cluster, now=10.0)) == {"fresh": 4}


def test_the_admission_layer_holds_an_elastic_job_without_a_reservation_until_its_size_is_available() -> None:
    lender = job("e", 2, low=1, high=4, placement={"n0": 3}, time_limit=10_000.0)
    elastic = job("p", 4, low=2, high=4, submit=5.0, time_limit=1000.0)
    rigid = job("q", 1, submit=6.0, time_limit=100_000.0)
    cluster = snapshot([4], [lender, elastic, rigid])
    # The plain daemon: Slurm starts p at its minimum and q beside it, out of the free GPU and e's two extras.
    assert sizes(AmoebadPolicy().decide(cluster, now=10.0)) == {"e": 1, "p": 2, "q": 1}
    # Held until 4 GPUs are free or lent: p holds no reservation, so q starts in the free GPU and e keeps its extras.
    held = AmoebadPolicy(admission=AdmissionLayer()).decide(cluster, now=10.0)
    assert sizes(held) == {"q": 1}
    check_actions(cluster, held)


def test_the_admission_layer_starts_at_the_requested_size_out_of_other_jobs_extras() -> None:
    linear = {size: float(size) for size in range(1, 5)}
    lender = job("e", 2, low=1, high=4, placement={"n0": 4}, throughput=linear, time_limit=10_000.0)
    elastic = job("p", 2, low=1, high=4, submit=5.0, throughput=linear, time_limit=1000.0)
    cluster = snapshot([4], [lender, elastic])
    assert sizes(AmoebadPolicy().decide(cluster, now=10.0)) == {"e": 3, "p": 1}
    decisions = AmoebadPolicy(admission=AdmissionLayer()).decide(cluster, now=10.0)
    assert sizes(decisions) == {"e": 2, "p": 2}
    check_actions(cluster, decisions)


def test_extras_above_the_request_go_back_before_those_below_it() -> None:
    linear = {size: float(size) for size in range(1, 9)}
    above = job("above", 2, low=1, high=4, placement={"n0": 3}, throughput=linear, attained_service=1.0)
    below = job("below", 4, low=2, high=4, placement={"n1": 3}, throughput=linear, attained_service=1.0)
    rigid = job("r", 1, submit=5.0, time_limit=100.0)
    cluster = snapshot([3, 3], [above, below, rigid])
    decisions = AmoebadPolicy().decide(cluster, now=10.0)
    assert sizes(decisions) == {"above": 2, "r": 1}


def test_compact_starts_take_extras_back_where_the_started_job_fits_on_one_node() -> None:
    spread = job("e", 2, low=2, high=8, placement={"n0": 3, "n1": 3}, time_limit=10_000.0)
    rigid = job("r", 4, submit=5.0, time_limit=100.0)
    cluster = snapshot([4, 4], [spread, rigid])
    decisions = {d.job_id: d for d in sized(AmoebadPolicy().decide(cluster, now=10.0))}
    assert len(decisions["r"].placement) == 1 and decisions["e"].workers == 3
    check_actions(cluster, list(decisions.values()))
    loose = {
        d.job_id: d for d in sized(AmoebadPolicy(elastic=ElasticLayer(compact_starts=False)).decide(cluster, 10.0))
    }
    assert len(loose["r"].placement) == 2


def test_compact_growth_does_not_spread_a_job_over_more_nodes_than_its_size_needs() -> None:
    linear = {size: float(size) for size in range(2, 5)}
    grower = job("j", 2, low=2, high=4, placement={"n0": 2}, throughput=linear, time_limit=10_000.0)
    other = job("x", 2, placement={"n0": 2}, time_limit=10_000.0)
    filler = job("y", 2, placement={"n1": 2}, time_limit=10_000.0)
    cluster = snapshot([4, 4], [grower, other, filler])
    assert AmoebadPolicy().decide(cluster, now=10.0) == []
    assert sizes(AmoebadPolicy(elastic=ElasticLayer(compact_growth=False)).decide(cluster, now=10.0)) == {"j": 4}
    # Room on its own node: it grows there only.
    roomy = snapshot([5, 4], [grower, other, filler])
    (decision,) = sized(AmoebadPolicy().decide(roomy, now=10.0))
    assert (decision.workers, decision.placement) == (3, {"n0": 3})


def test_restore_requests_regrows_a_job_behind_its_request_before_younger_jobs_grow() -> None:
    linear = {size: float(size) for size in range(1, 9)}
    # "old" was shrunk to 2 of its requested 4 for an hour (behind its request); "young" runs at its request.
    old = job("old", 4, low=2, high=8, placement={"n0": 2}, throughput=linear, attained_service=7200.0 * 2)
    old = dataclasses.replace(old, executed_time=7200.0)
    young = job("young", 2, low=1, high=8, placement={"n1": 2}, throughput=linear, attained_service=1200.0)
    young = dataclasses.replace(young, executed_time=600.0)
    cluster = snapshot([4, 4], [old, young])
    # By least attained service alone the young job takes every idle GPU, far above its request.
    assert sizes(AmoebadPolicy(elastic=ElasticLayer(restore_requests=False)).decide(cluster, now=10.0)) == {"young": 6}
    # Restored first: old back to its request on its own node, young grows into what is left.
    restore = AmoebadPolicy(elastic=ElasticLayer(restore_requests=True))
    assert sizes(restore.decide(cluster, now=10.0)) == {"old": 4, "young": 4}


def test_a_job_ahead_of_its_request_gives_back_before_one_behind_it() -> None:
    linear = {size: float(size) for size in range(1, 9)}
    # Both run at their request of 4; "late" held 6 on average so far (ahead), "early" exactly 4. By name and
    # speed gain alone "early" would go first.
    late = job("late", 4, low=2, high=8, placement={"n1": 4}, throughput=linear, attained_service=6 * 3600.0)
    early = job("early", 4, low=2, high=8, placement={"n0": 4}, throughput=linear, attained_service=4 * 3600.0)
    late, early = (dataclasses.replace(one, executed_time=3600.0, time_limit=100_000.0) for one in (late, early))
    arrival = job("p", 2, low=1, high=4, submit=5.0, time_limit=100.0)
    # Without compact starts (node choice first), the give-back order alone decides.
    admit = AmoebadPolicy(elastic=ElasticLayer(compact_starts=False), admission=AdmissionLayer())
    decisions = admit.decide(snapshot([4, 4], [early, late, arrival]), now=10.0)
    assert sizes(decisions) == {"late": 2, "p": 2}
    even = dataclasses.replace(late, attained_service=4 * 3600.0)
    assert sizes(admit.decide(snapshot([4, 4], [early, even, arrival]), now=10.0)) == {"early": 2, "p": 2}


def test_protect_requests_keeps_a_job_that_cannot_grow_at_its_request_for_an_admission() -> None:
    # "flat" gains nothing above 4 workers (as yolov3 here) and never grew: an admission may not take it below 4.
    flat = job("flat", 4, low=2, high=8, placement={"n0": 4}, throughput={2: 2.0, 3: 3.0, 4: 4.0, 5: 4.0, 6: 4.0})
    flat = dataclasses.replace(flat, attained_service=4 * 3600.0, executed_time=3600.0, time_limit=100_000.0)
    arrival = job("p", 2, low=1, high=4, submit=5.0, time_limit=1000.0)
    cluster = snapshot([4], [flat, arrival])
    assert sizes(AmoebadPolicy(admission=AdmissionLayer()).decide(cluster, now=10.0)) == {
        "flat": 2,
        "p": 2,
    }
    protect = AmoebadPolicy(admission=AdmissionLayer(protect_requests=True))
    assert protect.decide(cluster, now=10.0) == []
    # A job that scales past its request may still lend below it.
    linear = dataclasses.replace(flat, throughput={size: float(size) for size in range(1, 9)})
    assert sizes(protect.decide(snapshot([4], [linear, arrival]), now=10.0)) == {"flat": 2, "p": 2}


def test_submit_at_request_starts_elastic_jobs_at_their_request_and_lends_only_above_it() -> None:
    linear = {size: float(size) for size in range(1, 9)}
    pending = job("p", 4, low=2, high=8, submit=0.0, throughput=linear, time_limit=1000.0)
    submit = AmoebadPolicy(elastic=ElasticLayer(submitted_at="request"))
    # 3 GPUs free: the plain daemon starts p at its minimum and grows it; submitted at its request it waits.
    assert sizes(AmoebadPolicy().decide(snapshot([3], [pending]), now=10.0)) == {"p": 3}
    assert submit.decide(snapshot([3], [pending]), now=10.0) == []
    # Running at 6 of its requested 4: a rigid job may take the 2 loans, never the workers up to the request.
    running = job("e", 4, low=2, high=8, placement={"n0": 6}, throughput=linear, time_limit=10_000.0)
    small = job("r", 2, submit=5.0, time_limit=100.0)
    assert sizes(submit.decide(snapshot([6], [running, small]), now=10.0)) == {"e": 4, "r": 2}
    large = job("q", 3, submit=5.0, time_limit=100.0)
    assert submit.decide(snapshot([6], [running, large]), now=10.0) == []


def test_the_whole_node_layer_moves_an_elastic_jobs_workers_so_a_rigid_job_starts_on_one_node() -> None:
    linear = {size: float(size) for size in range(1, 5)}
    # Two nodes of 4 GPUs, 2 free on each: e runs at its request of 3 (2 on n0, 1 on n1), x holds 1 GPU of n1.
    elastic = job("e", 3, low=1, high=4, placement={"n0": 2, "n1": 1}, throughput=linear, time_limit=10_000.0)
    other = job("x", 1, placement={"n1": 1}, time_limit=10_000.0)
    rigid = job("r", 4, submit=5.0, time_limit=100.0)
    cluster = snapshot([4, 4], [elastic, other, rigid])
    admit = AmoebadPolicy(admission=AdmissionLayer())
    # Slurm may not take e below its request: without the rule r starts spread over both nodes (2 + 2).
    assert len({d.job_id: d for d in sized(admit.decide(cluster, now=10.0))}["r"].placement) == 2
    assert AmoebadPolicy().whole_node is None, "off by default, as the live daemon's"
    # With the whole-node layer e keeps its size and moves its 2 workers off n0, where r starts whole.
    whole = AmoebadPolicy(admission=AdmissionLayer(), whole_node=WholeNodeLayer())
    decisions = {d.job_id: d for d in sized(whole.decide(cluster, now=10.0))}
    assert decisions["r"].placement == {"n0": 4}
    assert (decisions["e"].workers, dict(decisions["e"].placement)) == (3, {"n1": 3})
    check_actions(cluster, list(decisions.values()))
    # A job larger than a node is spread as before (x gone: 5 GPUs free, 2 on n0 and 3 on n1).
    large = snapshot([4, 4], [elastic, job("r", 5, submit=5.0, time_limit=100.0)])
    spread = admit.decide(large, now=10.0)
    assert sizes(spread)["r"] == 5 and whole.decide(large, now=10.0) == spread


def test_compact_admissions_start_an_elastic_job_smaller_on_one_node_instead_of_spread() -> None:
    linear = {size: float(size) for size in range(2, 9)}
    # Two nodes of 4 GPUs: 3 free on n0, 1 on n1; p (requested 4, range 2..8) fits the cluster but no node whole.
    cluster = snapshot(
        [4, 4],
        [
            job("x", 1, placement={"n0": 1}, time_limit=10_000.0),
            job("y", 3, placement={"n1": 3}, time_limit=10_000.0),
            job("p", 4, low=2, high=8, submit=5.0, throughput=linear, time_limit=1000.0),
        ],
    )
    admit = AmoebadPolicy(admission=AdmissionLayer())
    (spread,) = sized(admit.decide(cluster, now=10.0))
    assert (spread.workers, len(spread.placement)) == (4, 2)
    (compact,) = sized(
        dataclasses.replace(admit, admission=AdmissionLayer(compact_admissions=True)).decide(cluster, now=10.0)
    )
    assert (compact.workers, dict(compact.placement)) == (3, {"n0": 3})
    # No node with room for its minimum (one GPU free on each of four nodes): spread at its request, as before.
    held = [job(f"x{i}", 3, placement={f"n{i}": 3}, time_limit=10_000.0) for i in range(4)]
    tight = snapshot([4, 4, 4, 4], [*held, cluster.jobs[2]])
    assert dataclasses.replace(admit, admission=AdmissionLayer(compact_admissions=True)).decide(
        tight, now=10.0
    ) == admit.decide(tight, 10.0)
    assert sizes(admit.decide(tight, now=10.0)) == {"p": 4}


def test_whole_node_moves_minimum_moves_an_elastic_job_at_its_minimum_so_a_rigid_job_starts_on_one_node() -> None:
    linear = {size: float(size) for size in range(1, 5)}
    # Two nodes of 4 GPUs, 2 free on each: e runs at its minimum (2 on n0, range 2..4), x holds 2 GPUs of n1.
    elastic = job("e", 2, low=2, high=4, placement={"n0": 2}, throughput=linear, time_limit=10_000.0)
    cluster = snapshot(
        [4, 4], [elastic, job("x", 2, placement={"n1": 2}, time_limit=10_000.0), job("r", 4, submit=5.0)]
    )
    # Without the rule the whole-node layer moves only workers above a job's minimum: none here, so r is spread 2 + 2.
    admit = AmoebadPolicy(admission=AdmissionLayer(), whole_node=WholeNodeLayer())
    assert admit.whole_node is not None and not admit.whole_node.moves_minimum, "a what-if: live, satellites move"
    assert len({d.job_id: d for d in sized(admit.decide(cluster, now=10.0))}["r"].placement) == 2
    # With the rule e moves whole to n1 (same size, one move) and r gets n0.
    moves = dataclasses.replace(admit, whole_node=WholeNodeLayer(moves_minimum=True))
    decisions = {d.job_id: d for d in sized(moves.decide(cluster, now=10.0))}
    assert decisions["r"].placement == {"n0": 4}
    assert (decisions["e"].workers, dict(decisions["e"].placement)) == (2, {"n1": 2})
    check_actions(cluster, list(decisions.values()))
    # A rigid job is never moved: with x on n0 instead of e, r is spread as before.
    rigid_only = snapshot([4, 4], [job("y", 2, placement={"n0": 2}), job("x", 2, placement={"n1": 2}), job("r", 4)])
    assert moves.decide(rigid_only, now=10.0) == admit.decide(rigid_only, now=10.0)


def test_spare_longer_jobs_starts_a_shorter_arrival_smaller_instead_of_taking_a_flat_job_below_its_request() -> None:
    # "flat" gains nothing above 4 workers and never grew; 2 GPUs are free; p asks for 4 and may run on 2.
    flat = job("flat", 4, low=2, high=8, placement={"n0": 4}, throughput={2: 2.0, 3: 3.0, 4: 4.0, 5: 4.0, 6: 4.0})
    flat = dataclasses.replace(flat, attained_service=4 * 3600.0, executed_time=3600.0, time_limit=100_000.0)
    arrival = job("p", 4, low=2, high=8, submit=5.0, time_limit=1000.0)
    admit = AmoebadPolicy(admission=AdmissionLayer(spare_tail_factor=0.0))
    spare = dataclasses.replace(admit, admission=AdmissionLayer(spare_tail_factor=0.0, spare_longer_jobs=True))
    cluster = snapshot([6], [flat, arrival])
    # Without the rule p starts at its request and flat goes down to 2; with it p starts at 2 beside flat.
    assert sizes(admit.decide(cluster, now=10.0)) == {"flat": 2, "p": 4}
    decisions = spare.decide(cluster, now=10.0)
    assert sizes(decisions) == {"p": 2}
    check_actions(cluster, list(decisions))
    # An arrival with more time than flat has left is admitted as without the rule.
    long = dataclasses.replace(arrival, time_limit=200_000.0)
    assert spare.decide(snapshot([6], [flat, long]), now=10.0) == admit.decide(snapshot([6], [flat, long]), 10.0)
    # So is one whose minimum does not fit beside flat (it would otherwise wait for hours).
    wide = dataclasses.replace(arrival, min_workers=3)
    assert sizes(spare.decide(snapshot([6], [flat, wide]), now=10.0)) == {"flat": 2, "p": 4}


def test_spare_tail_factor_starts_a_short_arrival_smaller_instead_of_taking_a_long_job_below_its_request() -> None:
    linear = {size: float(size) for size in range(1, 9)}
    # One node of 8 GPUs, none free: "long" (10^5 s left) and "short" (2,000 s left) run at their request of 4; the
    # arrival p asks for 4 (range 2..8, time limit 1,000 s). Both lenders gain alike from a worker.
    long = job("long", 4, low=2, high=8, placement={"n0": 4}, throughput=linear, time_limit=100_000.0)
    short = job("short", 4, low=2, high=8, placement={"n0": 4}, throughput=linear, time_limit=2_000.0)
    arrival = job("p", 4, low=2, high=8, submit=5.0, throughput=linear, time_limit=1_000.0)
    cluster = snapshot([8], [long, short, arrival])
    admit = AmoebadPolicy(admission=AdmissionLayer())
    assert admit.admission is not None and admit.admission.spare_tail_factor == 0.0, "a what-if: off, not live"
    # Without the rule p starts at its request and takes 2 workers from each.
    assert sizes(admit.decide(cluster, now=10.0)) == {"long": 2, "short": 2, "p": 4}
    # With it at 5, long (more than 5 x 1,000 s left) keeps its request; p starts at 2, from short alone.
    tail = dataclasses.replace(admit, admission=AdmissionLayer(spare_tail_factor=5.0))
    decisions = tail.decide(cluster, now=10.0)
    assert sizes(decisions) == {"short": 2, "p": 2}
    check_actions(cluster, list(decisions))
    # With a queue behind p above spare_tail_queue_share of the cluster (3 of 8 GPUs > 0.25), as without the rule.
    queued = snapshot([8], [long, short, arrival, job("q", 3, submit=6.0, time_limit=1_000.0)])
    assert sizes(tail.decide(queued, now=10.0)) == sizes(admit.decide(queued, now=10.0))
    # An arrival whose minimum does not fit beside long takes from both, as without the rule.
    wide = dataclasses.replace(arrival, min_workers=3)
    wide_cluster = snapshot([8], [long, short, wide])
    assert sizes(tail.decide(wide_cluster, now=10.0)) == {"long": 2, "short": 2, "p": 4}


def test_max_hold_s_releases_a_held_elastic_job_to_start_at_its_minimum_as_the_live_daemon_does() -> None:
    # 4 GPUs, a rigid job holds 2 until its limit; p (range 2..4) asks for 4, submitted at 0.
    cluster = snapshot([4], [job("r", 2, placement={"n0": 2}, time_limit=10_000.0), job("p", 4, low=2, high=4)])
    admit = AmoebadPolicy(admission=AdmissionLayer())
    # Without the bound p is held (its request is not free) at any age.
    assert admit.decide(cluster, now=7200.0) == []
    # With it, p held for an hour or more starts at its minimum as Slurm would; younger, it is still held.
    bound = dataclasses.replace(admit, admission=AdmissionLayer(max_hold_s=3600.0))
    assert sizes(bound.decide(cluster, now=7200.0)) == {"p": 2}
    assert bound.decide(cluster, now=1800.0) == []
    check_actions(cluster, list(bound.decide(cluster, now=7200.0)))


@pytest.mark.parametrize("seed", range(5))
def test_a_profile_built_from_releases_in_one_pass_is_the_one_adding_each_release_makes(seed: int) -> None:
    rng = random.Random(seed)
    now = 100.0
    releases = [(rng.choice((50.0, now, now + rng.choice((0.5, 10.0, 10.0, 300.0)), math.inf)), rng.randint(0, 8))]
    releases += [(now + rng.uniform(-20, 400), rng.randint(0, 8)) for _ in range(40)]
    releases += [(now + 10.0, 4), (now + 10.0, 2)]  # two at one time: one step
    one_by_one = Profile(now, 3)
    for at, gpus in releases:
        one_by_one.add(at, math.inf, gpus)
    built = Profile.with_releases(now, 3, releases)
    assert (built.times, built.free) == (one_by_one.times, one_by_one.free)


def _earliest_by_every_start(profile: Profile, need: int, duration: float, latest: float) -> float | None:
    """The definition: the first step start from which ``need`` GPUs stay free for ``duration`` (each start tried)."""
    for start, at in enumerate(profile.times):
        if at > latest:
            return None
        ends = [i for i in range(start, len(profile.times)) if profile.times[i] < at + duration]
        if all(profile.free[i] >= need for i in ends):
            return at
    return None


@pytest.mark.parametrize("seed", range(20))
def test_the_earliest_start_in_one_pass_is_the_one_trying_every_start(seed: int) -> None:
    rng = random.Random(seed)
    profile = Profile(0.0, rng.randint(0, 16))
    for _ in range(rng.randint(0, 60)):
        start = rng.uniform(0, 500)
        end = rng.choice((math.inf, start + rng.uniform(1, 200)))
        profile.add(start, end, rng.randint(-6, 6))
    for _ in range(40):
        need, duration = rng.randint(0, 16), rng.choice((1.0, 30.0, 120.0, 600.0))
        latest = rng.choice((math.inf, rng.uniform(0, 500)))
        assert profile.earliest(need, duration, latest) == _earliest_by_every_start(profile, need, duration, latest)
