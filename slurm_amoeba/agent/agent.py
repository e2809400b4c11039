"""The job agent: hosts the rendezvous, runs the worker groups, grows and shrinks the job on directive.

One agent per elastic job, in component 0 of its heterogeneous allocation (one task, CPUs only) or in the batch step
of a one-component job (plain ``sbatch --elastic``), for the job's whole life (DESIGN.md, job flow). It

- hosts the runtime's :class:`~slurm_amoeba.runtime.coordinator.Coordinator` (the TCPStore the workers meet at);
- starts the **main worker group** (a step in component 1, or in the job's own allocation: the minimum workers);
- on a **grow** directive submits a **satellite** job in the elastic partition, whose step starts more workers that
  warm up and join at a step boundary; on a **shrink** asks workers to leave at a step boundary and then releases
  their satellite; a satellite that Slurm preempts has its workers leave within GraceTime (they get SIGTERM), and the
  job goes on; a satellite that dies (a lost node) takes the runtime's failure path;
- takes directives over an authenticated channel (:mod:`slurm_amoeba.transport.channel`) from the job's owner and from
  the daemon, reports size, throughput and history to the daemon, and keeps a status file for ``job.history()``;
- when the job ends (finished, failed, cancelled) cancels every satellite: no orphans.

The agent only observes and applies: each round of its loop it observes (Slurm, the coordinator, its main step),
asks the pure :func:`~slurm_amoeba.agent.plan.plan` what to do, and applies the actions (sbatch, scancel, leave
requests, its bookkeeping). Its Slurm client, coordinator, step launcher and clock are handed to it, so that tests
run its rounds against fakes. It acts as the job's owner (it runs as that user); it never decides *when* to resize:
that is the user's or the daemon's call. One thread runs the loop and handles directives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from slurm_amoeba.agent.config import AgentConfig, configured_daemon_uid
from slurm_amoeba.agent.entry import worker_entry
from slurm_amoeba.agent.groups import GroupState, WorkerGroup, planned_size, worker_ids
from slurm_amoeba.agent.lifecycle import (
    ENDED_BY_SIGNAL,
    MAIN_STEP_NAME,
    REQUEUE_SIGNAL,
    REQUEUED_EVENT,
    STOP_GRACE_S,
    JobLife,
)
from slurm_amoeba.agent.link import DaemonLink
from slurm_amoeba.agent.plan import (
    Action,
    AskToLeave,
    CoordinatorSeen,
    JobFailed,
    Limits,
    LowerTarget,
    MainGroupEnded,
    NodeFailing,
    Observation,
    PlaceBeside,
    ReleaseSatellite,
    Requeue,
    RestartFromCheckpoint,
    RetireGroup,
    SatelliteStarted,
    Stop,
    StopMainStep,
    SubmitSatellite,
    WorkerLost,
    final_releases,
    new_satellite_group,
    plan,
    record,
    release,
    workers_per_satellite,
)
from slurm_amoeba.agent.status import Journal, fit_status, release_fields
from slurm_amoeba.agent.submission import SatelliteSlurm
from slurm_amoeba.core.errors import AmoebaError, ParseError, SpecError
from slurm_amoeba.core.jobenv import ENV_PARENT_JOB
from slurm_amoeba.core.layout import AGENT_STATUS_FILE
from slurm_amoeba.core.messages import quote
from slurm_amoeba.core.sharing import ShareRole
from slurm_amoeba.runtime.auth import JOB_SECRET_FILE
from slurm_amoeba.runtime.checkpoint import ENV_CHECKPOINT_DIR
from slurm_amoeba.runtime.coordinator import Coordinator, CoordinatorConfig
from slurm_amoeba.runtime.errors import RuntimeConfigError
from slurm_amoeba.runtime.membership import Phase
from slurm_amoeba.runtime.protocol import PolicyBatch
from slurm_amoeba.runtime.share import ShareDirective
from slurm_amoeba.runtime.view import CoordinatorView
from slurm_amoeba.slurm import JobRecord, SlurmClient, SlurmCommandError
from slurm_amoeba.slurm.steps import StepOptions, start_step
from slurm_amoeba.transport.channel import ChannelServer, Request

__all__ = ["Agent", "AgentConfig", "JobCoordinator", "RunningStep", "StepStarter"]

log = logging.getLogger(__name__)


def directive_bind_address(advertise_addr: str) -> str:
    """Where the directive server binds: the address the daemon reaches the agent at when it is an IP address (the
    node's address Slurm gave), else every address (a host name ZeroMQ cannot bind)."""
    try:
        return str(ipaddress.ip_address(advertise_addr))
    except ValueError:
        return "0.0.0.0"  # noqa: S104 - a host name: bind all, the channel authenticates every request


class JobCoordinator(Protocol):
    """What the agent needs of the job's coordinator (:class:`~slurm_amoeba.runtime.coordinator.Coordinator`)."""

    @property
    def port(self) -> int: ...

    def start(self) -> None: ...

    def close(self) -> None: ...

    def worker_env(self, worker_id: str) -> dict[str, str]: ...

    def request_leave(self, worker_id: str, *, unstarted: bool = False) -> None: ...

    def mark_dead(self, worker_id: str, reason: str) -> None: ...

    def view(self) -> CoordinatorView: ...

    def set_policy_batch(self, batch: int, world_size: int) -> PolicyBatch: ...

    def set_share(self, directive: ShareDirective) -> ShareDirective: ...


class RunningStep(Protocol):
    """A running worker step (the ``srun`` process of :func:`~slurm_amoeba.slurm.steps.start_step`)."""

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int, /) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


