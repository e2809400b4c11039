"""The state transfer of a switch (runtime/transfer.py) between two processes: large parameter and optimizer-state
tensors go as they are, the model's buffers as a copy taken when the sends start, the joiner ends with exactly the
source's state, and what it received is its commit.
"""

from __future__ import annotations

import datetime
import multiprocessing
from pathlib import Path

import pytest
import torch
from torch._C._distributed_c10d import TCPStore

from slurm_amoeba.runtime import ElasticSampler, TorchState
from slurm_amoeba.runtime.auth import JobAuth, JobKey
from slurm_amoeba.runtime.group import GroupSettings, form_group, teardown_group
from slurm_amoeba.runtime.protocol import GenerationPlan
from slurm_amoeba.runtime.transfer import DIRECT_BYTES, _direct, sync_state

PLAN = GenerationPlan(
    generation=2, members=("src", "new"), hosts=("h", "h"), source="src", joiners=("new",), sync=True, start_step=1
)


def _state(seed: int) -> TorchState:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.BatchNorm1d(512), torch.nn.Linear(512, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return TorchState(model, optimizer, ElasticSampler(64, 16, seed=1))


def _running_mean(state: TorchState) -> torch.Tensor:
    buffer = state.model.get_buffer("1.running_mean")
    assert isinstance(buffer, torch.Tensor)
    return buffer


def _member(port: int, secret: str, worker: str, out: str) -> None:
    """One process: the source takes one step first (momentum), then both run the switch's transfer."""
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    settings = GroupSettings(worker, torch.device("cpu"), "gloo", 20.0, JobAuth(JobKey(bytes.fromhex(secret)), worker))
    state = _state(0 if worker == "src" else 1)
    if worker == "src":
        state.model(torch.randn(16, 64)).square().sum().backward()
        state.optimizer.step()
        state.sampler.advance()
        torch.save({k: v.clone() for k, v in state.as_tree()["model"].items()}, Path(out) / "sent-model.pt")
        momenta = [state.optimizer.state[p]["momentum_buffer"].clone() for p in state.model.parameters()]
        torch.save(momenta, Path(out) / "sent-momenta.pt")
    form_group(store, PLAN, settings)
    pending = sync_state(store, PLAN, settings, state)
    if pending is not None:
        # What a forward does while the sends are in flight: batch-norm statistics change (a copy was sent).
        _running_mean(state).add_(100.0)
        pending.wait()
    else:
        torch.save(dict(state.model.state_dict()), Path(out) / "got-model.pt")
        momenta = [state.optimizer.state[p]["momentum_buffer"] for p in state.model.parameters()]
        torch.save(momenta, Path(out) / "got-momenta.pt")
        (Path(out) / "got-step").write_text(str(state.step_index))
        # The received state is the joiner's commit, apart from its live state: a step, then a restore, gives it back.
        state.model(torch.randn(16, 64)).square().sum().backward()
        state.optimizer.step()
        state.restore()
        torch.save(dict(state.model.state_dict()), Path(out) / "restored-model.pt")
        momenta = [state.optimizer.state[p]["momentum_buffer"] for p in state.model.parameters()]
        torch.save(momenta, Path(out) / "restored-momenta.pt")
    teardown_group()


@pytest.mark.timeout(90)
def test_the_joiner_gets_the_sources_state_with_large_tensors_sent_as_they_are(tmp_path: Path) -> None:
    state = _state(0)
    state.model(torch.randn(16, 64)).square().sum().backward()
    state.optimizer.step()
    _manifest, tensors = state.encode()
    direct = _direct(tensors, state.unchanging_storage(), torch.device("cpu"))
    weights = {p.data_ptr() for p in state.model.parameters() if p.numel() * p.element_size() >= DIRECT_BYTES}
    momenta = {
        v.data_ptr() for s in state.optimizer.state.values() for v in s.values() if v.numel() * 4 >= DIRECT_BYTES
    }
    assert {tensors[i].data_ptr() for i in direct} == weights | momenta and len(weights) == len(momenta) == 1
    assert all(tensors[i].data_ptr() != _running_mean(state).data_ptr() for i in direct)

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
    secret = JobKey.new().hex()
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_member, args=(store.port, secret, w, str(tmp_path))) for w in PLAN.members]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
        assert proc.exitcode == 0
    sent = torch.load(tmp_path / "sent-model.pt")
    for got in ("got", "restored"):
        model = torch.load(tmp_path / f"{got}-model.pt")
        assert sent.keys() == model.keys()
        for name in sent:
            assert torch.equal(sent[name], model[name]), (got, name)
        pairs = zip(torch.load(tmp_path / "sent-momenta.pt"), torch.load(tmp_path / f"{got}-momenta.pt"), strict=True)
        assert all(torch.equal(a, b) for a, b in pairs), got
    assert (tmp_path / "got-step").read_text() == "1"
