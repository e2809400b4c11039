"""Test doubles for the agent's unit tests: a Slurm in memory, a coordinator view the test edits, a worker step.

The agent reaches Slurm only through its injected :class:`~slurm_amoeba.slurm.client.SlurmClient`, the coordinator
through :class:`~slurm_amoeba.agent.agent.JobCoordinator` and its main step through a
:class:`~slurm_amoeba.agent.agent.StepStarter`; these fakes stand in for all three, so a test runs the agent's rounds
with no Slurm, no store and no processes.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_amoeba.agent.plan import Action, LowerTarget, Observation, SubmitSatellite, new_satellite_group, record
from slurm_amoeba.core.messages import Message
from slurm_amoeba.runtime.membership import Phase, WorkerStatus
from slurm_amoeba.runtime.protocol import PolicyBatch
from slurm_amoeba.runtime.share import ShareDirective
from slurm_amoeba.runtime.view import CoordinatorView, WorkerView
from slurm_amoeba.slurm import JobRecord, JobState, NodeRecord, SlurmClient, SlurmCommandError, StepRecord
from slurm_amoeba.slurm.script import SubmitOptions
from slurm_amoeba.slurm.steps import StepOptions
from slurm_amoeba.transport.channel import ChannelServer

PARENT = 42


def squeue(job_id: int, state: JobState = JobState.RUNNING, reason: str = "None", **fields: Any) -> JobRecord:
    """A squeue record of job ``job_id``; ``fields`` override any other field."""
    running = state is JobState.RUNNING
    base = JobRecord(
        job_id=job_id,
        name=f"job{job_id}",
        comment="",
        state=state,
        state_reason=reason,
        user="alice",
        uid=1000,
        partition="elastic",
        nodes=("n1",) if running else (),
        batch_host="n1" if running else "",
        gpus_per_node=1,
        gpu_indices=((0,),) if running else (),
        cpus=1,
        node_count=1,
        het_job_id=0,
        het_job_offset=0,
        submit_time=1,
        start_time=2,
        priority=1,
    )
    return dataclasses.replace(base, **fields)


def node(name: str, gpus: int = 4) -> NodeRecord:
    """An idle node of both partitions."""
    return NodeRecord(name, "127.0.0.1", name, "idle", (), ("batch", "elastic"), 8, 0, gpus, 0)


def next_round(observation: Observation, actions: Sequence[Action]) -> Observation:
    """The same observation once the agent applied ``actions``: Slurm took every satellite (jobs 500, 501, ...;
    squeue shows them pending when it was polled)."""
    groups = [g.copy() for g in observation.groups]
    target = observation.target
    satellites = dict(observation.satellites) if observation.satellites is not None else None
    for job, action in enumerate(actions, start=500):
        if isinstance(action, SubmitSatellite):
            groups.append(new_satellite_group(action, job))
            if satellites is not None:
                satellites[job] = squeue(job, JobState.PENDING, "Resources")
        elif isinstance(action, LowerTarget):
            target = action.target
        else:
            record(groups, action)
    return dataclasses.replace(observation, groups=groups, target=target, satellites=satellites)


@dataclasses.dataclass
class Submission:
    """One sbatch call the fake took: the script's text and the environment it was submitted with."""

    job_id: int
    script: str
    env: dict[str, str]


