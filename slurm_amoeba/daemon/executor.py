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
- :class:`~slurm_amoeba.policy.actions.Share` (GPU sharing, docs/admin.md section 8e), only with ``sharing.enabled``:
  a directive to the sharer's agent whose ``place_beside`` puts its new workers beside the host, in satellites of one
  shard on the host's nodes. Applied only when both jobs' agents registered as opted in (the sharer
  ``opportunistic``), the host's sharing partition allows that many sharer workers per node (``sharing.partitions``),
  no other job runs beside the host (one sharer job per host, as a policy's answer has it: the snapshot does not show
  who hosts), the nodes are the host's, and the sharer keeps its own workers: ``placement`` is the sharer's workers to
  place beside the host, ``workers`` its size afterwards or (as the simulator's shares of a pending job have it) the
  same as ``placement``'s; :meth:`LiveExecutor.share_refusal` says why not, and the action is skipped. The directive
  also carries what the sharer's workers pace with: the host's uid (its registration's) and node-local status file
  (:func:`~slurm_amoeba.core.sharing.host_status_path`), the policy's ``pace_bound`` and ``sub_batch``, and the
  sharer's device memory cap: what the host leaves on its tightest node
  (:func:`~slurm_amoeba.policy.pairing.memory_left`: ``sharing.gpu_memory_gib`` less the memory the host's runtime
  reported), none when either is unknown; the cap follows the host's reported use: one that moves by
  :data:`CAP_CHANGE` or more of the cap in force is sent again, at the sharer's own size (its workers beside the host
  apply it at their next step boundary, or leave when a micro-batch of 1 does not fit). The place is taken back — a
  directive to the sharer with its own workers as the target, whose agent lets the workers beside the host leave
  first — when the policy shrinks the sharer, and by the executor itself when the host is resized or moved (by the
  policy or by ``amoebactl resize``), or is gone. The ledger keeps each share (:attr:`~.agents.AgentRecord.beside`);
  the snapshot does not mark the sharer ``shared_with``, which the policies read as the whole job running on the
  host's GPUs, while a live sharer keeps its own workers beside those it placed with the host.
- :class:`~slurm_amoeba.policy.actions.Place` is refused, and so is ``Share`` while ``sharing.enabled`` is off: a
  policy that can emit them is refused when the daemon is configured (:func:`live_refusal`), with the reason.

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
from slurm_amoeba.core.sharing import ShareRole, host_status_path
from slurm_amoeba.daemon.actuator import Actuator, QueueOrderer
from slurm_amoeba.daemon.admission import Admitter
from slurm_amoeba.daemon.agents import AgentRecord, Beside
from slurm_amoeba.daemon.config import Sharing
from slurm_amoeba.daemon.ledger import Ledger
from slurm_amoeba.daemon.metrics import DaemonMetrics
from slurm_amoeba.policy import JobInfo, NodeInfo
from slurm_amoeba.policy.pairing import memory_left

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
    act.Share: (
        "with sharing.enabled and both jobs opted in: a directive to the sharer's agent to place its new workers "
        "beside the host, in satellites of one shard on the host's nodes"
    ),
}
#: The action types the daemon cannot apply, and why: a policy that can emit one is refused at configuration.
REFUSED: Mapping[type[act.Action], str] = {
    act.Place: (
        "Slurm cannot move a running job's workers to other nodes at the same size (a job's own allocation never "
        "changes; only satellites come and go)"
    ),
}
#: Why a policy that shares GPUs is refused while the site's switch is off.
SHARING_OFF = (
    "GPU sharing is off at this site (a GPU held as gres/gpu is never given to a second job): set sharing.enabled "
    "and sharing.partitions in the daemon's configuration once the sharing partition offers shards (docs/admin.md "
    "section 8e)"
)


