"""The daemon's loop under the load of a site's agents (``scripts/bench-policy`` without ``--skip-loop``).

The real :class:`~slurm_amoeba.daemon.daemon.Daemon` loop runs on a real ZeroMQ socket over a synthetic Slurm
(:class:`benchmarks.policy.SyntheticSlurm`); every elastic job's agent is simulated and signs its messages with
munge, as at a site:

- **many uids**: run as root, the benchmark gives the elastic jobs to simulated users (uids from
  :data:`UID_BASE` on, ``--agents-per-uid`` jobs each) and forks one process per user that drops to its uid
  (``setgid``/``setuid``) before it makes any munge credential (munge signs with the real uid), so the daemon's
  per-uid limits meet what they meet at a site. The processes are forked before the daemon starts (no thread, no
  ZeroMQ context is forked) and learn its endpoint through a pipe. Run as another user, every agent is that
  user's, in one process;
- each process registers its agents, then reports each of them every ``report_s`` seconds, and follows the
  daemon's directives as an agent does (:class:`OrderedMoves`: it answers with its size, reports the target from
  then on, shrinks at once and waits for satellites to grow), so that an order is given once, not each round; with
  ``--seal ahead`` it signs the window's reports before the window starts (at a site each agent signs on its own
  node: signing them here, during the window, takes cores the daemon and munged are measured on), all but those
  of a job that moved since, which it signs as it sends them;
- one more process of the first simulated user asks ``status`` twice a second, as ``amoebactl status`` does, and
  times the replies while the agents report;
- the daemon's collector is set as amoebad sets it once started (:func:`~slurm_amoeba.cli.amoebad.tune_gc`);
- with ``--front`` the daemon runs with ``front_process`` (:mod:`slurm_amoeba.transport.front`);
- the CPU the daemon's process (every thread of it: the loop, the observer, the actuator), its front process and
  munged spend is sampled while the agents report (:class:`CpuSampler`), so that a run on a machine where the
  simulated agents take most of the cores still says what the daemon itself needs per report and how many reports
  one core of its own would answer (``daemon_cpu_per_report_s``, the front's CPU counted in,
  ``reports_per_daemon_core_s``): at a site the agents run on the job's nodes, not on the daemon's host.

Where the daemon's defaults (:class:`~slurm_amoeba.daemon.config.Limits`: ``agents_per_uid``, ``requests_per_s``,
``burst``) would refuse the load, the benchmark raises them and reports which (``raised_limits``): a site with that
many agents per user sets the same.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import zmq

from slurm_amoeba.cli.amoebad import tune_gc
from slurm_amoeba.core.messages import RETRY_SOON, Message, decode, encode
from slurm_amoeba.daemon.agents import Registration
from slurm_amoeba.daemon.config import AGENT_REPORT_S, AgentSettings, DaemonConfig, Limits
from slurm_amoeba.daemon.daemon import Daemon
from slurm_amoeba.daemon.observer import ClusterSource
from slurm_amoeba.slurm import JobRecord
from slurm_amoeba.transport.channel import ChannelError, ChannelServer, destination, request
from slurm_amoeba.transport.front import FrontChannel
from slurm_amoeba.transport.munge import MAX_AGE_S, seal

#: The first uid of the simulated users (unused on a site's machines: far above the usual ranges).
UID_BASE = 200_000
#: Seconds between two ``status`` requests of the simulated ``amoebactl``.
PROBE_EVERY_S = 0.5
#: How often a simulated agent asks again while the daemon has not read its job from Slurm yet (once a second).
REGISTER_TRIES = 60
#: Requests per second beyond the agents' reports that a user's uid is allowed (amoebactl, retries).
ROOM_PER_S = 10


def _cpu_s(stat_text: str) -> float:
    """utime + stime of a ``/proc/PID/stat`` text, in seconds (fields 14 and 15)."""
    values = stat_text.rsplit(")", 1)[1].split()
    return (int(values[11]) + int(values[12])) / os.sysconf("SC_CLK_TCK")


def munged_cpu_s() -> float:
    """CPU seconds (user + system) spent so far by every ``munged`` process this user may read (0 when none)."""
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                text = stat.read()
            if text.rsplit(")", 1)[0].endswith("(munged"):
                total += _cpu_s(text)
        except (OSError, IndexError, ValueError):
            continue  # a process that ended while it was read
    return total


def process_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) spent so far by process ``pid`` (0 for None or a process that ended)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return _cpu_s(stat.read())
    except (OSError, IndexError, ValueError):
        return 0.0


class CpuSampler:
    """Samples (wall clock, this process's CPU seconds, munged's, the front process's) every ``every_s`` on a
    thread of its own, so that the CPU spent inside any window of the run can be read afterwards (:meth:`spent`).

    Args:
        every_s: seconds between samples.
        front: the daemon's front process's pid, asked at each sample (None: no front).
    """

    def __init__(self, every_s: float = 0.25, front: Callable[[], int | None] = lambda: None) -> None:
        self.every_s = every_s
        self.samples: list[tuple[float, float, float, float]] = []
        self._front = front
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            front = process_cpu_s(self._front())
            self.samples.append((time.time(), time.process_time(), munged_cpu_s(), front))
            if self._stop.wait(self.every_s):
                return

    def spent(self, start: float, end: float) -> tuple[float, float, float, float]:
        """(wall seconds, this process's CPU seconds, munged's, the front's) between the samples nearest inside
        [start, end]; zeros when fewer than two samples lie there."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return 0.0, 0.0, 0.0, 0.0
        first, last = inside[0], inside[-1]
        return last[0] - first[0], last[1] - first[1], last[2] - first[2], last[3] - first[3]


def spread_over_users(
    jobs: Sequence[JobRecord], elastic: Mapping[str, tuple[Registration, int]], per_uid: int
) -> tuple[list[JobRecord], dict[str, int]]:
    """Give the elastic jobs to simulated users, ``per_uid`` each (uids from :data:`UID_BASE`).

    Returns:
        The job records with the elastic jobs' owners changed, and job id -> uid.
    """
    owner = {job_id: UID_BASE + index // max(per_uid, 1) for index, job_id in enumerate(elastic)}
    records = [
        dataclasses.replace(record, uid=owner[str(record.job_id)], user=f"u{owner[str(record.job_id)]}")
        if str(record.job_id) in owner
        else record
        for record in jobs
    ]
    return records, owner


def limits_for(per_uid: int, report_s: float, base: Limits | None = None) -> tuple[Limits, dict[str, float]]:
    """The daemon's limits raised where ``per_uid`` agents of one user reporting every ``report_s`` seconds (and
    registering all at once) would meet them; returns them and what was raised (setting -> new value).

    The rate is what the configuration asks of a site (:data:`~slurm_amoeba.daemon.config.AGENT_REPORT_S`: a real
    agent reports every 2 s) when that is more, so that the raised limits are ones ``amoebad.yaml`` accepts.
    """
    base = base or Limits()
    agents = max(base.agents_per_uid, per_uid)
    rate = max(base.requests_per_s, float(math.ceil(per_uid / min(report_s, AGENT_REPORT_S)) + ROOM_PER_S))
    burst = max(base.burst, per_uid + ROOM_PER_S)
    limits = dataclasses.replace(base, agents_per_uid=agents, requests_per_s=rate, burst=burst)
    raised = {
        key: float(getattr(limits, key))
        for key in ("agents_per_uid", "requests_per_s", "burst")
        if getattr(limits, key) != getattr(base, key)
    }
    return limits, raised


@dataclasses.dataclass
class _Forked:
    """A forked process of one simulated user: its pid, the pipe that gives it the endpoint, the pipe it answers on."""

    pid: int
    go: int
    answer: int

    def start(self, endpoint: str) -> None:
        os.write(self.go, endpoint.encode() + b"\n")
        os.close(self.go)

    def result(self) -> dict[str, Any]:
        chunks = []
        while chunk := os.read(self.answer, 1 << 16):
            chunks.append(chunk)
        os.close(self.answer)
        _, status = os.waitpid(self.pid, 0)
        text = b"".join(chunks).decode()
        if os.waitstatus_to_exitcode(status) != 0 or not text:
            return {"error": f"process {self.pid} exited with {os.waitstatus_to_exitcode(status)}: {text[-500:]}"}
        result: dict[str, Any] = json.loads(text)
        return result


def _fork_as(uid: int, work: Callable[[str], dict[str, Any]]) -> _Forked:
    """Fork a process that becomes ``uid`` (when run as root), waits for the endpoint, runs ``work(endpoint)`` and
    writes its JSON answer back."""
    go_read, go_write = os.pipe()
    answer_read, answer_write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(go_read)
        os.close(answer_write)
        return _Forked(pid, go_write, answer_read)
    code = 1
    try:
        os.close(go_write)
        os.close(answer_read)
        if os.getuid() == 0 and uid != 0:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        with os.fdopen(go_read) as pipe:
            endpoint = pipe.readline().strip()
        answer = json.dumps(work(endpoint)).encode()
        code = 0
    except BaseException as exc:  # the parent reports it; a forked child must never return into the benchmark
        answer = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
    with os.fdopen(answer_write, "wb") as out:
        out.write(answer)
    os._exit(code)


def check_signing_window(duration_s: float, seal_ahead: bool) -> None:
    """Refuse a window of reports signed ahead that outlives their credentials (``MAX_AGE_S``).

    Raises:
        ValueError: what was asked and what to do instead.
    """
    if seal_ahead and duration_s > MAX_AGE_S:
        raise ValueError(
            f"a {duration_s:g} s window of reports signed ahead outlives their credentials ({MAX_AGE_S:g} s, "
            f"MAX_AGE_S): report for {MAX_AGE_S:g} s or less, or sign each report as it is sent"
        )


def report_message(job: Mapping[str, Any], now: float, size: int | None = None, target: int | None = None) -> Message:
    """A simulated agent's report of ``job`` at ``now``: its size (``job["size"]`` unless given), the size it is
    moving to (its size unless given), throughput at every size up to one above it."""
    size = job["size"] if size is None else size
    body = {
        "job_id": job["job_id"],
        "size": size,
        "generation": 1,
        "target": size if target is None else target,
        "throughput": {str(n): 100.0 * n**0.9 for n in range(1, size + 2)},
        "history": [{"t": now, "event": "report"}],
        "satellites": [],
    }
    return Message("report", body)


#: Seconds from a shrink order to the simulated job's smaller size (``scripts/bench-grow`` measures about 0.1 s).
SHRINK_LAG_S = 0.5


class OrderedMoves:
    """The sizes of one simulated user's jobs as their agents follow the daemon's orders, so that an order is
    settled and not given again each round: an agent takes an order at once (its reports show the target from then
    on); a shrink arrives :data:`SHRINK_LAG_S` later; a grow waits for satellites the synthetic Slurm never starts,
    so its job reports itself growing for the rest of the run, as a real agent whose satellites wait in Slurm's
    queue does (the daemon leaves such a job alone until ``resize_timeout_s``).

    Shared by the directive thread and the reporting loop (each call one dictionary step under the GIL).

    Args:
        sizes: job id -> its size at the start.
    """

    def __init__(self, sizes: Mapping[str, int]) -> None:
        self._moves: dict[str, tuple[int, int, float]] = {job: (size, size, 0.0) for job, size in sizes.items()}

    def order(self, job_id: str, target: int, now: float) -> int:
        """Take an order to resize ``job_id`` to ``target``; returns the job's size now (the directive's answer)."""
        size, _ = self.position(job_id, now)
        arrives = now + SHRINK_LAG_S if target < size else math.inf
        self._moves[job_id] = (size, target, arrives)
        return size

    def position(self, job_id: str, now: float) -> tuple[int, int]:
        """The job's size and target at ``now``."""
        size, target, arrives = self._moves[job_id]
        return (target, target) if now >= arrives else (size, target)


def sealed_reports(spec: Sequence[Mapping[str, Any]], count: int, to: str, now: float) -> list[tuple[str, list[bytes]]]:
    """The first ``count`` reports of the schedule (the jobs of ``spec`` in turn), each signed now: (message id,
    frames to send)."""
    out = []
    for index in range(count):
        message = report_message(spec[index % len(spec)], now)
        payload = encode(message)
        out.append((message.id, [b"", seal(payload, to=to), payload]))
    return out


def simulate_agents(
    endpoint: str, spec: Sequence[Mapping[str, Any]], duration_s: float, report_s: float, *, ahead: bool = False
) -> dict[str, Any]:
    """One user's agents: register each job, answer directives, report every job every ``report_s`` seconds.

    With ``ahead`` every report of the window is signed before it starts (:func:`sealed_reports`; the window must
    then fit in the credentials' age bound, ``MAX_AGE_S``), so that the window's CPU on this machine is the daemon's
    and munged's checking of them, as at a site, where each agent signs on its own node; otherwise each report is
    signed when it is sent."""
    directives = ChannelServer("tcp://127.0.0.1:*")
    stop = threading.Event()
    answered = [0]
    moves = OrderedMoves({str(job["job_id"]): int(job["size"]) for job in spec})

    def answer_directives() -> None:
        while not stop.is_set():
            req = directives.receive(0.1)
            if req is not None:
                answered[0] += 1
                job_id, target = str(req.message.body["job_id"]), int(req.message.body["target"])
                size = moves.order(job_id, target, time.monotonic())
                directives.answer(req, req.message.reply(data={"size": size, "target": target}))

    responder = threading.Thread(target=answer_directives, daemon=True)
    responder.start()
    for job in spec:
        body = {
            "job_id": job["job_id"],
            "endpoint": directives.endpoint,
            "min_workers": job["min"],
            "max_workers": job["max"],
            "gpus_per_worker": job["gpw"],
            "partition": "batch",
            "elastic_partition": "elastic",
        }
        reply = request(endpoint, Message("register", body), timeout_s=60, retries=0)
        for _ in range(REGISTER_TRIES):  # as an agent does: the daemon may not have read Slurm since the job started
            if reply.body["ok"] or RETRY_SOON not in str(reply.body["error"]):  # the agent's own test (agent/link.py)
                break
            time.sleep(1.0)
            reply = request(endpoint, Message("register", body), timeout_s=60, retries=0)
        if not reply.body["ok"]:
            raise RuntimeError(f"registration of {job['job_id']} refused: {reply.body['error']}")
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sent: dict[str, float] = {}
    latencies: list[float] = []
    errors = 0
    per_report = report_s / len(spec)
    to = destination(endpoint)
    signed = sealed_reports(spec, math.ceil(duration_s / per_report), to, time.time()) if ahead else []
    begin = time.time()
    end = begin + duration_s
    index = 0

    def collect(wait_ms: int) -> None:
        nonlocal errors
        while sock.poll(wait_ms):
            wait_ms = 0
            reply = decode(sock.recv_multipart()[-1])
            started = sent.pop(reply.id, None)
            if started is not None:
                latencies.append(time.perf_counter() - started)
            if not reply.body["ok"]:
                errors += 1

    while (now := time.time()) < end:
        due = begin + index * per_report
        if now >= due:
            job = spec[index % len(spec)]
            size, target = moves.position(str(job["job_id"]), time.monotonic())
            if index < len(signed) and size == target == job["size"]:
                message_id, frames = signed[index]
            else:  # signed as it goes (a job that moved since, or the window outlasted what was signed ahead)
                message = report_message(job, now, size, target)
                payload = encode(message)
                message_id, frames = message.id, [b"", seal(payload, to=to), payload]
            sent[message_id] = time.perf_counter()
            sock.send_multipart(frames)
            index += 1
        # until the next report is due, rounded up: a wait rounded down to 0 ms would spin on the cores the daemon
        # is measured on for up to a millisecond before each report
        collect(0 if now >= due else max(1, math.ceil((due - time.time()) * 1000)))
    drain_until = time.time() + 10
    while sent and time.time() < drain_until:
        collect(100)
    stop.set()
    responder.join(5)
    sock.close(linger=0)
    directives.close()
    return {
        "reporting_from": begin,
        "reporting_to": end,
        "reports_sent": index,
        "reports_unanswered": len(sent),
        "report_errors": errors,
        "latencies": latencies,
        "directives_answered": answered[0],
    }


def probe_status(endpoint: str, duration_s: float) -> dict[str, Any]:
    """``amoebactl status`` twice a second for ``duration_s``: (when, reply seconds, ok) of each."""
    samples: list[tuple[float, float, bool]] = []
    end = time.time() + duration_s
    while time.time() < end:
        started = time.perf_counter()
        at = time.time()
        try:
            ok = bool(request(endpoint, Message("status", {}), timeout_s=10, retries=0).body["ok"])
        except ChannelError:
            ok = False
        samples.append((at, time.perf_counter() - started, ok))
        time.sleep(max(0.0, PROBE_EVERY_S - (time.perf_counter() - started)))
    return {"samples": samples}


def _percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))] if ordered else float("nan")


