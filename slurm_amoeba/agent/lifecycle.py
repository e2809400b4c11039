"""The job's life beyond one allocation: save and requeue before the time limit, restart from a disk checkpoint.

The agent (:mod:`slurm_amoeba.agent.agent`) applies two actions of its plan here (DESIGN.md, job flow):

* :class:`~slurm_amoeba.agent.plan.Requeue` — Slurm's warning before the time limit (``--signal=B:USR1@<s>``, which
  ``amoeba-sbatch`` and the executor set), or ``scancel --batch --signal=USR1`` by hand: every worker is asked to
  leave at once (the main group's tasks by ``SIGTERM`` through Slurm, the satellites' workers through the
  coordinator), so that all members leave at the same step boundary and the coordinator asks each one for its shard
  of a final disk checkpoint (:mod:`slurm_amoeba.runtime.checkpoint`); the satellites are released; the agent writes
  its status and requeues its own job (``scontrol requeue``: the same job id, so ``ElasticJob.result()`` and
  ``squeue`` follow it), at most ``max_requeues`` times. Slurm keeps a requeued job pending for its credential
  lifetime (``cred_expire``, 120 s by default) before it runs again; the workers then resume at the saved step.
* :class:`~slurm_amoeba.agent.plan.RestartFromCheckpoint` — every worker holding the state is gone while the agent
  still runs: the satellites are released, a fresh coordinator (a new store, a new secret) and a new main group
  start, and the workers resume from the newest complete checkpoint, at most ``max_restarts`` times per allocation.

A requeued job's new agent carries the previous runs' history on (:func:`resume_history`), so that the user sees
one job whose history says what happened: ``requeue_requested``, ``checkpoint_saved``, ``requeued``, then
``resumed`` in the next run (or ``restarted_by_slurm`` when the previous run ended without a word: its node failed
and Slurm requeued it, ``--requeue``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_amoeba.agent.groups import GroupState
from slurm_amoeba.agent.plan import CoordinatorSeen, Requeue, RestartFromCheckpoint, final_releases, release
from slurm_amoeba.core.errors import AmoebaError
from slurm_amoeba.core.layout import AGENT_STATUS_FILE
from slurm_amoeba.core.messages import quote
from slurm_amoeba.runtime.checkpoint import CHECKPOINTS_OFF, ENV_CHECKPOINT_DIR, newest_complete
from slurm_amoeba.runtime.errors import RuntimeConfigError
from slurm_amoeba.slurm import SlurmCommandError

if TYPE_CHECKING:
    from slurm_amoeba.agent.agent import Agent

log = logging.getLogger(__name__)

ENDED_BY_SIGNAL = 143
"""The agent's exit status when a signal stopped the job (128 + SIGTERM), requeued or not."""
STOP_GRACE_S = 20.0
"""How long a stopped job's workers get to leave (and write a final checkpoint) before they are killed."""
#: The signal that asks the agent to save the state and requeue the job (``--signal=B:USR1@<seconds>``).
REQUEUE_SIGNAL = signal.SIGUSR1
#: The main worker group's step name (``srun --job-name``), by which the agent signals its tasks through Slurm.
MAIN_STEP_NAME = "amoeba-workers-g0"
#: Where the agent's workers write disk checkpoints unless ``AMOEBA_CHECKPOINT_DIR`` names another place.
CHECKPOINT_SUBDIR = "checkpoints"
#: The history events that count against ``max_requeues``.
REQUEUED_EVENT = "requeued"
_HISTORY_KEEP = 150  # of a previous run's events, at most (the journal keeps 200)


def checkpoint_directory(worker_env: Mapping[str, str], state_dir: Path) -> Path | None:
    """Where the job's workers write disk checkpoints: ``AMOEBA_CHECKPOINT_DIR`` when set (``none``: nowhere), else
    ``<state_dir>/checkpoints`` (the agent gives its workers that default)."""
    named = worker_env.get(ENV_CHECKPOINT_DIR, "")
    if named == CHECKPOINTS_OFF:
        return None
    return Path(named) if named else state_dir / CHECKPOINT_SUBDIR


