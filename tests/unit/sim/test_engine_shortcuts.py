"""The engine's shortcuts for long queues change no decision.

A policy that admits in its own order (:class:`AdmitsInOrder`) is shown only the part of the queue that can matter,
and one that demotes by attained service (:class:`DemotesByService`) is asked only at events and threshold
crossings. Each is checked against the same policy wrapped so that the engine cannot see either property (every
pending job shown, a call at every tick): the per-job outcomes must be identical.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import pytest

from slurm_amoeba.policy import Action, Policy, Snapshot, make_policy
from slurm_amoeba.policy.layer import PolicyLayer
from slurm_amoeba.policy.types import AdmitsInOrder, DemotesByService
from slurm_amoeba.sim.engine import SimConfig, Simulator, estimated_time_limit, trace_models
from slurm_amoeba.sim.workload import JobSpec


@dataclasses.dataclass(frozen=True)
class Opaque(PolicyLayer):
    """A policy with the same answers whose shortcuts the engine cannot see (a layer that adds nothing)."""

    def decide(self, snapshot: Snapshot, now: float) -> Sequence[Action]:
        return self.inner.decide(snapshot, now)


def _overloaded(seed: int, count: int) -> list[JobSpec]:
    """Rigid jobs of 1-16 GPUs, mostly short, some long, arriving faster than 32 GPUs serve them."""
    rng = random.Random(seed)
    jobs = []
    for index in range(count):
        duration = rng.choice((60.0, 300.0, 900.0)) if rng.random() < 0.8 else rng.uniform(3600, 20000)
        gpus = rng.choice((1, 1, 1, 2, 4, 8, 16))
        jobs.append(JobSpec(f"j{index}", index * rng.uniform(0, 120), gpus, duration=duration))
    return jobs


def _outcomes(jobs: Sequence[JobSpec], policy: Policy) -> list[tuple[str, float | None, float | None, int]]:
    config = SimConfig(nodes=8, gpus_per_node=4)
    result = Simulator(jobs, policy, config, trace_models({}, 4)).run()
    return [(record.name, record.first_start, record.completion, record.preemptions) for record in result.jobs]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("name", ["tiresias", "srtf"])
def test_the_shortcuts_give_the_same_outcome_as_asking_with_everything(name: str, seed: int) -> None:
    # A threshold of 1 GPU-hour demotes many jobs within the run, so crossings matter.
    policy = make_policy(name, threshold_gpu_s=3600.0) if name == "tiresias" else make_policy(name)
    assert isinstance(policy, AdmitsInOrder)
    assert isinstance(policy, DemotesByService) == (name == "tiresias")
    jobs = _overloaded(seed, 400)
    fast, slow = _outcomes(jobs, policy), _outcomes(jobs, Opaque(policy))
    assert fast == slow
    assert sum(preempted for *_, preempted in fast) > 0  # the scenario does exercise preemption


def test_tiresias_is_asked_far_less_often_on_a_quiet_cluster() -> None:
    jobs = [JobSpec("long", 0, 4, duration=50_000.0), JobSpec("late", 40_000, 1, duration=100.0)]
    policy = make_policy("tiresias", threshold_gpu_s=3600.0)
    config = SimConfig(nodes=1, gpus_per_node=4)
    fast = Simulator(jobs, policy, config, trace_models({}, 4)).run()
    slow = Simulator(jobs, Opaque(policy), config, trace_models({}, 4)).run()
    assert [r.completion for r in fast.jobs] == [r.completion for r in slow.jobs]
    assert fast.decisions < 10 < 800 < slow.decisions


def test_an_elastic_jobs_estimated_limit_covers_a_run_at_its_minimum() -> None:
    rigid = JobSpec("r", 0, 4, duration=1000.0)
    elastic = JobSpec("e", 0, 4, duration=1000.0, min_workers=2, max_workers=8)
    config = SimConfig(nodes=2, gpus_per_node=4, restart_cost=0.0)
    sim = Simulator([rigid, elastic], make_policy("amoebad"), config, trace_models({}, 4))
    limits = {name: job.time_limit for name, job in sim._jobs.items()}  # what every snapshot of the job carries
    assert limits["r"] == estimated_time_limit(1000.0, 2.0)
    assert limits["e"] == estimated_time_limit(2000.0, 2.0)  # linear scaling: twice as long at half size
