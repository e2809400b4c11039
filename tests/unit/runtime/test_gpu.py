"""The GPU path: NCCL process groups and CUDA tensors (skips cleanly without a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.unit.runtime.conftest import ReferenceRun
from tests.unit.runtime.jobs import NEVER, ToyJob, final_params

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def assert_close_to_reference(out: Path, reference: ReferenceRun, workers: int) -> None:
    params = final_params(out)
    assert len(params) == workers
    for tensors in params.values():
        for name, tensor in reference.params.items():
            torch.testing.assert_close(tensors[name], tensor, rtol=1e-7, atol=1e-9, msg=name)


@pytest.mark.timeout(180)
def test_one_gpu_worker_trains_over_nccl_to_the_cpu_run_parameters(tmp_path: Path, fixed_run: ReferenceRun) -> None:
    with ToyJob(tmp_path, workers=1, hold=False, env={"AMOEBA_DEVICE": "cuda"}, cuda_devices=[0]) as toy:
        result = toy.finish()
    assert result.phase.value == "finished", toy.job.log_tail("w0")
    assert "device cuda:0" in (tmp_path / "logs" / "w0.log").read_text()
    assert_close_to_reference(tmp_path, fixed_run, workers=1)


@pytest.mark.timeout(180)
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_second_gpu_worker_warms_up_and_joins_over_nccl(tmp_path: Path, fixed_run: ReferenceRun) -> None:
    devices = list(range(torch.cuda.device_count()))
    with ToyJob(tmp_path, workers=1, hold=True, env={"AMOEBA_DEVICE": "cuda"}, cuda_devices=devices) as toy:
        toy.release(5)
        toy.wait_held(5)
        (joiner,) = toy.job.add(1)
        toy.wait_ready([joiner])
        toy.release(NEVER)
        toy.wait_members(2)
        result = toy.finish()
    assert result.phase.value == "finished"
    assert [r.plan.world_size for r in result.view.history] == [1, 2]
    assert_close_to_reference(tmp_path, fixed_run, workers=2)


@pytest.mark.timeout(240)
def test_the_tiny_lm_example_trains_one_fsdp2_worker_in_bf16_over_nccl(tmp_path: Path) -> None:
    """examples/tiny_lm.py as its docs run it, on the GPU: FSDP2 over a one-rank NCCL mesh, bf16 autocast."""
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "AMOEBA_DEVICE": "cuda", "PYTHONPATH": str(root)}
    command = [sys.executable, "-m", "slurm_amoeba.local.cli", "-n", "1", "--max-workers", "1"]
    command += ["--log-dir", str(tmp_path), "--", sys.executable, str(root / "examples" / "tiny_lm.py")]
    done = subprocess.run([*command, "--epochs", "4"], env=env, capture_output=True, text=True, timeout=220)
    log = (tmp_path / "w0.log").read_text()
    assert done.returncode == 0, done.stderr[-2000:] + log[-2000:]
    assert "worker w0: finished" in log and "device cuda:0" in log
    losses = [float(line.rsplit("~", 1)[1]) for line in log.splitlines() if line.startswith("step ")]
    assert len(losses) >= 4, log[-2000:]
    assert losses[-1] < losses[0] - 0.1, losses  # it learns the Markov chain: about 4.2 falling towards 3.x


def test_a_memory_cap_limits_the_caching_allocator_and_lifting_it_gives_the_device_back() -> None:
    """AntMan's memory mechanism on a GPU: a sharer's cap bounds what torch's caching allocator may hold in this
    process (an allocation beyond it fails here, not in the owner's process); a cap of 0 lifts the limit."""
    from slurm_amoeba import runtime as amoeba
    from slurm_amoeba.core.sharing import ShareRole
    from slurm_amoeba.runtime.share import ShareDirective
    from slurm_amoeba.runtime.shared_device import SharedDevice
    from tests.unit.runtime.test_share import PROFILE, Driver

    model = torch.nn.Linear(4, 1).cuda()
    sampler = amoeba.ElasticSampler(256, 32, seed=0)
    driver = Driver(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=64 << 20))
    state = amoeba.TorchState(
        model, torch.optim.SGD(model.parameters(), lr=0.1), sampler, sharing=SharedDevice(PROFILE, read_every_s=0.0)
    )
    state.bind(driver)  # type: ignore[arg-type]
    try:
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        driver.tell(ShareDirective(ShareRole.OPPORTUNISTIC, seq=1))
        state.after_step()
        assert torch.empty(256 << 20, dtype=torch.uint8, device="cuda").numel() == 256 << 20
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def test_a_gpu_workers_memory_peak_is_what_the_allocator_held_and_falls_after_a_lower_cap() -> None:
    """The peak a sharing worker reports on a GPU is torch's caching allocator's reserved peak over the last window
    (here a window of 0: every boundary reads), and a lowered cap, whose emptied cache returns the bytes, shows in
    the next reading."""
    from slurm_amoeba import runtime as amoeba
    from slurm_amoeba.core.sharing import ShareRole
    from slurm_amoeba.runtime.share import ShareDirective
    from slurm_amoeba.runtime.shared_device import SharedDevice
    from tests.unit.runtime.test_share import PROFILE, Driver

    model = torch.nn.Linear(4, 1).cuda()
    sampler = amoeba.ElasticSampler(256, 32, seed=0)
    driver = Driver()  # no directive yet: nothing empties the cache before the cap
    sharing = SharedDevice(PROFILE, read_every_s=0.0, memory_window_s=0.0)
    state = amoeba.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1), sampler, sharing=sharing)
    state.bind(driver)  # type: ignore[arg-type]
    try:
        block = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        del block  # freed, but still cached: the allocator holds it
        state.after_step()
        held = sharing.memory_peak_bytes
        assert held is not None and held >= 512 << 20
        assert state.progress_report()["share"]["memory_peak_bytes"] == held
        driver.tell(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=128 << 20, seq=1))
        state.after_step()  # read once more (the block is still cached), then the cap: the cache emptied
        assert sharing.memory_peak_bytes is not None and sharing.memory_peak_bytes >= 512 << 20
        state.after_step()
        assert sharing.memory_peak_bytes is not None and sharing.memory_peak_bytes < 128 << 20
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
