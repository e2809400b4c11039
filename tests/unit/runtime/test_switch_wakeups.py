"""What keeps polling off a switch's path: the coordinator's event pump, the workers' blocking waits, the abort's
wake-up of members waiting for each other, the optimizer warm-up of a joiner, and which joiners spend their first
step receiving the state (docs/runtime.md, section 2).

Each test checks behaviour (who wakes, in which order, what is left untouched), not speed: the speed is
``scripts/bench-runtime --pause-only``'s.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch._C._distributed_c10d import TCPStore

from slurm_amoeba.runtime.auth import COORDINATOR, JobAuth, JobKey
from slurm_amoeba.runtime.coordinator import EventPump
from slurm_amoeba.runtime.group import FormationFailed, GroupSettings, await_keys, not_arrived, wait_for_members
from slurm_amoeba.runtime.protocol import EVENTS_KEY, GenerationPlan, abort_key, arrival_key
from slurm_amoeba.runtime.sampler import ElasticSampler
from slurm_amoeba.runtime.state import TorchState
from slurm_amoeba.runtime.worker import _idle_joiners, _warm_optimizer, rehearse


@pytest.fixture
def store() -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


@pytest.mark.timeout(30)
def test_the_pump_hands_events_over_in_order_and_wakes_the_loop(store: TCPStore) -> None:
    wake = threading.Event()
    pump = EventPump("127.0.0.1", store.port, wake)
    try:
        client = TCPStore("127.0.0.1", store.port, is_master=False)
        for index in range(5):
            client.queue_push(EVENTS_KEY, f"event {index}".encode())
        assert wake.wait(10), "no wake-up after five events"
        taken: list[bytes] = []
        deadline = time.monotonic() + 10
        while len(taken) < 5 and time.monotonic() < deadline:
            taken += pump.take()
            time.sleep(0.01)
        assert taken == [f"event {index}".encode() for index in range(5)]
        # flush() returns once every event pushed before it is in hand, whatever the thread's timing
        client.queue_push(EVENTS_KEY, b"late")
        pump.flush(store)
        assert pump.take() == [b"late"]
    finally:
        pump.close(store)
    assert not any(t.name == "amoeba-coordinator-events" and t.is_alive() for t in threading.enumerate())


@pytest.mark.timeout(30)
def test_await_keys_returns_when_the_key_appears_and_at_the_deadline(store: TCPStore) -> None:
    timer = threading.Timer(0.2, lambda: TCPStore("127.0.0.1", store.port, is_master=False).set("k", "v"))
    timer.start()
    await_keys(store, ["k"], time.monotonic() + 20)
    assert store.check(["k"])
    timer.join()
    started = time.monotonic()
    await_keys(store, ["never"], started + 0.3)
    assert 0.2 < time.monotonic() - started < 10
    assert not store.check(["never"])


def _plan(members: tuple[str, ...]) -> GenerationPlan:
    return GenerationPlan(generation=3, members=members, hosts=("h",) * len(members), source=members[0])


@pytest.mark.timeout(60)
def test_an_abort_wakes_a_member_waiting_for_the_others_and_names_who_was_missing(store: TCPStore) -> None:
    key = JobKey.new()
    coordinator, member = JobAuth(key, COORDINATOR), JobAuth(key, "w0")
    plan = _plan(("w0", "w1"))
    settings = GroupSettings(worker_id="w0", device=torch.device("cpu"), backend="gloo", timeout_s=40.0, auth=member)
    token = coordinator.token(plan.generation)

    def abort() -> None:  # what the coordinator does when w1 dies: the abort, then its mark in w1's arrival key
        own = TCPStore("127.0.0.1", store.port, is_master=False)  # a connection of its own, as the coordinator's
        coordinator.put(own, abort_key(plan.generation, token), "member w1 is gone")
        coordinator.put(own, arrival_key(plan.generation, token, "w1"), "aborted")

    timer = threading.Timer(0.3, abort)
    timer.start()
    started = time.monotonic()
    with pytest.raises(FormationFailed, match="member w1 is gone") as failed:
        wait_for_members(store, plan, settings)
    assert time.monotonic() - started < 20, "the member waited for its deadline instead of the abort"
    assert failed.value.missing == ("w1",)  # the coordinator's mark is no arrival
    timer.join()
    keys = [arrival_key(plan.generation, token, m) for m in plan.members]
    assert not_arrived(store, keys, plan.members, member) == ("w1",)


def test_the_optimizer_warm_up_leaves_the_parameters_and_the_state_alone() -> None:
    model = torch.nn.Linear(8, 3)
    for optimizer in (
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1),
        torch.optim.AdamW(model.parameters(), lr=1e-3),
    ):
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)  # wraps optimizer.step
        before = [p.detach().clone() for p in model.parameters()]
        twin_state = _warm_optimizer(optimizer, "[test]")
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        assert not optimizer.state
        assert all(p.grad is None for p in model.parameters())
        assert scheduler.last_epoch == 0
        # The copy hands back its state after its step, of the real optimizer's future sizes (the warm-up's memory
        # is sized by it): momentum, or AdamW's moments, one per parameter.
        assert len(twin_state) == len(list(model.parameters()))
        for entry, param in zip(twin_state, model.parameters(), strict=True):
            tensors = [t for t in entry.values() if isinstance(t, torch.Tensor) and t.dim() > 0]
            assert tensors and all(t.shape == param.shape for t in tensors)


def test_an_optimizer_that_cannot_be_stepped_so_is_left_cold() -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.LBFGS(model.parameters())  # step() needs a closure
    assert _warm_optimizer(optimizer, "[test]") == []
    assert not optimizer.state


def test_a_rehearsal_puts_back_the_model_its_buffers_and_the_rng() -> None:
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4), torch.nn.Dropout(0.5))
    sampler = ElasticSampler(32, 8, seed=1)
    calls: list[int] = []

    def warm_up(net: torch.nn.Module) -> None:
        calls.append(1)
        net(torch.randn(8, 6)).sum().backward()  # moves the batch-norm statistics, draws dropout masks

    state = TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), sampler, warm_up=warm_up)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    rehearse(state, torch.device("cpu"))
    assert calls == [1]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.random.get_rng_state())
    assert any(p.grad is not None for p in model.parameters())  # the caller zeroes the flat buckets it keeps


def test_a_failing_rehearsal_is_the_users_error_and_still_puts_the_model_back() -> None:
    model = torch.nn.Linear(3, 1)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def warm_up(net: torch.nn.Module) -> None:
        with torch.no_grad():
            for param in net.parameters():
                param.add_(1.0)
        raise ValueError("shape mismatch in the user's warm-up")

    state = TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), ElasticSampler(8, 4), warm_up=warm_up)
    with pytest.raises(ValueError, match="user's warm-up"):
        rehearse(state, torch.device("cpu"))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_commit_copied_in_the_background_is_the_state_at_save_time() -> None:
    """The switch's auto-commit: buffers are copied before save() returns (a forward moves batch-norm statistics in
    place while the copy runs); parameters and optimizer state in the thread, which settle() waits for before the
    optimizer steps; a restore then puts back exactly what a foreground commit would have."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TorchState(model, optimizer, ElasticSampler(32, 8, seed=1))
    model(torch.randn(8, 6)).sum().backward()
    optimizer.step()  # momentum buffers exist
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    state.save(background=True)
    model.zero_grad()
    model(torch.randn(8, 6)).sum().backward()  # the next step's forward runs beside the copy
    state.settle()
    optimizer.step()
    assert not torch.equal(expected["1.running_mean"], model.state_dict()["1.running_mean"])
    state.restore()
    assert all(torch.equal(expected[k], v) for k, v in model.state_dict().items())
    assert all(
        torch.equal(m, optimizer.state[p]["momentum_buffer"]) for m, p in zip(momentum, model.parameters(), strict=True)
    )
    assert state.committed_step == 0


