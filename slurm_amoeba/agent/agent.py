"""The job agent: hosts the rendezvous, runs the worker groups, grows and shrinks the job on directive.

One agent per elastic job, in component 0 of its heterogeneous allocation (one task, CPUs only), for the job's whole
life (DESIGN.md, job flow). It

- hosts the runtime's :class:`~slurm_amoeba.runtime.coordinator.Coordinator` (the TCPStore the workers meet at);
- starts the **main worker group** (a step in component 1, the job's minimum workers);
- on a **grow** directive submits a **satellite** job in the elastic partition, whose step starts more workers that
  warm up and join at a step boundary; on a **shrink** asks workers to leave at a step boundary and then releases
  their satellite; a satellite that Slurm preempts has its workers leave within GraceTime (they get SIGTERM), and the
  job goes on; a satellite that dies (a lost node) takes the runtime's failure path;
- takes directives over an authenticated channel (:mod:`slurm_amoeba.transport.channel`) from the job's owner and from
  the daemon, reports size, throughput and history to the daemon, and keeps a status file for ``job.history()``;
- when the job ends (finished, failed, cancelled) cancels every satellite: no orphans.

The agent acts as the job's owner (it runs as that user); it never decides *when* to resize: that is the user's or
the daemon's call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from slurm_amoeba.agent.groups import (
    GroupState,
    WorkerGroup,
    choose_leavers,
    worker_ids,
)
from slurm_amoeba.core.errors import AmoebaError, SpecError
from slurm_amoeba.core.jobenv import ENV_PARENT_JOB
from slurm_amoeba.core.layout import AGENT_STATUS_FILE
from slurm_amoeba.core.messages import Message
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.runtime.coordinator import Coordinator, CoordinatorConfig, CoordinatorView
from slurm_amoeba.runtime.errors import RuntimeConfigError
from slurm_amoeba.runtime.membership import WorkerStatus
from slurm_amoeba.slurm import CliSlurmClient, JobState, SlurmCommandError, SubmitOptions, render_batch_script
from slurm_amoeba.slurm.satellite import parent_comment, satellite_name
from slurm_amoeba.slurm.steps import StepOptions, start_step
from slurm_amoeba.transport.channel import ChannelError, ChannelServer, Request, request, request_from

log = logging.getLogger(__name__)

PHASE_OVER_GRACE_S = 30.0  # after training ended, how long the worker step may take to exit on its own
_SERIES_LIMIT = 5000
_HISTORY_LIMIT = 2000


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """What one agent needs to know.

    Attributes:
        job_id: the Slurm job id of the elastic job (the heterogeneous leader).
        spec: worker range and per-worker resources.
        command: argv each worker runs (the user's training program).
        state_dir: where the status file, satellite scripts and logs go (on a file system the submitter sees).
        advertise_addr: the address of the agent's node that workers and the daemon can reach.
        elastic_partition: where satellites run.
        daemon_endpoint: the daemon's address (``tcp://host:port``), or None to run without a daemon.
        worker_env: extra environment for every worker.
        satellite_time_min: time limit of satellites in minutes (None: the partition's).
        poll_s: how often the agent looks at Slurm and the coordinator.
        report_s: how often it reports to the daemon.
        coordinator: further coordinator settings (timeouts).
        main_het_group: the heterogeneous component the main worker group runs in (1 with ``amoeba-sbatch``); None
            for a one-component allocation (plain ``sbatch --elastic``), where the workers' step shares the job with
            the agent in the batch step.
    """

    job_id: str
    spec: ElasticSpec
    command: tuple[str, ...]
    state_dir: Path
    advertise_addr: str
    elastic_partition: str = "elastic"
    daemon_endpoint: str | None = None
    worker_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    satellite_time_min: int | None = None
    poll_s: float = 0.5
    report_s: float = 2.0
    coordinator: Mapping[str, float] = dataclasses.field(default_factory=dict)
    main_het_group: int | None = 1

    def __post_init__(self) -> None:
        if not self.command:
            raise SpecError("the agent needs a worker command to run, e.g. ['python', 'train.py']")
        if not self.job_id.isdigit():
            raise SpecError(f"job_id={self.job_id!r} is not a Slurm job id")


class Agent:
    """One elastic job's agent (see the module docstring).

    Args:
        config: the settings.
        slurm: the Slurm client (its environment is the job's).
    """

    def __init__(self, config: AgentConfig, slurm: CliSlurmClient | None = None) -> None:
        self.config = config
        self.slurm = slurm or CliSlurmClient(timeout=30)
        self.prefix = f"[{config.job_id}/agent]"
        self.groups: list[WorkerGroup] = []
        self.target = config.spec.min_workers
        self.history: list[dict[str, Any]] = []
        self.series: list[dict[str, Any]] = []
        self.daemon_uid: int | None = None
        self._owner_uid = os.getuid()
        self._lock = threading.RLock()
        self._stop_reason = ""
        self._main_step: subprocess.Popen[bytes] | None = None
        self._channel: ChannelServer | None = None
        self._mono0 = time.monotonic()
        self._wall0 = time.time()
        self._seen_generations = 0
        self._node_gpus: int | None = None
        self._training_over = False
        self.coordinator = Coordinator(
            CoordinatorConfig(
                job_id=f"job{config.job_id}",
                initial_workers=config.spec.min_workers,
                max_workers=config.spec.max_workers,
                advertise_addr=config.advertise_addr,
                **config.coordinator,  # type: ignore[arg-type]
            )
        )
        config.state_dir.mkdir(parents=True, exist_ok=True)

    # ----------------------------------------------------------------------------------------------- lifecycle

    def run(self) -> int:
        """Run the job to its end; return the exit status of the main worker group (0: training finished).

        SIGTERM or SIGINT (the job cancelled, its time limit) stop the workers and release every satellite.
        """
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        for sig in previous:
            signal.signal(sig, self._on_signal)
        try:
            self.coordinator.start()
            self._channel = ChannelServer("tcp://0.0.0.0:*")
            self._event("started", min_workers=self.config.spec.min_workers, max_workers=self.config.spec.max_workers)
            log.info(
                "%s store at %s:%d, directives at %s",
                self.prefix,
                self.config.advertise_addr,
                self.coordinator.port,
                self.endpoint,
            )
            self._start_main_group()
            self._register_with_daemon()
            return self._loop()
        finally:
            self._shutdown()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @property
    def endpoint(self) -> str:
        """Where the agent takes directives (``tcp://<advertise_addr>:<port>``)."""
        if self._channel is None:
            return ""
        port = self._channel.endpoint.rsplit(":", 1)[1]
        return f"tcp://{self.config.advertise_addr}:{port}"

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop_reason = f"signal {signal.Signals(signum).name}"

    def _worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.config.worker_env)
        env.update(self.coordinator.worker_env("unassigned"))
        env.setdefault("OMP_NUM_THREADS", "1")
        env[ENV_PARENT_JOB] = self.config.job_id
        return env

    def _entry(self, group: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "slurm_amoeba.agent.entry",
            "worker",
            "--group",
            group,
            "--",
            *self.config.command,
        ]

    def _start_main_group(self) -> None:
        spec = self.config.spec
        group = WorkerGroup(
            "g0",
            False,
            worker_ids("g0", spec.min_workers),
            int(self.config.job_id),
            GroupState.RUNNING,
            time.time(),
            running_at=time.time(),
        )
        self.groups.append(group)
        self._main_step = start_step(
            StepOptions(
                ntasks=spec.min_workers,
                het_group=self.config.main_het_group,
                cpus_per_task=spec.cpus_per_worker,
                gpus_per_task=spec.gpus_per_worker,
                name="amoeba-workers-g0",
                output=str(self.config.state_dir / "worker-g0-%t.log"),
            ),
            self._entry("g0"),
            env=self._worker_env(),
            log_path=self.config.state_dir / "srun-g0.log",
        )
        self._event("group_started", group="g0", workers=spec.min_workers)

    def _loop(self) -> int:
        next_slurm = next_report = next_status = 0.0
        over_since: float | None = None
        while True:
            now = time.monotonic()
            if self._stop_reason:
                log.warning("%s stopping: %s", self.prefix, self._stop_reason)
                self._event("stopping", reason=self._stop_reason)
                return 143
            assert self._main_step is not None
            code = self._main_step.poll()
            if code is not None:
                log.info("%s the main worker group ended with status %s", self.prefix, code)
                self._event("main_group_ended", status=code)
                return code
            if now >= next_slurm:
                self._watch_satellites()
                next_slurm = now + max(self.config.poll_s, 1.0)
            view = self.coordinator.view()
            self._training_over = view.phase.is_over()
            if view.phase.is_over():
                over_since = over_since if over_since is not None else now
                if now - over_since > PHASE_OVER_GRACE_S:
                    # Training ended (or was lost) but a worker process lingers (hung, declared dead): stop the step.
                    log.warning(
                        "%s the job is %s but its worker step still runs; stopping it", self.prefix, view.phase.value
                    )
                    self._event("main_group_stopped", phase=view.phase.value)
                    return self._stop_main_step()
            self._watch_workers(view)
            self._reconcile()
            if now >= next_status:
                self._sample(view)
                self.write_status(view)
                next_status = now + 1.0
            if self.config.daemon_endpoint and now >= next_report:
                self._report(view)
                next_report = now + self.config.report_s
            if self._channel is not None:
                req = self._channel.receive(self.config.poll_s)
                if req is not None:
                    self._handle(req)
            else:
                time.sleep(self.config.poll_s)

    def _stop_main_step(self) -> int:
        """SIGTERM the main worker step (srun forwards it: workers leave at a step boundary), then SIGKILL."""
        if self._main_step is None:
            return 0
        if self._main_step.poll() is None:
            self._main_step.send_signal(signal.SIGTERM)
            try:
                self._main_step.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._main_step.kill()
        return self._main_step.wait()

    def _shutdown(self) -> None:
        """Stop the workers, cancel every satellite, write the final status. Safe to call more than once."""
        for group in self.groups:
            if group.satellite and group.state is not GroupState.ENDED:
                self._release(group, group.end_reason or "job ended")
        self._stop_main_step()
        with contextlib.suppress(RuntimeConfigError):
            self.write_status(self.coordinator.view())
        self.coordinator.close()
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    # ----------------------------------------------------------------------------------------------- resize

    def resize(self, target: int, reason: str = "") -> int:
        """Ask for ``target`` workers; the agent gets there in the background.

        Returns:
            The accepted target.

        Raises:
            SpecError: ``target`` is outside the job's range (the message gives the range).
        """
        spec = self.config.spec
        if not spec.min_workers <= target <= spec.max_workers:
            raise SpecError(
                f"resize to {target} workers is outside this job's range {spec.min_workers}..{spec.max_workers}"
            )
        with self._lock:
            if target != self.target:
                log.info("%s resize %d -> %d (%s)", self.prefix, self.target, target, reason or "no reason given")
                self._event("resize_requested", target=target, previous=self.target, reason=reason)
            self.target = target
        self._reconcile()
        return target

    def planned_size(self) -> int:
        """Workers the job has or is getting (groups not leaving or ended)."""
        return sum(len(g.active_workers) for g in self.groups)

    def _reconcile(self) -> None:
        if self._training_over:
            return  # nothing to grow into or shrink from once training has ended
        with self._lock:
            planned = self.planned_size()
            if self.target > planned:
                self._grow(self.target - planned)
            elif self.target < planned:
                self._shrink(planned - self.target)

    def _grow(self, count: int) -> None:
        # One satellite per node's worth of workers, each on one node: when Slurm preempts a node for a regular job
        # it takes one satellite, not every worker the job gained.
        per_node = self._workers_per_node()
        while count > 0:
            chunk = min(count, per_node)
            if not self._submit_satellite(chunk):
                return
            count -= chunk

    def _workers_per_node(self) -> int:
        spec = self.config.spec
        if spec.gpus_per_worker == 0:
            return spec.max_workers
        if self._node_gpus is None:
            try:
                nodes = self.slurm.nodes(partition=self.config.elastic_partition)
                self._node_gpus = max((n.gpus_total for n in nodes), default=0)
            except (SlurmCommandError, AmoebaError) as exc:
                log.warning("%s could not read the elastic partition's nodes: %s", self.prefix, exc)
                return 1
        return max(1, self._node_gpus // spec.gpus_per_worker)

    def _submit_satellite(self, count: int) -> bool:
        spec = self.config.spec
        name = f"g{len(self.groups)}"
        script = self.config.state_dir / f"satellite-{name}.sh"
        entry = [
            sys.executable,
            "-m",
            "slurm_amoeba.agent.entry",
            "satellite",
            "--parent",
            self.config.job_id,
            "--group",
            name,
            "--ntasks",
            str(count),
            "--cpus-per-task",
            str(spec.cpus_per_worker),
            "--gpus-per-task",
            str(spec.gpus_per_worker),
            "--log-dir",
            str(self.config.state_dir),
            "--",
            *self.config.command,
        ]
        options = SubmitOptions(
            name=satellite_name(self.config.job_id, name),
            comment=parent_comment(self.config.job_id),
            partition=self.config.elastic_partition,
            nodes=1,
            ntasks=count,
            cpus_per_task=spec.cpus_per_worker,
            time_min=self.config.satellite_time_min,
            mem_mb=spec.mem_per_worker_mb * count or None,
            output=str(self.config.state_dir / f"satellite-{name}.log"),
            extra=(f"--gpus-per-task={spec.gpus_per_worker}",) if spec.gpus_per_worker else (),
        )
        script.write_text(render_batch_script([options], [entry]))
        # A satellite is a job of its own: the parent's SLURM_* variables (its heterogeneous components, its SPANK
        # options) must not leak into it, or its srun looks for components it does not have.
        env = {k: v for k, v in self._worker_env().items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        client = CliSlurmClient(env, timeout=30)
        try:
            job = client.submit(script, SubmitOptions())
        except (SlurmCommandError, AmoebaError) as exc:
            log.error("%s could not submit a satellite for %d workers: %s", self.prefix, count, exc)
            self._event("grow_failed", workers=count, error=str(exc))
            self.target = self.planned_size()
            return False
        group = WorkerGroup(name, True, worker_ids(name, count), job, GroupState.PENDING, time.time())
        self.groups.append(group)
        log.info("%s satellite %d (%s) submitted for %d workers", self.prefix, job, name, count)
        self._event("satellite_submitted", group=name, slurm_job=job, workers=count)
        return True

    def _shrink(self, count: int) -> None:
        for group, leavers in choose_leavers(self.groups, count):
            if group.state is GroupState.PENDING:
                self._release(group, "shrink before it started")
                continue
            for worker in leavers:
                try:
                    self.coordinator.request_leave(worker)
                except RuntimeConfigError as exc:
                    # Not registered yet (still warming up) or already gone: it must not join, so stop it.
                    log.info(
                        "%s %s cannot leave gracefully (%s); it is stopped with its group", self.prefix, worker, exc
                    )
                group.leaving.add(worker)
            if set(group.leaving) >= set(group.worker_ids):
                group.state = GroupState.LEAVING
            self._event("shrink_requested", group=group.name, workers=leavers)

    def _release(self, group: WorkerGroup, reason: str) -> None:
        """Cancel a satellite's allocation and mark the group ended."""
        if group.state is GroupState.ENDED:
            return
        try:
            self.slurm.cancel(group.slurm_job)
        except SlurmCommandError as exc:
            log.warning("%s could not cancel satellite %d: %s", self.prefix, group.slurm_job, exc)
        workers = self.coordinator.view().workers  # one snapshot, not one per worker
        for worker in group.worker_ids:
            info = workers.get(worker)
            if info is not None and not info.status.is_gone():
                self.coordinator.mark_dead(worker, f"its satellite was released ({reason})")
        group.state = GroupState.ENDED
        group.ended_at = time.time()
        group.end_reason = reason
        self._event("satellite_released", group=group.name, slurm_job=group.slurm_job, reason=reason)

    # ----------------------------------------------------------------------------------------------- watching

    def _watch_satellites(self) -> None:
        live = [g for g in self.groups if g.satellite and g.state is not GroupState.ENDED]
        if not live:
            return
        try:
            records = {j.job_id: j for j in self.slurm.jobs(job_ids=[g.slurm_job for g in live])}
        except (SlurmCommandError, AmoebaError) as exc:
            log.warning("%s could not read satellites' states: %s", self.prefix, exc)
            return
        for group in live:
            record = records.get(group.slurm_job)
            state = record.state if record is not None else JobState.UNKNOWN
            if state is JobState.RUNNING and group.running_at is None:
                group.running_at = time.time()
                if group.state is GroupState.PENDING:
                    group.state = GroupState.RUNNING
                self._event(
                    "satellite_running",
                    group=group.name,
                    slurm_job=group.slurm_job,
                    waited_s=round(group.running_at - group.requested_at, 3),
                )
            elif not state.is_active():
                reason = (
                    "preempted"
                    if record is not None and "preempt" in record.state_reason.lower()
                    else (f"satellite {state.value.lower()}")
                )
                if state is JobState.UNKNOWN:
                    reason = "satellite gone"
                log.warning("%s satellite %d (%s) ended: %s", self.prefix, group.slurm_job, group.name, reason)
                self._release(group, reason)
                self._follow_losses()

    def _watch_workers(self, view: CoordinatorView) -> None:
        for group in self.groups:
            if not group.satellite or group.state is GroupState.ENDED:
                continue
            statuses = [view.workers[w].status if w in view.workers else None for w in group.worker_ids]
            gone = [s is not None and s.is_gone() for s in statuses]
            if all(gone):
                asked = set(group.leaving) >= set(group.worker_ids)
                finished = all(s is WorkerStatus.DONE for s in statuses)
                if asked:
                    self._release(group, "shrink")
                elif finished:
                    self._release(group, "training finished")
                else:
                    self._release(group, "its workers left (preempted or failed)")
                    self._follow_losses()
            elif group.state is GroupState.RUNNING:
                # Workers that left on their own (SIGTERM from preemption) no longer count toward the size.
                for worker, status in zip(group.worker_ids, statuses, strict=True):
                    if status is not None and status.is_gone() and worker not in group.leaving:
                        group.leaving.add(worker)
                        self._event("worker_lost", group=group.name, worker=worker, status=status.value)
                        if status in (WorkerStatus.DEAD, WorkerStatus.FAILED):
                            # A dead worker's process may still hang in the satellite: the rest of the group
                            # leaves gracefully, then releasing the satellite ends the hung process too.
                            self._retire(group)
                        self._follow_losses()

    def _retire(self, group: WorkerGroup) -> None:
        for worker in group.active_workers:
            with contextlib.suppress(RuntimeConfigError):
                self.coordinator.request_leave(worker)
            group.leaving.add(worker)
        group.state = GroupState.LEAVING
        self._event("group_retired", group=group.name)

    def _follow_losses(self) -> None:
        """Workers lost without a shrink (preemption, failure) lower the target: the job does not fight Slurm for
        them; the daemon or the user may grow it again."""
        with self._lock:
            target = max(self.config.spec.min_workers, min(self.target, self.planned_size()))
            if target != self.target:
                self._event("target_lowered", target=target, previous=self.target)
                self.target = target

    # ----------------------------------------------------------------------------------------------- directives

    def _handle(self, req: Request) -> None:
        assert self._channel is not None
        msg = req.message
        allowed = {self._owner_uid} | ({self.daemon_uid} if self.daemon_uid is not None else set())
        if msg.kind == "status":
            self._channel.answer(req, msg.reply(data=self.status()))
            return
        if req.sender.uid not in allowed:
            self._channel.refuse(
                req,
                f"uid {req.sender.uid} may not direct job {self.config.job_id}: only its "
                f"owner (uid {self._owner_uid}) and the daemon may",
            )
            return
        if msg.kind != "resize":
            self._channel.refuse(req, f"the agent does not take {msg.kind!r} messages; it takes resize and status")
            return
        if msg.body["job_id"] != self.config.job_id:
            self._channel.refuse(req, f"this is the agent of job {self.config.job_id}, not {msg.body['job_id']}")
            return
        try:
            target = self.resize(int(msg.body["target"]), str(msg.body["reason"]))
        except SpecError as exc:
            self._channel.answer(req, msg.reply(ok=False, error=str(exc)))
            return
        self._channel.answer(req, msg.reply(data={"size": self.coordinator.view().world_size, "target": target}))

    def _register_with_daemon(self) -> None:
        if not self.config.daemon_endpoint:
            return
        spec = self.config.spec
        message = Message(
            "register",
            {
                "job_id": self.config.job_id,
                "endpoint": self.endpoint,
                "min_workers": spec.min_workers,
                "max_workers": spec.max_workers,
                "gpus_per_worker": spec.gpus_per_worker,
                "partition": os.environ.get("SLURM_JOB_PARTITION", ""),
                "elastic_partition": self.config.elastic_partition,
            },
        )
        try:
            daemon, reply = request_from(self.config.daemon_endpoint, message, timeout_s=3, retries=1)
        except ChannelError as exc:
            log.warning("%s the daemon did not take the registration (%s); running without it", self.prefix, exc)
            return
        if reply.body["ok"]:
            self.daemon_uid = daemon.uid
            log.info("%s registered with the daemon at %s", self.prefix, self.config.daemon_endpoint)
        else:
            log.warning("%s the daemon refused the registration: %s", self.prefix, reply.body["error"])

    def _report(self, view: CoordinatorView) -> None:
        assert self.config.daemon_endpoint is not None
        status = self.status(view)
        message = Message(
            "report",
            {
                "job_id": self.config.job_id,
                "size": status["size"],
                "generation": status["generation"],
                "target": status["target"],
                "throughput": status["throughput"],
                "history": status["history"][-20:],
                "satellites": [g.slurm_job for g in self.groups if g.satellite and g.state is not GroupState.ENDED],
            },
        )
        try:
            reply = request(self.config.daemon_endpoint, message, timeout_s=2, retries=0)
        except ChannelError as exc:
            log.debug("%s report not delivered: %s", self.prefix, exc)
            return
        if not reply.body["ok"] and "unknown job" in str(reply.body["error"]):
            self._register_with_daemon()  # the daemon restarted and forgot us

    # ----------------------------------------------------------------------------------------------- reporting

    def _event(self, event: str, **fields: Any) -> None:
        entry = {"t": round(time.time(), 3), "event": event, **fields}
        self.history.append(entry)
        del self.history[:-_HISTORY_LIMIT]

    def _wall(self, mono: float | None) -> float | None:
        return None if mono is None else round(self._wall0 + (mono - self._mono0), 3)

    def _sample(self, view: CoordinatorView) -> None:
        progress = view.progress
        self.series.append(
            {
                "t": round(time.time(), 3),
                "size": view.world_size,
                "target": self.target,
                "generation": view.generation,
                "samples_per_s": float(progress.get("samples_per_s") or 0.0),
                "step": progress.get("step"),
            }
        )
        del self.series[:-_SERIES_LIMIT]
        if view.generation != self._seen_generations:
            for record in view.history[self._seen_generations :]:
                self._event(
                    "generation",
                    generation=record.plan.generation,
                    size=len(record.plan.members),
                    reason=record.plan.reason,
                    rollback=record.plan.rollback,
                )
            self._seen_generations = len(view.history)

    def status(self, view: CoordinatorView | None = None) -> dict[str, Any]:
        """The job's state as JSON: size, target, groups, generations with pauses, throughput, history."""
        view = view or self.coordinator.view()
        generations = []
        previous_end: float | None = None
        for record in view.history:
            pause = None if previous_end is None else round(record.formed_at - previous_end, 3)
            generations.append(
                {
                    "generation": record.plan.generation,
                    "size": len(record.plan.members),
                    "members": list(record.plan.members),
                    "formed_at": self._wall(record.formed_at),
                    "ended_at": self._wall(record.ended_at),
                    "end_reason": record.end_reason,
                    "reason": record.plan.reason,
                    "rollback": record.plan.rollback,
                    "pause_s": pause,
                    "start_step": record.plan.start_step,
                }
            )
            previous_end = record.ended_at
        return {
            "job_id": self.config.job_id,
            "endpoint": self.endpoint,
            "phase": view.phase.value,
            "size": view.world_size,
            "target": self.target,
            "generation": view.generation,
            "min_workers": self.config.spec.min_workers,
            "max_workers": self.config.spec.max_workers,
            "workers": {w: v.status.value for w, v in view.workers.items()},
            "groups": [g.to_json() for g in self.groups],
            "generations": generations,
            "throughput": {str(size): round(s.samples_per_s, 3) for size, s in sorted(view.throughput.items())},
            "history": list(self.history),
            "series": list(self.series),
            "updated_at": time.time(),
        }

    def write_status(self, view: CoordinatorView) -> None:
        """Write the status file atomically (``<state_dir>/agent-status.json``)."""
        path = self.config.state_dir / AGENT_STATUS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.status(view)))
        tmp.replace(path)
