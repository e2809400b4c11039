"""``scripts/bench-runtime``: the elastic runtime against plain DDP, stop-resume and torchrun, side by side.

On one small model and data set (:mod:`benchmarks.runtime_worker`: an MLP of 1.06 M parameters, global batch
64, gloo on CPU) it measures, in one run:

* ``overhead_ratio``: step time of the runtime at 2 workers over that of a plain ``DistributedDataParallel`` loop
  at 2 workers, minus 1 (0.01 = 1 % slower). Both run in the same two processes in alternating blocks of 10 steps
  (the DDP loop on a copy of the model, same process group, data and batch), and the ratio is the median over
  neighbouring block pairs, so that the load of a shared machine cancels out.
* ``scale_out_pause_s``: 1 -> 2 workers, one joiner warms up in the background; the pause seen by the current
  worker = end of its last step in the old generation to end of its first step in the new one.
* ``stop_resume_pause_s``: the same 1 -> 2 by stop-resume: SIGTERM, checkpoint to disk, exit, relaunch 2 DDP
  processes at once, restore; end of the last old step to end of the first new step.
* ``torchrun_restart_pause_s``: the same 1 -> 2 by torchrun's elastic restart (``--nnodes=1:2``, c10d rendezvous,
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` because the default shared store deadlocks on scale-out in torch 2.13,
  ``last_call_timeout=1``): a second agent starts; same gap, measured on the first agent's workers.
* ``scale_in_pause_s``: 2 -> 1 by SIGTERM to one worker (graceful leave); the survivor's gap.
* ``failure_recovery_s``: 2 -> 1 by SIGKILL of one worker; from the kill to the end of the survivor's first step
  in the new generation (it rolled back to its last commit).
* ``restart_pause`` (with the worker pause): the same repeated 1 -> 2 -> 1 resizes by the restart path for unmodified
  torchrun scripts (``amoeba-run --restart``), measured the same way, printed beside the stop-free path's with the
  ratio of the medians.

* ``worker_pause`` (``--pause-only`` alone): repeated 1 -> 2 -> 1 resizes of one job; per switch, the first
  worker's gap between its step ends around the switch minus its median ordinary step at the new world size (and
  over the first three new steps); for a scale-out also minus each step's own ordinary pace (``*_own_pace``: the
  joiners' idle first step counted as a step of the members alone, which on this machine is shorter than a step
  of the new size); and where the time went (the worker's ``switch_marks``: report, assignment, old group,
  meeting, group, manifest, check, broadcast, load, auto-commit, first step).
* ``comparison`` (``--baseline DIR [--rounds N]``): the same worker pause for the workers of another tree (a copy
  holding ``slurm_amoeba/`` and ``benchmarks/``, e.g. the code before a change) and for this checkout, in
  alternating rounds with the load average beside each round: on a shared machine only an interleaved
  comparison says whether a change helped.
* ``overhead`` (``--overhead-only``): only the steady-state overhead above, with the 95 % bootstrap interval of
  its median, its quartiles over block pairs and the load average.

Pauses are medians over ``--reps`` repetitions. ``--quick`` uses fewer steps and one repetition.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from benchmarks.runtime_worker import WARM_UP_VARIABLE, read_steps
from slurm_amoeba.launcher.restart import restart_command
from slurm_amoeba.local.job import LocalJob
from slurm_amoeba.runtime.view import CoordinatorView

WORKER = [sys.executable, "-m", "benchmarks.runtime_worker"]
DEADLINE_S = 120.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def _spawn(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen[bytes], grace_s: float = 0.0) -> None:
    if process.poll() is None and grace_s:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def _kill_stray_workers(out: Path) -> None:
    """Kill benchmark workers that outlived their launcher (torchrun starts its workers in sessions of their own).

    Only processes that wrote step files under ``out`` are considered, and only while they still run the
    benchmark worker.
    """
    for path in out.glob("steps-*-*.jsonl"):
        pid_text = path.stem.rsplit("-", 1)[1]
        if not pid_text.isdigit():
            continue
        pid = int(pid_text)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"benchmarks.runtime_worker" in cmdline and str(out).encode() in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench-runtime: waited {timeout_s:.0f} s for {what}")
        time.sleep(0.05)


def _records(out: Path, pattern: str) -> list[list[float]]:
    records: list[list[float]] = []
    for path in sorted(out.glob(pattern)):
        records.extend(read_steps(path))
    return sorted(records)


def _median_step(records: list[list[float]], skip: int = 20) -> float:
    times = [r[0] for r in records]
    gaps = [b - a for a, b in itertools.pairwise(times)][skip:]
    if not gaps:
        raise RuntimeError("bench-runtime: too few steps were recorded to time a step")
    return statistics.median(gaps)


def _stall(records: list[list[float]], old_world: int, new_world: int) -> float:
    """End of the last old-world step to the end of the first new-world step after it."""
    first_new = next(i for i, r in enumerate(records) if int(r[2]) == new_world and i > 0)
    last_old = max(r[0] for r in records[:first_new] if int(r[2]) == old_world)
    return records[first_new][0] - last_old


# --------------------------------------------------------------------------------------------------- steady state


def _amoeba_job(out: Path, workers: int, extra: list[str], tree: Path | None = None) -> LocalJob:
    """A local runtime job of benchmark workers; ``tree``: run the workers from that directory (a baseline copy
    holding ``slurm_amoeba/`` and ``benchmarks/``) instead of this checkout."""
    command = [*WORKER, "--mode", "amoeba", "--out", str(out), *extra]
    return LocalJob(
        command,
        initial_workers=workers,
        job_id="bench",
        log_dir=out / "logs",
        collective_timeout_s=30,
        poll_s=0.02,
        cwd=tree,
    )


def interleaved_step_times(out: Path, steps: int, block: int) -> dict[str, list[float]]:
    """Step times of the runtime and of a plain DDP loop, in alternating blocks in the same 2 processes.

    The job trains ``block`` steps through the runtime, then ``block`` steps of a plain ``DistributedDataParallel``
    loop on a copy of the model (same process group, data and batch), and so on; comparing neighbouring blocks
    cancels the drift of a shared machine's load. The first block of each kind is warm-up and dropped.

    Returns:
        ``{"amoeba": [...], "ddp": [...], "amoeba_cpu": [...], "ddp_cpu": [...]}``: the median step time of each
        block, in order, and the median CPU time of the first worker's process per step (all its threads).
    """
    with _amoeba_job(out, 2, ["--steps", str(steps), "--compare-ddp", str(block)]) as job:
        result = job.wait(DEADLINE_S)
    if result.phase.value != "finished":
        raise RuntimeError(f"bench-runtime: the runtime job ended {result.phase.value}; see {out}")
    amoeba_records = _records(out, "steps-amoeba-w0.jsonl")
    ddp_records = _records(out, "steps-ddpblock-w0.jsonl")
    times: dict[str, list[float]] = {}
    for column, suffix in ((0, ""), (4, "_cpu")):
        amoeba, ddp = _block_medians(amoeba_records, ddp_records, block, column)
        times["amoeba" + suffix], times["ddp" + suffix] = amoeba, ddp
    count = min(len(times["amoeba"]), len(times["ddp"]))
    if count == 0:
        raise RuntimeError(f"bench-runtime: too few blocks to compare step times; see {out}")
    return {key: values[:count] for key, values in times.items()}


def _block_medians(
    amoeba_records: list[list[float]], ddp_records: list[list[float]], block: int, column: int
) -> tuple[list[float], list[float]]:
    """Per block of the runtime's steps and of the DDP loop's, the median step of the records' ``column`` (0: wall
    time, 4: the process's CPU time); the first block of each kind (warm-up) dropped."""
    amoeba_blocks: list[list[float]] = [[]]
    for before, after in itertools.pairwise(amoeba_records):
        if after[1] < 0:  # the end of a DDP block: that gap is the DDP block, not a runtime step
            amoeba_blocks.append([])
        else:
            amoeba_blocks[-1].append(after[column] - before[column])
    ddp_blocks: dict[float, list[float]] = {}
    for before, after in itertools.pairwise(ddp_records):
        if after[1] == before[1]:
            ddp_blocks.setdefault(after[1], []).append(after[column] - before[column])
    amoeba = [statistics.median(b) for b in amoeba_blocks if len(b) >= block // 2][1:]
    ddp = [statistics.median(b) for _, b in sorted(ddp_blocks.items())][1:]
    return amoeba, ddp


# --------------------------------------------------------------------------------------------------- events


def _progress_step(view: CoordinatorView) -> int:
    return int(view.progress.get("step", -1)) if view.progress else -1


def amoeba_event(out: Path, event: str) -> dict[str, float]:
    """One resize of a running runtime job: ``join`` (1 -> 2), ``leave`` (2 -> 1, SIGTERM) or ``kill`` (2 -> 1)."""
    workers = 1 if event == "join" else 2
    job = _amoeba_job(out, workers, ["--flush", "--commit-every", "20"])
    with job:
        job.wait_for(lambda v: v.world_size == workers and _progress_step(v) >= 40, DEADLINE_S, "training to run")
        before = job.view()
        assert before.plan is not None
        survivor = before.plan.members[0]
        killed_at = 0.0
        if event == "join":
            job.add(1)
            target = 2
        elif event == "leave":
            job.terminate(before.plan.members[1])
            target = 1
        else:
            killed_at = time.time()
            job.kill(before.plan.members[1])
            target = 1
        view = job.wait_for(lambda v: v.generation > before.generation and v.world_size == target, DEADLINE_S, "resize")
        switched = view.generation
        job.wait_for(
            lambda v: v.generation == switched and _progress_step(v) >= _progress_step(view) + 30, DEADLINE_S, "steps"
        )
        job.coordinator.store.set("bench/stop_at", str(_progress_step(job.view()) + 40))
        job.wait(DEADLINE_S)
    records = _records(out, f"steps-amoeba-{survivor}.jsonl")
    old_generation = before.generation
    first_new = next(r for r in records if int(r[3]) > old_generation)
    last_old = max(r[0] for r in records if int(r[3]) == old_generation and r[0] < first_new[0])
    result = {"stall_s": first_new[0] - last_old, "step_s": _median_step(records)}
    if event == "kill":
        result["recovery_s"] = first_new[0] - killed_at
    return result


#: The pause is also counted over the first few steps after a switch: a wait moved from the first new step into
#: the next (a joiner that steps late) shows there.
OVER_STEPS = 3


def switch_pauses(
    records: list[list[float]], by_size: dict[int, float], steps: int, *, own_pace: bool = False
) -> dict[str, list[float]]:
    """Per switch, what the worker lost over the first ``steps`` steps of the new generation: the time from its
    last old step end to its ``steps``-th new step end, minus ``steps`` ordinary steps of the new size, or with
    ``own_pace`` minus each step's own ordinary pace: a step in which joiners took no samples (a scale-out's first
    step, split among the members as before the switch) counts as an ordinary step of the ranks that took samples.

    Against the new size alone a scale-out's idle first step counts as a step of the new size: on this 2-core
    machine a 1-worker step is shorter than a 2-worker one (a 2-worker step is mostly its all-reduce), so that
    figure is lower than the switch's own cost by the difference; on GPUs, where a bigger world takes shorter
    steps, it is the other way round. The benchmark reports both.

    Args:
        records: the worker's step ends, ``[time, step, world size, generation, CPU time, ranks with samples]``, in
            order (the last two may be missing: records of an older tree; every rank then counts as working).
        by_size: the median ordinary step per world size (:func:`steps_by_size`).
        steps: how many new steps to count; a switch followed by fewer steps of its generation is left out.
        own_pace: subtract each step's ordinary pace instead of the new size's.
    """
    pauses: dict[str, list[float]] = {"out": [], "in": []}
    for index in range(1, len(records)):
        before, first = records[index - 1], records[index]
        if first[3] == before[3]:
            continue
        last = index + steps - 1
        if last >= len(records) or any(r[3] != first[3] for r in records[index : last + 1]):
            continue
        kind = "out" if first[2] > before[2] else "in"
        window = records[index : last + 1]
        sizes = [_working(r) if own_pace else int(first[2]) for r in window]
        if any(size not in by_size for size in sizes):
            continue
        pauses[kind].append(records[last][0] - before[0] - sum(by_size[size] for size in sizes))
    return pauses


def _working(record: list[float]) -> int:
    """The ranks that took samples in a recorded step (the world size in a record without that field)."""
    return int(record[5] if len(record) > 5 else record[2])


def steps_by_size(records: list[list[float]]) -> dict[int, float]:
    """The median ordinary step per world size: gaps between consecutive step ends of one generation (a switch's
    gap spans two generations and is left out)."""
    gaps: dict[int, list[float]] = {}
    for before, after in itertools.pairwise(records):
        if after[3] == before[3]:
            gaps.setdefault(int(after[2]), []).append(after[0] - before[0])
    return {size: statistics.median(values) for size, values in sorted(gaps.items())}


def _spread(values: list[float]) -> dict[str, float]:
    """Median, quartiles and range of a sample (the figures a noisy shared machine must be read with); only
    ``n`` (0) for an empty one (e.g. no switch was followed by three steps of its generation)."""
    ordered = sorted(values)
    if not ordered:
        return {"n": 0.0}
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else ordered * 3
    return {
        "median": statistics.median(ordered),
        "q1": quartiles[0],
        "q3": quartiles[2],
        "min": ordered[0],
        "max": ordered[-1],
        "n": float(len(ordered)),
    }


def _resized(generation: int, size: int) -> Callable[[CoordinatorView], bool]:
    return lambda v: v.generation > generation and v.world_size == size


def _stepped(since: CoordinatorView, steps: int) -> Callable[[CoordinatorView], bool]:
    """``steps`` steps into ``since``'s generation, counted from the step it started at: the progress in ``since``
    itself may still be the last report of the old generation (then the next resize came after only a few steps,
    inside the first three steps that a switch's pause is counted over)."""
    start = since.plan.start_step if since.plan is not None else None
    first = _progress_step(since) if start is None else start
    return lambda v: v.generation == since.generation and _progress_step(v) >= first + steps


def repeated_resizes(out: Path, cycles: int, tree: Path | None = None) -> dict[str, Any]:
    """``cycles`` scale-outs (1 -> 2, a joiner warmed up in the background) and scale-ins (2 -> 1, SIGTERM) of one
    job; what its first worker, a member throughout, loses at each switch.

    A switch's pause is the gap between the worker's own step ends around it (last step of the old generation to
    first step of the new one) minus the median step time: the time lost beyond one ordinary step. The worker's
    timeline gives the split: ``group_s`` (meeting the other members and forming the process group) and
    ``state_s`` (state transfer to the joiner, the auto-commit).
    """
    job = _amoeba_job(out, 1, ["--flush", "--commit-every", "20", "--steps", "1000000"], tree)
    with job:
        job.wait_for(lambda v: v.world_size == 1 and _progress_step(v) >= 30, DEADLINE_S, "training to run")
        view = job.view()
        assert view.plan is not None
        keeper = view.plan.members[0]
        for _ in range(cycles):
            for target in (2, 1):
                before = job.view()
                if target == 2:
                    job.add(1)
                else:
                    assert before.plan is not None
                    job.terminate(before.plan.members[-1])
                after = job.wait_for(_resized(before.generation, target), DEADLINE_S, f"{target} workers")
                job.wait_for(_stepped(after, 30), DEADLINE_S, "steps after the switch")
        job.coordinator.store.set("bench/stop_at", str(_progress_step(job.view()) + 20))
        job.wait(DEADLINE_S)
    records = [r for r in _records(out, f"steps-amoeba-{keeper}.jsonl") if r[1] >= 0]
    step_s = _median_step(records, skip=5)
    by_size = steps_by_size(records)
    pauses = switch_pauses(records, by_size, 1)
    over = switch_pauses(records, by_size, OVER_STEPS)
    own = switch_pauses(records, by_size, 1, own_pace=True)
    own_over = switch_pauses(records, by_size, OVER_STEPS, own_pace=True)
    timeline = json.loads((out / f"timeline-{keeper}.json").read_text())[1:]
    split = {
        kind: {
            key: _spread([row[key] for row in timeline if (row["world_size"] == 2) == (kind == "out")])
            for key in ("group_s", "state_s")
        }
        for kind in ("out", "in")
    }
    return {
        "step_s": step_s,
        "step_s_by_size": by_size,
        "pauses": pauses,
        "scale_out": _spread(pauses["out"]),
        "scale_in": _spread(pauses["in"]),
        "pauses_over": over,
        "scale_out_over": _spread(over["out"]),
        "scale_in_over": _spread(over["in"]),
        "pauses_own_pace": own,
        "pauses_over_own_pace": own_over,
        # An older tree's worker does not record the ranks that took samples: its own pace is then the new size's.
        "idle_steps_recorded": all(len(r) > 5 for r in records),
        "scale_out_own_pace": _spread(own["out"]),
        "scale_out_over_own_pace": _spread(own_over["out"]),
        "split": split,
        "phases": switch_phases(json.loads((out / f"marks-{keeper}.json").read_text())),
        "joiner": joiner_phases(out, keeper),
    }


#: The worker's marks of one switch, in the order they happen (runtime/worker.py ``switch_marks``); a phase is the
#: time from the previous mark present to this one.
PHASES = (
    ("last_step", ""),
    ("report", "step end -> report"),
    ("assigned", "report -> assignment"),
    ("teardown", "old group closed"),
    ("arrived", "members met"),
    ("formed", "process group formed"),
    ("manifest", "state manifest"),
    ("agreed", "state check agreed"),
    ("broadcast", "state broadcast"),
    ("synced", "state loaded"),
    ("saved", "auto-commit"),
    ("batch", "first batch in hand"),
    ("sent", "own state send done"),
    ("reduced", "gradients reduced"),
    ("settled", "commit copy done"),
    ("first_step", "first step"),
)


def switch_phases(marks: list[dict[str, float]]) -> dict[str, dict[str, dict[str, float]]]:
    """Where the switches' time went: per kind (``out``: the world grew, ``in``: it shrank), the spread of each
    phase between consecutive marks of the worker."""
    phases: dict[str, dict[str, list[float]]] = {"out": {}, "in": {}}
    previous_size = 1.0
    for switch in marks:
        size = switch.get("world_size", previous_size)
        if "report" not in switch:  # the worker's first generation: no switch
            previous_size = size
            continue
        kind = "out" if size > previous_size else "in"
        previous_size = size
        present = [(name, switch[name]) for name, _ in PHASES if name in switch]
        for (_, before), (name, after) in itertools.pairwise(present):
            phases[kind].setdefault(name, []).append(after - before)
    return {kind: {name: _spread(values) for name, values in by.items()} for kind, by in phases.items()}


#: The joiner's marks at its admission (runtime/worker.py), timed from the member's end of its last old step.
JOINER_MARKS = (
    ("assigned", "admitted"),
    ("arrived", "members met"),
    ("formed", "process group formed"),
    ("manifest", "manifest checked"),
    ("agreed", "state check agreed"),
    ("broadcast", "state received"),
    ("synced", "state loaded"),
    ("saved", "auto-commit started"),
    ("batch", "first batch in hand"),
    ("reduced", "gradients reduced"),
    ("settled", "commit copy done"),
    ("first_step", "first step ended"),
)


def joiner_phases(out: Path, keeper: str) -> dict[str, dict[str, float]]:
    """When each joiner reached each mark of its admission, counted from the end of the member's last step in the
    old generation (both processes' marks are ``time.perf_counter``, one clock on one machine): what the member
    waits for at a scale-out."""
    member = {s["generation"]: s for s in json.loads((out / f"marks-{keeper}.json").read_text()) if "report" in s}
    offsets: dict[str, list[float]] = {}
    for path in sorted(out.glob("marks-*.json")):
        if path.name == f"marks-{keeper}.json":
            continue
        for switch in json.loads(path.read_text()):
            base = member.get(switch.get("generation", -1))
            if base is None or "assigned" not in switch:
                continue
            for name, _label in JOINER_MARKS:
                if name in switch:
                    offsets.setdefault(name, []).append(switch[name] - base["last_step"])
    return {name: _spread(values) for name, values in offsets.items()}


def stop_resume(out: Path) -> dict[str, float]:
    """1 -> 2 by stop-resume: SIGTERM, checkpoint, exit, relaunch 2 processes at once, restore."""
    port = str(_free_port())
    base = [*WORKER, "--mode", "stopresume", "--out", str(out), "--flush"]
    env = _env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, LOCAL_RANK="0")
    first = _spawn(base, env, out / "stopresume-1.log")
    procs = [first]
    try:
        _wait(lambda: len(_records(out, "steps-stopresume-*.jsonl")) >= 40, "stop-resume to train")
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=DEADLINE_S)
        port = str(_free_port())
        for rank in range(2):
            env = _env(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, LOCAL_RANK="0")
            procs.append(_spawn(base, env, out / f"stopresume-2-{rank}.log"))
        _wait(
            lambda: sum(1 for r in _records(out, "steps-stopresume-rank0-*.jsonl") if int(r[2]) == 2) >= 10,
            "the relaunched processes to train",
        )
    finally:
        for proc in procs:
            _stop(proc)
        _kill_stray_workers(out)
    records = _records(out, "steps-stopresume-rank0-*.jsonl")
    return {"stall_s": _stall(records, 1, 2)}


