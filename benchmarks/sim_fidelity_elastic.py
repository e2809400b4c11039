"""The elastic replay: amoebad on a real Slurm cluster against the simulator's run of the same policy.

``scripts/bench-sim-fidelity --elastic`` runs :func:`main`. It draws a workload of rigid sleep jobs (1-4 GPUs, like
:mod:`benchmarks.sim_fidelity`) and elastic jobs of known work (:mod:`benchmarks.replay_worker`: ``steps`` steps of
``t1 / n ** alpha`` seconds at ``n`` workers, 1..4 workers of one GPU, submitted with ``amoeba-sbatch``), and runs
it two or three times on a PRIVATE local cluster (:data:`PRIVATE_CLUSTER`: ``scripts/slurm-cluster`` with its own
directory, subnet, bridge, namespaces and ports, so that nobody else's jobs share it and its ``down`` never touches
the shared one):

1. ``rigid``: no daemon; every elastic job runs at its minimum (the cluster as it is today);
2. ``elastic``: amoebad with its default policy (``elastic-backfill``) and default settings (interval 5 s), on the
   cluster's own GraceTime;
3. ``admission`` (with ``--admission``): the same daemon with ``admission.enabled`` (docs/admin.md, section 8c):
   elastic jobs are submitted with ``AMOEBA_ADMISSION_DELAY_S`` (:data:`ADMISSION_DELAY_S`) and held until their
   requested size (4 workers) is free or lendable.

amoebad runs as its own unprivileged user (:data:`DAEMON_USER`, whose uid the jobs' agents are told to trust), as a
site runs it; for admission that user gets ``AdminLevel=Administrator`` in the private cluster's accounting.

From each live run it measures what the simulator must be told (none of it is invented): a rigid job's launch
overhead (its run time minus its sleep), an elastic job's start latency (Slurm start -> first step) and exit
latency (last step -> Slurm end), the agent's registration with the daemon, the grow lag (the daemon's grow
directive -> first step at the new size) and the switch pause (the step gap at a resize beyond the old step time);
their medians go into that run's simulation (:func:`costs_from`). Then it simulates both runs with the ``slurm``
policy (the cluster's slurm.conf, 1 s interval: its ``bf_interval``), the second with the ``amoebad`` policy (the
daemon's elastic backfill on top of the same Slurm model), the third with its admission layer too (the simulator's
admission, elastic jobs requesting their maximum), and compares per job: JCT and start error, pairwise start order,
resizes, mean/p50/p99 JCT and queueing, and the gain of each run over the rigid one, live and simulated. Prints a
table, writes JSON and a PNG.

``--short`` runs every step of that on jobs a tenth as long with the daemon's interval at
:data:`SHORT_INTERVAL_S` (the test command's run, which keeps the benchmark working; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import math
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks.record import Recording
from benchmarks.system_users import system_user
from slurm_amoeba.policy import make_policy
from slurm_amoeba.sim.engine import SimConfig, Simulator, WorkModel
from slurm_amoeba.sim.metrics import SimResult, percentile
from slurm_amoeba.sim.slurmconf import read_slurm_conf
from slurm_amoeba.sim.workload import JobSpec
from slurm_amoeba.slurm.runner import run_command

REPO = Path(__file__).resolve().parents[1]

#: The private cluster's settings for ``scripts/slurm-cluster`` (beside the shared instance's defaults).
PRIVATE_CLUSTER = {
    "AMOEBA_CLUSTER_DIR": "/tmp/slurm-amoeba-replay",
    "AMOEBA_CLUSTER_SUBNET": "10.78.0",
    "AMOEBA_CLUSTER_BRIDGE": "amoeba1",
    "AMOEBA_CLUSTER_NS_PREFIX": "amoebr-",
    "AMOEBA_CLUSTER_VETH": "amr-",
    "AMOEBA_CLUSTER_CTLD_PORT": "6837",
    "AMOEBA_CLUSTER_DBD_PORT": "6839",
    "AMOEBA_CLUSTER_DB_PORT": "33062",
}
#: Where the private cluster's nodes reach the daemon.
DAEMON_ENDPOINT = "tcp://10.78.0.1:6840"
#: The unprivileged user amoebad runs as (created as a system user when missing, as the e2e tests create theirs).
DAEMON_USER = "amoeba-replayd"
#: ``AMOEBA_ADMISSION_DELAY_S`` of the admission run: docs/admin.md's example, the daemon's 5 s interval plus a
#: squeue call with room for a slow round on the loaded machine.
ADMISSION_DELAY_S = 10
#: amoebad's default round interval (s), the live runs' unless ``--short``: a grow is ordered on average half of it
#: after GPUs fall idle, which the simulator (deciding every second, Slurm's bf_interval) adds to the measured lag
#: from directive to new size.
DAEMON_INTERVAL_S = 5.0
#: The daemon's round interval in the short mode (s).
SHORT_INTERVAL_S = 1.0


@dataclasses.dataclass(frozen=True)
class Mode:
    """One kind of live run.

    Attributes:
        label: its name in the tables and in ``live.json``.
        daemon: amoebad runs (elastic jobs ask for 1..4 workers; else 1..1).
        admission: with ``admission.enabled`` (and the submission delay).
    """

    label: str
    daemon: bool
    admission: bool = False


#: The runs, in the order they are recorded.
MODES = {mode.label: mode for mode in (Mode("rigid", False), Mode("elastic", True), Mode("admission", True, True))}
#: The step time of every elastic job on one worker (s).
T1 = 1.0
MAX_WORKERS = 4


@dataclasses.dataclass(frozen=True)
class ReplayJob:
    """One job of the replay.

    Attributes:
        name: unique name (``r<i>`` rigid, ``e<i>`` elastic).
        offset: submit second after the replay's start.
        gpus: a rigid job's GPUs; 1 (its minimum) for an elastic job.
        limit_min: time limit in minutes.
        sleep_s: a rigid job's sleep (0 for an elastic job).
        steps: an elastic job's steps (0 for a rigid job).
        alpha: an elastic job's scaling exponent.
    """

    name: str
    offset: float
    gpus: int
    limit_min: int
    sleep_s: int = 0
    steps: int = 0
    alpha: float = 1.0

    @property
    def elastic(self) -> bool:
        return self.steps > 0


#: The short mode's sizes (``--short``): rigid sleeps and elastic steps a tenth of a full replay's.
SHORT_SCALE = 0.1


def draw_workload(rigid: int, elastic: int, seed: int, spread_s: float, scale: float = 1.0) -> list[ReplayJob]:
    """The replay's jobs in submit order: rigid sleeps of 10-60 s, elastic jobs of 60-180 s of work at one worker;
    with ``scale`` both times that (at least one second or step)."""
    rng = random.Random(seed)
    jobs = []
    for index in range(rigid):
        sleep = max(1, round(rng.randint(10, 60) * scale))
        limit = max(1, -(-sleep * rng.choice((1, 2, 3)) // 60))
        jobs.append(ReplayJob(f"r{index}", rng.uniform(0, spread_s), rng.choice((1, 1, 2, 2, 3, 4)), limit, sleep))
    for index in range(elastic):
        steps = max(1, round(rng.randint(60, 180) * scale))
        limit = -(-int(steps * T1 * 2 + 60) // 60)  # twice the work at the minimum, plus a minute for start-up
        jobs.append(
            ReplayJob(f"e{index}", rng.uniform(0, spread_s), 1, limit, steps=steps, alpha=rng.choice((0.6, 0.8, 1.0)))
        )
    return sorted(jobs, key=lambda job: job.offset)


@dataclasses.dataclass
class LiveJob:
    """What the cluster did with one job (Unix seconds)."""

    job_id: str
    submit: float = math.nan
    start: float = math.nan
    end: float = math.nan
    steps_at: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    done_at: float = math.nan


class Live:
    """One live run of the workload on the private cluster."""

    def __init__(
        self, workload: Sequence[ReplayJob], workdir: Path, mode: Mode, interval_s: float = DAEMON_INTERVAL_S
    ) -> None:
        self.workload = workload
        self.workdir = workdir
        self.mode = mode
        self.interval_s = interval_s
        conf = Path(PRIVATE_CLUSTER["AMOEBA_CLUSTER_DIR"]) / "etc" / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(conf), "TZ": "UTC"}
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["PYTHONPATH"] = f"{REPO}{os.pathsep}{self.env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
        for name in ("AMOEBA_DAEMON_ENDPOINT", "AMOEBA_DAEMON_UID", "AMOEBA_ADMISSION_DELAY_S"):
            self.env.pop(name, None)
        if mode.daemon:
            self.env["AMOEBA_DAEMON_ENDPOINT"] = DAEMON_ENDPOINT
            self.env["AMOEBA_DAEMON_UID"] = str(system_user(DAEMON_USER))  # the agents trust the daemon's own user only
        if mode.admission:
            self.env["AMOEBA_ADMISSION_DELAY_S"] = str(ADMISSION_DELAY_S)
        self.conf = conf
        self.ids: dict[str, str] = {}

    def run(self) -> dict[str, LiveJob]:
        """Submit every job at its time, wait for the cluster to empty, read what happened."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        daemon = self._start_daemon() if self.mode.daemon else None
        try:
            self._submit_all()
            self._wait_empty(timeout_s=max(job.offset for job in self.workload) + 900)
        finally:
            if daemon is not None:
                daemon.terminate()
                daemon.wait(30)
        time.sleep(3)  # slurmdbd records the last ends
        return self._read()

    def _start_daemon(self) -> subprocess.Popen[bytes]:
        """amoebad as :data:`DAEMON_USER` (its state in a directory of its own), with admission when the mode says."""
        uid = system_user(DAEMON_USER)
        state = self.workdir / "amoebad-state"
        state.mkdir(exist_ok=True)
        os.chown(state, uid, -1)
        self.workdir.chmod(0o755)  # the daemon reads its configuration here
        config: dict[str, Any] = {
            "interval_s": self.interval_s,
            "listen": DAEMON_ENDPOINT,
            "metrics": {"port": 0},
            "partitions": {"regular": ["batch"], "elastic": "elastic"},
            "slurm": {"conf": str(self.conf)},
            "state_file": str(state / "state.json"),
        }
        if self.mode.admission:
            grant_admin(self.env)
            config["admission"] = {"enabled": True}
        (self.workdir / "amoebad.yaml").write_text(yaml.safe_dump(config))
        python, site_packages = daemon_python()
        env = {**self.env, "PYTHONPATH": f"{REPO}{os.pathsep}{site_packages}"}
        daemon = [python, "-m", "slurm_amoeba.cli.amoebad", "--config", str(self.workdir / "amoebad.yaml")]
        with (self.workdir / "amoebad.log").open("wb") as log:
            proc = subprocess.Popen(
                ["runuser", "-u", DAEMON_USER, "--", *daemon], stdout=log, stderr=subprocess.STDOUT, env=env
            )
        deadline = time.monotonic() + 30
        while "listening on" not in (self.workdir / "amoebad.log").read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"amoebad did not start; see {self.workdir / 'amoebad.log'}")
            time.sleep(0.5)
        return proc

    def _argv(self, job: ReplayJob) -> list[str]:
        common = ["-J", job.name, "-t", str(job.limit_min), f"--output={self.workdir}/{job.name}-%j.out"]
        if not job.elastic:
            return ["sbatch", "--parsable", *common, f"--gres=gpu:{job.gpus}", "--wrap", f"sleep {job.sleep_s}"]
        worker = [sys.executable, str(REPO / "benchmarks" / "replay_worker.py")]
        run = " ".join([*worker, "--steps", str(job.steps), "--t1", str(T1), "--alpha", str(job.alpha)])
        top = MAX_WORKERS if self.mode.daemon else 1
        return ["amoeba-sbatch", "--elastic", f"1:{top}", *common, f"--wrap=exec amoeba-run {run}"]

    def _submit_all(self) -> None:
        started = time.monotonic()
        for job in self.workload:
            time.sleep(max(0.0, job.offset - (time.monotonic() - started)))
            done = run_command(self._argv(job), env=self.env, timeout=60, cwd=str(self.workdir))
            match = re.search(r"^([0-9]+)", done.stdout.strip(), re.MULTILINE)
            if match is None:
                raise RuntimeError(f"job {job.name}: no job id in {done.stdout!r}")
            self.ids[job.name] = match.group(1)

    def _wait_empty(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while run_command(["squeue", "-h", "-o", "%i"], env=self.env, timeout=30).stdout.strip():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the private cluster still runs jobs after {timeout_s:.0f} s")
            time.sleep(2)

    def _read(self) -> dict[str, LiveJob]:
        fields = "JobID,Submit,Start,End,State"
        listed = run_command(
            ["sacct", "-a", "-X", "-n", "-P", "-o", fields, "-j", ",".join(self.ids.values())], env=self.env, timeout=60
        ).stdout
        times: dict[str, tuple[float, float, float]] = {}
        for line in listed.splitlines():
            job_id, submit, start, end, _ = line.split("|")
            if job_id.endswith("+1"):
                continue
            times[job_id.removesuffix("+0")] = (_stamp(submit), _stamp(start), _stamp(end))
        result = {}
        for name, job_id in self.ids.items():
            live = LiveJob(job_id, *times[job_id])
            for log in sorted((self.workdir / f"amoeba-{job_id}").glob("worker-*.log")):
                for line in log.read_text(errors="replace").splitlines():
                    words = line.split()
                    if len(words) == 4 and words[0] == "REPLAY":
                        live.steps_at.append((float(words[1]), int(words[2])))
                    elif len(words) == 2 and words[0] == "REPLAY-DONE":
                        live.done_at = float(words[1])
            live.steps_at.sort()
            result[name] = live
        return result


def daemon_python() -> tuple[str, str]:
    """An interpreter :data:`DAEMON_USER` may run, of this one's version, and this environment's site-packages.

    A virtual environment's interpreter often lives under ``/root`` (pyenv), which no other user may enter; the
    system's ``pythonX.Y`` of the same version runs the same compiled packages, read from the venv.
    """
    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")
    if found is None:
        raise RuntimeError(f"no {name} outside the virtual environment for the daemon's user {DAEMON_USER}")
    return found, sysconfig.get_paths()["purelib"]


def grant_admin(env: Mapping[str, str]) -> None:
    """Give :data:`DAEMON_USER` ``AdminLevel=Administrator`` in the private cluster's accounting, what admission needs
    (docs/admin.md, section 8c: Slurm lets only administrators write the ``AdminComment`` that keeps its hold marks);
    added under the ``root`` account if it is not a user there yet."""
    show = ["sacctmgr", "-n", "-P", "show", "user", DAEMON_USER, "format=User,AdminLevel"]
    shown = run_command(show, env=env, timeout=60).stdout.strip()
    if not shown:
        add = ["sacctmgr", "-i", "add", "user", DAEMON_USER, "account=root", "adminlevel=Administrator"]
        run_command(add, env=env, timeout=60)
    elif not shown.endswith("|Administrator"):
        modify = ["sacctmgr", "-i", "modify", "user", DAEMON_USER, "set", "adminlevel=Administrator"]
        run_command(modify, env=env, timeout=60)


def _stamp(text: str) -> float:
    """A sacct time (UTC, the harness sets TZ) as Unix seconds; NaN for Unknown/None."""
    try:
        return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.timezone.utc).timestamp()
    except ValueError:
        return math.nan