def live_refusal(policy_name: str, emits: Collection[type[act.Action]], *, sharing: bool = False) -> str:
    """Why the daemon cannot run a policy that emits ``emits``, as a sentence; "" when it can.

    Args:
        policy_name: the policy's configured name.
        emits: the action types the policy (with its layers) may answer with.
        sharing: the site's ``sharing.enabled`` (a policy that shares GPUs runs only with it).

    Returns:
        The refusal, naming the policy, the action and the reason, or "".
    """
    refused = {kind: why for kind, why in REFUSED.items() if kind in emits}
    if act.Share in emits and not sharing:
        refused[act.Share] = SHARING_OFF
    if not refused:
        return ""
    reasons = "; ".join(
        f"its {act.action_name(kind)} actions cannot be applied live: {refused[kind]}"
        for kind in act.ACTION_TYPES
        if kind in refused
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
        sharing: the site's GPU sharing settings (off: every share action is skipped).
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
        sharing: Sharing | None = None,
    ) -> None:
        self.sharing = sharing or Sharing()
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
        nodes: Mapping[str, NodeInfo] | None = None,
    ) -> Executed:
        """Apply one round's (checked) actions.

        Args:
            actions: the composed policy's answer.
            jobs: job id -> the snapshot's jobs (a hold's mark records the job's priority and requested GPUs).
            managed: the jobs whose agents registered (the only ones a directive can reach).
            source: ``policy`` or ``drain`` (counted with each directive).
            now: the daemon's clock.
            nodes: node name -> the snapshot's nodes (a share's memory cap is what its host leaves on them; None:
                no cap).

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
        ordered.update(self._take_places_back(actions, jobs, source))
        ordered.update(self._follow_host_memory(jobs, nodes or {}, source, ordered))
        for action in actions:
            if isinstance(action, (act.Start, act.Preempt)):
                name = act.action_name(type(action))
                recorded[name] = recorded.get(name, 0) + 1
                self.metrics.slurm_actions.inc(labels={"action": name})
                logger.debug("[daemon/executor] %s of job %s is Slurm's to do: %s", name, action.job_id, action.reason)
            elif isinstance(action, (act.Resize, act.Move, act.Share)):
                target: int | None = None
                if action.job_id in ordered:  # its place beside another job was taken back this round
                    pass
                elif isinstance(action, act.Share):
                    target = self._share(action, jobs, managed, source, nodes or {})
                else:
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
            else:  # Place: refused at configuration (live_refusal); one that comes anyway is a bug
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
        agent_beside = self.ledger.agents[action.job_id].beside if managed else None
        if info is None or not managed or info.pinned or info.resizing:
            return None
        if agent_beside is not None:  # a sharer: only a shrink to its own workers, which takes the shared ones back
            own = info.workers - agent_beside.workers
            if not isinstance(action, act.Resize) or action.workers > own:
                return None
            agent = self.ledger.agents[action.job_id]
            reason = action.reason or source
            self.actuator.send(self.ledger.order(agent, action.workers, reason, source, unshare=True))
            return action.workers
        if info.shared_with is not None:
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

    def share_refusal(self, action: act.Share, jobs: Mapping[str, JobInfo], managed: Collection[str]) -> str:
        """Why a share cannot be applied now, as a sentence naming the job, the value and the fix; "" when it can.

        Args:
            action: the share.
            jobs: the snapshot's jobs.
            managed: the jobs whose agents registered.
        """
        sharer, host = action.job_id, action.host
        info, host_info = jobs.get(sharer), jobs.get(host)
        if not self.sharing.enabled:
            return SHARING_OFF
        if info is None or sharer not in managed or host_info is None or host not in managed:
            return f"job {sharer} and its host {host} must both run with a registered agent (a pending job has none)"
        sharer_reg, host_reg = self.ledger.agents[sharer].registration, self.ledger.agents[host].registration
        if sharer_reg.share != ShareRole.OPPORTUNISTIC.value:
            return (
                f"job {sharer} opted in as {sharer_reg.share or 'nothing'}: only a job submitted with "
                "--share=opportunistic is placed beside another"
            )
        if host_reg.share is None:
            return f"host job {host} did not opt in to sharing (--share): its GPUs are its own"
        limit = self.sharing.limit(host_reg.share_partition)
        if limit == 0:
            return (
                f"host job {host} runs in partition {host_reg.share_partition!r}, which hosts no sharer: name it in "
                "sharing.partitions"
            )
        if info.pinned:
            return f"job {sharer} is pinned (amoebactl unpin)"
        if info.resizing:
            return f"job {sharer} is resizing (or has not reported since it started): ask again once it is steady"
        sharer_beside, host_beside = self.ledger.agents[sharer].beside, self.ledger.agents[host].beside
        if sharer_beside is not None:
            return f"job {sharer} already runs workers beside job {sharer_beside.host}"
        if host_beside is not None:
            return f"host job {host} runs workers beside job {host_beside.host} itself: a sharer hosts nobody"
        beside = sum(action.placement.values())
        if beside < 1 or action.workers not in (beside, info.workers + beside):
            return (
                f"the share places {beside} worker(s) of job {sharer} beside {host} and sizes it {action.workers}, "
                f"but it keeps its own {info.workers}: give placement the workers beside the host and workers "
                f"{info.workers} plus them (or only them)"
            )
        if info.workers + beside > info.max_workers:
            return f"job {sharer} would have {info.workers + beside} workers, above its maximum {info.max_workers}"
        sharing_now = self._sharers_on_nodes(host)
        for node, count in action.placement.items():
            if node not in host_info.placement:
                return f"node {node} is not one of host job {host}'s nodes ({', '.join(sorted(host_info.placement))})"
            if count + sharing_now.get(node, 0) > limit:
                return (
                    f"{count + sharing_now.get(node, 0)} sharer worker(s) beside job {host} on {node} is over "
                    f"sharing.partitions.{host_reg.share_partition} = {limit}"
                )
        beside_host = sorted(
            job for job, agent in self.ledger.agents.items() if agent.beside and agent.beside.host == host
        )
        if beside_host:
            return (
                f"host job {host} has job {beside_host[0]} beside it already: a host has one sharer job at a time "
                "(its place is free again once that share is taken back)"
            )
        return ""

    def _sharers_on_nodes(self, host: str) -> dict[str, int]:
        """Node -> workers of other jobs placed beside ``host`` there."""
        counts: dict[str, int] = {}
        for agent in self.ledger.agents.values():
            if agent.beside is not None and agent.beside.host == host:
                for node, count in agent.beside.nodes.items():
                    counts[node] = counts.get(node, 0) + count
        return counts

    def _share(
        self,
        action: act.Share,
        jobs: Mapping[str, JobInfo],
        managed: Collection[str],
        source: str,
        nodes: Mapping[str, NodeInfo],
    ) -> int | None:
        """Send the sharer's directive; the size ordered, or None (logged) when the share cannot be applied."""
        refusal = self.share_refusal(action, jobs, managed)
        if refusal:
            logger.info(
                "[daemon/executor] share of job %s beside %s not applied: %s", action.job_id, action.host, refusal
            )
            return None
        agent, host = self.ledger.agents[action.job_id], self.ledger.agents[action.host]
        beside = Beside(
            action.host,
            host.registration.share_partition,
            dict(action.placement),
            ShareRole.OPPORTUNISTIC.value,
            host_uid=host.uid,  # the uid the host registered with: the owner its status file must have
            status_path=str(host_status_path(action.host)),
            pace_bound=action.pace_bound or 0.0,
            sub_batch=action.sub_batch or 0,
            memory_cap_bytes=memory_cap_bytes(jobs[action.host], nodes),
        )
        reason = action.reason or f"{source}: beside job {action.host}"
        target = jobs[action.job_id].workers + beside.workers  # its own workers stay
        self.actuator.send(self.ledger.order(agent, target, reason, source, beside=beside))
        return target

    def _take_places_back(
        self, actions: Sequence[act.Action], jobs: Mapping[str, JobInfo], source: str
    ) -> dict[str, int]:
        """The owner needs its place back: every sharer whose host is resized or moved this round (by the policy, or
        by ``amoebactl resize`` since the last round), or is gone, is sent its own workers as the target (its agent
        lets the workers beside the host leave first). A sharer the policy preempts (a sharing policy's eviction)
        goes back to its own workers the same way, and so does one that measurably trains slower with its workers
        beside the host than it did alone (:meth:`_lost_by_growing`). Returns sharer -> the size ordered."""
        changing = {a.job_id for a in actions if isinstance(a, (act.Resize, act.Move, act.Preempt))}
        changing |= {job for job, agent in self.ledger.agents.items() if agent.in_flight is not None}
        evicted = {a.job_id for a in actions if isinstance(a, act.Preempt)}  # a sharing policy's eviction
        ordered: dict[str, int] = {}
        for agent in list(self.ledger.agents.values()):
            beside = agent.beside
            if beside is None:
                continue
            if agent.job_id in evicted:
                why = f"evicted from beside host job {beside.host}"
            elif beside.host not in jobs:
                why = f"host job {beside.host} is gone"
            elif beside.host in changing:
                why = f"host job {beside.host} needs its GPUs back"
            elif (lost := self._lost_by_growing(agent, beside)) is not None:
                why = lost
                agent.rates.grew_at_a_loss = True  # measured: it grows beside no host again
            else:
                continue
            ordered[agent.job_id] = self._unshare(agent, beside, why, source)
        return ordered

    @staticmethod
    def _lost_by_growing(agent: AgentRecord, beside: Beside) -> str | None:
        """Why a settled sharer goes back to its own workers because it trains slower with those beside the host
        than it did alone (:meth:`~.agents.MeasuredRates.lost_by_growing`, beyond :data:`GROWTH_LOSS_MARGIN`), or
        None."""
        report = agent.report
        if report is None or agent.in_flight is not None or report.resizing:
            return None
        own = report.size - beside.workers
        lost = agent.rates.lost_by_growing(own, report.size, GROWTH_LOSS_MARGIN) if own >= 1 else None
        if lost is None:
            return None
        return (
            f"it trains at {lost[0]:.1f} samples/s with {report.size} workers, {beside.workers} beside host job "
            f"{beside.host}, below its {lost[1]:.1f} with its own {own} alone: it grows beside no host again"
        )

    def _follow_host_memory(
        self, jobs: Mapping[str, JobInfo], nodes: Mapping[str, NodeInfo], source: str, ordered: Collection[str]
    ) -> dict[str, int]:
        """A host's memory use changed: every settled sharer whose cap (what its host leaves,
        :func:`memory_cap_bytes`) moved by :data:`CAP_CHANGE` or more of the cap in force gets the new one, in a
        directive to its current size naming the same host (its agent hands the workers beside the host the new
        terms; they apply it at their next step boundary, and one that cannot fit a micro-batch of 1 leaves). A cap
        that becomes unknown (the host stopped reporting its memory) leaves the one in force. Returns sharer -> the
        size ordered (its own)."""
        changed: dict[str, int] = {}
        for agent in list(self.ledger.agents.values()):
            beside = agent.beside
            if beside is None or agent.job_id in ordered or agent.in_flight is not None or agent.report is None:
                continue
            host = jobs.get(beside.host)
            cap = memory_cap_bytes(host, nodes) if host is not None else 0
            old = beside.memory_cap_bytes
            if cap == 0 or (old and abs(cap - old) < CAP_CHANGE * old):
                continue
            assert host is not None and host.memory_gib is not None  # a known cap needs both
            how = "lowered" if old and cap < old else "raised" if old else "set"
            reason = (
                f"host job {beside.host} uses {host.memory_gib:.2f} GiB: the memory cap beside it is {how} to "
                f"{cap / GIB:.2f} GiB"
            )
            renewed = dataclasses.replace(beside, memory_cap_bytes=cap)
            self.actuator.send(self.ledger.order(agent, agent.report.target, reason, source, beside=renewed))
            changed[agent.job_id] = agent.report.target
        return changed

    def _unshare(self, agent: AgentRecord, beside: Beside, reason: str, source: str) -> int:
        """Order a sharer back to its own workers; the size ordered."""
        current = agent.report.target if agent.report is not None else agent.registration.min_workers
        target = max(agent.registration.min_workers, current - beside.workers)
        self.actuator.send(self.ledger.order(agent, target, reason, source, unshare=True))
        return target

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


#: Bytes in a GiB.
GIB = 1 << 30


#: The share of its speed alone a sharer may lose with workers beside a host before the daemon gives the place back
#: (the measured rates' noise).
GROWTH_LOSS_MARGIN = 0.05
#: The relative change of a sharer's memory cap (of the cap in force) that makes the daemon send it the new one: the
#: host's reported peak moves a little from window to window, and a directive costs the sharer a step boundary.
CAP_CHANGE = 0.05


def memory_cap_bytes(host: JobInfo, nodes: Mapping[str, NodeInfo]) -> int:
    """A sharer's device memory cap beside ``host``: what the host leaves on its tightest node
    (:func:`~slurm_amoeba.policy.pairing.memory_left`), in bytes; 0 (no cap) when the nodes' GPU memory or the
    host's own use is unknown, at least 1 byte otherwise (a host that leaves nothing leaves its sharer nothing)."""
    left = memory_left(host, nodes)
    if left is None or host.memory_gib is None:
        return 0
    return max(1, int(left * GIB))


def _log_failure(run: concurrent.futures.Future[None]) -> None:
    if not run.cancelled() and run.exception() is not None:
        logger.error("[daemon/executor] Slurm calls failed this round: %r; the next round tries again", run.exception())