def torchrun_restart(out: Path) -> dict[str, float]:
    """1 -> 2 by torchrun's elastic restart when a second agent joins (c10d rendezvous)."""
    port = str(_free_port())
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1:2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=bench",
        "--rdzv-conf=last_call_timeout=1",
        "--max-restarts=3",
        "--monitor-interval=0.1",
        "-m",
        "benchmarks.runtime_worker",
        "--mode",
        "torchrun",
        "--out",
        str(out),
        "--flush",
    ]
    env = _env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    agents = [_spawn(command, env, out / "torchrun-agent-1.log")]
    try:
        _wait(lambda: len(_records(out, "steps-torchrun-*.jsonl")) >= 40, "the first torchrun agent to train")
        agents.append(_spawn(command, env, out / "torchrun-agent-2.log"))
        _wait(
            lambda: sum(1 for r in _records(out, "steps-torchrun-rank0-*.jsonl") if int(r[2]) == 2) >= 10,
            "torchrun to train at 2 workers",
        )
    finally:
        for agent in agents:
            _stop(agent, grace_s=10)  # SIGTERM first: a torchrun agent then stops its workers itself
        _kill_stray_workers(out)
    # Rank 0 of the new world may be either agent's worker; both agents' rank-0 files are merged by time.
    records = _records(out, "steps-torchrun-rank0-*.jsonl")
    return {"stall_s": _stall(records, 1, 2)}