def bench_loop(
    jobs: Sequence[JobRecord],
    elastic: Mapping[str, tuple[Registration, int]],
    source_for: Callable[[Sequence[JobRecord]], ClusterSource],
    *,
    interval_s: float,
    duration_s: float,
    policy_name: str,
    report_s: float,
    per_uid: int,
    seal_ahead: bool = False,
    front_process: bool = False,
) -> dict[str, Any]:
    """Run the daemon's loop with every elastic job's agent simulated (see the module docstring).

    Args:
        jobs: Slurm's job records.
        elastic: job id -> (its agent's registration, its size).
        source_for: the daemon's Slurm over job records (the elastic jobs' owners changed to the simulated users).
        interval_s: the daemon's round interval.
        duration_s: how long the agents report.
        policy_name: the daemon's policy.
        report_s: each agent reports every this many seconds.
        per_uid: elastic jobs per simulated user.
        seal_ahead: the agents sign the window's reports before it starts (:func:`simulate_agents`); the window
            must then be at most ``MAX_AGE_S``.
        front_process: the daemon checks credentials and signs replies in its front process (``front_process``
            in amoebad.yaml); its CPU is sampled too.

    Raises:
        ValueError: ``seal_ahead`` with a window longer than the credentials' age bound.

    Returns:
        ``loop_s`` (median round), ``loop_max_s``, ``late_max_s`` (how late the latest round started), ``rounds``,
        ``reports_per_s`` answered and their reply time ``report_p50_s``/``report_p99_s``, ``status_p50_s`` and
        ``status_p99_s`` (amoebactl's reply time while the agents report), ``uids``, ``processes``,
        ``raised_limits``, ``agents``, ``interval_s``, ``report_s``; ``errors`` from the simulated users; and, over
        the reporting window, ``daemon_cpu_share`` (the daemon's process CPU seconds per wall second: 1.0 is one
        core), ``munged_cpu_share``, ``round_wall_share`` (the rounds' wall time per wall second: an upper bound of
        their CPU), ``daemon_cpu_per_report_s`` (the daemon's CPU, rounds included, per answered report: an upper
        bound of a report's cost) and ``reports_per_daemon_core_s`` (one core over that cost: what one core of its
        own would answer, rounds and all, at least).
    """
    check_signing_window(duration_s, seal_ahead)
    root = os.getuid() == 0
    if root:
        records, owner = spread_over_users(jobs, elastic, per_uid)
    else:
        records, owner = list(jobs), dict.fromkeys(elastic, os.getuid())
    users: dict[int, list[dict[str, Any]]] = {}
    for job_id, (reg, size) in elastic.items():
        spec = {"job_id": job_id, "min": reg.min_workers, "max": reg.max_workers, "gpw": reg.gpus_per_worker}
        users.setdefault(owner[job_id], []).append({**spec, "size": size})
    most = max((len(spec) for spec in users.values()), default=0)
    limits, raised = limits_for(most, report_s)
    seal(b"load libmunge before forking", to="bench")
    settle_s = 10.0 + len(elastic) / 200  # registrations before the reporting starts
    processes = [
        _fork_as(
            uid,
            functools.partial(simulate_agents, spec=spec, duration_s=duration_s, report_s=report_s, ahead=seal_ahead),
        )
        for uid, spec in users.items()
    ]
    probe = _fork_as(next(iter(users), os.getuid()), lambda endpoint: probe_status(endpoint, duration_s + settle_s))
    config = DaemonConfig(
        interval_s=interval_s,
        listen="tcp://127.0.0.1:*",
        metrics_port=0,
        policy=policy_name,
        limits=limits,
        front_process=front_process,
        agents=AgentSettings(timeout_s=2.0, retries=0, parallel=8, stale_after_s=report_s * 3, backoff_s=30.0),
    )
    daemon = Daemon(config, source_for(records))
    daemon.start()
    assert daemon.server is not None
    tune_gc()  # as amoebad once started
    server = daemon.server
    sampler = CpuSampler(front=lambda: server.pid if isinstance(server, FrontChannel) else None)
    sampler.start()
    stop = threading.Event()
    thread = threading.Thread(target=daemon.run, args=(stop,), name="amoebad-loop", daemon=True)
    thread.start()
    try:
        for forked in [*processes, probe]:
            forked.start(daemon.server.endpoint)
        results = [forked.result() for forked in processes]
        probed = probe.result()
    finally:
        stop.set()
        thread.join(30)
        daemon.close()
        sampler.stop()
    errors = [r["error"] for r in [*results, probed] if "error" in r]
    done = [r for r in results if "error" not in r]
    start = max((r["reporting_from"] for r in done), default=0.0)
    end = min((r["reporting_to"] for r in done), default=0.0)
    rounds = [r for r in daemon.rounds if start <= r.at <= end]
    starts = sorted(r.at for r in rounds)
    late = max((b - a - interval_s for a, b in itertools.pairwise(starts)), default=0.0)
    durations = [r.duration_s for r in rounds]
    latencies = [lat for r in done for lat in r["latencies"]]
    status = [lat for at, lat, ok in probed.get("samples", []) if ok and start <= at <= end]
    wall, daemon_cpu, munged_cpu, front_cpu = sampler.spent(start, end)
    answered = len(latencies) * wall / duration_s if duration_s else 0.0  # the reports answered within the samples
    round_share = sum(durations) / wall if wall else 0.0
    # the rounds' CPU and the front's counted in: an upper bound of what a report costs the daemon
    per_report = (daemon_cpu + front_cpu) / answered if answered else float("nan")
    return {
        "loop_s": statistics.median(durations) if durations else float("nan"),
        "loop_max_s": max(durations, default=float("nan")),
        "late_max_s": max(0.0, late),
        "rounds": len(rounds),
        "interval_s": interval_s,
        "report_s": report_s,
        "agents": len(elastic),
        "uids": len(users),
        "processes": len(processes) + 1,
        "raised_limits": raised,
        "signed_ahead": seal_ahead,
        "reports_sent": sum(r["reports_sent"] for r in done),
        "reports_per_s": len(latencies) / duration_s,
        "reports_unanswered": sum(r["reports_unanswered"] for r in done),
        "report_errors": sum(r["report_errors"] for r in done),
        "report_p50_s": _percentile(latencies, 0.5),
        "report_p99_s": _percentile(latencies, 0.99),
        "status_requests": len(status),
        "status_p50_s": _percentile(status, 0.5),
        "status_p99_s": _percentile(status, 0.99),
        "directives_answered": sum(r["directives_answered"] for r in done),
        "errors": errors,
        "daemon_cpu_share": daemon_cpu / wall if wall else float("nan"),
        "munged_cpu_share": munged_cpu / wall if wall else float("nan"),
        "front_process": front_process,
        "front_cpu_share": front_cpu / wall if wall else float("nan"),
        "round_wall_share": round_share,
        "daemon_cpu_per_report_s": per_report,
        "reports_per_daemon_core_s": 1.0 / per_report if per_report > 0 else float("nan"),
    }
