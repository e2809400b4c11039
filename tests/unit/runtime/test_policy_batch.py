"""The policy's batch on its way into the workers: the coordinator's sealed ``batch`` key, rank 0's reader, the
three bytes on the gradient all-reduce, and the decision point where it replaces the runtime's own choice."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.utils.data import TensorDataset

from slurm_amoeba import runtime as amoeba
from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.core.messages import MAX_NOISE_SCALE
from slurm_amoeba.runtime.adaptive import REPORT_TIMES, AdaptiveBatch, PolicyBatchReader, report_times
from slurm_amoeba.runtime.auth import COORDINATOR, JobAuth, JobKey
from slurm_amoeba.runtime.coordinator import Coordinator, CoordinatorConfig
from slurm_amoeba.runtime.gns import NormProbe, ProbeReading
from slurm_amoeba.runtime.protocol import BATCH_KEY, MAX_POLICY_BATCH, PolicyBatch
from slurm_amoeba.runtime.state import TorchState
from tests.unit.runtime.test_adaptive import OneWorker


def test_policy_batch_round_trips_and_refuses_values_out_of_range() -> None:
    choice = PolicyBatch(batch=96, world_size=4, seq=3)
    assert PolicyBatch.from_json(choice.to_json()) == choice
    for text in (
        '{"batch": 0, "world_size": 4, "seq": 1}',
        f'{{"batch": {MAX_POLICY_BATCH + 1}, "world_size": 4, "seq": 1}}',
        '{"batch": true, "world_size": 4, "seq": 1}',
        '{"batch": 8.5, "world_size": 4, "seq": 1}',
        '{"batch": "8", "world_size": 4, "seq": 1}',
        '{"batch": 8, "world_size": 0, "seq": 1}',
        '{"batch": 8, "seq": 1}',
        "[8, 4, 1]",
        "not json",
    ):
        with pytest.raises(ParseError):
            PolicyBatch.from_json(text)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rank_0s_policy_batch_reaches_every_worker_exactly_in_any_gradient_dtype(dtype: torch.dtype) -> None:
    tail = 1 + NormProbe.SLOTS
    readings: list[ProbeReading] = []
    probes = [NormProbe(readings.append) for _ in range(3)]
    buckets = [torch.zeros(6 + tail, dtype=dtype) for _ in probes]
    for rank, (probe, bucket) in enumerate(zip(probes, buckets, strict=True)):
        probe.bind(bucket[-tail:-1])
        probe.prepare(1.0, step_time_s=0.5, want_pre=False, measure=False, policy_batch=1_234_567 if rank == 0 else 0)
        probe.before_launch(bucket, last=True, tail=tail)
    reduced = torch.stack(buckets).sum(dim=0)  # what the all-reduce (SUM) leaves in every worker's buffer
    for probe, bucket in zip(probes, buckets, strict=True):
        bucket.copy_(reduced)
        probe.after_reduce([bucket], tail)
    assert [r.policy_batch for r in readings] == [1_234_567] * 3
    assert {r.timed for r in readings} == {3}
    with pytest.raises(ValueError, match="three bytes"):
        probes[0].prepare(1.0, step_time_s=None, want_pre=False, policy_batch=1 << 24)


class FakeStore:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.reads = 0

    def check(self, keys: list[str]) -> bool:
        return all(k in self.values for k in keys)

    def get(self, key: str) -> bytes:
        self.reads += 1
        return self.values[key]

    def set(self, key: str, value: str | bytes) -> None:
        self.values[key] = value.encode() if isinstance(value, str) else value


class Driver:
    """What the reader asks of the worker runtime: values the coordinator sealed, opened with the job's key."""

    def __init__(self, store: Any, key: JobKey) -> None:
        self.store = store
        self.auth = JobAuth(key, "w0")

    def coordinator_value(self, key: str) -> str | None:
        return self.auth.read(self.store, key, sender=COORDINATOR)


def test_reader_takes_only_the_coordinators_sealed_batch_and_reads_at_most_once_a_second() -> None:
    key = JobKey.new()
    store = FakeStore()
    now = [100.0]
    reader = PolicyBatchReader(every_s=1.0, clock=lambda: now[0])
    assert reader(Driver(store, key)) is None, "no batch yet"
    JobAuth(key, COORDINATOR).put(store, BATCH_KEY, PolicyBatch(64, 2, 1).to_json())  # type: ignore[arg-type]
    assert reader(Driver(store, key)) is None, "read again only after every_s"
    now[0] += 1.0
    assert reader(Driver(store, key)) == PolicyBatch(64, 2, 1)
    JobAuth(key, "w0").put(store, BATCH_KEY, PolicyBatch(512, 2, 2).to_json())  # type: ignore[arg-type]
    now[0] += 1.0
    assert reader(Driver(store, key)) == PolicyBatch(64, 2, 1), "a worker's forgery is refused; the last value stays"
    JobAuth(JobKey.new(), COORDINATOR).put(store, BATCH_KEY, PolicyBatch(512, 2, 3).to_json())  # type: ignore[arg-type]
    now[0] += 1.0
    assert reader(Driver(store, key)) == PolicyBatch(64, 2, 1), "another job's secret is refused"
    assert PolicyBatchReader()(object()) is None, "a driver that reads no store (tests) has no policy batch"
    store.values[BATCH_KEY] = b"not sealed at all"
    now[0] += 1.0
    assert reader(Driver(store, key)) == PolicyBatch(64, 2, 1), "an unsealed value is refused; the last value stays"


