"""The ``slurm`` baseline inside the engine: backfill, reservations and GraceTime on timelines worked out by hand."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from slurm_amoeba.policy import make_policy
from slurm_amoeba.policy.slurm_baseline import SlurmPartition
from slurm_amoeba.sim.data import SimError
from slurm_amoeba.sim.engine import SimConfig, Simulator, estimated_time_limit, trace_models
from slurm_amoeba.sim.metrics import JobRecord
from slurm_amoeba.sim.workload import JobSpec


def _records(
    jobs: Sequence[JobSpec], config: SimConfig, policy: str = "slurm", **knobs: object
) -> dict[str, JobRecord]:
    result = Simulator(jobs, make_policy(policy, **knobs), config, trace_models({}, config.gpus_per_node)).run()
    return {record.name: record for record in result.jobs}


def test_a_short_job_backfills_and_a_long_one_waits_for_the_reserved_job() -> None:
    jobs = [
        JobSpec("A", 0, 2, duration=1000, time_limit=1000),
        JobSpec("B", 10, 4, duration=100, time_limit=200),  # top priority; reserved from A's limit (t=1000)
        JobSpec("C", 20, 2, duration=300, time_limit=300),  # ends at 360, before the reservation: backfills
        JobSpec("D", 20, 2, duration=100, time_limit=2000),  # would run into B's reservation: waits
    ]
    records = _records(jobs, SimConfig(nodes=1, gpus_per_node=4, restart_cost=0.0))
    assert {name: record.first_start for name, record in records.items()} == {
        "A": 0.0,
        "C": 60.0,
        "B": 1020.0,
        "D": 1140.0,
    }
    assert records["D"].completion == pytest.approx(1240.0)


def test_a_preempted_job_keeps_its_gpus_for_the_grace_time_then_the_preemptor_starts() -> None:
    partitions = (SlurmPartition("gpu", 2), SlurmPartition("elastic", 1, "requeue", 120.0))
    jobs = [
        JobSpec("low", 0, 4, duration=10_000, partition="elastic"),
        JobSpec("high", 30, 4, duration=100, partition="gpu"),
    ]
    config = SimConfig(nodes=1, gpus_per_node=4, restart_cost=0.0, grace_time=120.0)
    records = _records(jobs, config, partitions=partitions)
    # Signalled at the tick of t=60, low trains on until 180; high starts then and ends at 280; low resumes at the
    # next tick (300) with 180 s done.
    assert records["high"].first_start == pytest.approx(180.0)
    assert records["high"].completion == pytest.approx(280.0)
    assert records["low"].preemptions == 1
    assert records["low"].completion == pytest.approx(300.0 + 10_000 - 180)


def test_without_grace_time_the_preemptor_starts_at_once() -> None:
    partitions = (SlurmPartition("gpu", 2), SlurmPartition("elastic", 1, "requeue", 0.0))
    jobs = [
        JobSpec("low", 0, 4, duration=10_000, partition="elastic"),
        JobSpec("high", 30, 4, duration=100, partition="gpu"),
    ]
    records = _records(jobs, SimConfig(nodes=1, gpus_per_node=4, restart_cost=0.0), partitions=partitions)
    assert records["high"].first_start == pytest.approx(60.0)


def test_jobs_without_a_time_limit_get_the_modelled_user_estimate() -> None:
    assert estimated_time_limit(100.0, 2.0) == 240.0  # 200 s rounded up to whole minutes
    assert estimated_time_limit(1.0, 1.0) == 60.0
    # A's limit is known (600 s); C's is modelled. A perfect user (factor 1: 500 s -> 540 s) backfills C before
    # B's reservation at 600; a user who asks for twice the need (1020 s) does not, and C runs after B.
    jobs = [
        JobSpec("A", 0, 2, duration=600, time_limit=600),
        JobSpec("B", 10, 4, duration=60, time_limit=60),
        JobSpec("C", 20, 2, duration=500),
    ]
    exact = _records(jobs, SimConfig(nodes=1, gpus_per_node=4, restart_cost=0.0, time_limit_factor=1.0))
    assert (exact["C"].first_start, exact["B"].first_start) == (60.0, 600.0)
    loose = _records(jobs, SimConfig(nodes=1, gpus_per_node=4, restart_cost=0.0, time_limit_factor=2.0))
    assert (loose["B"].first_start, loose["C"].first_start) == (600.0, 660.0)


def test_a_time_limit_factor_below_one_is_refused() -> None:
    with pytest.raises(SimError, match="time_limit_factor=0.5 must be at least 1"):
        SimConfig(time_limit_factor=0.5)


def test_a_job_shrunk_below_its_request_for_an_admission_gets_it_back_before_a_younger_job_grows() -> None:
    config = SimConfig(nodes=2, gpus_per_node=4, restart_cost=0.0, resize_cost=0.0, grow_lag=0.0)
    jobs = [
        JobSpec("L", 0, 4, duration=20000, min_workers=2, max_workers=4, time_limit=60000),
        JobSpec("Y", 3000, 4, duration=40000, min_workers=2, max_workers=8, time_limit=90000),
        # Admitted at its request out of L's workers below L's request (the cluster is full).
        JobSpec("S", 5000, 2, duration=1200, min_workers=1, max_workers=2, time_limit=3000),
    ]
    restored = _records(jobs, config, "amoebad", admission=True, **{"elastic.restore_requests": True})
    left = _records(jobs, config, "amoebad", admission=True)
    assert restored["S"].first_start == left["S"].first_start == 5040.0
    # When S ends, Y has the least attained service and would take the 2 GPUs; L gets them back first instead.
    assert restored["L"].completion is not None and left["L"].completion is not None
    assert restored["L"].completion < 21000 < 25000 < left["L"].completion