def newest_step(directory: Path | None) -> int | None:
    """The step of the newest complete checkpoint under ``directory`` (None: none, or no directory)."""
    if directory is None:
        return None
    try:
        newest = newest_complete(directory)
    except OSError as exc:  # a file system hiccup: no restart this round, the next one looks again
        log.warning("cannot read the checkpoints under %s: %s", directory, exc)
        return None
    return None if newest is None else newest.step


# ----------------------------------------------------------------------------------------------- history


def resume_history(agent: Agent, environ: Mapping[str, str]) -> int:
    """Carry a requeued job's earlier runs' history on (read from the status file they left), and say how this run
    began. Returns how many times the job requeued itself so far (what counts against ``max_requeues``)."""
    path = agent.config.state_dir / AGENT_STATUS_FILE
    restarts = environ.get("SLURM_RESTART_COUNT", "")
    if restarts in ("", "0"):  # the job's first run: what the state dir holds is another job's of the same id
        set_aside_stale_checkpoints(agent)
        return 0
    try:
        previous = json.loads(path.read_text())
    except (OSError, ValueError):
        return 0
    if not isinstance(previous, dict) or previous.get("job_id") != agent.config.job_id:
        return 0
    history = [e for e in previous.get("history") or [] if isinstance(e, dict) and "event" in e]
    agent.journal.history[:0] = history[-_HISTORY_KEEP:]
    requeues = sum(1 for e in history if e["event"] == REQUEUED_EVENT)
    last = history[-1]["event"] if history else ""
    if last == REQUEUED_EVENT:
        agent.journal.event("resumed", restart_count=restarts, requeues=requeues)
    else:
        # The previous run neither finished nor requeued itself: its node failed (Slurm requeued it: --requeue), or
        # someone requeued it by hand.
        agent.journal.event("restarted_by_slurm", restart_count=restarts, previous_last_event=last)
    return requeues


def set_aside_stale_checkpoints(agent: Agent) -> None:
    """In a job's first run, checkpoints in the default directory belong to an earlier job of the same id (Slurm's
    ids start again after a reinstall): rename them aside, so that this job does not resume from them. A directory
    the user named is left alone (resuming from it is the point)."""
    default = agent.config.state_dir / CHECKPOINT_SUBDIR
    if agent.checkpoint_dir != default or not default.is_dir() or not any(default.iterdir()):
        return
    aside = default.with_name(f"{CHECKPOINT_SUBDIR}.earlier-{int(time.time())}")
    default.rename(aside)
    log.warning("%s %s held an earlier job's checkpoints; moved to %s", agent.prefix, default, aside)


# ----------------------------------------------------------------------------------------------- requeue


def ask_every_worker_to_leave(agent: Agent, reason: str, timeout_s: float) -> int:
    """Every worker leaves at the same step boundary (so the coordinator asks each for a final checkpoint): pending
    satellites are released, running satellites' workers asked to leave through the coordinator, the main group
    sent ``SIGTERM``; then wait up to ``timeout_s`` for the main group's step to end.

    Returns:
        The main step's exit status (it is killed if it has not ended within ``timeout_s``).
    """
    try:
        seen = CoordinatorSeen.of(agent.coordinator.view())
    except RuntimeConfigError:  # the coordinator's thread crashed: nobody to ask; stop the main group
        return agent.stop_main_step(timeout_s)
    for group in [g for g in agent.groups if g.satellite and g.state is not GroupState.ENDED]:
        if group.state is GroupState.PENDING:
            agent.release_satellite(release(group, reason, seen, agent.now()))
            continue
        for worker in group.active_workers:
            try:
                agent.coordinator.request_leave(worker)
            except RuntimeConfigError as exc:  # not registered yet: its satellite's release ends it
                log.info("%s %s cannot leave gracefully: %s", agent.prefix, worker, exc)
    return agent.stop_main_step(timeout_s, told=tell_main_group_to_leave(agent))


