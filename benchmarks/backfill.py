"""bench-backfill: GPU utilization and regular jobs' waits without and with amoebad, measured in one run.

Runs the same workload twice on the live local Slurm cluster (``scripts/slurm-cluster up``), first without the
daemon, then with it:

- two elastic jobs (``amoeba-sbatch --elastic 1:3 --gpus-per-worker 4``, the example MLP on CPU) that start at
  their minimum;
- a stream of regular jobs in the regular partition, each taking a whole node's GPUs for a while.

Without the daemon the elastic jobs stay at their minimum and the GPUs nobody asked for stay idle. With it they grow
into idle GPUs, and give them back (gracefully, or through Slurm's preemption within GraceTime) when a regular job
queues. Utilization is the share of the usable GPUs (on nodes not down or drained) that the benchmark's own jobs
hold (the elastic jobs with their satellites, and the regular jobs), sampled every second over the measured window;
a regular job's wait is its start time minus its submit time. The promise checked: no regular job waits longer with
the daemon than without it plus the elastic partition's GraceTime (and one daemon interval).

Prints a table, or JSON with ``--json`` (keys ``util_without``, ``util_with``, ``regular_wait_without_s``,
``regular_wait_with_s`` and more). Exit status 0, 1 when the promise is broken, 3 when the cluster was busy with
other jobs (before or during the run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.record import Recording
from slurm_amoeba.core.messages import Message
from slurm_amoeba.slurm import CliSlurmClient, JobRecord, SubmitOptions
from slurm_amoeba.transport.channel import ChannelError, request

REPO = Path(__file__).resolve().parents[1]


class BenchError(Exception):
    """The benchmark could not run (a busy cluster, a job that never started); the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Workload:
    """What each phase runs.

    Attributes:
        elastic_jobs: how many elastic jobs.
        elastic_min: their minimum workers.
        elastic_max: their maximum workers.
        gpus_per_worker: GPUs per worker.
        regular_jobs: how many regular jobs arrive.
        first_regular_s: when the first arrives (seconds into the window).
        regular_every_s: seconds between arrivals.
        regular_runtime_s: how long each runs.
        regular_gpus: GPUs each takes (on one node).
        window_s: length of the measured window.
    """

    elastic_jobs: int = 2
    elastic_min: int = 1
    elastic_max: int = 3
    gpus_per_worker: int = 4
    regular_jobs: int = 4
    first_regular_s: float = 15.0
    regular_every_s: float = 20.0
    regular_runtime_s: float = 15.0
    regular_gpus: int = 4
    window_s: float = 100.0


@dataclasses.dataclass
class Phase:
    """What one phase measured.

    Attributes:
        util: mean share of GPUs allocated over the window.
        elastic_gpus: mean GPUs held by the elastic jobs (with their satellites).
        waits: each regular job's wait, in submission order.
        grows: grow directives the daemon sent (0 without it).
        shrinks: shrink directives the daemon sent.
        samples: utilization samples taken.
        elastic_drops: how often the elastic jobs' GPUs went down from one sample to the next (they shrank).
    """

    util: float
    elastic_gpus: float
    waits: list[float]
    grows: int = 0
    shrinks: int = 0
    samples: int = 0
    elastic_drops: int = 0


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def grace_time(conf: Path, partition: str) -> int:
    """GraceTime of ``partition`` from slurm.conf (0 when not set)."""
    for line in conf.read_text().splitlines():
        words = line.split()
        if words and words[0] == f"PartitionName={partition}":
            for word in words:
                if word.startswith("GraceTime="):
                    return int(word.split("=", 1)[1])
    return 0


