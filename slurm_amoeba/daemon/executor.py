"""The daemon's executor: applies a policy's typed actions to the live cluster (DESIGN.md, control flow, act step).

The round asks the composed policy (drain, admission, whole-node moves and queue order composed around the configured
policy) for :mod:`~slurm_amoeba.policy.actions` and hands them here; this is the one place where they become effects.
What each action type does live (:data:`APPLIED`), and which ones cannot be applied live (:data:`REFUSED`):

- :class:`~slurm_amoeba.policy.actions.Resize`: a directive to the job's agent, through the ledger (in flight from
  then on) and the actuator; with ``batch`` the directive carries the policy's global batch, and a resize to the
  job's current size that carries a batch is a batch-only directive. Only managed jobs that may be resized now get
  one.
- :class:`~slurm_amoeba.policy.actions.Move`: a directive that keeps the job's target and vacates ``node`` (its
  satellites there leave and grow back elsewhere).
- :class:`~slurm_amoeba.policy.actions.Hold` and :class:`~slurm_amoeba.policy.actions.Release`: ``scontrol
  hold``/``release`` with the daemon's hold mark in the job's ``AdminComment`` (:class:`~.admission.Admitter`, which
  first takes the round's snapshot as the record of the daemon's holds: :meth:`~.admission.Admitter.sync`).
- :class:`~slurm_amoeba.policy.actions.SetPriority`: ``scontrol update Priority=`` (:class:`~.actuator.QueueOrderer`,
  which lets at most ``queue_order.max_updates_per_round`` through per round, backs off a job Slurm refused, and
  gives jobs their own priority back when the daemon stops).
- :class:`~slurm_amoeba.policy.actions.Start` and :class:`~slurm_amoeba.policy.actions.Preempt`: the live world's
  scheduler is Slurm, which starts and preempts jobs itself; they are recorded (a counter, a debug line), nothing is
  sent.
- :class:`~slurm_amoeba.policy.actions.Place` and :class:`~slurm_amoeba.policy.actions.Share` are refused: a policy
  that can emit them is refused when the daemon is configured (:func:`live_refusal`), with the reason.

Slurm calls (holds, releases, priorities) may hang as ``squeue`` may, so they run on one thread of their own, one
round's worth at a time; a round whose previous Slurm work has not finished skips its own (the next round's
actions supersede it). Directives go out on the actuator's threads.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TypeVar

import slurm_amoeba.policy.actions as act
from slurm_amoeba.daemon.actuator import Actuator, QueueOrderer
from slurm_amoeba.daemon.admission import Admitter
from slurm_amoeba.daemon.ledger import Ledger
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.policy import JobInfo

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The action types the daemon applies, and how.
APPLIED: Mapping[type[act.Action], str] = {
    act.Start: "recorded only: Slurm starts pending jobs itself",
    act.Resize: "a resize directive to the job's agent (with the policy's batch when it gives one)",
    act.Preempt: "recorded only: Slurm preempts jobs itself",
    act.Move: "a directive that keeps the job's target and moves its satellites off the node",
    act.Hold: "scontrol hold, with the daemon's hold mark in the job's AdminComment",
    act.Release: "scontrol release, the mark cleared and the job's priority given back",
    act.SetPriority: "scontrol update Priority=, undone when the daemon stops",
}
#: The action types the daemon cannot apply, and why: a policy that can emit one is refused at configuration.
REFUSED: Mapping[type[act.Action], str] = {
    act.Place: (
        "Slurm cannot move a running job's workers to other nodes at the same size (a job's own allocation never "
        "changes; only satellites come and go)"
    ),
    act.Share: (
        "Slurm gives a GPU to one job at a time (gres/gpu is not shared), so a job cannot run on GPUs another job holds"
    ),
}


def live_refusal(policy_name: str, emits: Collection[type[act.Action]]) -> str:
    """Why the daemon cannot run a policy that emits ``emits``, as a sentence; "" when it can.

    Args:
        policy_name: the policy's configured name.
        emits: the action types the policy (with its layers) may answer with.

    Returns:
        The refusal, naming the policy, the action and the reason, or "".
    """
    refused = [kind for kind in act.ACTION_TYPES if kind in emits and kind in REFUSED]
    if not refused:
        return ""
    reasons = "; ".join(
        f"its {act.action_name(kind)} actions cannot be applied live: {REFUSED[kind]}" for kind in refused
    )
    return f"policy {policy_name!r} cannot run in amoebad: {reasons}; choose a policy that only resizes (e.g. elastic)"


@dataclasses.dataclass(frozen=True)
class Executed:
    """What one round's actions did.

    Attributes:
        ordered: job id -> the size ordered (resizes and moves sent to agents).
        recorded: action name -> how many actions of Slurm's own part (start, preempt) were recorded.
        skipped: actions left out (a job not managed, resizing, or a size it has already; Slurm work of a round
            whose previous Slurm work had not finished).
    """

    ordered: Mapping[str, int]
    recorded: Mapping[str, int]
    skipped: int


class LiveExecutor:
    """Applies actions to the live cluster (see the module docstring).

    Args:
        ledger: the registered jobs (a directive is recorded there as in flight).
        actuator: where directives go.
        metrics: the daemon's metrics.
        admitter: applies holds and releases; None when the daemon may not hold jobs (no hold or release is then
            composed in, and one that comes is skipped with a warning).
        orderer: applies priorities; None likewise.
        revert_on_stop: :meth:`close` gives jobs whose priority was set their own priority back.
    """

    def __init__(
        self,
        ledger: Ledger,
        actuator: Actuator,
        metrics: DaemonMetrics,
        *,
        admitter: Admitter | None = None,
        orderer: QueueOrderer | None = None,
        revert_on_stop: bool = True,
    ) -> None:
        self.ledger = ledger
        self.actuator = actuator
        self.metrics = metrics
        self.admitter = admitter
        self.orderer = orderer
        self.revert_on_stop = revert_on_stop
        self._slurm_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="amoebad-slurm")
        self._slurm_run: concurrent.futures.Future[None] | None = None

    def apply(
        self,
        actions: Sequence[act.Action],
        jobs: Mapping[str, JobInfo],
        managed: Collection[str],
        *,
        source: str,
        now: float,
    ) -> Executed:
        """Apply one round's (checked) actions.

        Args:
            actions: the composed policy's answer.
            jobs: job id -> the snapshot's jobs (a hold's mark records the job's priority and requested GPUs).
            managed: the jobs whose agents registered (the only ones a directive can reach).
            source: ``policy`` or ``drain`` (counted with each directive).
            now: the daemon's clock.

        Returns:
            What was ordered and recorded.
        """
        ordered: dict[str, int] = {}
        recorded: dict[str, int] = {}
        skipped = 0
        slurm_work: list[Callable[[], object]] = []
        if self.admitter is not None:
            self.admitter.sync(jobs, now)
        if self.orderer is not None:
            self.orderer.sync(jobs.values())
            priorities = [action for action in actions if isinstance(action, act.SetPriority)]
            allowed = set(map(id, self.orderer.bounded(priorities, now)))
            skipped += len(priorities) - len(allowed)
            actions = [a for a in actions if not isinstance(a, act.SetPriority) or id(a) in allowed]
        for action in actions:
            if isinstance(action, (act.Start, act.Preempt)):
                name = act.action_name(type(action))
                recorded[name] = recorded.get(name, 0) + 1
                self.metrics.slurm_actions.inc(labels={"action": name})
                logger.debug("[daemon/executor] %s of job %s is Slurm's to do: %s", name, action.job_id, action.reason)
            elif isinstance(action, (act.Resize, act.Move)):
                target = self._direct(action, jobs.get(action.job_id), action.job_id in managed, source)
                if target is None:
                    skipped += 1
                else:
                    ordered[action.job_id] = target
            elif isinstance(action, (act.Hold, act.Release, act.SetPriority)):
                work = self._slurm_call(action, jobs.get(action.job_id), now)
                if work is None:
                    skipped += 1
                else:
                    slurm_work.append(work)
            else:  # Place, Share: refused at configuration (live_refusal); one that comes anyway is a bug
                raise TypeError(f"the daemon cannot apply {action!r}: {REFUSED[type(action)]}")
        if slurm_work and not self._submit(slurm_work):
            skipped += len(slurm_work)
        return Executed(ordered, recorded, skipped)

    def _direct(self, action: act.Resize | act.Move, info: JobInfo | None, managed: bool, source: str) -> int | None:
        """Send the directive of a resize or move; the size ordered, or None when the job cannot take one now."""
        batch_only = (
            isinstance(action, act.Resize)
            and info is not None
            and action.workers == info.workers
            and action.batch is not None
        )
        if info is None or not managed or (info.pinned or info.resizing or info.shared_with is not None):
            return None
        if not batch_only and not info.is_resizable:  # a fixed-size adaptive job takes batch-only directives
            return None
        agent = self.ledger.agents[action.job_id]
        if isinstance(action, act.Move):
            target = agent.report.target if agent.report else info.workers
            directive = self.ledger.order(
                agent, target, action.reason, source, vacate=action.node, for_job=action.for_job
            )
            self.actuator.send(directive)
            return target
        if action.workers == 0 or (action.workers == info.workers and action.batch is None):
            return None
        reason = action.reason or source
        self.actuator.send(self.ledger.order(agent, action.workers, reason, source, batch=action.batch))
        return action.workers

    def _slurm_call(
        self, action: act.Hold | act.Release | act.SetPriority, info: JobInfo | None, now: float
    ) -> Callable[[], object] | None:
        """The Slurm call that applies a hold, release or priority (run on the Slurm thread), or None when the
        daemon has no control for it."""
        job_id = action.job_id
        owner = info.owner if info is not None else ""
        if isinstance(action, act.SetPriority):
            orderer = self.orderer
            if orderer is None:
                logger.warning("[daemon/executor] no queue control: priority of job %s not set", job_id)
                return None
            current = info.priority if info is not None else 0
            attained = info.attained_service if info is not None else 0.0
            return lambda: orderer.set_priority(job_id, action.priority, current, attained, now)
        admitter = self.admitter
        if admitter is None:
            logger.warning(
                "[daemon/executor] no admission control: %s of job %s not applied",
                act.action_name(type(action)),
                job_id,
            )
            return None
        if isinstance(action, act.Hold):
            priority = info.priority if info is not None else 0
            wanted = action.wants_gpus or (info.max_workers * info.gpus_per_worker if info is not None else 0)
            return lambda: admitter.hold(job_id, owner, priority, wanted, action.reason, now)
        return lambda: admitter.release(job_id, owner, action.reason, now, starved=action.starved)

    def _submit(self, work: Sequence[Callable[[], object]]) -> bool:
        """Run one round's Slurm calls on the Slurm thread; False when the previous round's are still running."""
        if self._slurm_run is not None and not self._slurm_run.done():
            logger.info("[daemon/executor] the previous round's Slurm calls are still running; %d skipped", len(work))
            return False

        def run() -> None:
            for call in work:
                call()

        self._slurm_run = self._slurm_pool.submit(run)
        self._slurm_run.add_done_callback(_log_failure)
        return True

    def submit(self, call: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``call`` on the Slurm thread (one Slurm call at a time, off the round's thread)."""
        return self._slurm_pool.submit(call)

    def wait(self) -> None:
        """Wait for the Slurm calls under way (tests; :meth:`close`)."""
        if self._slurm_run is not None:
            concurrent.futures.wait([self._slurm_run])

    def close(self) -> None:
        """Wait for the Slurm calls under way, then (``revert_on_stop``) give reordered jobs their own priority
        back and release every job the daemon holds."""
        self._slurm_pool.shutdown(wait=True, cancel_futures=True)
        if self.orderer is not None and self.revert_on_stop:
            self.orderer.revert()
        if self.admitter is not None:
            self.admitter.release_all()


def _log_failure(run: concurrent.futures.Future[None]) -> None:
    if not run.cancelled() and run.exception() is not None:
        logger.error("[daemon/executor] Slurm calls failed this round: %r; the next round tries again", run.exception())