def test_coordinator_publishes_the_policy_batch_sealed_for_its_workers() -> None:
    with Coordinator(CoordinatorConfig(job_id="policy-batch")) as coordinator:
        first = coordinator.set_policy_batch(96, world_size=4)
        second = coordinator.set_policy_batch(128, world_size=4)
        assert second.seq == first.seq + 1
        assert PolicyBatchReader(every_s=0.0)(Driver(coordinator.store, coordinator.job_key)) == PolicyBatch(
            128, 4, second.seq
        )
        with pytest.raises(ParseError):
            coordinator.set_policy_batch(0, world_size=4)


def _run(choice: PolicyBatch | None, *, choose: bool = True, steps: int = 12) -> tuple[list[int], AdaptiveBatch]:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(512, 4, generator=generator, dtype=torch.float64)
    dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = torch.nn.Linear(4, 1, dtype=torch.float64)
    sampler = amoeba.ElasticSampler(512, 8, seed=1, max_local_batch=8, max_global_batch=200, adapt_every=4)
    adaptive = AdaptiveBatch(measure_every=1, choose=choose)
    state = TorchState(model, torch.optim.SGD(model.parameters(), lr=0.01), sampler, adaptive=adaptive)
    adaptive.policy_source = lambda: choice
    loader = amoeba.ElasticDataLoader(dataset, sampler)
    state.bind(OneWorker(state))
    state.run_reset_callbacks()
    batches: list[int] = []
    while state.step_index < steps:
        for step in loader:
            for (xb, yb), weight in step:
                torch.autograd.backward(torch.nn.functional.mse_loss(model(xb), yb) * weight)
            batches.append(step.assignment.plan.step_samples)
            state.step()
            if state.step_index >= steps:
                break
    state.bind(None)
    return batches, adaptive


@pytest.mark.timeout(60)
def test_policy_batch_for_this_world_size_replaces_the_runtimes_choice_at_a_decision_point(
    single_process_group: None,
) -> None:
    batches, adaptive = _run(PolicyBatch(batch=48, world_size=1, seq=1))
    assert batches[:4] == [8] * 4, "the first iteration keeps the initial batch"
    assert set(batches[4:]) == {48}, "from the first decision point on, the policy's batch"
    assert adaptive.batch_source == "policy" and adaptive.report["policy_batch"] == 48
    assert adaptive.report["global_batch"] == 48
    clipped, _ = _run(PolicyBatch(batch=5000, world_size=1, seq=1))
    assert clipped[4] == max(clipped) == 200, "clipped to max_global_batch (an epoch's last step may be shorter)"
    other, adaptive = _run(PolicyBatch(batch=48, world_size=3, seq=1))
    assert adaptive.batch_source == "runtime" and adaptive.report["policy_batch"] is None
    assert 48 not in other, "a batch for another world size is ignored"
    _, adaptive = _run(PolicyBatch(batch=48, world_size=1, seq=1), choose=False)
    assert adaptive.report["global_batch"] == 8, "choose=False: the user owns the batch"
    assert adaptive.report["batch_source"] == "user" and adaptive.report["policy_batch"] is None


def test_report_keeps_the_most_measured_step_times_and_stays_bounded() -> None:
    times = {(w, b): (0.1 * w, w * b) for w in range(1, 9) for b in (8, 16, 32, 64, 128)}
    table = report_times(times)
    assert len(table) == REPORT_TIMES
    assert min(n for *_, n in table) >= sorted((n for _, n in times.values()), reverse=True)[REPORT_TIMES - 1]
    assert table == sorted(table)


def test_an_infinite_noise_scale_is_reported_as_the_largest_the_daemon_takes() -> None:
    model = torch.nn.Linear(2, 1)
    sampler = amoeba.ElasticSampler(64, 8, max_global_batch=32)
    state = TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), sampler)
    adaptive = state.adaptive
    assert adaptive is not None and adaptive.report["noise_scale"] is None, "nothing measured yet"
    adaptive.gns.load_state_dict({"noise": 1.0, "signal": -0.5, "weight": 1.0, "updates": 3})  # all noise
    adaptive.load_state_dict(adaptive.state_dict())  # refreshes the report
    assert adaptive.gns.scale == math.inf and adaptive.report["noise_scale"] == MAX_NOISE_SCALE