def daemon_decisions(log: Path) -> list[tuple[float, str, str, int, int]]:
    """(Unix time, job id, grow/shrink, from, to) of every directive in amoebad's log."""
    found = []
    pattern = re.compile(r"^(\S+ \S+) INFO +\[daemon/actuator\] job ([0-9]+): (grow|shrink) ([0-9]+) -> ([0-9]+) ")
    for line in log.read_text(errors="replace").splitlines():
        match = pattern.match(line)
        if match:
            stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            when = stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
            found.append((when, match.group(2), match.group(3), int(match.group(4)), int(match.group(5))))
    return found


def admission_events(log: Path) -> list[tuple[float, str, str]]:
    """(Unix time, job id, held/released/starved/admitted) of every admission decision in amoebad's log."""
    found = []
    pattern = re.compile(
        r"^(\S+ \S+) INFO +\[daemon/admission\] job ([0-9]+) \(user \S+\) "
        r"(held|released after [0-9]+ s|admitted): (.*)$"
    )
    for line in log.read_text(errors="replace").splitlines():
        match = pattern.match(line)
        if match:
            stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            when = stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
            action = match.group(3).split()[0]
            if action == "released" and "admission.max_hold_s" in match.group(4):
                action = "starved"
            found.append((when, match.group(2), action))
    return found


