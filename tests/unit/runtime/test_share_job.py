"""A live job told to share: an opportunistic worker whose new memory cap holds not even one sample leaves at a step
boundary through the runtime's graceful leave, and every sample is still applied exactly once (CPU, local mode);
the memory peak a worker measured reaches the coordinator's view in rank 0's progress report."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_amoeba.core.sharing import ShareRole
from slurm_amoeba.runtime.share import ShareDirective
from tests.unit.runtime.jobs import NEVER, ToyJob, applied_ledger, epoch_counts, read_ledgers


@pytest.mark.timeout(120)
def test_a_worker_that_cannot_fit_under_its_new_cap_leaves_and_the_job_keeps_every_sample_once(tmp_path: Path) -> None:
    pace = ["--step-delay", "0.05"]  # long enough a run for the directive to arrive (read at most every 0.1 s)
    with ToyJob(tmp_path, workers=2, hold=True, env={"AMOEBA_SHARE": "1"}, extra_args=pace) as toy:
        toy.wait_members(2)
        toy.release(5)
        toy.wait_held(5)
        # One byte: the worker measures one step (it was given no profile), then finds that nothing fits.
        toy.job.coordinator.set_share(ShareDirective(ShareRole.OPPORTUNISTIC, memory_cap_bytes=1, workers=("w1",)))
        toy.release(NEVER)
        result = toy.finish()
    assert result.phase.value == "finished"
    assert [sorted(record.plan.members) for record in result.view.history] == [["w0", "w1"], ["w0"]]
    assert "this worker leaves" in (tmp_path / "logs" / "w1.log").read_text()
    peak = result.view.progress["share"]["memory_peak_bytes"]
    assert isinstance(peak, int) and peak > 0, "rank 0 reports the peak of its measured step"
    counts = epoch_counts(applied_ledger(read_ledgers(tmp_path), result.view.history))
    assert sorted(counts) == list(range(5))
    for counter in counts.values():
        assert sorted(counter) == list(range(100)) and set(counter.values()) == {1}
