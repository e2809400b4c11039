"""The job's life beyond one allocation: save and requeue before the time limit, restart from a disk checkpoint.

:class:`JobLife` owns what outlives one run of the agent or one coordinator: how often the job requeued itself
(its earlier runs' history says), how often it restarted from a disk checkpoint in this allocation, where its
checkpoints are, and the history its earlier runs left. The agent (:mod:`slurm_amoeba.agent.agent`) owns its
workers, satellites and coordinator, and applies two actions of its plan with it (DESIGN.md, job flow):

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

A requeued job's new agent carries the previous runs' history on (:meth:`JobLife.resume`), so that the user sees
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
from collections.abc import Callable, Mapping
from pathlib import Path

from slurm_amoeba.agent.config import AgentConfig
from slurm_amoeba.agent.plan import RestartFromCheckpoint
from slurm_amoeba.agent.status import Journal
from slurm_amoeba.core.layout import AGENT_STATUS_FILE
from slurm_amoeba.runtime.checkpoint import CHECKPOINTS_OFF, ENV_CHECKPOINT_DIR, newest_complete

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


class JobLife:
    """The job's life beyond one run and one coordinator (see the module docstring).

    Args:
        config: the agent's settings (state directory, job id, ``max_requeues``, ``max_restarts``).
        journal: the job's history, which earlier runs' history is carried into.
        prefix: the agent's log prefix.
        before_requeue: called before the job requeues itself; a non-empty answer is why it must not.
        environ: the agent's environment (``AMOEBA_CHECKPOINT_DIR`` besides the configured worker environment).
    """

    def __init__(
        self,
        config: AgentConfig,
        journal: Journal,
        prefix: str,
        before_requeue: Callable[[], str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._config = config
        self._journal = journal
        self._prefix = prefix
        self.before_requeue = before_requeue
        environ = os.environ if environ is None else environ
        self.checkpoint_dir = checkpoint_directory({**environ, **config.worker_env}, config.state_dir)
        self.requeues = 0  # times the job requeued itself before this run (its history says)
        self.restarts = 0  # restarts from a disk checkpoint in this allocation

    @property
    def runs(self) -> int:
        """Runs of the main group before the current one (requeues and restarts): names its new logs apart."""
        return self.requeues + self.restarts

    @property
    def restarts_left(self) -> int:
        """Restarts from a disk checkpoint this allocation may still make (``max_restarts`` less those made)."""
        return self._config.max_restarts - self.restarts

    def newest_step(self) -> int | None:
        """The step of the job's newest complete disk checkpoint (None: none, or checkpoints off)."""
        return newest_step(self.checkpoint_dir)

    # ------------------------------------------------------------------------------------------- history

    def resume(self, environ: Mapping[str, str]) -> None:
        """Carry a requeued job's earlier runs' history on (read from the status file they left), say how this run
        began, and count the job's requeues so far (what counts against ``max_requeues``). In a job's first run,
        set aside the checkpoints an earlier job of the same id left (:meth:`set_aside_stale_checkpoints`)."""
        restarts = environ.get("SLURM_RESTART_COUNT", "")
        if restarts in ("", "0"):  # the job's first run: what the state dir holds is another job's of the same id
            self.set_aside_stale_checkpoints()
            return
        try:
            previous = json.loads((self._config.state_dir / AGENT_STATUS_FILE).read_text())
        except (OSError, ValueError):
            return
        if not isinstance(previous, dict) or previous.get("job_id") != self._config.job_id:
            return
        history = [e for e in previous.get("history") or [] if isinstance(e, dict) and "event" in e]
        self._journal.history[:0] = history[-_HISTORY_KEEP:]
        self.requeues = sum(1 for e in history if e["event"] == REQUEUED_EVENT)
        last = history[-1]["event"] if history else ""
        if last == REQUEUED_EVENT:
            self._journal.event("resumed", restart_count=restarts, requeues=self.requeues)
        else:
            # The previous run neither finished nor requeued itself: its node failed (Slurm requeued it: --requeue),
            # or someone requeued it by hand.
            self._journal.event("restarted_by_slurm", restart_count=restarts, previous_last_event=last)

    def set_aside_stale_checkpoints(self) -> None:
        """In a job's first run, checkpoints in the default directory belong to an earlier job of the same id (Slurm's
        ids start again after a reinstall): rename them aside, so that this job does not resume from them. A
        directory the user named is left alone (resuming from it is the point)."""
        default = self._config.state_dir / CHECKPOINT_SUBDIR
        if self.checkpoint_dir != default or not default.is_dir() or not any(default.iterdir()):
            return
        aside = default.with_name(f"{CHECKPOINT_SUBDIR}.earlier-{int(time.time())}")
        default.rename(aside)
        log.warning("%s %s held an earlier job's checkpoints; moved to %s", self._prefix, default, aside)

    # ------------------------------------------------------------------------------------------- requeue, restart

    def requeue_refusal(self) -> str:
        """Why the job must not requeue itself now (``max_requeues`` reached, or the executor's hook says so), or
        ""."""
        if self.requeues >= self._config.max_requeues:
            return f"the job requeued itself {self.requeues} times already (max_requeues={self._config.max_requeues})"
        return self.before_requeue() if self.before_requeue is not None else ""

    def count_restart(self, action: RestartFromCheckpoint) -> None:
        """Count a restart from the checkpoint of ``action`` and say so in the log and the history."""
        self.restarts += 1
        log.warning(
            "%s %s: restarting from the checkpoint of step %s (restart %d of %d)",
            self._prefix,
            action.reason,
            action.step,
            self.restarts,
            self._config.max_restarts,
        )
        self._journal.event("restarting", reason=action.reason, step=action.step, restart=self.restarts)