@dataclasses.dataclass
class FakeSlurm(SlurmClient):
    """Slurm in memory. The parent (job 42) is a running heterogeneous job of two components (42 and 43).

    ``refuse`` makes sbatch fail, ``refuse_requeue`` scontrol requeue; ``down`` makes every call fail like a dead
    slurmctld; ``sinfo_down`` only sinfo.
    """

    records: dict[int, JobRecord] = dataclasses.field(default_factory=dict)
    node_list: list[NodeRecord] = dataclasses.field(default_factory=lambda: [node("n1"), node("n2")])
    submissions: list[Submission] = dataclasses.field(default_factory=list)
    cancelled: list[int] = dataclasses.field(default_factory=list)
    requeued: list[int] = dataclasses.field(default_factory=list)
    step_list: list[StepRecord] = dataclasses.field(default_factory=list)
    signalled: list[tuple[int, int | None, str | None]] = dataclasses.field(default_factory=list)
    refuse: bool = False
    refuse_requeue: bool = False
    requeue_ends_scontrol: bool = False
    down: bool = False
    sinfo_down: bool = False
    next_id: int = 101

    def __post_init__(self) -> None:
        for job_id, offset in ((PARENT, 0), (PARENT + 1, 1)):
            component = squeue(job_id, partition="batch", het_job_id=PARENT, het_job_offset=offset, account="physics")
            # The workers' component (offset 1) asked for the QOS and the node features.
            if offset:
                component = dataclasses.replace(component, qos="high", features="a100")
            self.records.setdefault(job_id, component)

    def _check(self, argv: list[str]) -> None:
        if self.down:
            raise SlurmCommandError(argv, 1, "slurm_load_jobs error: Unable to contact slurm controller")

    def submit(
        self,
        script: Path,
        components: SubmitOptions | Sequence[SubmitOptions],
        script_args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
    ) -> int:
        self._check(["sbatch"])
        if self.refuse:
            raise SlurmCommandError(["sbatch", str(script)], 1, "sbatch: error: Invalid account or partition")
        job_id = self.next_id
        self.next_id += 1
        self.submissions.append(Submission(job_id, Path(script).read_text(), dict(env or {})))
        self.records[job_id] = squeue(job_id, JobState.PENDING, "Resources")
        return job_id

    def set_state(self, job_id: int, state: JobState, reason: str = "None") -> None:
        """What squeue shows for ``job_id`` from now on."""
        self.records[job_id] = dataclasses.replace(self.records[job_id], state=state, state_reason=reason)

    def forget(self, job_id: int) -> None:
        """squeue no longer shows ``job_id`` (past MinJobAge)."""
        del self.records[job_id]

    def cancel(self, job_id: int, *, step: int | None = None, signal: str | None = None, full: bool = False) -> None:
        self._check(["scancel", str(job_id)])
        if signal is not None:  # a signal, not a cancel
            self.signalled.append((job_id, step, signal))
            return
        self.cancelled.append(job_id)
        if job_id in self.records:
            self.set_state(job_id, JobState.CANCELLED)

    def requeue(self, job_id: int) -> None:
        self._check(["scontrol", "requeue", str(job_id)])
        if self.refuse_requeue:
            raise SlurmCommandError(["scontrol", "requeue", str(job_id)], 1, "Requeue of JobId=42 not allowed")
        if self.requeue_ends_scontrol:  # Slurm takes it and ends the run's processes, scontrol among them
            self.requeued.append(job_id)
            raise SlurmCommandError(["scontrol", "requeue", str(job_id)], -15, "")
        self.requeued.append(job_id)
        self.set_state(job_id, JobState.PENDING, "BeginTime")

    def jobs(
        self,
        *,
        job_ids: Collection[int] | None = None,
        name: str | None = None,
        user: str | None = None,
        states: Collection[JobState] | None = None,
    ) -> list[JobRecord]:
        self._check(["squeue", "--json"])
        return [r for r in self.records.values() if job_ids is None or r.job_id in job_ids]

    def steps(self, job_id: int) -> list[StepRecord]:
        return [s for s in self.step_list if s.job_id == job_id]

    def nodes(self, *, partition: str | None = None) -> list[NodeRecord]:
        self._check(["sinfo", "--json"])
        if self.sinfo_down:
            raise SlurmCommandError(["sinfo", "--json"], 1, "sinfo: error: Socket timed out")
        return [n for n in self.node_list if partition is None or partition in n.partitions]

    def accounting_state(self, job_id: int) -> JobState:
        return JobState.UNKNOWN

    def test_submit(
        self,
        script: Path,
        components: SubmitOptions | Sequence[SubmitOptions],
        script_args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
    ) -> str:
        self._check(["sbatch", "--test-only"])
        return f"sbatch: Job {self.next_id} to start at now using 1 processors on nodes n1 in partition batch"

    def ping(self) -> bool:
        return not self.down

    # A job's owner has no operator rights: Slurm refuses every operator call, as it would the agent's user.

    def _operator(self, argv: list[str]) -> None:
        self._check(argv)
        raise SlurmCommandError(argv, 1, "Access/permission denied")

    def set_priority(self, job_id: int, priority: int) -> None:
        self._operator(["scontrol", "update", f"JobId={job_id}", f"Priority={priority}"])

    def hold(self, job_id: int) -> None:
        self._operator(["scontrol", "hold", str(job_id)])

    def release(self, job_id: int) -> None:
        self._operator(["scontrol", "release", str(job_id)])

    def set_admin_comment(self, job_id: int, text: str) -> None:
        self._operator(["scontrol", "update", f"JobId={job_id}", f"AdminComment={text}"])

    def config_values(self) -> dict[str, str]:
        self._check(["scontrol", "show", "config"])
        return {"PriorityType": "priority/basic"}

    def admin_level(self, user: str) -> str:
        return "None"

    def past_service(self, job_ids: Collection[int]) -> dict[int, float]:
        return {}


