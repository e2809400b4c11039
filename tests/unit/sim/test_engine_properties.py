"""End-to-end properties of the engine with every policy on random small workloads (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_amoeba.policy import make_policy, policy_names
from slurm_amoeba.sim.engine import SimConfig, Simulator, trace_models
from slurm_amoeba.sim.workload import JobSpec


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[JobSpec], int, int]:
    nodes = draw(st.integers(1, 3))
    gpus = draw(st.integers(2, 4))
    jobs = []
    for index in range(draw(st.integers(1, 8))):
        requested = draw(st.integers(1, nodes * gpus))
        low = draw(st.integers(1, requested))
        high = draw(st.integers(requested, nodes * gpus))
        jobs.append(
            JobSpec(
                f"j{index}",
                draw(st.integers(0, 300)),
                requested,
                duration=draw(st.integers(1, 500)),
                min_workers=low,
                max_workers=high,
            )
        )
    return jobs, nodes, gpus


@pytest.mark.parametrize("name", policy_names())
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=workloads())
def test_every_job_finishes_no_faster_than_alone_at_its_largest_size(
    name: str, case: tuple[list[JobSpec], int, int]
) -> None:
    jobs, nodes, gpus = case
    config = SimConfig(nodes=nodes, gpus_per_node=gpus, resize_cost=1.0, grow_lag=0.0)
    result = Simulator(jobs, make_policy(name), config, trace_models({}, gpus)).run()
    assert all(used <= nodes * gpus for _, used in result.usage)
    specs = {job.name: job for job in jobs}
    for record in result.jobs:
        spec = specs[record.name]
        assert record.completion is not None
        fastest = config.restart_cost + spec.duration * spec.requested_workers / spec.max_workers
        assert record.completion - spec.submit_time >= fastest - 1e-6