def restart_resizes(out: Path, cycles: int) -> dict[str, Any]:
    """The restart path (``amoeba-run --restart``, launcher/restart.py) on the same model: ``cycles`` scale-outs
    (1 -> 2) and scale-ins (2 -> 1, SIGTERM to the joiner and its script) of one job whose workers run the
    ``stopresume`` DDP loop (a torchrun script that saves on SIGTERM) under the restart supervisor.

    Measured like the stop-free path's pause: rank 0's step ends (the first worker is rank 0 throughout); a
    switch's pause is the gap between its last step at the old size and its first at the new size, minus the
    median ordinary step at the new size.
    """
    command = restart_command([*WORKER, "--mode", "stopresume", "--out", str(out), "--flush"])
    job = LocalJob(command, initial_workers=1, job_id="bench-restart", log_dir=out / "logs", poll_s=0.02)

    def rank0_steps(size: int, after: int) -> int:
        return sum(1 for r in _records(out, "steps-stopresume-rank0-*.jsonl")[after:] if int(r[2]) == size)

    with job:
        _wait(lambda: rank0_steps(1, 0) >= 30, "the restart path to train")
        for _ in range(cycles):
            for target in (2, 1):
                before, seen = job.view(), len(_records(out, "steps-stopresume-rank0-*.jsonl"))
                if target == 2:
                    job.add(1)
                else:
                    assert before.plan is not None
                    job.terminate(before.plan.members[-1])
                job.wait_for(_resized(before.generation, target), DEADLINE_S, f"{target} workers (restart path)")
                _wait(lambda: rank0_steps(target, seen) >= 20, "steps after the restart")  # noqa: B023
    records = _records(out, "steps-stopresume-rank0-*.jsonl")
    gaps: dict[int, list[float]] = {}
    for before_r, after_r in itertools.pairwise(records):
        if after_r[2] == before_r[2]:
            gaps.setdefault(int(after_r[2]), []).append(after_r[0] - before_r[0])
    by_size = {size: statistics.median(values) for size, values in sorted(gaps.items())}
    pauses: dict[str, list[float]] = {"out": [], "in": []}
    for before_r, after_r in itertools.pairwise(records):
        if after_r[2] != before_r[2]:
            kind = "out" if after_r[2] > before_r[2] else "in"
            pauses[kind].append(after_r[0] - before_r[0] - by_size[int(after_r[2])])
    return {
        "step_s_by_size": by_size,
        "pauses": pauses,
        "scale_out": _spread(pauses["out"]),
        "scale_in": _spread(pauses["in"]),
    }