def het_start_failures(job_ids: Sequence[str]) -> int:
    """How often Slurm deallocated one of these heterogeneous jobs at its start and requeued it (slurmctld's log of
    the private cluster: a component could not start, e.g. on GPUs a preempted satellite still held)."""
    path = Path(PRIVATE_CLUSTER["AMOEBA_CLUSTER_DIR"]) / "log" / "slurmctld.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    failed = re.findall(r"Deallocate JobId=([0-9]+)\+0\([0-9]+\) due to hetjob start failure", text)
    wanted = set(job_ids)
    return sum(1 for job_id in failed if job_id in wanted)


def daemon_registrations(log: Path) -> dict[str, float]:
    """Job id -> Unix time of its agent's registration with amoebad (from its log)."""
    found = {}
    pattern = re.compile(r"^(\S+ \S+) INFO +\[daemon/api\] job ([0-9]+) \(user \S+\) registered")
    for line in log.read_text(errors="replace").splitlines():
        match = pattern.match(line)
        if match:
            stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            found[match.group(2)] = stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
    return found


def measure(
    workload: Sequence[ReplayJob],
    live: Mapping[str, LiveJob],
    decisions: Sequence[tuple[float, str, str, int, int]],
    registrations: Mapping[str, float],
) -> dict[str, list[float]]:
    """The costs the simulator must be told, measured on the live run (one value per job or event)."""
    by_name = {job.name: job for job in workload}
    out: dict[str, list[float]] = {"rigid_overhead_s": [], "start_latency_s": [], "exit_latency_s": []}
    out.update({"grow_lag_s": [], "switch_pause_s": [], "size_changes": [], "registration_s": [], "time_to_max_s": []})
    names = {record.job_id: name for name, record in live.items()}
    for job_id, when in registrations.items():
        if job_id in names:
            out["registration_s"].append(when - live[names[job_id]].start)
    for name, record in live.items():
        job = by_name[name]
        if not job.elastic:
            out["rigid_overhead_s"].append(record.end - record.start - job.sleep_s)
            continue
        if record.steps_at:
            out["start_latency_s"].append(record.steps_at[0][0] - record.start)
        if not math.isnan(record.done_at):
            out["exit_latency_s"].append(record.end - record.done_at)
        at_max = [when for when, size in record.steps_at if size >= MAX_WORKERS]
        if at_max:
            out["time_to_max_s"].append(at_max[0] - record.start)
        changes = [(a, b) for a, b in itertools.pairwise(record.steps_at) if a[1] != b[1]]
        out["size_changes"].append(float(len(changes)))
        for before, after in changes:
            out["switch_pause_s"].append(after[0] - before[0] - T1 / before[1] ** job.alpha)
    for when, job_id, kind, old, _ in decisions:
        grown = live[names[job_id]] if job_id in names else None
        if kind != "grow" or grown is None:
            continue
        later = [t for t, n in grown.steps_at if t > when and n > old]
        if later:
            out["grow_lag_s"].append(later[0] - when)
    return out