class StepStarter(Protocol):
    """Starts a step: :func:`~slurm_amoeba.slurm.steps.start_step`'s signature."""

    def __call__(
        self, options: StepOptions, command: Sequence[str], *, env: Mapping[str, str], log_path: Path | None = None
    ) -> RunningStep: ...


class Agent:
    """One elastic job's agent (see the module docstring).

    Args:
        config: the settings.
        slurm: the Slurm client (its environment is the job's), built by the program's entry (``amoeba-run``).
        coordinator: the job's coordinator; None: a :class:`Coordinator` from ``config``.
        step_starter: starts the main worker step.
        clock: wall-clock time (Unix seconds).
        new_coordinator: makes the fresh coordinator of a restart from a disk checkpoint; None: from ``config``.
        before_requeue: called before the job requeues itself; a non-empty answer is why it must not (the
            executor's hook for submitit's ``checkpoint()``, :mod:`slurm_amoeba.launcher.fn_worker`).
    """

    def __init__(
        self,
        config: AgentConfig,
        slurm: SlurmClient,
        *,
        coordinator: JobCoordinator | None = None,
        step_starter: StepStarter = start_step,
        clock: Callable[[], float] = time.time,
        new_coordinator: Callable[[], JobCoordinator] | None = None,
        before_requeue: Callable[[], str] | None = None,
    ) -> None:
        self.config = config
        self.slurm = slurm
        self.prefix = f"[{config.job_id}/agent]"
        self.groups: list[WorkerGroup] = []
        self.target = config.spec.min_workers
        self.journal = Journal(clock)
        daemon_uid = config.daemon_uid if config.daemon_uid is not None else configured_daemon_uid()
        self.link = DaemonLink(config.daemon_endpoint, os.getuid(), self.prefix, daemon_uid)
        self._clock = clock
        self._start_step = step_starter
        self._stop_reason = ""
        self._requeue_reason = ""
        self._vacate = ""  # a node the daemon asked the job's satellites to move off (:meth:`order_move`)
        self._beside: PlaceBeside | None = None  # where the daemon asked the next growth to go (:meth:`order_beside`)
        self._sharing: PlaceBeside | None = None  # the order the job's workers beside a host follow (:meth:`_submit`)
        self._shared: ShareDirective | None = None  # the share directive last published (:meth:`publish_share`)
        self.life = JobLife(config, self.journal, self.prefix, before_requeue)
        self.new_coordinator = new_coordinator or (lambda: default_coordinator(config))
        self._main_step: RunningStep | None = None
        self._channel: ChannelServer | None = None
        self._view: CoordinatorView | None = None
        self._over_since: float | None = None
        self._next_poll = 0.0
        self.satellites = SatelliteSlurm(config, self.slurm, self.prefix)
        self._node_gpus: int | None = None
        self.coordinator: JobCoordinator = coordinator or self.new_coordinator()
        config.state_dir.mkdir(parents=True, exist_ok=True)

    # ----------------------------------------------------------------------------------------------- lifecycle

    def run(self) -> int:
        """Run the job to its end; return the exit status of the main worker group (0: training finished).

        SIGTERM or SIGINT (the job cancelled) stop the workers and release every satellite; ``USR1`` (Slurm's
        warning before the time limit) saves the state and requeues the job (:mod:`slurm_amoeba.agent.lifecycle`).
        """
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, REQUEUE_SIGNAL)}
        for sig in previous:
            signal.signal(sig, self._on_signal)
        try:
            self.life.resume(os.environ)
            self.coordinator.start()
            self._channel = ChannelServer(f"tcp://{directive_bind_address(self.config.advertise_addr)}:*")
            spec = self.config.spec
            self.journal.event("started", min_workers=spec.min_workers, max_workers=spec.max_workers)
            log.info(
                "%s store at %s:%d, directives at %s",
                self.prefix,
                self.config.advertise_addr,
                self.coordinator.port,
                self.endpoint,
            )
            self.start_main_group()
            self._register_with_daemon()
            return self._loop()
        finally:
            self.shutdown()
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
        if signum == REQUEUE_SIGNAL:
            self._requeue_reason = f"signal {signal.Signals(signum).name} (the time limit is near)"
        else:
            self.stop(f"signal {signal.Signals(signum).name}")

    def stop(self, reason: str) -> None:
        """Ask the job to stop (what SIGTERM does): the next round ends the loop; satellites are released."""
        self._stop_reason = reason

    def worker_env(self) -> dict[str, str]:
        """The environment of every worker (the store's address; the job's id as ``AMOEBA_PARENT_JOB``)."""
        env = dict(os.environ)
        env.update(self.config.worker_env)
        env.update(self.coordinator.worker_env("unassigned"))
        env.setdefault("OMP_NUM_THREADS", "1")
        if self.life.checkpoint_dir is not None:  # disk checkpoints by default: a lost or requeued job resumes
            env.setdefault(ENV_CHECKPOINT_DIR, str(self.life.checkpoint_dir))
        env[ENV_PARENT_JOB] = self.config.job_id
        return env

    def start_main_group(self) -> None:
        """Start the main worker group ``g0``: the job's minimum workers, as a step of its own allocation."""
        spec = self.config.spec
        now = self._clock()
        group = WorkerGroup(
            "g0",
            False,
            worker_ids("g0", spec.min_workers),
            int(self.config.job_id),
            GroupState.RUNNING,
            now,
            running_at=now,
        )
        self.groups.insert(0, group)
        run = f"-run{self.life.runs + 1}" if self.life.runs else ""  # the earlier runs' logs stay
        self._main_step = self._start_step(
            StepOptions(
                ntasks=spec.min_workers,
                het_group=self.config.main_het_group,
                cpus_per_task=spec.cpus_per_worker,
                gpus_per_task=0 if self.config.share is not None else spec.gpus_per_worker,  # shards: inherited
                name=MAIN_STEP_NAME,
                output=str(self.config.state_dir / f"worker-g0{run}-%t.log"),
            ),
            worker_entry("g0", self.config.command),
            env=self.worker_env(),
            log_path=self.config.state_dir / f"srun-g0{run}.log",
        )
        self.journal.event("group_started", group="g0", workers=spec.min_workers)

    def _loop(self) -> int:
        next_report = next_status = 0.0
        while True:
            status = self.round()
            if status is not None:
                return status
            assert self._view is not None  # observed by the round
            now = self._clock()
            if now >= next_status:
                self.journal.sample(self._view, self.target)
                self.write_status(self._view)
                next_status = now + 1.0
            if self.config.daemon_endpoint and now >= next_report:
                try:
                    self.report_to_daemon(self._view)
                except Exception as exc:  # a report is best effort: never the end of the job
                    log.warning("%s report not sent: %s", self.prefix, quote(exc, 200))
                next_report = now + self.config.report_s
            if self._channel is not None:
                self.serve_one(self._channel, self.config.poll_s)
            else:
                time.sleep(self.config.poll_s)

    def serve_one(self, channel: ChannelServer, timeout_s: float) -> None:
        """Take at most one directive; nothing a peer sends ends the loop (a refusal answers it, at most quoted)."""
        try:
            req = channel.receive(timeout_s)
        except Exception as exc:  # a socket error: log, and the next round tries again
            log.warning("%s receiving a directive failed: %s", self.prefix, quote(exc, 200))
            return
        if req is None:
            return
        try:
            self.handle_directive(channel, req)
        except Exception as exc:  # a bug a message provoked must cost that message only, not the job
            log.exception("%s a %s directive failed", self.prefix, quote(req.message.kind, 40))
            with contextlib.suppress(Exception):
                channel.refuse(req, f"the agent could not handle it ({type(exc).__name__})")

    def round(self) -> int | None:
        """One round: observe, plan, apply. Returns the job's exit status once it ends, else None."""
        seen = self.observe()
        spec = self.config.spec
        limits = Limits(spec.min_workers, workers_per_satellite(spec, self._node_gpus))
        status = self.apply(plan(seen, limits))
        if status is None:
            self.publish_share()
        return status

    def shutdown(self) -> None:
        """Release every satellite, stop the workers, write the final status. Safe to call more than once."""
        try:
            seen = CoordinatorSeen.of(self.coordinator.view())
        except RuntimeConfigError:
            seen = CoordinatorSeen(Phase.LOST, {})  # its thread crashed: nobody to tell about dead workers
        for action in final_releases(self.groups, seen, self._clock()):
            self.release_satellite(action)
        self.stop_main_step()
        with contextlib.suppress(RuntimeConfigError):
            self.write_status(self.coordinator.view())
        self.coordinator.close()
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def stop_main_step(self, grace_s: float = 20.0, *, told: bool = False) -> int:
        """Stop the main worker step (:func:`stop_step`); returns its exit status."""
        return stop_step(self._main_step, grace_s, told=told)

    def now(self) -> float:
        """The agent's clock (Unix seconds)."""
        return self._clock()

    # ----------------------------------------------------------------------------------------------- requeue, restart

    def _ask_every_worker_to_leave(self, reason: str, timeout_s: float) -> int:
        """Every worker leaves at the same step boundary (so the coordinator asks each for a final checkpoint):
        pending satellites are released, running satellites' workers asked to leave through the coordinator, the main
        group sent ``SIGTERM``; then wait up to ``timeout_s`` for the main group's step to end.

        Returns:
            The main step's exit status (it is killed if it has not ended within ``timeout_s``).
        """
        try:
            seen = CoordinatorSeen.of(self.coordinator.view())
        except RuntimeConfigError:  # the coordinator's thread crashed: nobody to ask; stop the main group
            return self.stop_main_step(timeout_s)
        for group in [g for g in self.groups if g.satellite and g.state is not GroupState.ENDED]:
            if group.state is GroupState.PENDING:
                self.release_satellite(release(group, reason, seen, self.now()))
                continue
            for worker in group.active_workers:
                try:
                    self.coordinator.request_leave(worker)
                except RuntimeConfigError as exc:  # not registered yet: its satellite's release ends it
                    log.info("%s %s cannot leave gracefully: %s", self.prefix, worker, exc)
        return self.stop_main_step(timeout_s, told=self._tell_main_group_to_leave())

    def _tell_main_group_to_leave(self) -> bool:
        """``SIGTERM`` the main group's tasks through Slurm (``scancel --signal=TERM <job>.<step>``): each leaves at
        the next step boundary. Its ``srun`` cannot pass it on: a ``SIGTERM`` to ``srun`` ends the step at once.
        Returns whether Slurm took the signal (else the caller stops the step through ``srun``)."""
        try:
            for component in self.slurm.het_components(int(self.config.job_id)):
                for step in self.slurm.steps(component.job_id):
                    if step.name == MAIN_STEP_NAME and step.number is not None:
                        self.slurm.cancel(step.job_id, step=step.number, signal="TERM")
                        return True
        except (SlurmCommandError, AmoebaError) as exc:
            log.warning("%s cannot signal the main group's tasks through Slurm: %s", self.prefix, exc)
        return False

    def _requeue(self, action: Requeue) -> int:
        """Apply :class:`Requeue` (:mod:`slurm_amoeba.agent.lifecycle`); returns the agent's exit status."""
        config = self.config
        log.warning("%s %s: the workers save the state, then the job requeues", self.prefix, action.reason)
        self.journal.event("requeue_requested", reason=action.reason)
        started = time.monotonic()
        status = self._ask_every_worker_to_leave(action.reason, config.stop_timeout_s)
        step = self.life.newest_step()
        self.journal.event(
            "checkpoint_saved" if step is not None else "no_checkpoint",
            step=step,
            workers_status=status,
            stop_s=round(time.monotonic() - started, 3),
        )
        for leftover in final_releases(self.groups, CoordinatorSeen.of(self.coordinator.view()), self.now()):
            self.release_satellite(leftover)
        refusal = self.life.requeue_refusal()
        if refusal:
            log.warning("%s not requeued: %s", self.prefix, refusal)
            self.journal.event("requeue_refused", reason=refusal)
            return ENDED_BY_SIGNAL
        self.journal.event(REQUEUED_EVENT, reason=action.reason, step=step, requeues=self.life.requeues + 1)
        self.write_status(self.coordinator.view())  # Slurm may end this process as soon as the requeue is taken
        try:
            self.slurm.requeue(int(config.job_id))
        except SlurmCommandError as exc:
            if exc.returncode is not None and exc.returncode < 0 and not exc.timed_out:
                # Slurm took the requeue and is ending this run's processes, scontrol among them (measured: -15).
                log.info(
                    "%s job %s requeued at step %s (scontrol ended with this run)", self.prefix, config.job_id, step
                )
                return ENDED_BY_SIGNAL
            log.error("%s scontrol requeue failed: %s", self.prefix, exc)
            self.journal.event("requeue_failed", error=quote(str(exc), 200))
            return ENDED_BY_SIGNAL
        log.info("%s job %s requeued at step %s", self.prefix, config.job_id, step)
        return ENDED_BY_SIGNAL

    def _restart(self, action: RestartFromCheckpoint) -> None:
        """Apply :class:`RestartFromCheckpoint` (:mod:`slurm_amoeba.agent.lifecycle`): release the satellites, stop
        the main group, start a fresh coordinator and main group; the lost run's progress is forgotten."""
        self.life.count_restart(action)
        seen = CoordinatorSeen.of(self.coordinator.view())
        for leftover in final_releases(self.groups, seen, self.now()):
            self.release_satellite(leftover)
        self.stop_main_step(5.0)
        self.coordinator.close()
        self.groups[:] = [g for g in self.groups if g.satellite]  # ended satellites stay: new groups get new names
        self.coordinator = self.new_coordinator()
        self.coordinator.start()
        self._shared = None  # the fresh coordinator has no directive: the next round publishes it again
        self.target = self.config.spec.min_workers
        self._over_since = None
        self.start_main_group()

    # ----------------------------------------------------------------------------------------------- observing

    def observe(self) -> Observation:
        """What the agent sees now: the coordinator every round, Slurm at most once a second."""
        now = self._clock()
        view = self.coordinator.view()
        self._view = view
        if view.phase.is_over() and self._over_since is None:
            self._over_since = now
        satellites: dict[int, JobRecord] | None = None
        main_status = self._main_step.poll() if self._main_step is not None else None
        if now >= self._next_poll:
            self._next_poll = now + max(self.config.poll_s, 1.0)
            if self.config.spec.gpus_per_worker:
                self._node_gpus = self.satellites.node_gpus()  # asked once, again only while it fails
            live = [g.slurm_job for g in self.groups if g.satellite and g.state is not GroupState.ENDED]
            satellites = self.satellites.poll(live) if live else None
        return Observation(
            now=now,
            target=self.target,
            vacate=self._take_move(),
            beside=self._take_beside(),
            groups=self.groups,
            coordinator=CoordinatorSeen.of(view),
            satellites=satellites,
            training_over_since=self._over_since,
            main_step_status=main_status,
            stop_reason=self._stop_reason,
            requeue_reason=self._requeue_reason,
            checkpoint_step=self.life.newest_step() if view.phase is Phase.LOST or main_status else None,
            restarts_left=self.life.restarts_left,
        )

    # ----------------------------------------------------------------------------------------------- applying

    def apply(self, actions: Sequence[Action]) -> int | None:
        """Apply a plan's actions in order (each recorded in the groups once done).

        Returns:
            The job's exit status after an ending action, else None.
        """
        refused = False
        for action in actions:
            if isinstance(action, Stop):
                log.warning("%s stopping: %s", self.prefix, action.reason)
                self.journal.event("stopping", reason=action.reason)
                self._ask_every_worker_to_leave(action.reason, STOP_GRACE_S)  # together: a final checkpoint
                return ENDED_BY_SIGNAL
            if isinstance(action, Requeue):
                return self._requeue(action)
            if isinstance(action, JobFailed):  # a failure a retry repeats: end now, the traceback in our output
                self.journal.announce_failure(action, self.prefix)
                return self.stop_main_step() or 1
            if isinstance(action, MainGroupEnded):
                log.info("%s the main worker group ended with status %s", self.prefix, action.status)
                self.journal.event("main_group_ended", status=action.status, failure=action.failure)
                return action.status
            if isinstance(action, StopMainStep):
                # Training ended (or was lost) but a worker process lingers (hung, declared dead): stop the step.
                log.warning(
                    "%s the job is %s but its worker step still runs; stopping it", self.prefix, action.phase.value
                )
                self.journal.event("main_group_stopped", phase=action.phase.value)
                return self.stop_main_step()
            if isinstance(action, SubmitSatellite):
                if not refused:  # after a refusal the round's further submissions are dropped
                    refused = not self._submit(action)
            elif isinstance(action, ReleaseSatellite):
                self.release_satellite(action)
            elif isinstance(action, RestartFromCheckpoint):
                self._restart(action)
            elif isinstance(action, NodeFailing):
                self.journal.note_node_failing(action, self.prefix)
            elif isinstance(action, LowerTarget):
                self.journal.event("target_lowered", target=action.target, previous=action.previous)
                self.target = action.target
            else:
                self._apply_to_workers(action)
        return None

    def _apply_to_workers(self, action: SatelliteStarted | AskToLeave | WorkerLost | RetireGroup) -> None:
        """Apply an action that changes a group's workers, not its allocation."""
        if isinstance(action, AskToLeave | RetireGroup):
            for worker in action.workers:
                try:
                    # A worker still starting in a running satellite is told to leave the moment it is ready
                    # (it once joined anyway, and its satellite was never released).
                    self.coordinator.request_leave(worker, unstarted=True)
                except RuntimeConfigError as exc:
                    # Already gone, or the last member: it is stopped with its group.
                    log.info(
                        "%s %s cannot leave gracefully (%s); it is stopped with its group", self.prefix, worker, exc
                    )
        record(self.groups, action)
        if isinstance(action, SatelliteStarted):
            requested_at = next(g.requested_at for g in self.groups if g.name == action.group)
            self.journal.event(
                "satellite_running",
                group=action.group,
                slurm_job=action.slurm_job,
                waited_s=round(action.at - requested_at, 3),
            )
        elif isinstance(action, AskToLeave):
            self.journal.event("shrink_requested", group=action.group, workers=list(action.workers))
        elif isinstance(action, RetireGroup):
            self.journal.event("group_retired", group=action.group)
        else:
            self.journal.event("worker_lost", group=action.group, worker=action.worker, status=action.status.value)

    def _submit(self, action: SubmitSatellite) -> bool:
        """Submit a satellite; on a refusal lower the target as the plan said. Returns whether Slurm took it."""
        try:
            beside = (action.beside, action.node) if action.beside is not None else None
            job = self.satellites.submit(action.group, action.workers, self.worker_env(), action.exclude, beside)
        except (SlurmCommandError, AmoebaError, OSError) as exc:
            log.error("%s could not submit a satellite for %d workers: %s", self.prefix, action.workers, exc)
            self.journal.event("grow_failed", workers=action.workers, error=str(exc))
            self.target = action.target_if_refused
            return False
        self.groups.append(new_satellite_group(action, job))
        if action.beside is not None:
            self._sharing = action.beside
        log.info("%s satellite %d (%s) submitted for %d workers", self.prefix, job, action.group, action.workers)
        self.journal.event("satellite_submitted", group=action.group, slurm_job=job, workers=action.workers)
        return True

    def release_satellite(self, action: ReleaseSatellite) -> None:
        """Cancel a satellite's allocation, tell the coordinator its workers are gone, end the group."""
        self.satellites.cancel(action.slurm_job)
        for worker in action.mark_dead:
            self.coordinator.mark_dead(worker, f"its satellite was released ({action.reason})")
        record(self.groups, action)
        log.info("%s satellite %d (%s) released: %s", self.prefix, action.slurm_job, action.group, action.reason)
        self.journal.event("satellite_released", **release_fields(action))

    # ----------------------------------------------------------------------------------------------- directives

    def resize(self, target: int, reason: str = "", batch: int | None = None) -> int:
        """Ask for ``target`` workers; the agent's next round gets there in the background.

        ``batch``: the global batch the daemon's policy chose for ``target`` workers (:meth:`_hand_batch`).

        Returns:
            The accepted target.

        Raises:
            SpecError: ``target`` is outside the job's range (the message gives the range), or ``batch`` is not a
                global batch.
        """
        spec = self.config.spec
        if not spec.min_workers <= target <= spec.max_workers:
            raise SpecError(
                f"resize to {target} workers is outside this job's range {spec.min_workers}..{spec.max_workers}"
            )
        if batch is not None:
            self._hand_batch(batch, target)
        if target != self.target:
            log.info("%s resize %d -> %d (%s)", self.prefix, self.target, target, reason or "no reason given")
            self.journal.event("resize_requested", target=target, previous=self.target, reason=reason)
        self.target = target
        return target

    def order_move(self, node: str, reason: str) -> None:
        """The daemon's move (a directive's ``vacate``): the job's running satellites on ``node`` leave at a step
        boundary and as many workers grow back in satellites that exclude it, the size kept (the next round does it,
        :func:`~slurm_amoeba.agent.plan.plan`; the daemon asks again if it still wants it later)."""
        log.info("%s moving its satellites off %s (%s)", self.prefix, node, reason or "no reason given")
        self.journal.event("move_requested", node=node, target=self.target, reason=reason)
        self._vacate = node

    def order_beside(self, order: PlaceBeside, reason: str) -> None:
        """The daemon's share (a directive's ``place_beside``): the growth it ordered goes beside job
        ``order.host``, one satellite of one shard per worker on the nodes named (the next round does it).

        An order beside the host the job's workers already run beside also gives those workers its terms (memory
        cap, pace bound, sub-batch): the next round publishes them a new directive (:meth:`publish_share`), so
        that the daemon lowers or raises a sharer's cap live."""
        log.info("%s placing workers beside job %s on %s (%s)", self.prefix, order.host, dict(order.nodes), reason)
        self.journal.event(
            "share_requested",
            host=order.host,
            nodes=dict(order.nodes),
            role=order.role,
            memory_cap_bytes=order.memory_cap_bytes,
            reason=reason,
        )
        self._beside = order
        if self._sharing is not None and self._sharing.host == order.host:
            self._sharing = order

    def publish_share(self) -> None:
        """Hand the job's workers beside a host their share directive through the coordinator, when it changes.

        The workers of groups beside another job (not asked to leave) get an ``opportunistic`` directive whose
        partner is the host: its status file and uid, the policy's pace bound and sub-batch, as the daemon's
        ``place_beside`` gave them. It is published as soon as their satellite is submitted, so it is in force
        when they join the sharing generation (their first step is paced). When the place is taken back (the
        workers asked to leave, their satellite released) the directive is cleared: the same workers, no partner,
        no cap, so that they stop pacing at once and leave at their next step boundary. The order's
        ``memory_cap_bytes`` becomes the directive's: each of these workers fits its micro-batch under it (0: no cap).
        """
        order = self._sharing
        beside = tuple(sorted(w for g in self.groups if g.beside for w in g.active_workers))
        if beside and order is not None:
            wanted = ShareDirective(
                ShareRole.OPPORTUNISTIC,
                partner_status_path=order.status_path,
                partner_uid=order.host_uid,
                workers=beside,
                pace_bound=order.pace_bound,
                sub_batch=order.sub_batch,
                memory_cap_bytes=order.memory_cap_bytes,
            )
        elif self._shared is not None and self._shared.partner_status_path:
            wanted = ShareDirective(ShareRole.OPPORTUNISTIC, workers=self._shared.workers)
        else:
            return
        if self._shared is not None and dataclasses.replace(self._shared, seq=0) == wanted:
            return
        try:
            self._shared = self.coordinator.set_share(wanted)
        except (RuntimeConfigError, RuntimeError, OSError) as exc:  # the store failed: the next round tries again
            log.warning("%s share directive not published: %s", self.prefix, exc)
            return
        host = order.host if order is not None else ""
        kind = "share_directive" if wanted.partner_status_path else "share_cleared"
        log.info("%s %s %d for %s beside job %s", self.prefix, kind, self._shared.seq, ",".join(wanted.workers), host)
        self.journal.event(
            kind,
            host=host,
            workers=list(wanted.workers),
            role=wanted.role.value,
            partner_uid=wanted.partner_uid,
            partner_status_path=wanted.partner_status_path,
            memory_cap_bytes=wanted.memory_cap_bytes,
            seq=self._shared.seq,
        )

    def _take_beside(self) -> PlaceBeside | None:
        """The share ordered since the last round, or None; the order is taken (one round's)."""
        order, self._beside = self._beside, None
        return order

    def _take_move(self) -> str:
        """The node of the move ordered since the last round, or ""; the order is taken (one round's)."""
        node, self._vacate = self._vacate, ""
        return node

    def _hand_batch(self, batch: int, workers: int) -> None:
        """Hand the policy's global batch for ``workers`` workers to the coordinator at once (an adaptive job's
        workers apply it once they are ``workers``, docs/runtime.md section 12; a fixed-batch job ignores it).

        Raises:
            SpecError: ``batch`` is not a global batch the runtime takes.
        """
        try:
            choice = self.coordinator.set_policy_batch(batch, workers)
        except ParseError as exc:
            raise SpecError(f"global batch {batch} for {workers} workers: {exc}") from None
        self.journal.event("batch_chosen", batch=batch, workers=workers, choice=choice.seq)

    def handle_directive(self, channel: ChannelServer, req: Request) -> None:
        """Answer one authenticated directive: ``status`` for the owner, the daemon and root; ``resize`` for the
        owner and the daemon; anything else is refused."""
        msg = req.message
        job_id = self.config.job_id
        if msg.kind == "status":
            if not self.link.may_read(req.sender.uid):
                channel.refuse(
                    req, f"uid {req.sender.uid} may not read job {job_id}: only its owner, the daemon and root may"
                )
                return
            channel.answer(req, msg.reply(data=fit_status(self.status())))
            return
        if not self.link.may_direct(req.sender.uid):
            channel.refuse(
                req,
                f"uid {req.sender.uid} may not direct job {job_id}: only its "
                f"owner (uid {self.link.owner_uid}) and the daemon may",
            )
            return
        if msg.kind != "resize":
            channel.refuse(req, f"the agent does not take {msg.kind!r} messages; it takes resize and status")
            return
        if msg.body["job_id"] != job_id:
            channel.refuse(req, f"this is the agent of job {job_id}, not {quote(msg.body['job_id'])}")
            return
        fenced = self.link.admit(msg.body)
        if fenced:
            channel.refuse(req, fenced)
            return
        batch = msg.body.get("batch")
        try:
            target = self.resize(
                int(msg.body["target"]), str(msg.body["reason"]), batch=None if batch is None else int(batch)
            )
        except SpecError as exc:
            channel.answer(req, msg.reply(ok=False, error=str(exc)))
            return
        if msg.body.get("vacate"):
            self.order_move(str(msg.body["vacate"]), str(msg.body["reason"]))
        place = msg.body.get("place_beside")
        if place is not None:  # checked by the protocol (core/messages.check_place_beside)
            self.order_beside(PlaceBeside.from_body(place), str(msg.body["reason"]))
        channel.answer(req, msg.reply(data={"size": self.coordinator.view().world_size, "target": target}))

    def planned_size(self) -> int:
        """Workers the job has or is getting (groups not leaving or ended)."""
        return planned_size(self.groups)

    # ----------------------------------------------------------------------------------------------- reporting

    def status(self, view: CoordinatorView | None = None) -> dict[str, Any]:
        """The job's state as JSON: size, target, groups, generations with pauses, throughput, history."""
        return self.journal.status(
            job_id=self.config.job_id,
            endpoint=self.endpoint,
            spec=self.config.spec,
            target=self.target,
            groups=self.groups,
            view=view or self.coordinator.view(),
        )

    def write_status(self, view: CoordinatorView) -> None:
        """Write the status file atomically (``<state_dir>/agent-status.json``)."""
        path = self.config.state_dir / AGENT_STATUS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.status(view)))
        tmp.replace(path)

    def _register_with_daemon(self) -> None:
        """Register the job with the daemon (its range, resources and directive endpoint)."""
        spec = self.config.spec
        self.link.register(
            {
                "job_id": self.config.job_id,
                "endpoint": self.endpoint,
                "min_workers": spec.min_workers,
                "max_workers": spec.max_workers,
                "gpus_per_worker": spec.gpus_per_worker,
                "partition": os.environ.get("SLURM_JOB_PARTITION", ""),
                "elastic_partition": self.config.elastic_partition,
                **(
                    {"share": self.config.share, "share_partition": self.config.share_partition}
                    if self.config.share is not None
                    else {}
                ),
            }
        )

    def report_to_daemon(self, view: CoordinatorView) -> None:
        """Report the job's size, target, throughput, recent history and satellites to the daemon, an adaptive
        job's statistics (:func:`~slurm_amoeba.agent.status.adaptive_fields`), a planned job's plans, and the device
        memory a sharing job's worker peaked at (``memory_gib``, :func:`~slurm_amoeba.agent.status.memory_gib`;
        absent until the runtime measured it)."""
        status = self.status(view)
        self.link.report(
            {
                "job_id": self.config.job_id,
                "size": status["size"],
                "generation": status["generation"],
                "target": status["target"],
                "throughput": status["throughput"],
                "history": status["history"][-20:],
                "satellites": [g.slurm_job for g in self.groups if g.satellite and g.state is not GroupState.ENDED],
                **({"adaptive": status["adaptive"]} if status.get("adaptive") else {}),
                **({"plans": status["plans"]} if status.get("plans") else {}),
                **({"memory_gib": status["memory_gib"]} if status.get("memory_gib") is not None else {}),
            }
        )


def stop_step(step: RunningStep | None, grace_s: float, *, told: bool = False) -> int:
    """Stop a worker step: SIGTERM its ``srun`` (which ends the step at once: "forcing job termination"), unless
    its tasks were already told to leave through Slurm (``told``: then wait); SIGKILL after ``grace_s``. Returns its
    exit status (0 when there is none)."""
    if step is None:
        return 0
    if step.poll() is None:
        if not told:
            step.send_signal(signal.SIGTERM)
        try:
            step.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            step.kill()
    return step.wait()


def default_coordinator(config: AgentConfig) -> Coordinator:
    """The job's coordinator as ``config`` says (a fresh one, with a new store and secret, on each restart)."""
    return Coordinator(
        CoordinatorConfig(
            job_id=f"job{config.job_id}",
            initial_workers=config.spec.min_workers,
            max_workers=config.spec.max_workers,
            advertise_addr=config.advertise_addr,
            secret_file=str(config.state_dir / JOB_SECRET_FILE),  # the job's secret, 0600, for its workers
            **config.coordinator,  # type: ignore[arg-type]
        )
    )