def format_restart(restart: dict[str, Any], stop_free: dict[str, Any]) -> str:
    """The restart path's pause beside the stop-free path's, with their ratio (medians)."""
    lines = ["restart path (amoeba-run --restart) vs stop-free path: pause beyond one ordinary step"]
    for kind, name in (("out", "scale-out 1 -> 2"), ("in", "scale-in 2 -> 1")):
        again, free = restart["scale_" + kind], stop_free["scale_" + kind]
        ratio = again["median"] / free["median"] if free["median"] > 0 else float("inf")
        lines.append(
            f"  {name:<17} restart {again['median']:7.3f} s [{again['q1']:.3f}..{again['q3']:.3f}] "
            f"({again['min']:.3f}..{again['max']:.3f}), n={again['n']:.0f}   stop-free "
            f"{free['median'] * 1000:6.1f} ms   ratio {ratio:6.0f}x"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------- driver


def _median(values: list[float]) -> float:
    return statistics.median(values)


def median_interval(values: list[float], draws: int = 4000, seed: int = 1) -> tuple[float, float]:
    """The 95 % bootstrap interval of the median of ``values`` (seeded: the same data gives the same interval)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def run_pauses(work: Path, cycles: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """The worker's pause over ``cycles`` repeated scale-outs and scale-ins (:func:`repeated_resizes`)."""
    progress(f"worker pause: {cycles} scale-outs and {cycles} scale-ins of one job")
    directory = work / "pauses"
    directory.mkdir()
    return repeated_resizes(directory, cycles)


def compare_pauses(
    work: Path, baseline: Path, rounds: int, cycles: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    """The worker's pause of the baseline tree's workers against this checkout's, in alternating rounds.

    Each round runs ``cycles`` scale-outs and scale-ins with each tree (order alternating: old-new, new-old, ...),
    so that both see the same drifting load of a shared machine; the load average is recorded beside every round.
    """
    found = [name for name in ("slurm_amoeba", "benchmarks") if not (baseline / name).is_dir()]
    if found:
        raise SystemExit(
            f"bench-runtime: the baseline {baseline} lacks {', '.join(found)}; make it with e.g. "
            f"`git archive <commit> slurm_amoeba benchmarks | tar -x -C {baseline}`"
        )
    pauses: dict[str, dict[str, list[float]]] = {"old": {"out": [], "in": []}, "new": {"out": [], "in": []}}
    over: dict[str, dict[str, list[float]]] = {"old": {"out": [], "in": []}, "new": {"out": [], "in": []}}
    # Scale-outs beyond each step's own pace (see switch_pauses): the first step and the first OVER_STEPS.
    own: dict[str, dict[str, list[float]]] = {"old": {"first": [], "over": []}, "new": {"first": [], "over": []}}
    blind: set[str] = set()  # trees whose workers do not record the ranks that took samples
    rows: list[dict[str, Any]] = []
    for index in range(rounds):
        order = [("old", baseline), ("new", None)]
        for label, tree in order if index % 2 == 0 else order[::-1]:
            progress(f"round {index + 1}/{rounds}: {label} tree, {cycles} scale-outs and scale-ins")
            directory = work / f"{label}-{index}"
            directory.mkdir()
            load_before = os.getloadavg()[0]
            result = repeated_resizes(directory, cycles, tree)
            for kind in ("out", "in"):
                pauses[label][kind].extend(result["pauses"][kind])
                over[label][kind].extend(result["pauses_over"][kind])
            if not result["idle_steps_recorded"]:
                blind.add(label)
            own[label]["first"].extend(result["pauses_own_pace"]["out"])
            own[label]["over"].extend(result["pauses_over_own_pace"]["out"])
            rows.append(
                {
                    "round": index,
                    "tree": label,
                    "load": [load_before, os.getloadavg()[0]],
                    "step_s_by_size": result["step_s_by_size"],
                    "scale_out": result["scale_out"],
                    "scale_in": result["scale_in"],
                    "scale_out_over": result["scale_out_over"],
                    "scale_in_over": result["scale_in_over"],
                    "scale_out_own_pace": result["scale_out_own_pace"],
                    "scale_out_over_own_pace": result["scale_out_over_own_pace"],
                    "phases": result["phases"],
                    "joiner": result.get("joiner", {}),
                }
            )
    summary = {label: {kind: _spread(values) for kind, values in by.items()} for label, by in pauses.items()}
    summary_over = {label: {kind: _spread(values) for kind, values in by.items()} for label, by in over.items()}
    return {
        "rounds": rows,
        "pauses": pauses,
        "summary": summary,
        "pauses_over": over,
        "summary_over": summary_over,
        "pauses_own_pace": own,
        "summary_own_pace": {label: {kind: _spread(v) for kind, v in by.items()} for label, by in own.items()},
        "own_pace_unknown": sorted(blind),
        "over_steps": OVER_STEPS,
        "baseline": str(baseline),
    }


def _ms(spread: dict[str, float]) -> str:
    """A spread in milliseconds: median [quartiles] (range), count."""
    if not spread["n"]:
        return "     none, n=0"
    return (
        f"{spread['median'] * 1000:6.1f} ms [{spread['q1'] * 1000:.1f}..{spread['q3'] * 1000:.1f}] "
        f"({spread['min'] * 1000:.1f}..{spread['max'] * 1000:.1f}), n={spread['n']:.0f}"
    )


def format_comparison(report: dict[str, Any]) -> str:
    """The old-vs-new pause comparison, per round (with the load) and overall."""

    lines = ["worker pause beyond one ordinary step of the new world size: baseline (old) vs this checkout (new)"]
    for row in report["rounds"]:
        steps = ", ".join(f"{size}w {step * 1000:.1f} ms" for size, step in row["step_s_by_size"].items())
        lines.append(
            f"  round {row['round'] + 1} {row['tree']:<3} load {row['load'][0]:.1f}->{row['load'][1]:.1f}  "
            f"step {steps}  out {_ms(row['scale_out'])}  in {_ms(row['scale_in'])}"
        )
    for label in ("old", "new"):
        summary = report["summary"][label]
        lines.append(f"  all rounds {label:<3}  scale-out {_ms(summary['out'])}  scale-in {_ms(summary['in'])}")
    if "summary_over" in report:
        lines.append(
            f"the same over the first {report['over_steps']} steps of the new generation (beyond as many steps)"
        )
        for label in ("old", "new"):
            summary = report["summary_over"][label]
            lines.append(f"  all rounds {label:<3}  scale-out {_ms(summary['out'])}  scale-in {_ms(summary['in'])}")
    if "summary_own_pace" in report:
        lines.append(
            "scale-out beyond each step's own pace (a joiners' idle first step as a step of the members alone; "
            "scale-in: the same as above)"
        )
        for label in ("old", "new"):
            summary = report["summary_own_pace"][label]
            lines.append(
                f"  all rounds {label:<3}  first step {_ms(summary['first'])}  "
                f"over {report['over_steps']} steps {_ms(summary['over'])}"
            )
        for label in report.get("own_pace_unknown", []):
            lines.append(
                f"  ({label}: its workers do not record which ranks took samples, so its idle steps count at the "
                "new size: give that tree this checkout's benchmarks/ to compare at the own pace)"
            )
    return "\n".join(lines)


def run_overhead(work: Path, reps: int, steps: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """The steady-state overhead against plain DDP: ``reps`` jobs of interleaved blocks (see
    :func:`interleaved_step_times`); the ratio of each runtime block to its DDP neighbour."""
    ratios: list[float] = []
    cpu_ratios: list[float] = []
    blocks: list[dict[str, list[float]]] = []
    for rep in range(reps):
        progress(f"steady state, repetition {rep + 1}/{reps}: runtime and plain DDP blocks at 2 workers")
        directory = work / f"steady-{rep}"
        directory.mkdir()
        times = interleaved_step_times(directory, steps, block=10)
        blocks.append(times)
        ratios.extend(a / d for a, d in zip(times["amoeba"], times["ddp"], strict=True))
        cpu_ratios.extend(a / d for a, d in zip(times["amoeba_cpu"], times["ddp_cpu"], strict=True) if d > 0)
    low, high = median_interval(ratios)
    cpu_low, cpu_high = median_interval(cpu_ratios)
    return {
        "overhead_ratio": _median(ratios) - 1.0,
        "overhead_spread": {k: v - 1.0 if k != "n" else v for k, v in _spread(ratios).items()},
        "overhead_interval": [low - 1.0, high - 1.0],
        "ddp_step_s": _median([t for b in blocks for t in b["ddp"]]),
        "amoeba_step_s": _median([t for b in blocks for t in b["amoeba"]]),
        "block_ratios": ratios,
        # The same for the worker process's CPU time per step: the work the runtime adds, without the waits and
        # the machine's scheduling (a runtime that overlapped less would show in the wall time only).
        "overhead_cpu_ratio": _median(cpu_ratios) - 1.0,
        "overhead_cpu_interval": [cpu_low - 1.0, cpu_high - 1.0],
        "ddp_cpu_s": _median([t for b in blocks for t in b["ddp_cpu"]]),
        "amoeba_cpu_s": _median([t for b in blocks for t in b["amoeba_cpu"]]),
        "load": os.getloadavg()[0],
    }


def format_overhead(overhead: Mapping[str, Any]) -> str:
    """The steady-state overhead as three lines: wall time, steps, CPU time."""
    spread = overhead["overhead_spread"]
    low, high = overhead["overhead_interval"]
    cpu_low, cpu_high = overhead["overhead_cpu_interval"]
    return (
        f"steady-state overhead vs plain DDP at 2 workers: {overhead['overhead_ratio'] * 100:+.2f} % (95 % interval "
        f"of the median {low * 100:+.2f}..{high * 100:+.2f} %; quartiles {spread['q1'] * 100:+.1f}.."
        f"{spread['q3'] * 100:+.1f} %, {len(overhead['block_ratios'])} block pairs)\n"
        f"  step {overhead['amoeba_step_s'] * 1000:.2f} ms vs DDP {overhead['ddp_step_s'] * 1000:.2f} ms, "
        f"load {overhead['load']:.1f}\n"
        f"  CPU time of the worker process per step: {overhead['overhead_cpu_ratio'] * 100:+.2f} % (95 % interval "
        f"{cpu_low * 100:+.2f}..{cpu_high * 100:+.2f} %), {overhead['amoeba_cpu_s'] * 1000:.2f} ms vs DDP "
        f"{overhead['ddp_cpu_s'] * 1000:.2f} ms"
    )


def run_benchmark(work: Path, reps: int, steps: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """Run every measurement; returns the JSON report."""
    overhead = run_overhead(work, reps, steps, progress)
    events: dict[str, list[dict[str, float]]] = {"join": [], "leave": [], "kill": [], "stop": [], "torchrun": []}
    for rep in range(reps):
        for name, measure in (
            ("join", lambda d: amoeba_event(d, "join")),
            ("stop", stop_resume),
            ("torchrun", torchrun_restart),
            ("leave", lambda d: amoeba_event(d, "leave")),
            ("kill", lambda d: amoeba_event(d, "kill")),
        ):
            progress(f"{name}, repetition {rep + 1}/{reps}")
            directory = work / f"{name}-{rep}"
            directory.mkdir()
            events[name].append(measure(directory))
    report: dict[str, Any] = {
        "overhead_ratio": overhead["overhead_ratio"],
        "overhead_spread": overhead["overhead_spread"],
        "scale_out_pause_s": _median([e["stall_s"] for e in events["join"]]),
        "stop_resume_pause_s": _median([e["stall_s"] for e in events["stop"]]),
        "torchrun_restart_pause_s": _median([e["stall_s"] for e in events["torchrun"]]),
        "scale_in_pause_s": _median([e["stall_s"] for e in events["leave"]]),
        "failure_recovery_s": _median([e["recovery_s"] for e in events["kill"]]),
        "details": {
            "ddp_step_s": overhead["ddp_step_s"],
            "amoeba_step_s": overhead["amoeba_step_s"],
            "block_ratios": overhead["block_ratios"],
            "events": events,
            "reps": reps,
            "steady_steps": steps,
            "model": "MLP 512-1024-512-10 (1.06 M parameters), global batch 64, SGD, gloo on CPU",
            "torchrun": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, --rdzv-conf last_call_timeout=1, c10d rendezvous",
            "stall": "end of the last step in the old world to the end of the first step in the new world",
            "torch": torch.__version__,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "host": platform.node(),
        },
    }
    return report


def format_table(report: dict[str, Any]) -> str:
    """The report as a plain-text table."""
    details = report["details"]
    rows = [
        (
            "overhead_ratio",
            f"{report['overhead_ratio'] * 100:+.2f} %",
            f"step {details['amoeba_step_s'] * 1000:.2f} ms vs DDP {details['ddp_step_s'] * 1000:.2f} ms "
            f"(median of {len(details['block_ratios'])} block pairs)",
        ),
        ("scale_out_pause_s", f"{report['scale_out_pause_s']:.3f} s", "1 -> 2, joiner warmed up in the background"),
        ("stop_resume_pause_s", f"{report['stop_resume_pause_s']:.3f} s", "1 -> 2, checkpoint + relaunch + restore"),
        ("torchrun_restart_pause_s", f"{report['torchrun_restart_pause_s']:.3f} s", "1 -> 2, second torchrun agent"),
        ("scale_in_pause_s", f"{report['scale_in_pause_s']:.3f} s", "2 -> 1, SIGTERM (graceful leave)"),
        ("failure_recovery_s", f"{report['failure_recovery_s']:.3f} s", "2 -> 1, SIGKILL to training again"),
    ]
    out = report["scale_out_pause_s"]
    spread = report["overhead_spread"]
    rows.insert(1, ("overhead quartiles", f"{spread['q1'] * 100:+.1f}..{spread['q3'] * 100:+.1f} %", "block pairs"))
    rows.append(("scale-out / stop-resume", f"{out / report['stop_resume_pause_s'] * 100:.1f} %", "target <= 5 %"))
    rows.append(("scale-out / torchrun", f"{out / report['torchrun_restart_pause_s'] * 100:.1f} %", "target <= 5 %"))
    width = max(len(r[0]) for r in rows)
    lines = [f"{'measure'.ljust(width)}  {'value':>12}  notes", "-" * (width + 60)]
    lines += [f"{name.ljust(width)}  {value:>12}  {note}" for name, value, note in rows]
    return "\n".join(lines)


def format_pauses(pauses: dict[str, Any]) -> str:
    """The worker-pause figures: beyond one step, median [quartiles] (range), and where the time went."""

    sizes = ", ".join(f"{size} workers {step * 1000:.1f} ms" for size, step in pauses["step_s_by_size"].items())
    lines = [f"worker pause beyond one ordinary step of the new world size (median step: {sizes})"]
    for kind, name in (("out", "scale-out 1 -> 2"), ("in", "scale-in 2 -> 1")):
        lines.append(f"  {name:<17} {_ms(pauses['scale_' + kind])}")
        if "scale_" + kind + "_over" in pauses:
            lines.append(f"    {'over ' + str(OVER_STEPS) + ' steps':<15} {_ms(pauses['scale_' + kind + '_over'])}")
        if "scale_" + kind + "_own_pace" in pauses:
            lines.append(f"    {'own pace':<15} {_ms(pauses['scale_' + kind + '_own_pace'])}")
            lines.append(f"    {'own pace, ' + str(OVER_STEPS):<15} {_ms(pauses['scale_' + kind + '_over_own_pace'])}")
        for key in ("group_s", "state_s"):
            lines.append(f"    {key:<15} {_ms(pauses['split'][kind][key])}")
        for name, label in PHASES:
            if name in pauses.get("phases", {}).get(kind, {}):
                lines.append(f"      {label:<22} {_ms(pauses['phases'][kind][name])}")
    if pauses.get("joiner"):
        lines.append("  the joiner at a scale-out, from the member's last old step end:")
        for name, label in JOINER_MARKS:
            if name in pauses["joiner"]:
                lines.append(f"      {label:<22} {_ms(pauses['joiner'][name])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``scripts/bench-runtime``."""
    parser = argparse.ArgumentParser(prog="bench-runtime", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repetition, fewer steps (a few minutes)")
    parser.add_argument("--reps", type=int, default=0, help="repetitions (default 3, or 1 with --quick)")
    parser.add_argument("--json", type=Path, help="also write the report as JSON to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory with logs")
    parser.add_argument("--cycles", type=int, default=10, help="scale-out/scale-in pairs for the worker pause")
    parser.add_argument("--pause-only", action="store_true", help="measure only the worker pause")
    parser.add_argument(
        "--overhead-only", action="store_true", help="measure only the steady-state overhead against plain DDP"
    )
    parser.add_argument(
        "--warm-up",
        action="store_true",
        help="the runtime's workers pass TorchState(warm_up=...): a joiner rehearses a forward and backward",
    )
    parser.add_argument(
        "--restart-cycles", type=int, default=3, help="scale-out/scale-in pairs of the restart path (0: skip it)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="compare the worker pause with the workers of the tree in DIR (slurm_amoeba/ and benchmarks/), in "
        "alternating rounds (implies --pause-only)",
    )
    parser.add_argument("--rounds", type=int, default=4, help="with --baseline: rounds per tree")
    args = parser.parse_args(argv)
    os.environ.setdefault("AMOEBA_DEVICE", "cpu")  # the benchmark's model trains on CPU (gloo), GPU or not
    reps = args.reps or (1 if args.quick else 3)
    steps = 400 if args.quick else 1000
    work = Path(tempfile.mkdtemp(prefix="bench-runtime-"))
    started = time.monotonic()

    def progress(text: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {text}", file=sys.stderr, flush=True)

    if args.warm_up:  # the workers inherit the environment (benchmarks/runtime_worker.py reads it)
        os.environ[WARM_UP_VARIABLE] = "1"
    if args.baseline is not None:
        report: dict[str, Any] = {"comparison": compare_pauses(work, args.baseline, args.rounds, args.cycles, progress)}
        print(format_comparison(report["comparison"]))
    elif args.overhead_only:
        report = {"overhead": run_overhead(work, reps, steps, progress)}
        print(format_overhead(report["overhead"]))
    elif args.pause_only:
        report = {"worker_pause": run_pauses(work, args.cycles, progress)}
    else:
        report = run_benchmark(work, reps, steps, progress)
        report["worker_pause"] = run_pauses(work, args.cycles, progress)
        print(format_table(report))
    if "worker_pause" in report and args.restart_cycles:
        progress(f"restart path: {args.restart_cycles} scale-outs and scale-ins of one job")
        (work / "restart").mkdir()
        report["restart_pause"] = restart_resizes(work / "restart", args.restart_cycles)
    report["wall_s"] = time.monotonic() - started
    report["warm_up"] = args.warm_up
    if "worker_pause" in report:
        print(format_pauses(report["worker_pause"]))
    if "restart_pause" in report:
        print(format_restart(report["restart_pause"], report["worker_pause"]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.keep:
        print(f"work directory: {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
