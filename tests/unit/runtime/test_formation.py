"""No wait without a deadline, no retry without progress: forming generations, aborting them, evicting no-shows,
loader processes that exit with their parent, and what ``run()`` leaves behind (issue 12, F1-F3 and the traps).
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, TCPStore

from slurm_amoeba.runtime import Phase, WorkerStatus
from slurm_amoeba.runtime.group import teardown_group
from slurm_amoeba.runtime.protocol import AssignAction, EventKind
from tests.unit.runtime.conftest import ReferenceRun
from tests.unit.runtime.jobs import DEADLINE_S, NEVER, ToyJob, applied_ledger, epoch_counts, final_params, read_ledgers
from tests.unit.runtime.test_membership import SimJob

HERE = Path(__file__).parent
REPO = HERE.parents[2]


# ----------------------------------------------------------------------------------------------- F1: group counter


def _form_after_a_failed_formation(port: int, rank: int, fail_first: bool) -> None:
    """Child process: optionally fail one formation (nobody comes), then form a group of 2 with a fresh process."""
    store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    if fail_first:
        try:
            dist.init_process_group(
                "gloo", store=PrefixStore("first", store), rank=0, world_size=2, timeout=datetime.timedelta(seconds=1)
            )
        except RuntimeError:
            pass
        else:
            sys.exit(5)
        teardown_group()
        store.set("failed", "1")
    else:
        store.wait(["failed"])
    dist.init_process_group(
        "gloo", store=PrefixStore("second", store), rank=rank, world_size=2, timeout=datetime.timedelta(seconds=8)
    )
    total = torch.ones(1)
    dist.all_reduce(total)
    teardown_group()
    sys.exit(0 if total.item() == 2 else 6)


@pytest.mark.timeout(60)
def test_a_process_whose_formation_failed_forms_the_next_group_with_a_fresh_one() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))
    context = multiprocessing.get_context("spawn")
    survivor = context.Process(target=_form_after_a_failed_formation, args=(store.port, 0, True))
    joiner = context.Process(target=_form_after_a_failed_formation, args=(store.port, 1, False))
    survivor.start()
    joiner.start()
    survivor.join(40)
    joiner.join(40)
    for process in (survivor, joiner):
        if process.is_alive():
            process.kill()
    # Before the fix both waited for different store keys (group "1" vs "0") until the deadline.
    assert (survivor.exitcode, joiner.exitcode) == (0, 0)


# ----------------------------------------------------------------------------------------------- F3 + F1 in a job


@pytest.mark.timeout(200)
def test_joiner_killed_at_admission_releases_the_survivors_at_once_and_the_next_joiner_gets_in(
    tmp_path: Path, fixed_run: ReferenceRun
) -> None:
    out = tmp_path / "job"
    with ToyJob(out, workers=2, hold=True, extra_args=["--step-delay", "0.01"]) as toy:
        job = toy.job
        toy.release(4)
        toy.wait_held(4)
        (doomed,) = job.add(1, command=[sys.executable, str(HERE / "fake_joiner.py"), "die"])
        toy.wait_ready([doomed])
        started = time.monotonic()
        toy.release(8)
        view = job.wait_for(
            lambda v: v.phase is Phase.RUNNING and v.generation >= 3, DEADLINE_S, "a generation without the dead joiner"
        )
        recovered_s = time.monotonic() - started
        assert view.world_size == 2
        toy.wait_held(8)
        (joiner,) = job.add(1)
        toy.wait_ready([joiner])
        toy.release(NEVER)
        toy.wait_members(3)
        result = toy.finish()
    # The collective timeout is 20 s; the coordinator knew of the death within a fraction of a second.
    assert recovered_s < 5, f"the survivors stalled {recovered_s:.1f} s after the joiner died"
    assert result.phase is Phase.FINISHED
    assert result.returncodes[doomed] == -9
    plans = [r.plan for r in result.view.history]
    assert [p.world_size for p in plans] == [2, 3, 2, 3]
    assert plans[2].rollback and doomed not in plans[2].members
    counts = epoch_counts(applied_ledger(read_ledgers(out), result.view.history))
    assert all(set(c.values()) == {1} and len(c) == 100 for c in counts.values())
    for params in final_params(out).values():
        for name, tensor in fixed_run.params.items():
            torch.testing.assert_close(params[name], tensor, rtol=1e-9, atol=1e-11)


@pytest.mark.timeout(200)
def test_joiner_that_never_shows_up_to_form_is_evicted_after_three_failed_formations(
    tmp_path: Path, fixed_run: ReferenceRun
) -> None:
    out = tmp_path / "job"
    with ToyJob(out, workers=2, hold=True, collective_timeout_s=2) as toy:
        job = toy.job
        toy.release(4)
        toy.wait_held(4)
        (stuck,) = job.add(1, command=[sys.executable, str(HERE / "fake_joiner.py"), "no-show"])
        toy.wait_ready([stuck])
        toy.release(NEVER)
        result = toy.finish()
    assert result.phase is Phase.FINISHED
    assert result.view.workers[stuck].status is WorkerStatus.DEAD
    assert "evicted: did not show up to form 3 generations in a row" in result.view.workers[stuck].reason
    plans = [r.plan for r in result.view.history]
    assert [p.world_size for p in plans] == [2, 3, 3, 3, 2], "three tries with the no-show, then without it"
    counts = epoch_counts(applied_ledger(read_ledgers(out), result.view.history))
    assert all(set(c.values()) == {1} and len(c) == 100 for c in counts.values())
    for params in final_params(out).values():
        for name, tensor in fixed_run.params.items():
            torch.testing.assert_close(params[name], tensor, rtol=1e-9, atol=1e-11)


# ----------------------------------------------------------------------------------------------- coordinator side


def test_member_death_while_a_generation_forms_aborts_it_once() -> None:
    job = SimJob(initial=2)
    job.apply_assignments()
    job.train(5)
    joiner = job.add()
    job.tick()
    job.boundary()
    job.tick()
    assert job.plan.members == ("w0", "w1", joiner) and job.aborted == []
    job.m.mark_dead(joiner, "signal 9")
    job.tick()
    job.tick()
    assert job.aborted == [2]


def test_failed_report_aborts_the_generation_for_the_members_still_forming() -> None:
    job = SimJob(initial=2)
    job.apply_assignments()
    job.event("w0", EventKind.REPORT, generation=1, step=0, committed_step=0, failed=True, missing=("w1",))
    job.tick()
    assert job.aborted == [1]


def _fail_formation(job: SimJob, no_show: str) -> None:
    """Every member reports that the current generation did not form; the others name ``no_show`` as missing."""
    generation = job.m.generation
    for member in job.plan.members:
        missing = () if member == no_show else (no_show,)
        job.event(
            member, EventKind.REPORT, generation=generation, step=0, committed_step=0, failed=True, missing=missing
        )
    job.tick()


def test_worker_missing_from_three_failed_formations_in_a_row_is_evicted() -> None:
    job = SimJob(initial=3)
    job.apply_assignments()
    for attempt in range(1, 4):
        assert "w2" in job.plan.members, f"w2 must still be tried in attempt {attempt}"
        _fail_formation(job, "w2")
    assert job.plan.members == ("w0", "w1")
    info = job.m.workers["w2"]
    assert info.status is WorkerStatus.DEAD and "evicted" in info.reason
    assert job.workers["w2"].inbox[-1].action is AssignAction.LEAVE


def test_a_generation_that_forms_resets_the_no_show_count() -> None:
    job = SimJob(initial=3)
    job.apply_assignments()
    _fail_formation(job, "w2")
    _fail_formation(job, "w2")
    job.apply_assignments()
    job.boundary()  # this one formed and ended normally
    job.tick()
    assert job.m.generation == 4
    _fail_formation(job, "w2")
    _fail_formation(job, "w2")
    assert "w2" in job.plan.members and job.m.workers["w2"].status is WorkerStatus.MEMBER


# ----------------------------------------------------------------------------------------------- F2: loader processes


def _start_loader_script(mode: str) -> tuple[subprocess.Popen[str], list[int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, str(HERE / "loader_exit.py"), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    pids = [int(p) for p in line.split()]
    assert len(pids) == 2, f"expected two loader processes, got {line!r}"
    return process, pids


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in _state(p)]
        if not alive:
            return True
        time.sleep(0.05)
    return False


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


@pytest.mark.timeout(60)
def test_loader_processes_let_the_process_exit_when_an_exception_escapes() -> None:
    process, pids = _start_loader_script("raise")
    try:
        code = process.wait(timeout=20)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert code == 1
    assert _gone_within(pids, 5)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("signum", "whole_group"),
    [(signal.SIGTERM, True), (signal.SIGKILL, False)],
    ids=["sigterm-to-the-step", "sigkill-to-the-parent"],
)
def test_loader_processes_exit_with_a_parent_killed_by_a_signal(signum: int, whole_group: bool) -> None:
    process, pids = _start_loader_script("wait")
    try:
        if whole_group:  # as Slurm signals every process of a step
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        process.wait(timeout=20)
        # torch's own watchdog would notice the dead parent only after up to 5 s
        assert _gone_within(pids, 2), f"loader processes {pids} outlived their parent"
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# ----------------------------------------------------------------------------------------------- what run() leaves


def test_end_of_run_table_is_written_to_stderr_when_logging_is_not_configured() -> None:
    code = (
        "from slurm_amoeba.runtime.worker import _announce\n"
        "from slurm_amoeba.runtime.result import GenerationTiming, RunStatus, generation_table\n"
        "t = GenerationTiming(3, 1, 2, 40, 0.004, 0.002, '1 joined')\n"
        "_announce(generation_table('[j/w1]', RunStatus.LEFT, (t,)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, cwd=REPO
    )
    assert "[j/w1] run left after 1 generation(s) as a member:" in done.stderr
    assert "   3    1     2         40    0.004    0.002  1 joined" in done.stderr