@dataclasses.dataclass
class FakeCoordinator:
    """The coordinator as the agent sees it: the test sets ``phase`` and ``statuses``; calls are recorded."""

    phase: Phase = Phase.RUNNING
    statuses: dict[str, WorkerStatus] = dataclasses.field(default_factory=dict)
    leave_requests: list[str] = dataclasses.field(default_factory=list)
    deaths: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    started: bool = False
    closed: bool = False
    batches: list[PolicyBatch] = dataclasses.field(default_factory=list)
    progress: dict[str, Any] = dataclasses.field(default_factory=dict)
    shares: list[ShareDirective] = dataclasses.field(default_factory=list)

    @property
    def port(self) -> int:
        return 29400

    def start(self) -> None:
        self.started = True

    def close(self) -> None:
        self.closed = True

    def worker_env(self, worker_id: str) -> dict[str, str]:
        return {"AMOEBA_STORE_ADDR": "10.0.0.1", "AMOEBA_STORE_PORT": str(self.port), "AMOEBA_WORKER_ID": worker_id}

    def request_leave(self, worker_id: str, *, unstarted: bool = False) -> None:
        self.leave_requests.append(worker_id)

    def mark_dead(self, worker_id: str, reason: str) -> None:
        self.deaths.append((worker_id, reason))

    def set_policy_batch(self, batch: int, world_size: int) -> PolicyBatch:
        choice = PolicyBatch(batch=batch, world_size=world_size, seq=len(self.batches) + 1)
        self.batches.append(choice)
        return choice

    def set_share(self, directive: ShareDirective) -> ShareDirective:
        published = dataclasses.replace(directive, seq=len(self.shares) + 1)
        self.shares.append(published)
        return published

    def members(self, *workers: str) -> None:
        """These workers are members of the current generation."""
        self.statuses.update(dict.fromkeys(workers, WorkerStatus.MEMBER))

    def view(self) -> CoordinatorView:
        workers = {
            w: WorkerView(w, status, 1, "n1", 0.1, w in self.leave_requests, "") for w, status in self.statuses.items()
        }
        members = sum(1 for s in self.statuses.values() if s is WorkerStatus.MEMBER)
        progress = {"members": members, **self.progress}
        return CoordinatorView(self.phase, 1 if members else 0, None, workers, (), {}, progress, "")


@dataclasses.dataclass
class FakeStep:
    """A worker step: runs until the test sets ``status`` or the agent signals it (then it exits with 143)."""

    options: StepOptions
    command: list[str]
    env: dict[str, str]
    status: int | None = None
    signals: list[int] = dataclasses.field(default_factory=list)

    def poll(self) -> int | None:
        return self.status

    def send_signal(self, sig: int, /) -> None:
        self.signals.append(sig)
        if sig == signal.SIGTERM:
            self.status = 143

    def wait(self, timeout: float | None = None) -> int:
        assert self.status is not None, "the fake step was waited for while it runs"
        return self.status

    def kill(self) -> None:
        self.status = -9


@dataclasses.dataclass
class FakeSteps:
    """Starts :class:`FakeStep`\\ s and keeps them (``started[0]`` is the main group's)."""

    started: list[FakeStep] = dataclasses.field(default_factory=list)

    def __call__(
        self, options: StepOptions, command: Sequence[str], *, env: Mapping[str, str], log_path: Path | None = None
    ) -> FakeStep:
        step = FakeStep(options, list(command), dict(env))
        self.started.append(step)
        return step


@dataclasses.dataclass
class FakeClock:
    """Wall-clock time the test moves."""

    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ServingStandIn:
    """A stand-in for a daemon that serves on a thread of its own until :meth:`close`.

    A subclass binds its socket before calling ``__init__`` (which starts the thread), answers at most one request
    per :meth:`serve_once` (returning soon when none comes, so that :meth:`close` is heard) and closes its socket in
    :meth:`release`. ``kinds`` records the kinds of the requests it answered.
    """

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.serve_once()

    def serve_once(self) -> None:
        """Answer the next request, if one comes soon."""
        raise NotImplementedError

    def release(self) -> None:
        """Close the stand-in's socket."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop the thread, then close the socket."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.release()


class ChannelStandIn(ServingStandIn):
    """A stand-in daemon on a channel server of its own on loopback that answers every request "ok"; a subclass
    may answer otherwise (:meth:`answer`)."""

    def __init__(self) -> None:
        self.server = ChannelServer("tcp://127.0.0.1:*")
        super().__init__()

    def serve_once(self) -> None:
        req = self.server.receive(0.05)
        if req is not None:
            self.kinds.append(req.message.kind)
            self.server.answer(req, self.answer(req.message))

    def answer(self, message: Message) -> Message:
        """The reply to one request."""
        return message.reply()

    def release(self) -> None:
        self.server.close()
