"""The daemon's round: observe -> snapshot -> decide -> act, once every ``interval_s`` (DESIGN.md, control flow).

Each step is a function of the previous one's result: :func:`~slurm_amoeba.daemon.observer.observe` reads Slurm,
:func:`~slurm_amoeba.daemon.snapshot.build_snapshot` (pure) turns that and the agents' reports into the policy's
snapshot, :func:`decide` (pure but for timing the policy) asks the policy, wrapped in the operator's drain
(:class:`~slurm_amoeba.policy.drain.DrainPolicy`), and keeps the resizes of managed jobs, and :meth:`RoundLoop.act`
hands them to the actuator. Bookkeeping (the ledger's expired resizes and forgotten jobs, satellite warnings, the
state file, metrics, the rounds kept for ``status``) happens between the steps, in :class:`RoundLoop`, never inside
them.

Reading Slurm can hang (a slurmctld that does not answer holds squeue for ``slurm.timeout_s``), so the live loop
never reads it on its own thread: :meth:`RoundLoop.begin_round` starts the observe step on a thread of its own and
:meth:`RoundLoop.finish_round` runs the rest of the round once Slurm has answered. A hung slurmctld delays rounds;
requests are answered meanwhile, from the last view (a request about a job the view does not show yet asks for an
early round and is told to retry).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.daemon.actuator import QueueOrderer, QueueRound
from slurm_amoeba.daemon.admission import AdmissionRound, Admitter
from slurm_amoeba.daemon.batches import policy_batches
from slurm_amoeba.daemon.config import DaemonConfig
from slurm_amoeba.daemon.executor import LiveExecutor
from slurm_amoeba.daemon.ledger import Ledger, SatelliteWatch
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.daemon.observer import ClusterSource, ClusterView, Observation, SubmissionBook, observe
from slurm_amoeba.daemon.snapshot import build_snapshot
from slurm_amoeba.policy import Decision, DrainPolicy, JobInfo, Policy, PolicyError, check_decisions
from slurm_amoeba.policy.actions import Resize
from slurm_amoeba.policy.moves import whole_node_moves
from slurm_amoeba.slurm import JobRecord, SlurmCommandError

logger = logging.getLogger(__name__)

#: Recent rounds kept for ``status`` and benchmarks.
ROUNDS_KEPT = 1000
#: A registration for a job the last view does not show reads Slurm again, at most this often.
REFRESH_MIN_S = 1.0


@dataclasses.dataclass(frozen=True)
class RoundSummary:
    """What one round did (for ``amoebactl status``, logs and tests).

    Attributes:
        at: when it started (the daemon's clock).
        duration_s: how long it took.
        policy_s: how long the policy took (0 when it did not run).
        ordered: job id -> ordered size.
        error: why the round was cut short, or "".
    """

    at: float
    duration_s: float
    policy_s: float
    ordered: dict[str, int]
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the decide step wants done.

    Attributes:
        targets: managed job id -> the size to order.
        reasons: job id -> why (sent to the agent).
        source: ``policy``, or ``drain`` while an operator's drain is on.
        policy_s: how long the policy took.
        error: why nothing may be done (the policy broke an invariant), or "".
        batches: job id -> the global batch sent with its directive (``goodput``'s adaptive jobs, daemon/batches.py).
    """

    targets: Mapping[str, int]
    reasons: Mapping[str, str]
    source: str
    policy_s: float
    error: str = ""
    batches: Mapping[str, int] = dataclasses.field(default_factory=dict)


def resize_targets(
    managed: Mapping[str, JobInfo], decisions: Sequence[Decision], default_reason: str
) -> tuple[dict[str, int], dict[str, str]]:
    """The decisions the daemon acts on: resizes of the managed elastic jobs that may be resized now.

    Slurm starts and preempts jobs itself; the daemon only resizes the elastic jobs whose agents registered.

    Args:
        managed: job id -> the managed jobs as the snapshot shows them.
        decisions: the policy's (checked) decisions.
        default_reason: the reason of a decision that gives none (the policy's name).

    Returns:
        job id -> target size, and job id -> reason.
    """
    targets: dict[str, int] = {}
    reasons: dict[str, str] = {}
    for decision in decisions:
        info = managed.get(decision.job_id)
        if info is None or not info.is_resizable or decision.workers in (0, info.workers):
            continue
        targets[decision.job_id] = decision.workers
        reasons[decision.job_id] = decision.reason or default_reason
    return targets, reasons


def decide(policy: Policy, obs: Observation, now: float, *, draining: bool) -> Plan:
    """The decide step: the policy (behind the drain switch) on the snapshot, checked, narrowed to resizes.

    Args:
        policy: the configured policy.
        obs: the snapshot step's result.
        now: the daemon's clock.
        draining: whether an operator's drain is on.

    Returns:
        The plan; with ``error`` set and no targets when the decisions broke an invariant.
    """
    source = "drain" if draining else "policy"
    tick = time.perf_counter()
    decisions = DrainPolicy(policy, draining).decide(obs.snapshot, now)
    policy_s = time.perf_counter() - tick
    try:
        check_decisions(obs.snapshot, decisions)
    except PolicyError as exc:
        return Plan({}, {}, source, policy_s, f"policy error: {exc}")
    targets, reasons = resize_targets(obs.managed, decisions, policy.name)
    targets, reasons, batches = policy_batches(policy.name, obs.managed, targets, reasons)
    return Plan(targets, reasons, source, policy_s, batches=batches)


class RoundLoop:
    """Runs rounds (see the module docstring) and keeps the latest view of the cluster.

    Args:
        config: the daemon's configuration.
        slurm: where jobs and nodes are read from.
        policy: the configured policy.
        ledger: the registered jobs and the persistent state.
        metrics: the daemon's metrics.
        executor: applies the round's actions (directives to agents; holds, releases and priorities in Slurm, on
            its Slurm thread), built at the daemon's entry with the daemon's user and Slurm controls.
        clock: the daemon's wall clock.

    Attributes:
        view: Slurm's jobs and nodes as last read.
        last_observation: the last snapshot step's result.
        last_round: the last round's summary.
        rounds: the last :data:`ROUNDS_KEPT` summaries.
    """

    def __init__(
        self,
        config: DaemonConfig,
        slurm: ClusterSource,
        policy: Policy,
        ledger: Ledger,
        metrics: DaemonMetrics,
        executor: LiveExecutor,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.slurm = slurm
        self.policy = policy
        self.ledger = ledger
        self.metrics = metrics
        self.executor = executor
        self.clock = clock
        self.view: ClusterView | None = None
        self.last_observation: Observation | None = None
        self.last_round: RoundSummary | None = None
        self.rounds: collections.deque[RoundSummary] = collections.deque(maxlen=ROUNDS_KEPT)
        self.watch = SatelliteWatch(config.orphan_grace_s)
        self.refresh_wanted = False
        self.submissions = SubmissionBook.for_source(slurm, config.slurm_timeout_s)
        self._pending: _Observing | None = None
        self._moved: dict[str, float] = {}  # job id -> when a move was ordered for it or to it (:meth:`move`)
        self._queue_run: concurrent.futures.Future[QueueRound] | None = None
        self._admission_run: concurrent.futures.Future[AdmissionRound] | None = None

    @property
    def queue(self) -> QueueOrderer | None:
        """Queue ordering (the executor's priority control), or None when it is off."""
        return self.executor.orderer

    @property
    def admission(self) -> Admitter | None:
        """Admission (the executor's hold control), or None when the Slurm source cannot hold jobs."""
        return self.executor.admitter

    def begin_round(self) -> bool:
        """Start a round: read Slurm on a thread of its own (see the module docstring).

        Returns:
            False when the previous round's read of Slurm has not come back yet (nothing is started).
        """
        if self._pending is not None:
            return False
        self.refresh_wanted = False
        self._pending = _Observing(self.slurm, self.clock(), self.submissions)
        return True

    @property
    def observing(self) -> bool:
        """Whether a round waits for Slurm's answer."""
        return self._pending is not None

    def finish_round(self) -> RoundSummary | None:
        """Finish the round :meth:`begin_round` started once Slurm has answered; never raises.

        Returns:
            The round's summary, or None while Slurm has not answered (or no round was started).
        """
        pending = self._pending
        if pending is None or not pending.done.is_set():
            return None
        self._pending = None
        return self._run(pending.now, pending.started, lambda: pending.result())

    def run_round(self) -> RoundSummary:
        """Observe, decide and order once; never raises (a failed round is logged and reported)."""
        return self._run(self.clock(), time.perf_counter(), lambda: observe(self.slurm, self.clock(), self.submissions))

    def _run(self, now: float, started: float, read: Callable[[], ClusterView]) -> RoundSummary:
        try:
            summary = self._round(now, started, read)
        except Exception as exc:
            logger.exception("[daemon] the round failed; the next one starts afresh")
            summary = RoundSummary(now, time.perf_counter() - started, 0.0, {}, f"internal error: {exc}")
        self._book_round(summary, now)
        return summary

    def _round(self, now: float, started: float, read: Callable[[], ClusterView]) -> RoundSummary:
        try:
            view = read()
        except (SlurmCommandError, ParseError) as exc:
            self.metrics.observe_failures.inc()
            logger.warning("[daemon/observer] Slurm did not answer (%s); no decisions this round", exc)
            return RoundSummary(now, time.perf_counter() - started, 0.0, {}, f"Slurm did not answer: {exc}")
        self.view = view
        self.ledger.expire_resizes(now)  # before the snapshot, which shows jobs with a resize in flight as resizing
        obs = self.snapshot(view, now)
        self._book_observation(obs, view, now)
        plan = decide(self.policy, obs, now, draining=self.ledger.state.draining)
        self.metrics.policy_time.observe(plan.policy_s)
        if plan.error:
            logger.error("[daemon/policy] %s: %s; no directives this round", self.policy.name, plan.error)
            return RoundSummary(now, time.perf_counter() - started, plan.policy_s, {}, plan.error)
        self.act(plan, obs, now)
        self.move(obs, view, plan, now)
        self.order_queue(view, now)
        self.admit(view, now, frozenset(obs.managed))
        update_gauges(self.metrics, obs, self.ledger)
        return RoundSummary(now, time.perf_counter() - started, plan.policy_s, dict(plan.targets))

    def move(self, obs: Observation, view: ClusterView, plan: Plan, now: float) -> None:
        """Whole-node starts (``whole_node_starts``, :mod:`.moves`): order the moves that let a pending job start on
        one node, to jobs the policy does not resize this round; neither that pending job nor a moved job is moved
        for again within ``resize_timeout_s`` (the node is being vacated)."""
        if not self.config.whole_node_starts or plan.source != "policy":
            return
        timeout = self.config.resize_timeout_s
        self._moved = {job_id: at for job_id, at in self._moved.items() if now - at < timeout}
        moves = whole_node_moves(obs.snapshot, exclude={*plan.targets, *self._moved}, skip=self._moved)
        self.executor.apply(moves, obs.managed, obs.managed, source="policy", now=now)
        for move in moves:
            self._moved[move.job_id] = self._moved[move.for_job] = now

    def order_queue(self, view: ClusterView, now: float) -> None:
        """Queue ordering's round (when enabled), on a thread of its own: ``scontrol`` may hang as ``squeue`` may.

        A round whose previous ordering has not finished skips it.
        """
        if self.queue is None or (self._queue_run is not None and not self._queue_run.done()):
            return
        self._queue_run = self.executor.submit(functools.partial(self.queue.apply, view, now))
        self._queue_run.add_done_callback(functools.partial(_log_failure, "queue ordering"))

    def admit(self, view: ClusterView, now: float, lenders: frozenset[str]) -> None:
        """Admission's round (docs/admin.md 8c), on the queue ordering's thread (one ``scontrol`` at a time);
        ``lenders`` are the managed jobs, whose satellites the daemon takes back.

        A round whose previous admission has not finished skips it.
        """
        if self.admission is None or (self._admission_run is not None and not self._admission_run.done()):
            return
        self._admission_run = self.executor.submit(functools.partial(self.admission.apply, view, now, lenders))
        self._admission_run.add_done_callback(functools.partial(_log_failure, "admission"))

    @property
    def last_queue_round(self) -> QueueRound | None:
        """What the last finished queue ordering did (None before the first, or when it failed)."""
        run = self._queue_run
        if run is None or not run.done() or run.exception() is not None:
            return None
        return run.result()

    def close(self) -> None:
        """Stop the executor: wait for its Slurm calls, undo queue ordering's changes, release admission's holds."""
        self.executor.close()

    def snapshot(self, view: ClusterView, now: float) -> Observation:
        """The snapshot step; while an operator's drain is on no job shows pinned (a drain outranks a pin)."""
        state = self.ledger.state
        return build_snapshot(
            view,
            self.ledger.agents,
            pinned=() if state.draining else state.pinned,
            regular_partitions=self.config.regular_partitions,
            elastic_partition=self.config.elastic_partition,
            stale_after_s=self.config.agents.stale_after_s,
            now=now,
            make_room_after_s=self.config.make_room_after_s,
        )

    def act(self, plan: Plan, obs: Observation, now: float) -> None:
        """The act step: the plan's resizes, as actions, to the executor (a directive each, in flight from then on)."""
        actions = [
            Resize(job_id, target, reason=plan.reasons[job_id], batch=plan.batches.get(job_id))
            for job_id, target in plan.targets.items()
        ]
        self.executor.apply(actions, obs.managed, obs.managed, source=plan.source, now=now)

    def _book_observation(self, obs: Observation, view: ClusterView, now: float) -> None:
        self.last_observation = obs
        self.ledger.forget(obs.gone, view.active_groups())
        self.watch.update(obs, now)

    def _book_round(self, summary: RoundSummary, now: float) -> None:
        self.last_round = summary
        self.rounds.append(summary)
        self.ledger.save()
        self.metrics.loop_time.observe(summary.duration_s)
        if not summary.error:
            self.metrics.last_round.set(now)

    def job_records(self, job_id: str) -> list[JobRecord]:
        """The active records of a job as the last view shows them; never reads Slurm (see the module docstring).

        When the view does not show the job, :attr:`refresh_wanted` asks the loop for an early round (at most every
        :data:`REFRESH_MIN_S`) and the answer is "no such job" until it has come.
        """
        known = self.view.active_job(job_id) if self.view is not None else []
        if not known:
            self.refresh_wanted = True
        return known


class _Observing:
    """One read of Slurm on a thread of its own; :attr:`done` is set when it returned or failed."""

    def __init__(self, slurm: ClusterSource, now: float, submissions: SubmissionBook) -> None:
        self.now = now
        self.started = time.perf_counter()
        self.done = threading.Event()
        self._view: ClusterView | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._read, args=(slurm, submissions), name="amoebad-observe", daemon=True).start()

    def _read(self, slurm: ClusterSource, submissions: SubmissionBook) -> None:
        try:
            self._view = observe(slurm, self.now, submissions)
        except BaseException as exc:  # handed to the loop's thread, which logs it like a failure of its own read
            self._error = exc
        finally:
            self.done.set()

    def result(self) -> ClusterView:
        """The view Slurm gave, or the read's exception raised again."""
        if self._error is not None:
            raise self._error
        if self._view is None:
            raise RuntimeError("the read of Slurm has not finished; wait for done")
        return self._view


def _log_failure(what: str, run: concurrent.futures.Future[QueueRound | AdmissionRound]) -> None:
    """A done-callback of the queue thread's work (bound to ``what`` with ``functools.partial``)."""
    if not run.cancelled() and run.exception() is not None:
        logger.error("[daemon] %s failed this round: %r; the next round tries again", what, run.exception())


def update_gauges(metrics: DaemonMetrics, obs: Observation, ledger: Ledger) -> None:
    """Bring the gauges up to date with a round's observation and the ledger."""
    metrics.jobs.replace(
        [
            ({"kind": "elastic"}, len(obs.managed)),
            ({"kind": "regular_running"}, obs.regular_running),
            ({"kind": "regular_pending"}, obs.regular_pending),
        ]
    )
    metrics.agents.set(len(ledger.agents))
    metrics.workers.replace(({"job": job_id}, info.workers) for job_id, info in obs.managed.items())
    metrics.gpus.replace([({"state": "total"}, obs.snapshot.total_gpus), ({"state": "free"}, obs.snapshot.free_gpus)])
    metrics.in_flight.set(ledger.in_flight_count())
    metrics.orphans.set(len(obs.orphans))
    metrics.draining.set(1 if ledger.state.draining else 0)