def tell_main_group_to_leave(agent: Agent) -> bool:
    """``SIGTERM`` the main group's tasks through Slurm (``scancel --signal=TERM <job>.<step>``): each leaves at the
    next step boundary. Its ``srun`` cannot pass it on: a ``SIGTERM`` to ``srun`` ends the step at once. Returns
    whether Slurm took the signal (else the caller stops the step through ``srun``)."""
    try:
        for component in agent.slurm.het_components(int(agent.config.job_id)):
            for step in agent.slurm.steps(component.job_id):
                if step.name == MAIN_STEP_NAME and step.number is not None:
                    agent.slurm.cancel(step.job_id, step=step.number, signal="TERM")
                    return True
    except (SlurmCommandError, AmoebaError) as exc:
        log.warning("%s cannot signal the main group's tasks through Slurm: %s", agent.prefix, exc)
    return False


def requeue(agent: Agent, action: Requeue, requeues: int) -> int:
    """Apply :class:`Requeue` (see the module docstring); returns the agent's exit status."""
    config = agent.config
    log.warning("%s %s: the workers save the state, then the job requeues", agent.prefix, action.reason)
    agent.journal.event("requeue_requested", reason=action.reason)
    started = time.monotonic()
    status = ask_every_worker_to_leave(agent, action.reason, config.stop_timeout_s)
    step = newest_step(agent.checkpoint_dir)
    agent.journal.event(
        "checkpoint_saved" if step is not None else "no_checkpoint",
        step=step,
        workers_status=status,
        stop_s=round(time.monotonic() - started, 3),
    )
    for leftover in final_releases(agent.groups, CoordinatorSeen.of(agent.coordinator.view()), agent.now()):
        agent.release_satellite(leftover)
    refusal = ""
    if requeues >= config.max_requeues:
        refusal = f"the job requeued itself {requeues} times already (max_requeues={config.max_requeues})"
    elif agent.before_requeue is not None:
        refusal = agent.before_requeue()
    if refusal:
        log.warning("%s not requeued: %s", agent.prefix, refusal)
        agent.journal.event("requeue_refused", reason=refusal)
        return ENDED_BY_SIGNAL
    agent.journal.event(REQUEUED_EVENT, reason=action.reason, step=step, requeues=requeues + 1)
    agent.write_status(agent.coordinator.view())  # Slurm may end this process as soon as the requeue is taken
    try:
        agent.slurm.requeue(int(config.job_id))
    except SlurmCommandError as exc:
        if exc.returncode is not None and exc.returncode < 0 and not exc.timed_out:
            # Slurm took the requeue and is ending this run's processes, scontrol among them (measured: -15).
            log.info("%s job %s requeued at step %s (scontrol ended with this run)", agent.prefix, config.job_id, step)
            return ENDED_BY_SIGNAL
        log.error("%s scontrol requeue failed: %s", agent.prefix, exc)
        agent.journal.event("requeue_failed", error=quote(str(exc), 200))
        return ENDED_BY_SIGNAL
    log.info("%s job %s requeued at step %s", agent.prefix, config.job_id, step)
    return ENDED_BY_SIGNAL


# ----------------------------------------------------------------------------------------------- restart


def restart(agent: Agent, action: RestartFromCheckpoint) -> None:
    """Apply :class:`RestartFromCheckpoint` (see the module docstring)."""
    agent.restarts += 1
    log.warning(
        "%s %s: restarting from the checkpoint of step %s (restart %d of %d)",
        agent.prefix,
        action.reason,
        action.step,
        agent.restarts,
        agent.config.max_restarts,
    )
    agent.journal.event("restarting", reason=action.reason, step=action.step, restart=agent.restarts)
    seen = CoordinatorSeen.of(agent.coordinator.view())
    for leftover in final_releases(agent.groups, seen, agent.now()):
        agent.release_satellite(leftover)
    agent.stop_main_step(5.0)
    agent.coordinator.close()
    agent.groups[:] = [g for g in agent.groups if g.satellite]  # ended satellites stay: new groups get new names
    agent.coordinator = agent.new_coordinator()
    agent.coordinator.start()
    agent.reset_for_restart()
    agent.start_main_group()


def environ_restart_count(environ: Mapping[str, str] | None = None) -> int:
    """How many times Slurm has restarted this job (``SLURM_RESTART_COUNT``; 0 when unset or malformed)."""
    text = (os.environ if environ is None else environ).get("SLURM_RESTART_COUNT", "")
    return int(text) if text.isdigit() else 0
