"""Bad input gets a clear error naming the value, and leaves the training state untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from slurm_amoeba.core import SpecError
from slurm_amoeba.core.runtime_env import WorkerEnv
from slurm_amoeba.runtime import (
    Coordinator,
    CoordinatorConfig,
    ElasticSampler,
    RuntimeConfigError,
    StateError,
    TorchState,
    WorkerStatus,
)
from tests.unit.runtime.conftest import ReferenceRun
from tests.unit.runtime.jobs import NEVER, ToyJob, applied_ledger, epoch_counts, final_params, read_ledgers, toy_command


def small_state(extras: dict[str, object] | None = None) -> TorchState:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return TorchState(model, optimizer, ElasticSampler(10, 2), extras=extras)


def test_extra_that_cannot_be_sent_is_refused_and_the_old_value_kept() -> None:
    state = small_state({"best": 1.5})
    with pytest.raises(StateError, match=r"state extra 'best' holds a object"):
        state.extras["best"] = object()
    assert state.extras["best"] == 1.5
    with pytest.raises(StateError, match=r"state extra 'loader'\[0\] holds a set"):
        small_state({"loader": [{1, 2}]})


def test_commit_of_state_that_cannot_be_sent_fails_and_keeps_the_last_commit() -> None:
    state = small_state()
    state.save()
    param = next(state.model.parameters())
    weight_before = param.detach().clone()
    state.optimizer.state[param]["note"] = object()
    with torch.no_grad():
        param.add_(1.0)
    with pytest.raises(StateError, match=r"state\['optimizer'\]\['state'\]\[0\]\['note'\] holds a object"):
        state.commit()
    assert state.committed_step == 0
    del state.optimizer.state[param]["note"]
    state.restore()
    torch.testing.assert_close(param.detach(), weight_before)


def test_joiner_model_with_other_shapes_is_named_in_the_refusal() -> None:
    running = small_state()
    manifest, _ = running.encode()
    torch.manual_seed(0)
    other_model = torch.nn.Linear(4, 2)
    joiner = TorchState(other_model, torch.optim.SGD(other_model.parameters(), lr=0.1), ElasticSampler(10, 2))
    problem = joiner.check_compatible(json.loads(json.dumps(manifest)))
    assert problem is not None
    assert "model entry 'weight' has shape [2, 4]" in problem and "[2, 3]" in problem


def test_worker_environment_without_the_store_names_the_missing_variables() -> None:
    with pytest.raises(SpecError, match=r"AMOEBA_STORE_ADDR, AMOEBA_STORE_PORT"):
        WorkerEnv.from_environ({"AMOEBA_JOB_ID": "j", "AMOEBA_WORKER_ID": "w0"})
    with pytest.raises(SpecError, match=r"AMOEBA_COLLECTIVE_TIMEOUT_S='-1'"):
        WorkerEnv.from_environ(
            {
                "AMOEBA_JOB_ID": "j",
                "AMOEBA_WORKER_ID": "w0",
                "AMOEBA_STORE_ADDR": "node1",
                "AMOEBA_STORE_PORT": "29400",
                "AMOEBA_COLLECTIVE_TIMEOUT_S": "-1",
            }
        )


def test_worker_environment_round_trips_through_the_contract() -> None:
    env = WorkerEnv(job_id="job-7", worker_id="w3", store_addr="node12", store_port=29411, max_local_batch=16)
    assert WorkerEnv.from_environ(env.to_environ()) == env


@pytest.mark.timeout(30)
def test_leave_request_for_an_unknown_worker_names_it_and_the_live_ones() -> None:
    with Coordinator(CoordinatorConfig(job_id="bad", initial_workers=1)) as coordinator:
        with pytest.raises(RuntimeConfigError, match=r"worker 'w9' is not a live worker of this job"):
            coordinator.request_leave("w9")
        assert coordinator.worker_env("w0")["AMOEBA_STORE_PORT"] == str(coordinator.port)


@pytest.mark.timeout(120)
def test_joiner_whose_model_shapes_differ_is_refused_and_training_goes_on_untouched(
    tmp_path: Path, fixed_run: ReferenceRun
) -> None:
    out = tmp_path / "job"
    with ToyJob(out, workers=2, hold=True) as toy:
        toy.release(5)
        toy.wait_held(5)
        (joiner,) = toy.job.add(1, command=toy_command(out, ["--hidden", "17"], hold=True))
        toy.wait_ready([joiner])
        toy.release(NEVER)
        result = toy.finish()
    assert result.phase.value == "finished"
    bad = result.view.workers[joiner]
    assert bad.status is WorkerStatus.FAILED
    assert "model entry '0.weight' has shape [17, 8]" in bad.reason and "[16, 8]" in bad.reason
    assert result.returncodes[joiner] != 0
    plans = [r.plan for r in result.view.history]
    assert [p.world_size for p in plans] == [2, 3, 2]
    assert not plans[2].rollback and plans[2].start_step == plans[1].start_step
    counts = epoch_counts(applied_ledger(read_ledgers(out), result.view.history))
    assert all(set(c.values()) == {1} and len(c) == 100 for c in counts.values())
    for params in final_params(out).values():
        for name, tensor in fixed_run.params.items():
            torch.testing.assert_close(params[name], tensor, rtol=1e-9, atol=1e-11)
