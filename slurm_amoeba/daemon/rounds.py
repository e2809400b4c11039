"""The daemon's round: observe -> snapshot -> decide -> act, once every ``interval_s`` (DESIGN.md, control flow).

Each step is a function of the previous one's result: :func:`~slurm_amoeba.daemon.observer.observe` reads Slurm,
:func:`~slurm_amoeba.daemon.snapshot.build_snapshot` (pure) turns that, the agents' reports and the service book
(:class:`~slurm_amoeba.daemon.observer.ServiceBook`, the GPU-seconds every job attained) into the policy's snapshot,
:func:`decide` (pure but for timing the policy) asks the composed policy (the configured one with its
layers, the operator's drain outermost: :func:`~slurm_amoeba.daemon.daemon.compose_policy`) and checks its actions
(:func:`~slurm_amoeba.policy.check.check_actions`), and :meth:`RoundLoop.act` hands them to the executor
(:class:`~slurm_amoeba.daemon.executor.LiveExecutor`). Bookkeeping (the ledger's expired resizes and moves and
forgotten jobs, satellite warnings, the state file, metrics, the rounds kept for ``status``) happens between the
steps, in :class:`RoundLoop`, never inside them.

Reading Slurm can hang (a slurmctld that does not answer holds squeue for ``slurm.timeout_s``), so the live loop
never reads it on its own thread: :meth:`RoundLoop.begin_round` starts the observe step on a thread of its own and
:meth:`RoundLoop.finish_round` runs the rest of the round once Slurm has answered. A hung slurmctld delays rounds;
requests are answered meanwhile, from the last view (a request about a job the view does not show yet asks for an
early round and is told to retry).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from slurm_amoeba.core.errors import ParseError
from slurm_amoeba.daemon.actuator import QueueOrderer, QueueRound
from slurm_amoeba.daemon.admission import Admitter
from slurm_amoeba.daemon.config import DaemonConfig
from slurm_amoeba.daemon.executor import Executed, LiveExecutor
from slurm_amoeba.daemon.ledger import Ledger, SatelliteWatch
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.daemon.observer import (
    ClusterSource,
    ClusterView,
    Observation,
    ServiceBook,
    SubmissionBook,
    observe,
)
from slurm_amoeba.daemon.snapshot import SnapshotCache, build_snapshot
from slurm_amoeba.policy import Action, DrainPolicy, PolicyError, check_actions
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
        actions: the composed policy's (checked) actions; every one without a reason carries the policy's name.
        source: ``policy``, or ``drain`` while an operator's drain is on.
        policy_s: how long the policy took.
        error: why nothing may be done (the policy broke an invariant), or "".
    """

    actions: tuple[Action, ...]
    source: str
    policy_s: float
    error: str = ""


def decide(policy: DrainPolicy, obs: Observation, now: float) -> Plan:
    """The decide step: the composed policy (drain outermost) on the snapshot, its answer checked.

    Args:
        policy: the composed policy, its drain switch set as the operator left it.
        obs: the snapshot step's result.
        now: the daemon's clock.

    Returns:
        The plan; with ``error`` set and no actions when the answer broke an invariant.
    """
    source = "drain" if policy.draining else "policy"
    tick = time.perf_counter()
    actions = policy.decide(obs.snapshot, now)
    policy_s = time.perf_counter() - tick
    try:
        check_actions(obs.snapshot, actions)
    except PolicyError as exc:
        return Plan((), source, policy_s, f"policy error: {exc}")
    named = tuple(action if action.reason else dataclasses.replace(action, reason=policy.name) for action in actions)
    return Plan(named, source, policy_s)