class ReplayWorkModel(WorkModel):
    """An elastic job of the replay: its start latency, its work, its exit latency, one epoch each.

    The first and last epochs progress at one unit a second whatever the size (Slurm start -> first step, last step
    -> Slurm end: Python, torch and the rendezvous, then the workers' and agent's exit); the middle one, ``work``
    seconds at one worker, at ``n ** alpha`` on ``n`` workers, the step time the job really has.
    """

    def __init__(self, start_s: float, work_s: float, exit_s: float, alpha: float) -> None:
        super().__init__(start_s + work_s + exit_s, 1, alpha)
        self.epoch_ends = [start_s, start_s + work_s, start_s + work_s + exit_s]

    def rate(self, placement: tuple[int, ...], epoch: int, micro_batch: int | None) -> float:
        return super().rate(placement, epoch, micro_batch) if epoch == 1 else 1.0


def simulate(
    workload: Sequence[ReplayJob],
    submits: Mapping[str, float],
    costs: Mapping[str, float],
    conf: Path,
    elastic: bool,
    admission: Mapping[str, object] | None = None,
) -> SimResult:
    """The workload through the ``slurm`` policy (the ``amoebad`` policy, the daemon on top, when ``elastic``).

    Args:
        workload: the jobs.
        submits: each job's submit second as the live run recorded it (relative to the first submission).
        costs: the measured costs (:func:`costs_from`).
        conf: the cluster's slurm.conf.
        elastic: elastic jobs get 1..4 workers and the ``amoebad`` policy grows them; else they keep one.
        admission: with ``elastic``, the simulator's admission: these knobs on top (:data:`ADMISSION_KNOBS`), elastic
            jobs request their maximum (what the live daemon admits them at) and become eligible
            :data:`ADMISSION_DELAY_S` after their submission (``--begin``; :func:`compare` counts their JCT from the
            submission).
    """
    site = read_slurm_conf(conf)
    specs = []
    for job in sorted(workload, key=lambda job: submits[job.name]):
        top = MAX_WORKERS if elastic and job.elastic else job.gpus
        request = top if admission is not None else job.gpus
        delay = ADMISSION_DELAY_S if admission is not None and job.elastic else 0.0
        duration = job.steps * T1 if job.elastic else job.sleep_s + costs["rigid_overhead_s"]
        specs.append(
            JobSpec(
                job.name,
                submits[job.name] + delay,
                request,
                duration=duration,
                min_workers=job.gpus,
                max_workers=top,
                time_limit=job.limit_min * 60.0,
                partition="batch",
            )
        )
    alphas = {job.name: job.alpha for job in workload if job.elastic}

    def models(spec: JobSpec) -> WorkModel:
        if spec.name not in alphas:
            return WorkModel(spec.duration, spec.requested_workers)
        return ReplayWorkModel(costs["start_latency_s"], spec.duration, costs["exit_latency_s"], alphas[spec.name])

    config = SimConfig(
        nodes=site.nodes or 4,
        gpus_per_node=site.gpus_per_node or 4,
        interval=1.0,
        restart_cost=0.0,
        resize_cost=max(0.0, costs["switch_pause_s"]),
        grow_lag=costs["grow_lag_s"],
        start_grow_lag=costs["start_grow_lag_s"],
        grace_time=site.grace_time,
    )
    policy = (
        make_policy("amoebad", **site.knobs, **(admission or {})) if elastic else make_policy("slurm", **site.knobs)
    )
    return Simulator(specs, policy, config, models).run()


