"""bench-grow's split of the runtime's part of a grow (benchmarks/grow.py), read from the satellites' and the
agent's logs as they write them."""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
from pathlib import Path

import pytest

from benchmarks.grow import log_time, runtime_parts, start_modes
from slurm_amoeba.agent.warm import WarmWorkers

TARGET = str(Path(__file__).parents[1] / "agent" / "warm_target.py")


def _stamp(epoch: float) -> str:
    """``epoch`` as logging's asctime writes it (local time, the milliseconds cut, after a comma)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) + f",{int(epoch % 1 * 1000):03d}"


def _forked(epoch: float, group: str, preload: float, torch: float) -> str:
    return (
        f"{_stamp(epoch)} INFO [7/satellite {group}] warm start: 1 worker(s) forked (preloading {preload:.2f} s, "
        f"forking 0.010 s; preloaded torch {torch:.2f} s, torch._dynamo 0.50 s; 295876 objects frozen)\n"
    )


def _asked(epoch: float, generation: int) -> str:
    return (
        f"{_stamp(epoch)} INFO slurm_amoeba.runtime.coordinator [job7/coordinator] asking generation {generation} to "
        "end at its next step boundary\n"
    )


def test_a_log_lines_time_is_read_back_to_the_millisecond() -> None:
    epoch = 1_795_903_828.44
    assert log_time(_stamp(epoch)) == pytest.approx(epoch, abs=0.001)


def test_the_runtimes_part_is_split_at_the_last_fork_and_the_coordinators_ask(tmp_path: Path) -> None:
    t0 = 1_795_903_820.0  # the last satellite ran at t0; its workers forked 1.5 s later, the other's at 1.2 s
    (tmp_path / "satellite-g3.log").write_text(_forked(t0 + 1.2, "g3", 1.1, 0.6))
    (tmp_path / "satellite-g4.log").write_text("an earlier line\n" + _forked(t0 + 1.5, "g4", 1.4, 0.7))
    (tmp_path / "satellite-g1.log").write_text(_forked(t0 - 30, "g1", 9.0, 9.0))  # another round's satellite
    agent = tmp_path / "agent.log"
    # An ask of an earlier round, the one this round's joiners caused at +1.9 s, and a later shrink's.
    agent.write_text(_asked(t0 - 20, 2) + _asked(t0 + 1.9, 3) + _asked(t0 + 9, 4))
    parts = runtime_parts(tmp_path, agent, ["g3", "g4"], started=t0, formed=t0 + 2.1)
    assert parts["warm_s"] == pytest.approx(1.5, abs=0.002)
    assert parts["ready_s"] == pytest.approx(0.4, abs=0.002)
    assert parts["join_s"] == pytest.approx(0.2, abs=0.002)
    assert (parts["preload_s"], parts["preload_torch_s"]) == (1.4, 0.7)


def test_a_last_satellite_whose_joiner_is_ready_by_the_step_boundary_another_asked_for_has_no_ready_part(
    tmp_path: Path,
) -> None:
    t0 = 1_795_903_820.0  # g3's joiner was ready at +1.3 s and the coordinator asked; g4's forked at +1.4 s
    (tmp_path / "satellite-g3.log").write_text(_forked(t0 + 1.2, "g3", 1.1, 0.6))
    (tmp_path / "satellite-g4.log").write_text(_forked(t0 + 1.4, "g4", 1.3, 0.7))
    agent = tmp_path / "agent.log"
    agent.write_text(_asked(t0 + 1.3, 3))
    parts = runtime_parts(tmp_path, agent, ["g3", "g4"], started=t0, formed=t0 + 1.6)
    assert parts["ready_s"] == 0.0 and parts["join_s"] == pytest.approx(0.2, abs=0.002)
    assert parts["warm_s"] + parts["ready_s"] + parts["join_s"] == pytest.approx(1.6, abs=0.002)


def test_a_cold_start_counts_the_workers_start_from_the_satellites(tmp_path: Path) -> None:
    t0 = 1_795_903_820.0
    agent = tmp_path / "agent.log"
    agent.write_text(_asked(t0 + 4.0, 3))
    parts = runtime_parts(tmp_path, agent, ["g3"], started=t0, formed=t0 + 4.25)
    assert parts["warm_s"] == 0.0 and parts["preload_s"] == 0.0
    assert parts["ready_s"] == pytest.approx(4.0, abs=0.002) and parts["join_s"] == pytest.approx(0.25, abs=0.002)


def test_the_bench_reads_the_preloading_a_warm_satellite_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The satellite's log line, as :mod:`slurm_amoeba.agent.warm` writes it in the satellite's format (agent/entry.py's
    ``basicConfig``: asctime, level, message), read back."""
    env = {**os.environ, "AMOEBA_PARENT_JOB": "7"}
    workers = WarmWorkers("g2", 1, 1, 0, tmp_path, [sys.executable, TARGET, str(tmp_path)], env)
    started = time.time()
    try:
        with caplog.at_level(logging.INFO, logger="slurm_amoeba.agent.warm"):
            workers.start(preload=["json"])
    finally:
        gc.unfreeze()  # the warm start froze this test process's objects before it forked
    assert workers.wait(timeout=30) == 0
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    (tmp_path / "satellite-g2.log").write_text("".join(formatter.format(r) + "\n" for r in caplog.records))
    modes, walls, cpus = start_modes(tmp_path)
    assert modes == {"warm": 1, "cold": 0} and len(walls) == 1 and len(cpus) == 1 and 0 <= cpus[0] <= 30
    parts = runtime_parts(tmp_path, tmp_path / "no-agent.log", ["g2"], started=started, formed=time.time())
    assert 0 <= parts["warm_s"] < 30 and parts["preload_s"] == walls[0]