class RoundLoop:
    """Runs rounds (see the module docstring) and keeps the latest view of the cluster.

    Args:
        config: the daemon's configuration.
        slurm: where jobs and nodes are read from.
        policy: the composed policy (drain outermost; its switch is set from the ledger each round).
        ledger: the registered jobs and the persistent state.
        metrics: the daemon's metrics.
        executor: applies the round's actions (directives to agents; holds, releases and priorities in Slurm, on
            its Slurm thread), built at the daemon's entry with the daemon's user and Slurm controls.
        clock: the daemon's wall clock.

    Attributes:
        view: Slurm's jobs and nodes as last read.
        last_observation: the last snapshot step's result.
        last_round: the last round's summary.
        snapshot_cache: the nodes and unmanaged jobs the snapshot step reuses from round to round.
        rounds: the last :data:`ROUNDS_KEPT` summaries.
    """

    def __init__(
        self,
        config: DaemonConfig,
        slurm: ClusterSource,
        policy: DrainPolicy,
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
        self.snapshot_cache = SnapshotCache()
        self.refresh_wanted = False
        self.submissions = SubmissionBook.for_source(slurm, config.slurm_timeout_s)
        self._pending: _Observing | None = None
        orderer = executor.orderer
        self.service = ServiceBook(orderer.control.past_service if orderer is not None else None)

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
        if self.config.sharing.enabled:  # the new reports' speeds, alone or beside a partner, before the snapshot
            self.ledger.attribute_rates(opted_in_types(view, self.ledger))
        obs = self.snapshot(view, now)
        self._book_observation(obs, view, now)
        plan = decide(dataclasses.replace(self.policy, draining=self.ledger.state.draining), obs, now)
        self.metrics.policy_time.observe(plan.policy_s)
        if plan.error:
            logger.error("[daemon/policy] %s: %s; no directives this round", self.policy.name, plan.error)
            return RoundSummary(now, time.perf_counter() - started, plan.policy_s, {}, plan.error)
        executed = self.act(plan, obs, now)
        update_gauges(self.metrics, obs, self.ledger)
        return RoundSummary(now, time.perf_counter() - started, plan.policy_s, dict(executed.ordered))

    @property
    def last_queue_round(self) -> QueueRound | None:
        """What the last round's priorities were (None before the first, or with queue ordering off)."""
        return self.queue.last if self.queue is not None else None

    def close(self) -> None:
        """Stop the executor: wait for its Slurm calls, undo queue ordering's changes, release admission's holds."""
        self.executor.close()

    def snapshot(self, view: ClusterView, now: float) -> Observation:
        """The snapshot step; while an operator's drain is on no job shows pinned (a drain outranks a pin)."""
        state = self.ledger.state
        admitter = self.executor.admitter
        return build_snapshot(
            view if admitter is None else admitter.overlay(view),
            self.ledger.agents,
            pinned=() if state.draining else state.pinned,
            regular_partitions=self.config.regular_partitions,
            elastic_partition=self.config.elastic_partition,
            stale_after_s=self.config.agents.stale_after_s,
            now=now,
            make_room_after_s=self.config.make_room_after_s,
            service=self.service.update(view, now),
            reuse=self.snapshot_cache,
            sharing=self.config.sharing,
        )

    def act(self, plan: Plan, obs: Observation, now: float) -> Executed:
        """The act step: the plan's actions to the executor (a directive is in flight from then on)."""
        jobs = obs.snapshot.queued_by_id()
        actions = (*plan.actions, *self.ledger.take_requested_shares())  # an operator's shares (amoebactl share)
        nodes = {node.name: node for node in obs.snapshot.nodes} if self.config.sharing.enabled else None
        return self.executor.apply(actions, jobs, obs.managed, source=plan.source, now=now, nodes=nodes)

    def _book_observation(self, obs: Observation, view: ClusterView, now: float) -> None:
        self.last_observation = obs
        self.ledger.forget(obs.gone, view.active_ids)
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


def opted_in_types(view: ClusterView, ledger: Ledger) -> dict[str, str]:
    """Job id -> job type (its Slurm job name) of the registered jobs that opted in to sharing and Slurm shows."""
    types: dict[str, str] = {}
    for job_id, agent in ledger.agents.items():
        records = view.groups.get(job_id)
        if records and agent.registration.share is not None:
            types[job_id] = records[0].name
    return types


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
    total, free = obs.snapshot.total_gpus, obs.snapshot.free_gpus
    metrics.gpus_capacity.set(total)
    metrics.gpus.replace([({"state": "free"}, free), ({"state": "allocated"}, total - free)])
    metrics.in_flight.set(ledger.in_flight_count())
    metrics.orphans.set(len(obs.orphans))
    metrics.draining.set(1 if ledger.state.draining else 0)