def test_joiners_idle_in_their_first_step_only_where_the_members_keep_an_old_pace() -> None:
    def state(**sampler: object) -> TorchState:
        model = torch.nn.Linear(2, 1)
        return TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), ElasticSampler(64, 12, **sampler))  # type: ignore[arg-type]

    members = ("w0", "w5", "w1", "w6")
    out = GenerationPlan(5, members, ("h",) * 4, source="w0", joiners=("w5", "w6"), sync=True, start_step=9)
    assert _idle_joiners(out, state()) == frozenset({1, 3})
    fresh = GenerationPlan(1, members, ("h",) * 4, source="w0", joiners=members[1:], sync=True)
    assert _idle_joiners(fresh, state()) == frozenset(), "a job's first generation has no old pace to keep"
    after_failure = GenerationPlan(5, members, ("h",) * 4, "w0", ("w5", "w6"), rollback=True, sync=True, start_step=9)
    assert _idle_joiners(after_failure, state()) == frozenset(), "not in a rollback generation"
    assert _idle_joiners(out, state(even=True)) == frozenset({1, 3})  # 12 over the 2 members
    six = ("w0", "w1", "w2", "w3", "w4", "w9")
    plan = GenerationPlan(5, six, ("h",) * 6, source="w0", joiners=("w9",), sync=True, start_step=9)
    assert _idle_joiners(plan, state()) == frozenset({5})
    assert _idle_joiners(plan, state(even=True)) == frozenset(), "12 samples cannot go evenly over the 5 members"
    sharded = state()
    sharded.joiners_may_idle = False  # type: ignore[misc]
    assert _idle_joiners(out, sharded) == frozenset()