#: The simulator's counterpart of ``admission.enabled`` (benchmarks/sim_study.py's ``ADMIT_SETUP``).
ADMISSION_KNOBS: Mapping[str, object] = {"admission": True}
#: The same as the live daemon lends: a job Slurm starts may take any satellite, not only the loans above requests
#: (live, every satellite runs in the preemptible partition; ``admission.slurm_takes_loans_only`` is not built live).
ADMISSION_KNOBS_AS_LIVE: Mapping[str, object] = {**ADMISSION_KNOBS, "admission.slurm_takes_loans_only": False}


def costs_from(measured: Mapping[str, Sequence[float]], interval_s: float = DAEMON_INTERVAL_S) -> dict[str, float]:
    """The medians of the measured costs, in the form :func:`simulate` takes.

    ``grow_lag_s`` is the lag from the daemon's directive to the first step at the new size plus half the daemon's
    interval (``interval_s``, the live runs'); ``start_grow_lag_s`` is how long after its first step a job started
    on idle GPUs trains at its minimum (registration + half an interval + the grow lag - the start latency): the
    simulator starts such a job at its larger size at once, the engine then charges the equivalent pause
    (``SimConfig.start_grow_lag``).
    """

    def median(key: str) -> float:
        values = measured.get(key, [])
        return float(statistics.median(values)) if values else 0.0

    grow = median("grow_lag_s")
    half = interval_s / 2 if measured.get("grow_lag_s") else 0.0  # no daemon, no grow: nothing to add
    return {
        "rigid_overhead_s": median("rigid_overhead_s"),
        "start_latency_s": median("start_latency_s"),
        "exit_latency_s": median("exit_latency_s"),
        "switch_pause_s": median("switch_pause_s"),
        "grow_lag_s": grow + half,
        "start_grow_lag_s": max(0.0, median("registration_s") + half + grow - median("start_latency_s")),
    }


def run_stats(rows: Sequence[Mapping[str, Any]], side: str) -> dict[str, float]:
    """Mean, p50 and p99 JCT, mean queueing (submission to Slurm's start), and the rigid jobs' mean queueing of one
    side (``live`` or ``sim``) of :func:`compare`'s per-job rows."""
    jcts = [row[f"{side}_jct_s"] for row in rows]
    waits = [row[f"{side}_start_s"] - row["submit_s"] for row in rows]
    rigid = [wait for wait, row in zip(waits, rows, strict=True) if not row["elastic"]]
    return {
        "mean_jct_s": statistics.fmean(jcts),
        "p50_jct_s": percentile(jcts, 0.5),
        "p99_jct_s": percentile(jcts, 0.99),
        "mean_queue_s": statistics.fmean(waits),
        "rigid_mean_wait_s": statistics.fmean(rigid) if rigid else math.nan,
    }


def compare(
    workload: Sequence[ReplayJob], live: Mapping[str, LiveJob], result: SimResult, elastic_delay_s: float = 0.0
) -> dict[str, Any]:
    """Per-job JCT and start errors, pairwise start order and means of one live run against its simulation.

    ``elastic_delay_s``: the simulated elastic jobs were submitted this much later (:func:`simulate`'s admission
    delay); their JCT and queueing count from the live submission, as the live ones do.
    """
    origin = min(record.submit for record in live.values())
    simulated = {record.name: record for record in result.jobs}
    rows = []
    for job in workload:
        rec, sim = live[job.name], simulated[job.name]
        if sim.jct is None or sim.first_start is None or math.isnan(rec.end):
            continue
        live_start, sim_start = rec.start - origin, sim.first_start
        sim_jct = sim.jct + (elastic_delay_s if job.elastic else 0.0)
        rows.append((job.name, rec.end - rec.submit, sim_jct, live_start, sim_start, job.elastic, rec.submit - origin))
    pairs = list(itertools.combinations(rows, 2))
    agree = sum(1 for a, b in pairs if (a[3] - b[3]) * (a[4] - b[4]) > 0 or (a[3] == b[3] and a[4] == b[4]))
    jct_rel = [abs(sim / rec - 1) for _, rec, sim, *_ in rows]
    start_abs = [abs(s - r) for *_, r, s, _, _ in rows]
    live_mean = statistics.fmean(r[1] for r in rows)
    sim_mean = statistics.fmean(r[2] for r in rows)
    per_job = [
        {"name": n, "elastic": e, "live_jct_s": lj, "sim_jct_s": sj, "live_start_s": ls, "sim_start_s": ss}
        | {"submit_s": sub}
        for n, lj, sj, ls, ss, e, sub in rows
    ]
    return {
        "jobs": len(rows),
        "live_mean_jct_s": live_mean,
        "sim_mean_jct_s": sim_mean,
        "mean_jct_error": sim_mean / live_mean - 1,
        "jct_abs_error_median": percentile(jct_rel, 0.5),
        "jct_abs_error_p90": percentile(jct_rel, 0.9),
        "jct_abs_error_max": max(jct_rel),
        "start_abs_error_median_s": percentile(start_abs, 0.5),
        "start_abs_error_p90_s": percentile(start_abs, 0.9),
        "start_abs_error_max_s": max(start_abs),
        "pairs": len(pairs),
        "pairs_agreeing": agree / len(pairs) if pairs else 1.0,
        "sim_resizes": sum(record.resizes for record in result.jobs),
        "live": run_stats(per_job, "live"),
        "sim": run_stats(per_job, "sim"),
        "per_job": per_job,
    }