def start_amoebad(config: dict[str, Any], workdir: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start ``amoebad`` with ``config`` (written to ``workdir/amoebad.yaml``, its log to ``workdir/amoebad.log``) and
    wait until it answers ``status`` on ``config["listen"]``.

    Raises:
        BenchError: it did not answer within 20 s (its log says why).
    """
    (workdir / "amoebad.yaml").write_text(yaml.safe_dump(config))
    with (workdir / "amoebad.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slurm_amoeba.cli.amoebad", "--config", str(workdir / "amoebad.yaml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    deadline = time.monotonic() + 20
    while True:
        try:
            request(config["listen"], Message("status", {}), timeout_s=1, retries=0)
            return proc
        except ChannelError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise BenchError(f"amoebad did not start; see {workdir / 'amoebad.log'}") from None


class Bench:
    """One benchmark run (both phases) against the cluster of ``slurm_conf``."""

    def __init__(self, args: argparse.Namespace, workload: Workload) -> None:
        self.args = args
        self.workload = workload
        self.workdir: Path = args.workdir
        self.env = dict(os.environ)
        self.env["SLURM_CONF"] = str(args.slurm_conf)
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.env.pop("AMOEBA_DAEMON_ENDPOINT", None)
        self.client = CliSlurmClient.from_environment(self.env)
        self.mine: set[int] = set()
        self.usable_gpus = 0

    def log(self, text: str) -> None:
        if not self.args.quiet:
            print(f"[bench-backfill] {text}", file=sys.stderr, flush=True)

    def wait_idle(self) -> None:
        deadline = time.monotonic() + self.args.idle_timeout
        while True:
            busy = [j.job_id for j in self.client.jobs() if j.state.is_active()]
            if not busy:
                return
            if time.monotonic() > deadline:
                raise BenchError(
                    f"the cluster stayed busy with jobs {busy} for {self.args.idle_timeout:g} s; this benchmark "
                    f"needs it to itself (wait for them, or raise --idle-timeout)"
                )
            time.sleep(1)

    def start_daemon(self, phase_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
        endpoint = f"tcp://{self.args.daemon_host}:{free_port()}"
        config = {
            "interval_s": self.args.interval,
            "listen": endpoint,
            "metrics": {"port": 0},
            "policy": {"name": self.args.policy},
            "partitions": {"regular": [self.args.regular_partition], "elastic": self.args.elastic_partition},
            "slurm": {"conf": str(self.args.slurm_conf)},
            "state_file": str(phase_dir / "amoebad-state.json"),
        }
        return start_amoebad(config, phase_dir, self.env), endpoint

    def submit_elastic(self, phase_dir: Path, endpoint: str | None) -> list[int]:
        wl = self.workload
        job_script = phase_dir / "elastic.sh"
        job_script.write_text(
            "#!/bin/bash\n#SBATCH --job-name=bench-elastic\n"
            f'exec amoeba-run {sys.executable} {REPO / "examples" / "elastic_mlp.py"} "$@"\n'
        )
        job_script.chmod(0o755)
        env = dict(self.env)
        if endpoint is not None:
            env["AMOEBA_DAEMON_ENDPOINT"] = endpoint
        ids: list[int] = []
        for index in range(wl.elastic_jobs):
            argv = [
                "amoeba-sbatch",
                "--elastic",
                f"{wl.elastic_min}:{wl.elastic_max}",
                "--gpus-per-worker",
                str(wl.gpus_per_worker),
                f"--output={phase_dir}/elastic-{index}-%j.out",
                str(job_script),
                "--epochs",
                "100000",
                "--dataset-size",
                "2048",
                "--sample-delay",
                "0.006",
            ]
            done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=phase_dir, timeout=60, check=False)
            match = re.search(r"^([0-9]+)\s*$", done.stdout, re.MULTILINE)
            if done.returncode != 0 or match is None:
                raise BenchError(f"amoeba-sbatch failed (exit {done.returncode}): {done.stderr.strip()}")
            ids.append(int(match.group(1)))
            self.mine.add(ids[-1])
        deadline = time.monotonic() + 90
        while not all(self._running(job_id) for job_id in ids):
            if time.monotonic() > deadline:
                raise BenchError(f"the elastic jobs {ids} did not start within 90 s; see {phase_dir}")
            time.sleep(0.5)
        return ids

    def _running(self, job_id: int) -> bool:
        comps = self.client.het_components(job_id)
        return bool(comps) and all(c.state.value == "RUNNING" for c in comps)

    def _elastic_gpus(self, records: list[JobRecord], parents: list[int]) -> int:
        names = {str(p) for p in parents}
        held = 0
        for record in records:
            parent = record.comment.removeprefix("amoeba-parent=") if record.comment.startswith("amoeba-") else ""
            if record.het_job_id in parents or record.job_id in parents or parent in names:
                held += record.gpus_held
        return held

    def run_phase(self, with_daemon: bool) -> Phase:
        wl = self.workload
        name = "with" if with_daemon else "without"
        phase_dir = self.workdir / name
        phase_dir.mkdir(parents=True, exist_ok=True)
        self.wait_idle()
        daemon: subprocess.Popen[bytes] | None = None
        endpoint: str | None = None
        if with_daemon:
            daemon, endpoint = self.start_daemon(phase_dir)
            self.log(f"amoebad listening on {endpoint} (interval {self.args.interval:g} s)")
        try:
            elastic = self.submit_elastic(phase_dir, endpoint)
            self.log(f"{name} amoebad: elastic jobs {elastic} running; window of {wl.window_s:g} s starts")
            samples: list[tuple[float, float]] = []
            stop = threading.Event()

            # GPUs of the nodes that can run jobs (a drained node is nobody's to fill; the sharing partition's are
            # no regular job's).
            total = sum(n.gpus_total for n in self.client.nodes(partition=self.args.regular_partition) if n.is_usable)
            self.usable_gpus = total

            foreign: set[int] = set()
            names = {str(p) for p in elastic}

            def sample() -> None:
                # Only this benchmark's jobs count. Another job that holds GPUs meanwhile (the cluster may be
                # shared) takes capacity from one phase and not the other: it is noted, and spoils the run.
                while not stop.is_set():
                    records = self.client.jobs()
                    held_elastic = self._elastic_gpus(records, elastic)
                    held_regular = sum(r.gpus_held for r in records if r.job_id in regular)
                    samples.append(((held_elastic + held_regular) / total if total else 0.0, held_elastic))
                    foreign.update(
                        r.het_job_id or r.job_id
                        for r in records
                        if r.gpus_held
                        and r.job_id not in regular
                        and r.het_job_id not in elastic
                        and r.job_id not in elastic
                        and r.comment.removeprefix("amoeba-parent=") not in names
                    )
                    stop.wait(1.0)

            regular: list[int] = []
            sampler = threading.Thread(target=sample, daemon=True)
            start = time.monotonic()
            sampler.start()
            regular_script = phase_dir / "regular.sh"
            regular_script.write_text(f"#!/bin/bash\nexec sleep {wl.regular_runtime_s:g}\n")
            regular_script.chmod(0o755)
            for index in range(wl.regular_jobs):
                due = start + wl.first_regular_s + index * wl.regular_every_s
                time.sleep(max(0.0, due - time.monotonic()))
                job_id = self.client.submit(
                    regular_script,
                    SubmitOptions(
                        name="bench-regular",
                        partition=self.args.regular_partition,
                        nodes=1,
                        ntasks=1,
                        gpus_per_node=wl.regular_gpus,
                        output=str(phase_dir / f"regular-{index}-%j.out"),
                    ),
                )
                regular.append(job_id)
                self.mine.add(job_id)
                self.log(f"regular job {job_id} submitted at +{time.monotonic() - start:.0f} s")
            time.sleep(max(0.0, start + wl.window_s - time.monotonic()))
            stop.set()
            sampler.join(10)
            waits = self._waits(regular)
            for job_id in elastic:
                self.client.cancel(job_id)
            self._wait_mine_gone(elastic)
            if foreign:
                raise BenchError(
                    f"jobs {sorted(foreign)} of someone else held GPUs during the phase {name} amoebad, so the two "
                    f"phases did not have the same cluster; run again when the cluster is idle"
                )
        finally:
            if daemon is not None:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(30)
                except subprocess.TimeoutExpired:
                    daemon.kill()
        grows = shrinks = 0
        if with_daemon:
            text = (phase_dir / "amoebad.log").read_text(errors="replace")
            grows = len(re.findall(r"\[daemon/actuator\] job [0-9]+: grow ", text))
            shrinks = len(re.findall(r"\[daemon/actuator\] job [0-9]+: shrink ", text))
        return Phase(
            util=statistics.fmean(u for u, _ in samples) if samples else 0.0,
            elastic_gpus=statistics.fmean(g for _, g in samples) if samples else 0.0,
            waits=waits,
            grows=grows,
            shrinks=shrinks,
            samples=len(samples),
            elastic_drops=sum(1 for (_, a), (_, b) in itertools.pairwise(samples) if b < a),
        )

    def _waits(self, regular: list[int]) -> list[float]:
        deadline = time.monotonic() + 120
        while True:
            records = {j.job_id: j for j in self.client.jobs() if j.job_id in regular}
            if all(r.start_time and r.state.value != "PENDING" for r in records.values()) and len(records) == len(
                regular
            ):
                return [float(records[j].start_time - records[j].submit_time) for j in regular]
            if time.monotonic() > deadline:
                raise BenchError(f"regular jobs {regular} did not all start within 120 s after the window")
            time.sleep(1)

    def _wait_mine_gone(self, parents: list[int]) -> None:
        names = {str(p) for p in parents}
        deadline = time.monotonic() + 60
        while True:
            left = [
                j
                for j in self.client.jobs()
                if j.state.is_active()
                and (
                    j.job_id in self.mine
                    or j.het_job_id in parents
                    or j.job_id in parents
                    or j.comment.removeprefix("amoeba-parent=") in names
                )
            ]
            if not left:
                return
            if time.monotonic() > deadline:
                for job in left:  # our own jobs: satellites an agent did not get to release
                    with contextlib.suppress(Exception):
                        self.client.cancel(job.job_id)
                return
            time.sleep(1)

    def cleanup(self) -> None:
        """Cancel whatever of ours is still there (after an error)."""
        for job in self.client.jobs():
            parent = job.comment.removeprefix("amoeba-parent=")
            if job.state.is_active() and (job.job_id in self.mine or (parent.isdigit() and int(parent) in self.mine)):
                with contextlib.suppress(Exception):
                    self.client.cancel(job.job_id)


def add_cluster_arguments(parser: argparse.ArgumentParser, mode: str = "") -> None:
    """The options of a benchmark that runs amoebad against the local cluster: ``--slurm-conf``, ``--daemon-host``
    and ``--interval`` (their help prefixed with ``mode``, e.g. ``--live: ``, where a script has other modes)."""
    default_conf = os.environ.get("SLURM_CONF", "/tmp/slurm-amoeba-cluster/etc/slurm.conf")
    parser.add_argument("--slurm-conf", type=Path, default=Path(default_conf), help=f"{mode}the cluster's slurm.conf")
    parser.add_argument(
        "--daemon-host",
        default=os.environ.get("AMOEBA_CLUSTER_SUBNET", "10.77.0") + ".1",
        help=f"{mode}an address of this host the nodes reach (default: the cluster bridge, AMOEBA_CLUSTER_SUBNET + .1)",
    )
    parser.add_argument("--interval", type=float, default=2.0, help=f"{mode}the daemon's round interval (s)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench-backfill", description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_cluster_arguments(parser)
    parser.add_argument("--policy", default="elastic-backfill")
    parser.add_argument("--regular-partition", default="batch")
    parser.add_argument("--elastic-partition", default="elastic")
    parser.add_argument("--window", type=float, default=Workload.window_s, help="measured seconds per phase")
    parser.add_argument("--regular-jobs", type=int, default=Workload.regular_jobs)
    parser.add_argument("--regular-every", type=float, default=Workload.regular_every_s)
    parser.add_argument("--regular-runtime", type=float, default=Workload.regular_runtime_s)
    parser.add_argument("--first-regular", type=float, default=Workload.first_regular_s)
    parser.add_argument("--idle-timeout", type=float, default=180.0, help="seconds to wait for others' jobs")
    parser.add_argument("--workdir", type=Path, default=None, help="where jobs write (default: a new /tmp dir)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--out", type=Path, default=None, help="also write the result document here")
    args = parser.parse_args(argv)
    if args.workdir is None:
        args.workdir = Path(f"/tmp/amoeba-bench-backfill-{os.getpid()}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    recording = Recording("backfill", vars(args))
    workload = Workload(
        regular_jobs=args.regular_jobs,
        first_regular_s=args.first_regular,
        regular_every_s=args.regular_every,
        regular_runtime_s=args.regular_runtime,
        window_s=args.window,
    )
    bench = Bench(args, workload)
    grace = grace_time(args.slurm_conf, args.elastic_partition)
    try:
        without = bench.run_phase(with_daemon=False)
        with_ = bench.run_phase(with_daemon=True)
    except BenchError as exc:
        bench.cleanup()
        print(f"bench-backfill: {exc}", file=sys.stderr)
        return 3
    except BaseException:
        bench.cleanup()
        raise
    extra = [w - wo for w, wo in zip(with_.waits, without.waits, strict=True)]
    allowed = grace + args.interval + 2.0  # +2 s: Slurm's own scheduling passes and whole-second start times
    result: dict[str, Any] = {
        "util_without": round(without.util, 4),
        "util_with": round(with_.util, 4),
        "regular_wait_without_s": round(statistics.fmean(without.waits), 2) if without.waits else 0.0,
        "regular_wait_with_s": round(statistics.fmean(with_.waits), 2) if with_.waits else 0.0,
        "regular_wait_max_without_s": max(without.waits, default=0.0),
        "regular_wait_max_with_s": max(with_.waits, default=0.0),
        "regular_waits_without_s": without.waits,
        "regular_waits_with_s": with_.waits,
        "worst_extra_wait_s": max(extra, default=0.0),
        "allowed_extra_wait_s": allowed,
        "grace_time_s": grace,
        "elastic_gpus_without": round(without.elastic_gpus, 2),
        "elastic_gpus_with": round(with_.elastic_gpus, 2),
        "elastic_drops_with": with_.elastic_drops,
        "grows": with_.grows,
        "shrinks": with_.shrinks,
        "usable_gpus": bench.usable_gpus,
        "window_s": workload.window_s,
        "workdir": str(args.workdir),
    }
    ok = result["worst_extra_wait_s"] <= allowed
    if args.out is not None:
        recording.write(args.out, result)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        rows = [
            ("", "without amoebad", "with amoebad"),
            ("GPU utilization", f"{without.util:.1%}", f"{with_.util:.1%}"),
            ("GPUs held by elastic jobs (mean)", f"{without.elastic_gpus:.1f}", f"{with_.elastic_gpus:.1f}"),
            (
                "regular wait, mean (max)",
                f"{result['regular_wait_without_s']:.1f} s ({result['regular_wait_max_without_s']:.0f} s)",
                f"{result['regular_wait_with_s']:.1f} s ({result['regular_wait_max_with_s']:.0f} s)",
            ),
            ("grow / shrink directives", "-", f"{with_.grows} / {with_.shrinks}"),
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        for row in rows:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        verdict = "holds" if ok else "BROKEN"
        print(
            f"\nno regular job waits longer than without the daemon + GraceTime ({grace} s) + one interval: {verdict} "
            f"(worst extra wait {result['worst_extra_wait_s']:.0f} s of {allowed:.0f} s allowed)"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
