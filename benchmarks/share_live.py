"""``scripts/bench-share --live``: two real jobs on one GPU of the local Slurm cluster, placed together by amoebad.

The live counterpart of :mod:`benchmarks.share` (which runs the two jobs as local processes, without Slurm). Here
everything is the shipped path: ``amoeba-sbatch --share`` jobs on the cluster's sharing partition (``gres/shard``,
docs/admin.md), ``amoebad`` with ``policy: antman`` and ``sharing.enabled``, whose policy decides the pair on its own
(no operator's ``amoebactl share``), the sharer's agent placing a worker beside the host in a satellite of one shard,
the share directive (pace bound, memory cap) reaching that worker, and the place taken back when the host's owner
grows it.

The fake GPUs stand in for real ones through CPU cores: every worker pins itself to the core of the GPU Slurm gave it
(``share_worker.py --cores gpu``: GPU index modulo the cores), so the host's worker and the sharer's worker beside
it compute on one core, and the sharer's own worker on another. The host idles ``--idle`` times its compute per step
(its input pipeline: the room on its GPU that a sharer can use; AntMan's jobs leave most of their GPU idle).

Phases of one run, each measured over ``--window`` seconds of wall clock from the jobs' ledgers:

1. **host alone**: the host (1 worker, ``--share``) trains on its GPU: ``host_alone_samples_per_s``;
2. **together**: the sharer (``--share=opportunistic``, 1 to 2 workers) starts on a GPU of its own; the daemon's
   policy places its second worker beside the host (gated by the host's activity, paced by its step times, under the
   memory cap the daemon computed from the host's reported use and ``sharing.gpu_memory_gib``):
   ``host_shared_samples_per_s``, ``sharer_shared_samples_per_s``;
3. **owner grows back**: the host is resized to 2 workers (``amoebactl resize``, as its owner would); the daemon
   takes the place back, the sharer's worker beside the host leaves at a step boundary, the sharer is pinned (so
   that the policy places it nowhere else) and trains on its own GPU alone: ``sharer_own_samples_per_s``.

Where the daemon measures, during phase 2, that the sharer trains slower with its worker beside the host than it did
alone, it gives the place back by itself (``given_back_for_loss``; docs/admin.md section 8e); phase 2's figures are
then those of the sharer's steps with its worker beside the host (their span: ``shared_s``), however short.

Figures: ``guaranteed_ratio`` (host shared / alone), ``sharer_gain_beside`` (the sharer's throughput with its
worker beside the host over its throughput on its own GPU alone), ``pair_gain`` (the shared GPU's normalised
throughput: the host's shared / alone, plus what the sharer's worker beside it added, over what one GPU of the
sharer's own gives: ``guaranteed_ratio + sharer_gain_beside - 1``), ``guaranteed_failures`` (the host's generations
that ended on a failure, and 1 if it did not run to the end), ``exactly_once`` (no sample twice in an epoch of
either job, every completed epoch whole), ``beside_on_host_gpu`` (Slurm gave the sharer's satellite the host's
GPU), ``paired_by`` (the daemon's log line of the decision), the memory cap the
sharer's worker received, how long the pairing and the takeback took.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.backfill import BenchError, add_cluster_arguments, free_port, start_amoebad
from slurm_amoeba.core.messages import Message
from slurm_amoeba.slurm import CliSlurmClient, JobRecord
from slurm_amoeba.transport.channel import ChannelError, request

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("share_worker.py")
#: The cluster's sharing partition (scripts/slurm-cluster's default).
SHARE_PARTITION = "share"
#: What the daemon logs when it gives a sharer's place back because the sharer trained slower for it.
LOSS_LINE = "it grows beside no host again"
#: Samples in one epoch of either job.
DATASET = 4096
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 0.5) -> T:
    """Poll ``probe`` until it returns something other than None/False; :class:`BenchError` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def steps_of(out: Path) -> list[dict[str, Any]]:
    """The job's applied steps, once each (every worker writes a line per step it took part in), by their end."""
    steps: dict[tuple[int, int], dict[str, Any]] = {}
    for path in out.glob("ledger-*.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line being written
                entry = json.loads(line)
                key = (int(entry["epoch"]), int(entry["step"]))
                kept = steps.setdefault(key, {**entry, "workers": 0})
                kept["end"] = max(float(kept["end"]), float(entry["end"]))
                kept["workers"] += 1
    return sorted(steps.values(), key=lambda e: float(e["end"]))


def rate_between(out: Path, start: float, end: float) -> float:
    """Samples per second of the steps that ended within [start, end] (from the first such step's end)."""
    inside = [e for e in steps_of(out) if start <= float(e["end"]) <= end]
    if len(inside) < 2:
        return 0.0
    samples = sum(int(e["samples"]) for e in inside[1:])
    return samples / max(1e-9, float(inside[-1]["end"]) - float(inside[0]["end"]))


def shared_interval(out: Path, until: float) -> tuple[float, float] | None:
    """The span of the job's steps taken with more than one worker (its worker beside the host among them) that
    ended before ``until``: from the first such step's end to the last's; None when it took fewer than two."""
    ends = [float(e["end"]) for e in steps_of(out) if int(e["workers"]) > 1 and float(e["end"]) <= until]
    return (ends[0], ends[-1]) if len(ends) >= 2 else None


def once_so_far(out: Path, dataset: int) -> bool:
    """No sample twice within an epoch, and every epoch before the last one seen holds every sample (read once the
    job ended: while it runs, one worker may have begun the next epoch before another wrote its last step)."""
    seen: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for path in out.glob("ledger-*.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line cut short by the job's cancellation
                entry = json.loads(line)
                seen[int(entry["epoch"])].update(int(i) for i in entry["indices"])
    if not seen:
        return False
    last = max(seen)
    return all(set(c.values()) == {1} for c in seen.values()) and all(
        sorted(seen[e]) == list(range(dataset)) for e in range(last)
    )


class LiveShare:
    """One run of the three phases against the cluster of ``args.slurm_conf`` (see the module docstring)."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.env = dict(os.environ)
        self.env["SLURM_CONF"] = str(args.slurm_conf)
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), self.env.get("PYTHONPATH")]))
        self.env.pop("AMOEBA_DAEMON_ENDPOINT", None)
        self.client = CliSlurmClient.from_environment(self.env)
        self.endpoint = f"tcp://{args.daemon_host}:{free_port()}"
        self.daemon: subprocess.Popen[bytes] | None = None
        self.jobs: list[str] = []

    def log(self, text: str) -> None:
        if not self.args.quiet:
            print(f"[bench-share --live] {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------------------------------------ the pieces

    def ask(self, kind: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """A request to the daemon (as the job's owner, as amoebactl sends it); its reply's data."""
        reply = request(self.endpoint, Message(kind, body or {}), timeout_s=30, retries=1)
        if not reply.body["ok"]:
            raise BenchError(f"amoebad refused {kind}: {reply.body['error']}")
        data: dict[str, Any] = reply.body["data"]
        return data

    def sizes(self) -> dict[str, tuple[int, int]]:
        """Job id -> (size, target) as the daemon has it from the agents' reports."""
        try:
            return {j["job_id"]: (j["size"], j["target"]) for j in self.ask("jobs", {"limit": 100}).get("jobs", [])}
        except (ChannelError, BenchError):
            return {}

    def history(self, job_id: str, kind: str) -> list[dict[str, Any]]:
        """The ``kind`` events of the history the job's agent last reported."""
        for job in self.ask("jobs", {"limit": 100}).get("jobs", []):
            if job["job_id"] == job_id:
                return [e for e in job.get("history", []) if isinstance(e, dict) and e.get("event") == kind]
        return []

    def daemon_log(self) -> str:
        return (self.work / "amoebad.log").read_text(errors="replace")

    def logged_at(self, *parts: str) -> float | None:
        """When the daemon first logged a line holding every one of ``parts`` (its log's local time), or None."""
        for line in self.daemon_log().splitlines():
            if all(part in line for part in parts):
                with contextlib.suppress(ValueError):
                    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        return None

    def start_daemon(self) -> None:
        config = {
            "interval_s": self.args.interval,
            "listen": self.endpoint,
            "metrics": {"port": 0},
            "policy": {"name": "antman"},
            "slurm": {"conf": str(self.args.slurm_conf)},
            "state_file": str(self.work / "amoebad-state.json"),
            "sharing": {
                "enabled": True,
                "partitions": {SHARE_PARTITION: 4},
                "gpu_memory_gib": {SHARE_PARTITION: self.args.gpu_memory_gib},
                "default_kept": self.args.default_kept,
            },
        }
        self.daemon = start_amoebad(config, self.work, self.env)

    def submit(self, name: str, mode: str, idle: float) -> str:
        """An elastic 1:2 job of the benchmark's worker on the sharing partition, opted in with ``mode``."""
        out = self.work / name
        out.mkdir(parents=True, exist_ok=True)
        script = self.work / f"{name}.sh"
        script.write_text(f'#!/bin/bash\nexec amoeba-run {sys.executable} {WORKER} "$@"\n')
        script.chmod(0o755)
        argv = [
            "amoeba-sbatch", "--elastic", "1:2", "--gpus-per-worker", "1", f"--share={mode}",
            f"--share-partition={SHARE_PARTITION}", f"--job-name={name}", f"--output={self.work}/{name}-%j.out",
            str(script), "--out", str(out), "--cores", "gpu", "--width", str(self.args.width),
            "--global-batch", str(self.args.global_batch), "--dataset-size", str(DATASET), "--epochs", "1000",
            "--idle-per-step", str(idle),
        ]  # fmt: skip
        env = {**self.env, "AMOEBA_DAEMON_ENDPOINT": self.endpoint}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=self.work, timeout=60, check=False)
        match = re.search(r"^([0-9]+)\s*$", done.stdout, re.MULTILINE)
        if done.returncode != 0 or match is None:
            raise BenchError(f"amoeba-sbatch failed (exit {done.returncode}): {done.stderr.strip()}")
        self.jobs.append(match.group(1))
        return match.group(1)

    def satellites(self, job_id: str) -> list[JobRecord]:
        """The job's active satellites (its agent's Slurm jobs beside its own allocation)."""
        return [j for j in self.client.jobs() if j.state.is_active() and j.comment == f"amoeba-parent={job_id}"]

    def gpus_of(self, job_id: str) -> tuple[int, ...]:
        """The GPU indices of the job's own workers (its last heterogeneous component), empty when not running."""
        records = self.client.het_components(int(job_id))
        if not records or not records[-1].state.is_active():
            return ()
        return tuple(g for per_node in records[-1].gpu_indices for g in per_node)

    def measure(self, what: str) -> tuple[float, float]:
        """Let ``--settle`` seconds pass, then ``--window`` seconds; the window's (start, end)."""
        time.sleep(self.args.settle)
        start = time.time()
        self.log(f"measuring {what} for {self.args.window:g} s")
        time.sleep(self.args.window)
        return start, time.time()

    def stop(self) -> None:
        """Cancel the benchmark's jobs (and their satellites) and stop the daemon."""
        self.end_jobs()
        if self.daemon is not None:
            self.daemon.terminate()
            try:
                self.daemon.wait(20)
            except subprocess.TimeoutExpired:
                self.daemon.kill()

    def end_jobs(self) -> None:
        """Cancel the benchmark's jobs (and their satellites) and wait until Slurm ended them (at most 90 s)."""
        for job_id in self.jobs:
            with contextlib.suppress(Exception):
                self.client.cancel(int(job_id))
        with contextlib.suppress(BenchError):
            wait_for(
                "the benchmark's jobs to end",
                lambda: (
                    not any(
                        j.state.is_active()
                        and (str(j.job_id) in self.jobs or j.comment.removeprefix("amoeba-parent=") in self.jobs)
                        for j in self.client.jobs()
                    )
                ),
                90,
            )

    # ------------------------------------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        """The three phases; the figures (see the module docstring)."""
        if not self.client.nodes(partition=SHARE_PARTITION):
            raise BenchError(
                f"the cluster has no {SHARE_PARTITION!r} partition: start it with scripts/slurm-cluster (down, then "
                "up), which offers gres/shard there"
            )
        busy = [j.job_id for j in self.client.jobs() if j.state.is_active()]
        if busy:
            raise BenchError(f"the cluster runs jobs {busy}; this benchmark needs it to itself")
        self.start_daemon()
        host = self.submit("host", "guaranteed", self.args.idle)
        self.log(f"host job {host} submitted")
        wait_for("the host's first steps", lambda: len(steps_of(self.work / "host")) >= 5, 180)
        alone = self.measure("the host alone")
        sharer = self.submit("sharer", "opportunistic", self.args.sharer_idle)
        self.log(f"sharer job {sharer} submitted")
        wait_for("the sharer's first steps", lambda: len(steps_of(self.work / "sharer")) >= 3, 180)
        asked = time.time()
        paired_line = wait_for(
            "the daemon's policy to place the sharer beside the host",
            lambda: next((ln for ln in self.daemon_log().splitlines() if f"beside job {host}" in ln), None),
            self.args.pair_timeout,
        )
        wait_for("the sharer's 2 workers", lambda: self.sizes().get(sharer) == (2, 2), 180)
        paired_s = time.time() - asked
        beside = [g for record in self.satellites(sharer) for per_node in record.gpu_indices for g in per_node]
        same_gpu = bool(beside) and set(beside) <= set(self.gpus_of(host))
        together = self.measure("the pair")
        directive = (self.history(sharer, "share_directive") or [{}])[-1]
        lost_at = self.logged_at(f"job {sharer}: ", LOSS_LINE)
        if lost_at is not None:  # the daemon measured the sharer slower with its worker beside the host
            together = shared_interval(self.work / "sharer", lost_at) or together
            self.log("the daemon gave the place back: the sharer trained slower with its worker beside the host")
        back_at = time.time()
        self.ask("resize", {"job_id": host, "target": 2, "reason": "bench-share: the owner grows back"})
        wait_for("the sharer's satellite beside the host to be released", lambda: not self.satellites(sharer), 180)
        wait_for("the sharer back at its own worker", lambda: self.sizes().get(sharer) == (1, 1), 180)
        takeback_s = time.time() - back_at
        self.ask("pin", {"job_id": sharer, "pinned": True})  # alone from here: the policy places it nowhere again
        own = self.measure("the sharer alone on its own GPU")
        host_running = any(str(j.job_id) == host and j.state.is_active() for j in self.client.jobs())
        failures = sum(len(self.history(host, kind)) for kind in ("worker_lost", "restarting"))
        host_out, sharer_out = self.work / "host", self.work / "sharer"
        self.end_jobs()  # the ledgers are final: no worker is between two lines of one step
        figures = self._figures(host_out, sharer_out, alone, together, own)
        figures["shared_s"] = round(together[1] - together[0], 1)
        figures.update(
            guaranteed_failures=failures + (not host_running),
            exactly_once=once_so_far(host_out, DATASET) and once_so_far(sharer_out, DATASET),
            paired_by=paired_line.split("] ", 1)[-1][:300],
            beside_on_host_gpu=same_gpu,
            pairing_s=round(paired_s, 1),
            takeback_s=round(takeback_s, 1) if lost_at is None else None,
            given_back_for_loss=lost_at is not None,
            sharer_memory_cap_bytes=directive.get("memory_cap_bytes"),
            host=host,
            sharer=sharer,
        )
        return figures

    @staticmethod
    def _figures(
        host: Path, sharer: Path, alone: tuple[float, float], together: tuple[float, float], own: tuple[float, float]
    ) -> dict[str, Any]:
        host_alone, host_shared = rate_between(host, *alone), rate_between(host, *together)
        sharer_shared, sharer_own = rate_between(sharer, *together), rate_between(sharer, *own)
        ratio = host_shared / host_alone if host_alone else 0.0
        gain = sharer_shared / sharer_own if sharer_own else 0.0
        return {
            "host_alone_samples_per_s": round(host_alone, 2),
            "host_shared_samples_per_s": round(host_shared, 2),
            "sharer_shared_samples_per_s": round(sharer_shared, 2),
            "sharer_own_samples_per_s": round(sharer_own, 2),
            "guaranteed_ratio": round(ratio, 4),
            "sharer_gain_beside": round(gain, 4),
            "pair_gain": round(ratio + gain - 1.0, 4),
        }


def run_live(args: argparse.Namespace) -> dict[str, Any]:
    """Run once in ``args.keep`` (or a temporary directory); the figures. Always cancels its jobs and stops the
    daemon, also on an error."""
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            work = args.keep
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-share-live-")))
        work.chmod(0o755)
        bench = LiveShare(args, work)
        try:
            return bench.run()
        finally:
            bench.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The live run's options (``scripts/bench-share --live ...``)."""
    add_cluster_arguments(parser, "--live: ")
    parser.add_argument("--window", type=float, default=30.0, help="--live: measured seconds per phase")
    parser.add_argument("--settle", type=float, default=5.0, help="--live: seconds before each window")
    parser.add_argument("--pair-timeout", type=float, default=120.0, help="--live: seconds the policy may take to pair")
    parser.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=1.0,
        help="--live: the fake GPUs' memory the daemon is told (sharing.gpu_memory_gib): what bounds the sharer's cap",
    )
    parser.add_argument(
        "--sharer-idle",
        type=float,
        default=3.0,
        help="--live: the sharer's idle time per step / compute (its input pipeline; AntMan's jobs idle their GPUs)",
    )
    parser.add_argument(
        "--default-kept",
        type=float,
        default=0.97,
        help="--live: the daemon's prior (sharing.default_kept): a host that idles most of its steps loses little",
    )
    parser.add_argument("--quiet", action="store_true", help="--live: no progress lines on stderr")
