"""Warm start of a satellite's workers (agent/warm.py): what can be forked, how the devices are shared out, that every
worker runs exactly once, warm or cold, and that the satellite falls back to srun with its reason.

The forking tests fork this test process: each worker runs ``warm_target.py`` in-process and exits.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_amoeba.agent import entry, warm
from slurm_amoeba.agent.warm import (
    WarmStartRefused,
    WarmWorkers,
    collector_paused,
    exit_status,
    fork_plan,
    preload_modules,
    preload_parts,
    split_cpus,
    split_devices,
    warm_up,
)

TARGET = str(Path(__file__).with_name("warm_target.py"))
PY = sys.executable


@pytest.fixture(autouse=True)
def _unfreeze_after() -> Any:
    """A warm start freezes the process's objects before it forks (for good, in a satellite); the test session's
    are given back to its collector after each test."""
    yield
    gc.unfreeze()


def test_a_module_or_a_script_of_this_python_is_run_in_process() -> None:
    module = fork_plan([PY, "-m", "slurm_amoeba.launcher.fn_worker", "--x"])
    assert (module.module, module.script, module.argv) == ("slurm_amoeba.launcher.fn_worker", None, (
        "slurm_amoeba.launcher.fn_worker", "--x"))  # fmt: skip
    script = fork_plan([PY, "train.py", "--lr", "0.1"])
    assert (script.module, script.script, script.argv) == (None, "train.py", ("train.py", "--lr", "0.1"))


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (["/bin/true"], "is not `python -m MODULE`"),
        (["/bin/sh", "train.sh"], "not this satellite's Python"),
        ([PY, "-u", "train.py"], "interpreter option '-u'"),
        ([PY, "-m"], "names no module"),
        (["no-such-program-anywhere", "x.py"], "not this satellite's Python"),
    ],
)
def test_a_command_a_fork_cannot_run_is_refused_with_its_reason(command: list[str], reason: str) -> None:
    with pytest.raises(WarmStartRefused, match=reason):
        fork_plan(command)


def test_each_worker_gets_its_slice_of_the_devices_in_task_order_as_srun_gives_them() -> None:
    assert split_devices("0,1,2,3", 2, 2) == ["0,1", "2,3"]
    assert split_devices("4,5,6,7", 4, 1) == ["4", "5", "6", "7"]
    assert split_devices(None, 3, 0) == [None, None, None]
    with pytest.raises(WarmStartRefused, match="CUDA_VISIBLE_DEVICES='0,1'"):
        split_devices("0,1", 2, 2)
    assert split_cpus([3, 1, 0, 2], 2, 2) == [frozenset({0, 1}), frozenset({2, 3})]
    assert split_cpus([0, 1], 4, 1) is None


def test_the_preloaded_modules_are_torch_and_the_runtimes_worker_side_unless_the_job_names_others() -> None:
    assert preload_modules({})[0] == "torch" and "slurm_amoeba.runtime.worker" in preload_modules({})
    assert preload_modules({"AMOEBA_WARM_PRELOAD": " json, ,csv"}) == ("json", "csv")
    assert preload_modules({"AMOEBA_WARM_PRELOAD": ""}) == ()


def test_exit_status_is_the_code_or_128_plus_the_signal() -> None:
    assert exit_status(3 << 8) == 3
    assert exit_status(signal.SIGKILL) == 128 + signal.SIGKILL


def _workers(tmp_path: Path, tasks: int, *extra: str, gpus: int = 1) -> WarmWorkers:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "AMOEBA_PARENT_JOB": "7"}
    return WarmWorkers("g2", tasks, 1, gpus, tmp_path, [PY, TARGET, str(tmp_path), *extra], env)


def _records(tmp_path: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("g2-*.json")}


def test_forked_workers_run_the_command_once_each_with_their_task_devices_and_log(tmp_path: Path) -> None:
    workers = _workers(tmp_path, 3, gpus=2)
    workers.start(preload=["json"])
    assert workers.wait(timeout=30) == 2  # the highest exit status: task 2 exits with 2
    records = _records(tmp_path)
    assert sorted(records) == ["g2-0", "g2-1", "g2-2"]
    assert [records[f"g2-{i}"]["devices"] for i in range(3)] == ["0,1", "2,3", "4,5"]
    assert {r["ppid"] for r in records.values()} == {os.getpid()}  # forked from this process, not started anew
    assert all(r["name"] == "__main__" and r["argv"] == [TARGET, str(tmp_path)] for r in records.values())
    assert (tmp_path / "worker-g2-1.log").read_text() == "worker g2-1 running\n"


def test_a_forked_worker_collects_garbage_but_never_walks_the_objects_the_warm_process_imported(
    tmp_path: Path,
) -> None:
    before = gc.get_freeze_count()
    workers = _workers(tmp_path, 2)
    workers.start(preload=["json"])
    assert workers.wait(timeout=30) == 1
    records = _records(tmp_path).values()
    assert all(r["gc_enabled"] for r in records)
    assert all(r["frozen"] > before for r in records)  # the warm process's objects, frozen before the fork
    assert gc.isenabled()


def test_the_collector_is_off_while_the_warm_process_imports_and_as_it_was_after() -> None:
    sys.modules.pop("tests.unit.agent.gc_probe", None)
    plan = fork_plan([PY, TARGET])
    with collector_paused():
        seconds = warm_up(plan, ["tests.unit.agent.gc_probe", "json"], "[7/satellite g2]")
    from tests.unit.agent import gc_probe

    assert gc_probe.COLLECTOR_ON_AT_IMPORT is False and gc.isenabled()
    assert list(seconds) == ["tests.unit.agent.gc_probe", "json"] and all(s >= 0 for s in seconds.values())
    gc.disable()
    try:
        with pytest.raises(KeyError), collector_paused():
            raise KeyError("x")
        assert not gc.isenabled()  # a collector that was off stays off
    finally:
        gc.enable()


def test_the_warm_up_times_each_preloaded_module_and_the_commands_own_warm_up() -> None:
    plan = fork_plan([PY, "-m", "slurm_amoeba.launcher.fn_worker"])
    seconds = warm_up(plan, ["json"], "[7/satellite g2]")
    assert list(seconds) == ["json", "slurm_amoeba.launcher.fn_worker"]
    assert preload_parts({"torch": 1.234, "json": 0.001, "torch._dynamo": 0.5}) == "torch 1.23 s, torch._dynamo 0.50 s"
    assert preload_parts({"json": 0.0}) == "nothing to import"


def test_a_forked_worker_runs_none_of_the_exit_handlers_its_parent_registered(tmp_path: Path) -> None:
    """A worker exits as a started Python does: only handlers it registered itself run (the test session's own,
    such as the one that stops its Slurm cluster, must not run once per forked worker)."""
    mark = tmp_path / "parent-handler-ran"
    atexit.register(mark.touch)
    try:
        workers = _workers(tmp_path, 2)
        workers.start(preload=["json"])
        assert workers.wait(timeout=30) == 1
    finally:
        atexit.unregister(mark.touch)
    assert sorted(_records(tmp_path)) == ["g2-0", "g2-1"] and not mark.exists()


def test_a_signal_reaches_every_forked_worker(tmp_path: Path) -> None:
    workers = _workers(tmp_path, 2, "wait")
    workers.start(preload=[])
    deadline = time.monotonic() + 20
    while len(list(tmp_path.glob("*.ready"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert workers.poll() is None
    workers.send_signal(signal.SIGTERM)
    assert workers.wait(timeout=20) == 0
    assert all(r["told"] == [signal.SIGTERM] for r in _records(tmp_path).values())


def test_a_failed_fork_lets_no_worker_run_so_the_cold_start_runs_each_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fork = os.fork
    forks: list[int] = []

    def second_fork_fails() -> int:
        forks.append(1)
        if len(forks) == 2:
            raise OSError(11, "Resource temporarily unavailable")
        return real_fork()

    monkeypatch.setattr(os, "fork", second_fork_fails)
    workers = _workers(tmp_path, 3)
    with pytest.raises(WarmStartRefused, match="fork failed after 1 worker"):
        workers.start(preload=[])
    assert _records(tmp_path) == {} and not list(tmp_path.glob("worker-*.log"))


def test_a_running_thread_refuses_the_fork(tmp_path: Path) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="poller")
    thread.start()
    try:
        with pytest.raises(WarmStartRefused, match="poller"):
            _workers(tmp_path, 1).start(preload=[])
    finally:
        stop.set()
        thread.join()
    assert _records(tmp_path) == {}


class _Step:
    """What start_step returned, for the cold path's tests."""