def plot(figures: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    """Per-job JCT, live against simulated, for both runs (rigid jobs dots, elastic jobs crosses)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(figures), figsize=(5.5 * len(figures), 5), squeeze=False)
    for ax, (label, run) in zip(axes[0], figures.items(), strict=True):
        rows = run["per_job"]
        top = max(max(r["live_jct_s"], r["sim_jct_s"]) for r in rows) * 1.05
        ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
        for elastic, marker in ((False, "o"), (True, "x")):
            chosen = [r for r in rows if r["elastic"] is elastic]
            ax.scatter(
                [r["live_jct_s"] for r in chosen],
                [r["sim_jct_s"] for r in chosen],
                marker=marker,
                label="elastic jobs" if elastic else "rigid jobs",
            )
        ax.set_title(f"{label}: mean JCT {run['live_mean_jct_s']:.0f} s live, {run['sim_mean_jct_s']:.0f} s sim")
        ax.set_xlabel("JCT on the cluster (s)")
        ax.set_ylabel("JCT simulated (s)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _live_to_json(live: Mapping[str, LiveJob]) -> dict[str, Any]:
    return {name: dataclasses.asdict(record) for name, record in live.items()}


def _live_from_json(data: Mapping[str, Any]) -> dict[str, LiveJob]:
    return {
        name: LiveJob(**{**record, "steps_at": [tuple(step) for step in record["steps_at"]]})
        for name, record in data.items()
    }


def private_cluster(action: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``scripts/slurm-cluster ACTION`` on the private instance (never the shared one)."""
    env = {**os.environ, **PRIVATE_CLUSTER}
    script = str(REPO / "scripts" / "slurm-cluster")
    capture = action == "status"
    return subprocess.run([script, action], env=env, capture_output=capture, text=True, check=check, timeout=300)


def ensure_private_cluster() -> bool:
    """Start the private cluster when it is not up; True when this call started it (its caller then stops it)."""
    if private_cluster("status", check=False).returncode == 0:
        return False
    private_cluster("up")
    return True


def record_runs(args: argparse.Namespace, labels: Sequence[str], saved: dict[str, Any]) -> dict[str, Any]:
    """The live runs of ``labels`` not in ``saved`` yet, in that order, saved to ``WORKDIR/live.json`` as they end."""
    workload = [ReplayJob(**job) for job in saved["workload"]]
    interval = saved.setdefault("daemon_interval_s", DAEMON_INTERVAL_S)
    saved.setdefault("load", {})
    for label in labels:
        if label in saved:
            continue
        saved["load"][f"{label}_before"] = os.getloadavg()
        print(f"[replay] {label} run: {len(workload)} jobs, load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
        live = Live(workload, args.workdir / label, MODES[label], interval).run()
        saved[label] = _live_to_json(live)
        saved["load"][f"{label}_after"] = os.getloadavg()
        (args.workdir / "live.json").write_text(json.dumps(saved, indent=1) + "\n")
    return saved


def admission_summary(
    workload: Sequence[ReplayJob], live: Mapping[str, LiveJob], events: Sequence[tuple[float, str, str]]
) -> dict[str, Any]:
    """What admission did live: how many elastic jobs it held, released (their requested size free or lendable),
    released by the bound, admitted without a hold, how long the holds lasted, holds never released, and whether the
    released and admitted jobs then grew to their requested size (growth after release) and how soon after their
    Slurm start."""
    held: dict[str, float] = {}
    ended: dict[str, tuple[float, str]] = {}
    admitted: set[str] = set()
    for when, job_id, action in events:
        if action == "held":
            held.setdefault(job_id, when)
        elif action in ("released", "starved"):
            ended.setdefault(job_id, (when, action))
        else:
            admitted.add(job_id)
    elastic = {live[job.name].job_id: live[job.name] for job in workload if job.elastic}
    let_go = [job_id for job_id in elastic if job_id in admitted or ended.get(job_id, (0.0, ""))[1] == "released"]
    to_max = {}
    for job_id in let_go:
        at_max = [when for when, size in elastic[job_id].steps_at if size >= MAX_WORKERS]
        if at_max:
            to_max[job_id] = at_max[0] - elastic[job_id].start
    return {
        "elastic_jobs": len(elastic),
        "held": len(held),
        "released": sum(1 for _, action in ended.values() if action == "released"),
        "starved": sum(1 for _, action in ended.values() if action == "starved"),
        "admitted_unheld": len(admitted - set(held)),
        "never_released": sorted(set(held) - set(ended)),
        "hold_s": _spread([ended[job_id][0] - since for job_id, since in held.items() if job_id in ended]),
        "let_go": len(let_go),
        "grown_to_request": len(to_max),
        "not_grown": sorted(set(let_go) - set(to_max)),
        "start_to_request_s": _spread(list(to_max.values())),
    }


def _simulated(
    workload: Sequence[ReplayJob],
    live: Mapping[str, LiveJob],
    mode: Mode,
    costs: Mapping[str, Mapping[str, float]],
    conf: Path,
) -> tuple[dict[str, Any], float]:
    """One live run against its simulation (with its own costs), and the simulated mean JCT with the elastic run's
    costs (the simulator's claim when it is told one set of costs for every run)."""
    origin = min(record.submit for record in live.values())
    submits = {name: record.submit - origin for name, record in live.items()}
    knobs = ADMISSION_KNOBS if mode.admission else None
    delay = float(ADMISSION_DELAY_S) if mode.admission else 0.0
    result = simulate(workload, submits, costs[mode.label], conf, elastic=mode.daemon, admission=knobs)
    figures = compare(workload, live, result, delay)
    if mode.admission:
        as_live = simulate(workload, submits, costs[mode.label], conf, elastic=True, admission=ADMISSION_KNOBS_AS_LIVE)
        figures["sim_as_live"] = compare(workload, live, as_live, delay)["sim"]
    shared = simulate(workload, submits, costs.get("elastic", costs[mode.label]), conf, mode.daemon, knobs)
    return figures, statistics.fmean((record.jct or math.nan) for record in shared.jobs)


def evaluate(saved: Mapping[str, Any], workdir: Path, conf: Path) -> dict[str, Any]:
    """Measure each run's costs on itself, simulate every run, compare."""
    workload = [ReplayJob(**job) for job in saved["workload"]]
    runs = {label: _live_from_json(saved[label]) for label in MODES if label in saved}
    measured, directives, admissions = {}, {}, {}
    for label, live in runs.items():
        log = workdir / label / "amoebad.log"
        daemon = MODES[label].daemon and log.exists()
        decisions = daemon_decisions(log) if daemon else []
        measured[label] = measure(workload, live, decisions, daemon_registrations(log) if daemon else {})
        grows = sum(1 for decision in decisions if decision[2] == "grow")
        directives[label] = {"grow": grows, "shrink": len(decisions) - grows}
        if MODES[label].admission and daemon:
            admissions[label] = admission_summary(workload, live, admission_events(log))
    interval = saved.get("daemon_interval_s", DAEMON_INTERVAL_S)
    costs = {label: costs_from(values, interval) for label, values in measured.items()}
    figures: dict[str, Any] = {}
    same_costs: dict[str, float] = {}
    for label, live in runs.items():
        figures[label], same_costs[label] = _simulated(workload, live, MODES[label], costs, conf)
    gains: dict[str, dict[str, float]] = {}
    for label in runs:
        for base in ("rigid", "elastic"):
            if base in runs and list(MODES).index(base) < list(MODES).index(label):
                gains[f"{label} vs {base}"] = {
                    "live": figures[label]["live_mean_jct_s"] / figures[base]["live_mean_jct_s"] - 1,
                    "sim": figures[label]["sim_mean_jct_s"] / figures[base]["sim_mean_jct_s"] - 1,
                    "sim_elastic_costs": same_costs[label] / same_costs[base] - 1,
                }
    summary = {
        "jobs": len(workload),
        "elastic_jobs": sum(1 for job in workload if job.elastic),
        "costs": costs,
        "measured": {label: {key: _spread(values) for key, values in m.items()} for label, m in measured.items()},
        "live_directives": directives,
        "live_size_changes": {label: int(sum(m["size_changes"])) for label, m in measured.items()},
        "het_start_failures": {
            label: het_start_failures([record.job_id for record in live.values()]) for label, live in runs.items()
        },
        "sim_resizes": {label: run["sim_resizes"] for label, run in figures.items()},
        "admission": admissions,
        "gains": gains,
        "load": saved.get("load", {}),
    }
    return {"summary": summary, "runs": figures}


def _spread(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "median": float(statistics.median(values)),
        "p90": percentile(values, 0.9),
        "min": min(values),
        "max": max(values),
    }


#: The fidelity rows of :func:`table`: label, key of :func:`compare`'s figures, format.
FIDELITY_ROWS = (
    ("mean JCT error", "mean_jct_error", "{:+.1%}"),
    ("per-job |JCT error| median", "jct_abs_error_median", "{:.1%}"),
    ("per-job |JCT error| p90", "jct_abs_error_p90", "{:.1%}"),
    ("per-job |JCT error| max", "jct_abs_error_max", "{:.1%}"),
    ("|start error| median (s)", "start_abs_error_median_s", "{:.1f}"),
    ("|start error| p90 (s)", "start_abs_error_p90_s", "{:.1f}"),
    ("|start error| max (s)", "start_abs_error_max_s", "{:.1f}"),
    ("pairs agreeing", "pairs_agreeing", "{:.1%}"),
)
#: The outcome rows of :func:`table` (live / simulated): label, key of :func:`run_stats`.
OUTCOME_ROWS = (
    ("mean JCT (s)", "mean_jct_s"),
    ("p50 JCT (s)", "p50_jct_s"),
    ("p99 JCT (s)", "p99_jct_s"),
    ("mean queueing (s)", "mean_queue_s"),
    ("rigid jobs' mean wait (s)", "rigid_mean_wait_s"),
)


def table(report: Mapping[str, Any]) -> str:
    """The figures as a text table: a column per run."""
    runs, summary = report["runs"], report["summary"]
    lines = [f"{'live / simulated':<30}" + "".join(f" {label + ' run':>17}" for label in runs)]
    for label, key in OUTCOME_ROWS:
        cells = [f"{run['live'][key]:.1f} / {run['sim'][key]:.1f}" for run in runs.values()]
        lines.append(f"{label:<30}" + "".join(f" {cell:>17}" for cell in cells))
    for label, key, form in FIDELITY_ROWS:
        lines.append(f"{label:<30}" + "".join(f" {form.format(run[key]):>17}" for run in runs.values()))
    for label, run in runs.items():
        if "sim_as_live" in run:
            as_live = run["sim_as_live"]
            lines.append(
                f"{label} run simulated with slurm_takes_loans_only off (as amoebad lends): mean JCT "
                f"{as_live['mean_jct_s']:.1f} s, p99 {as_live['p99_jct_s']:.1f} s, queueing "
                f"{as_live['mean_queue_s']:.1f} s, rigid wait {as_live['rigid_mean_wait_s']:.1f} s"
            )
    for label, dirs in summary["live_directives"].items():
        if MODES[label].daemon:
            lines.append(
                f"{label} run resizes: live {dirs['grow']} grow + {dirs['shrink']} shrink directives "
                f"({summary['live_size_changes'][label]} size changes seen by the jobs), "
                f"simulated {summary['sim_resizes'][label]}"
            )
    for label, adm in summary["admission"].items():
        lines.append(
            f"{label} run: of {adm['elastic_jobs']} elastic jobs {adm['held']} held, {adm['released']} released at "
            f"their request, {adm['starved']} by the bound, {adm['admitted_unheld']} admitted unheld; holds "
            f"{_median_text(adm['hold_s'])}; never released {adm['never_released'] or 'none'}; grown to "
            f"{MAX_WORKERS} workers after admission: {adm['grown_to_request']} of {adm['let_go']} (start -> 4 workers "
            f"{_median_text(adm['start_to_request_s'])}; not grown {adm['not_grown'] or 'none'})"
        )
    failures = summary["het_start_failures"]
    lines.append(
        "heterogeneous jobs whose start failed and were requeued by Slurm (not simulated): "
        + ", ".join(f"{label} run {count}" for label, count in failures.items())
    )
    for name, gain in summary["gains"].items():
        lines.append(
            f"avg-JCT gain, {name}: live {gain['live']:+.1%}, simulated {gain['sim']:+.1%} (each run with its own "
            f"measured costs; {gain['sim_elastic_costs']:+.1%} with the elastic run's costs for all)"
        )
    for label, costs in summary["costs"].items():
        lines.append(
            f"costs measured on the {label} run (medians): "
            + ", ".join(f"{key} {value:.2f}" for key, value in costs.items())
        )
    load = summary["load"]
    lines.append(
        "load average (1 min) before -> after: "
        + ", ".join(
            f"{label} {load[label + '_before'][0]:.1f} -> {load[label + '_after'][0]:.1f}"
            for label in runs
            if label + "_before" in load
        )
    )
    return "\n".join(lines)


def _median_text(spread: Mapping[str, float]) -> str:
    if not spread.get("n"):
        return "n/a"
    return f"median {spread['median']:.0f} s (range {spread['min']:.0f}-{spread['max']:.0f} s, n={spread['n']:.0f})"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the live replays (or, with ``--from DIR``, reuse them and record only those missing), simulate, print and
    write the figures.

    Returns:
        0 when every run meets the goals (mean JCT within 10%, pairs agreeing >= 90%), 1 otherwise.
    """
    parser = argparse.ArgumentParser(prog="bench-sim-fidelity --elastic", description=__doc__.splitlines()[0])
    parser.add_argument("--rigid", type=int, default=20, help="rigid sleep jobs")
    parser.add_argument("--elastic-jobs", type=int, default=10, help="elastic jobs")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--spread-s", type=float, default=180.0, help="arrivals spread over this many seconds")
    parser.add_argument("--admission", action="store_true", help="a third run: amoebad with admission.enabled")
    parser.add_argument(
        "--short",
        action="store_true",
        help=f"every step of the replay on jobs a tenth as long, the daemon's interval {SHORT_INTERVAL_S:g} s "
        "(keeps the benchmark working; its figures mean nothing)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where jobs write (default: a new /tmp dir)")
    parser.add_argument(
        "--keep-cluster",
        action="store_true",
        help="leave the private cluster up when this run started it (the next seed reuses it); default: stop it",
    )
    parser.add_argument(
        "--from", dest="source", type=Path, default=None, help="reuse the live runs of this workdir (records the rest)"
    )
    parser.add_argument("--json", type=Path, default=Path("bench-sim-fidelity-elastic.json"))
    parser.add_argument("--png", type=Path, default=None, help="the per-job JCT plot (default: beside --json)")
    args = parser.parse_args(argv)
    recording = Recording(f"replay-seed{args.seed}" + ("-admission" if args.admission else ""), vars(args))
    labels = ["rigid", "elastic", "admission"] if args.admission else ["rigid", "elastic"]
    conf = Path(PRIVATE_CLUSTER["AMOEBA_CLUSTER_DIR"]) / "etc" / "slurm.conf"
    if args.source is not None:
        args.workdir = args.source
        saved = json.loads((args.source / "live.json").read_text())
    else:
        args.workdir = args.workdir or Path(f"/tmp/amoeba-replay-{os.getpid()}")
        args.workdir.mkdir(parents=True, exist_ok=True)
        scale = SHORT_SCALE if args.short else 1.0
        workload = draw_workload(args.rigid, args.elastic_jobs, args.seed, args.spread_s, scale)
        interval = SHORT_INTERVAL_S if args.short else DAEMON_INTERVAL_S
        saved = {"workload": [dataclasses.asdict(job) for job in workload], "load": {}, "daemon_interval_s": interval}
    if any(label not in saved for label in labels):
        started = ensure_private_cluster()
        try:
            saved = record_runs(args, labels, saved)
        finally:
            if started and not args.keep_cluster:
                private_cluster("down", check=False)  # its configuration and logs stay for the evaluation
    report = evaluate(saved, args.workdir, conf)
    print(table(report))
    recording.write(args.json, {"workdir": str(args.workdir), **report})
    plot(report["runs"], args.png or args.json.with_suffix(".png"))
    good = all(abs(run["mean_jct_error"]) <= 0.10 and run["pairs_agreeing"] >= 0.90 for run in report["runs"].values())
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