def _satellite_args(tmp_path: Path, command: list[str]) -> argparse.Namespace:
    return argparse.Namespace(
        group="g2", ntasks=2, cpus_per_task=1, gpus_per_task=0, log_dir=str(tmp_path), command=command
    )


@pytest.mark.parametrize(
    ("environ", "command", "reason"),
    [
        ({"AMOEBA_WARM_START": "0"}, [PY, TARGET], "AMOEBA_WARM_START=0"),
        ({}, ["/bin/sh", "train.sh"], "not this satellite's Python"),
    ],
)
def test_the_satellite_starts_its_workers_cold_with_the_reason_logged(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    environ: dict[str, str],
    command: list[str],
    reason: str,
) -> None:
    started: list[list[str]] = []
    step = _Step()

    def start_step(options: object, argv: list[str], env: object) -> _Step:
        started.append(list(argv))
        return step

    monkeypatch.setattr(entry, "start_step", start_step)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    with caplog.at_level(logging.WARNING):
        result: object = entry.start_workers(_satellite_args(tmp_path, command), "[7/satellite g2]")
    assert result is step
    assert started == [entry.worker_entry("g2", command)]
    assert "starting the workers cold, as an srun step: " in caplog.text and reason in caplog.text


def test_the_satellite_forks_its_workers_warm_when_it_can(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entry, "start_step", lambda *a, **k: pytest.fail("started cold"))
    monkeypatch.setenv("AMOEBA_WARM_PRELOAD", "")
    workers = entry.start_workers(_satellite_args(tmp_path, [PY, TARGET, str(tmp_path)]), "[7/satellite g2]")
    assert isinstance(workers, warm.WarmWorkers)
    assert workers.wait(timeout=30) == 1
    assert sorted(_records(tmp_path)) == ["g2-0", "g2-1"]


def test_the_executors_warm_up_imports_the_submitted_functions_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from submitit.core import utils

    from slurm_amoeba.launcher import fn_worker
    from tests.unit.launcher import worker_fns

    paths = utils.JobPaths(tmp_path, job_id="7", task_id=0)
    paths.folder.mkdir(parents=True, exist_ok=True)
    utils.DelayedSubmission(worker_fns.shout, "hi").dump(paths.submitted_pickle)
    monkeypatch.setenv("AMOEBA_JOB_FOLDER", str(tmp_path))
    monkeypatch.setenv("AMOEBA_PARENT_JOB", "7")
    monkeypatch.delitem(sys.modules, worker_fns.__name__)
    fn_worker.warm_up()
    assert worker_fns.__name__ in sys.modules and not (tmp_path / "7_0_result.pkl").exists()


def test_the_runtimes_worker_side_imports_no_dcp_so_a_worker_does_not_pay_for_it_at_its_start() -> None:
    code = "import sys, slurm_amoeba.runtime.worker; print('torch.distributed.checkpoint' in sys.modules)"
    found = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert found.stdout.strip() == "False"
