"""What the daemon knows about each elastic job's agent: its registration, its last report, its resize in flight.

Records are built from ``register`` and ``report`` messages (DESIGN.md, control flow); they live only in the
daemon's memory and are rebuilt after a restart when the agents re-register. The body fields were type-checked by
:mod:`slurm_amoeba.core.messages`; here their *values* are checked (ranges, ids, endpoints), and a bad value raises
:class:`AgentMessageError` whose message the daemon sends back as the refusal's reason.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from slurm_amoeba.core.errors import AmoebaError
from slurm_amoeba.core.messages import MAX_BATCH, MAX_MEMORY_GIB, MAX_NOISE_SCALE, MAX_STEP_S, check_place_beside, quote

_JOB_ID = re.compile(r"^[0-9]{1,12}$")
_AGENT_ENDPOINT = re.compile(r"^tcp://[A-Za-z0-9.\-]+:[0-9]{1,5}$|^tcp://\[[0-9A-Fa-f:]+\]:[0-9]{1,5}$")
#: Events kept per job for ``amoebactl jobs`` (the agent sends its recent history with each report) ...
HISTORY_KEPT = 50
#: ... and their size at most, encoded (the newest events that fit are kept).
HISTORY_BYTES = 16384
#: Nesting an event may have (an object of values and lists of values); deeper ones are kept as a quoted string,
#: so that a ``jobs`` reply, where events sit 7 levels down, stays within the protocol's nesting limit.
EVENT_DEPTH = 2
#: Largest worker count the daemon accepts in a registration (a sanity bound, not a site policy).
MAX_WORKERS = 100_000
#: Words an adaptive report's ``batch_source`` may be.
BATCH_SOURCES = frozenset({"initial", "runtime", "policy", "user"})


class AgentMessageError(AmoebaError, ValueError):
    """A register or report message carries a value the daemon cannot accept."""


def check_job_id(job_id: str) -> str:
    """Return ``job_id`` if it looks like a Slurm job id.

    Raises:
        AgentMessageError: it is not 1..12 digits.
    """
    if not _JOB_ID.match(job_id):
        raise AgentMessageError(f"job_id {job_id!r} is not a Slurm job id (digits only, e.g. '1234')")
    return job_id


def _depth(value: object) -> int:
    """Nesting of a decoded JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
        else:
            deepest = max(deepest, depth)
            continue
        deepest = max(deepest, depth + 1)
    return deepest


def bounded_history(events: tuple[Any, ...] | list[Any]) -> tuple[Any, ...]:
    """The newest of ``events`` within :data:`HISTORY_KEPT` events and :data:`HISTORY_BYTES` bytes.

    An event nested deeper than :data:`EVENT_DEPTH` is kept as ``{"event": "unreadable", "text": <quoted>}``.
    """
    kept: list[Any] = []
    size = 0
    for event in reversed(list(events)[-HISTORY_KEPT:]):
        if _depth(event) > EVENT_DEPTH:
            event = {"event": "unreadable", "text": quote(event, 200)}
        size += len(json.dumps(event, separators=(",", ":")))
        if size > HISTORY_BYTES:
            break
        kept.append(event)
    return tuple(reversed(kept))


@dataclasses.dataclass(frozen=True)
class Registration:
    """An agent's ``register`` message, checked.

    Attributes:
        job_id: the Slurm job id (of the heterogeneous job's leader).
        endpoint: where the agent takes directives.
        min_workers: the job's minimum size.
        max_workers: its maximum size.
        gpus_per_worker: GPUs of one node each worker holds.
        partition: the partition of the job's own allocation.
        elastic_partition: where its satellites run.
        share: the job's GPU sharing mode (:data:`~slurm_amoeba.core.sharing.SHARE_MODES`), or None: it never
            shares a GPU.
        share_partition: where its minimum workers hold shards (with ``share``).
    """

    job_id: str
    endpoint: str
    min_workers: int
    max_workers: int
    gpus_per_worker: int
    partition: str
    elastic_partition: str
    share: str | None = None
    share_partition: str = ""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Registration:
        """Check a ``register`` body.

        Raises:
            AgentMessageError: an id, endpoint, range or partition that cannot be right.
        """
        job_id = check_job_id(str(body["job_id"]))
        endpoint = str(body["endpoint"])
        if not _AGENT_ENDPOINT.match(endpoint) or not 1 <= int(endpoint.rsplit(":", 1)[1]) <= 65535:
            raise AgentMessageError(f"endpoint {endpoint!r} is not tcp://HOST:PORT; the daemon sends directives there")
        low, high, gpw = int(body["min_workers"]), int(body["max_workers"]), int(body["gpus_per_worker"])
        if not 1 <= low <= high <= MAX_WORKERS:
            raise AgentMessageError(f"worker range {low}:{high} is invalid; it needs 1 <= min <= max <= {MAX_WORKERS}")
        if not 1 <= gpw <= 1024:
            raise AgentMessageError(f"gpus_per_worker={gpw} is invalid; give 1 to 1024")
        for field, shortest in (("partition", 0), ("elastic_partition", 1)):
            value = str(body[field])
            if not re.match(rf"^[A-Za-z0-9_.\-]{{{shortest},64}}$", value):
                raise AgentMessageError(f"{field}={value!r} is not a Slurm partition name")
        share = body.get("share")  # checked by the protocol (core/messages.py)
        return cls(
            job_id,
            endpoint,
            low,
            high,
            gpw,
            str(body["partition"]),
            str(body["elastic_partition"]),
            None if share is None else str(share),
            str(body.get("share_partition", "")) if share is not None else "",
        )


@dataclasses.dataclass(frozen=True)
class Beside:
    """Workers of a job the daemon placed beside another job's (GPU sharing; a directive's ``place_beside``).

    Attributes:
        host: the job whose GPUs they share.
        partition: the sharing partition.
        nodes: node name -> the job's workers beside the host there.
        role: their part (:class:`~slurm_amoeba.core.sharing.ShareRole` value).
        host_uid: the host owner's uid (from its registration): the owner the sharer's workers require of the
            host's status file.
        status_path: the host's node-local status file (:func:`~slurm_amoeba.core.sharing.host_status_path`).
        pace_bound: the share of its exclusive speed the host may lose to the sharer (the policy's; 0: the
            runtime's default bound).
        sub_batch: the sharer's local micro-batch the policy searched (0: the runtime fits its own).
        memory_cap_bytes: the device memory each of the sharer's workers beside the host may use: what the host
            leaves on its tightest node (0: no cap, the GPU's memory or the host's use is unknown).
    """

    host: str
    partition: str
    nodes: Mapping[str, int]
    role: str
    host_uid: int
    status_path: str
    pace_bound: float = 0.0
    sub_batch: int = 0
    memory_cap_bytes: int = 0

    @property
    def workers(self) -> int:
        """The job's workers beside the host."""
        return sum(self.nodes.values())

    def to_body(self) -> dict[str, Any]:
        """The directive's ``place_beside`` object (``memory_cap_bytes`` only when there is a cap)."""
        fields = dataclasses.asdict(self)
        if not self.memory_cap_bytes:
            del fields["memory_cap_bytes"]
        return {**fields, "nodes": dict(self.nodes)}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Beside:
        """The share a ``place_beside`` object describes (the state file keeps shares in that form).

        Raises:
            ProtocolError: a field is missing, unknown or wrong
                (:func:`~slurm_amoeba.core.messages.check_place_beside`).
        """
        check_place_beside(body)
        return cls(
            str(body["host"]),
            str(body["partition"]),
            {str(node): int(count) for node, count in body["nodes"].items()},
            str(body["role"]),
            int(body["host_uid"]),
            str(body["status_path"]),
            pace_bound=float(body["pace_bound"]),
            sub_batch=int(body["sub_batch"]),
            memory_cap_bytes=int(body.get("memory_cap_bytes", 0)),
        )


@dataclasses.dataclass(frozen=True)
class AdaptiveStats:
    """An adaptive-batch job's statistics from its runtime (a report's ``adaptive`` object), checked.

    Attributes:
        global_batch: the global batch the job runs with now.
        base_batch: its initial (smallest) global batch.
        max_batch: the largest global batch it allows.
        noise_scale: the smoothed gradient noise scale (samples), or None before a measurement (or when the
            runtime measured no signal: an infinite scale).
        step_times: ``(world size, global batch, seconds per step, steps measured)`` entries.
        efficiency: the statistical efficiency of the current batch over the initial one, when reported.
        measured_steps: steps that updated the noise scale.
        policy_batch: the policy's batch the runtime applies now, or None.
        batch_source: who chose the current batch (``initial``, ``runtime``, ``policy``, ``user``), or "".
    """

    global_batch: int
    base_batch: int
    max_batch: int
    noise_scale: float | None
    step_times: tuple[tuple[int, int, float, int], ...]
    efficiency: float | None = None
    measured_steps: int = 0
    policy_batch: int | None = None
    batch_source: str = ""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> AdaptiveStats:
        """Check the ranges of a report's ``adaptive`` object (its types were checked by ``core.messages``).

        Raises:
            AgentMessageError: a batch out of ``1 <= base <= global <= max <= MAX_BATCH``, a negative or huge noise
                scale, a step time that is not a positive number of seconds, an unknown batch source.
        """
        base, batch, top = int(body["base_batch"]), int(body["global_batch"]), int(body["max_batch"])
        if not 1 <= base <= batch <= top <= MAX_BATCH:
            raise AgentMessageError(
                f"adaptive batches base={base}, global={batch}, max={top}: they need 1 <= base <= global <= max <= "
                f"{MAX_BATCH}"
            )
        phi = body["noise_scale"]
        if phi is not None and not 0 <= float(phi) <= MAX_NOISE_SCALE:
            raise AgentMessageError(f"adaptive noise_scale={phi!r} is not 0 to {MAX_NOISE_SCALE:g} samples")
        times: list[tuple[int, int, float, int]] = []
        for w, b, t, n in body["step_time_s"]:
            if not (1 <= w <= MAX_WORKERS and 1 <= b <= MAX_BATCH and 0 < t <= MAX_STEP_S and 0 <= n < 2**53):
                raise AgentMessageError(
                    f"adaptive step time {quote([w, b, t, n])} is not [workers, batch, seconds, steps] with 1 to "
                    f"{MAX_WORKERS} workers, a batch of 1 to {MAX_BATCH} and 0 to {MAX_STEP_S:g} seconds"
                )
            times.append((int(w), int(b), float(t), int(n)))
        efficiency = body.get("efficiency")
        if efficiency is not None and not 0 <= float(efficiency) <= 1e6:
            raise AgentMessageError(f"adaptive efficiency={efficiency!r} is not a number from 0")
        steps, policy = int(body.get("measured_steps", 0)), body.get("policy_batch")
        if steps < 0 or (policy is not None and not 1 <= int(policy) <= MAX_BATCH):
            raise AgentMessageError(f"adaptive measured_steps={steps} or policy_batch={policy!r} is out of range")
        source = str(body.get("batch_source", ""))
        if source and source not in BATCH_SOURCES:
            raise AgentMessageError(f"adaptive batch_source {quote(source)} is not one of {sorted(BATCH_SOURCES)}")
        return cls(
            batch,
            base,
            top,
            None if phi is None else float(phi),
            tuple(times),
            None if efficiency is None else float(efficiency),
            steps,
            None if policy is None else int(policy),
            source,
        )

    def as_report(self) -> dict[str, Any]:
        """The statistics in the runtime's report form (what ``policy.goodput.model_from_report`` reads)."""
        return {
            "global_batch": self.global_batch,
            "base_batch": self.base_batch,
            "max_batch": self.max_batch,
            "noise_scale": self.noise_scale,
            "step_time_s": [list(entry) for entry in self.step_times],
        }

    def summary(self) -> dict[str, Any]:
        """What ``amoebactl jobs`` shows of them."""
        return {
            "global_batch": self.global_batch,
            "base_batch": self.base_batch,
            "max_batch": self.max_batch,
            "noise_scale": self.noise_scale,
            "efficiency": self.efficiency,
            "measured_steps": self.measured_steps,
            "batch_source": self.batch_source,
            "policy_batch": self.policy_batch,
        }


@dataclasses.dataclass(frozen=True)
class Report:
    """An agent's ``report`` message, checked.

    Attributes:
        size: workers the job runs with now.
        generation: the membership generation (grows with every resize).
        target: the size the job is moving to (``== size`` when no resize is in flight).
        throughput: workers -> samples per second measured at that size.
        satellites: Slurm job ids of the satellites the agent holds.
        history: the agent's recent events (JSON objects or strings), newest last.
        received_at: when the daemon received it (its clock).
        adaptive: an adaptive-batch job's statistics, or None (a fixed batch, or an agent that sends none).
        min_feasible: the smallest size at which the job's plans fit its memory budget (0: not reported).
        predicted: workers -> samples per second its plans predict at that size.
        memory_gib: the device memory one worker of the job peaked at (GiB), or None when the runtime did not say:
            what a sharer beside it cannot use.
    """

    size: int
    generation: int
    target: int
    throughput: Mapping[int, float]
    satellites: tuple[str, ...]
    history: tuple[Any, ...]
    received_at: float
    adaptive: AdaptiveStats | None = None
    min_feasible: int = 0
    predicted: Mapping[int, float] = dataclasses.field(default_factory=dict)
    memory_gib: float | None = None

    @property
    def resizing(self) -> bool:
        """Whether the agent is still moving to another size."""
        return self.target != self.size

    @classmethod
    def from_body(cls, body: Mapping[str, Any], received_at: float) -> Report:
        """Check a ``report`` body.

        Raises:
            AgentMessageError: a negative size, a throughput entry that is not ``"<size>": rate``, a satellite id
                that is not a Slurm job id, adaptive statistics out of range (:meth:`AdaptiveStats.from_body`), or a
                ``memory_gib`` that is not a finite number of GiB from 0 to ``MAX_MEMORY_GIB``.
        """
        size, generation, target = int(body["size"]), int(body["generation"]), int(body["target"])
        if not 0 <= size <= MAX_WORKERS or not 0 <= target <= MAX_WORKERS or generation < 0:
            raise AgentMessageError(
                f"size={size}, target={target}, generation={generation}: sizes lie in 0..{MAX_WORKERS} and the "
                f"generation is 0 or more"
            )
        throughput = _rates(dict(body["throughput"]), "throughput")
        satellites: list[str] = []
        for item in body["satellites"]:
            if isinstance(item, bool) or not isinstance(item, (str, int)):
                raise AgentMessageError(f"satellite {item!r} is not a Slurm job id")
            satellites.append(check_job_id(str(item)))
        history = bounded_history(list(body["history"]))
        adaptive = AdaptiveStats.from_body(body["adaptive"]) if body.get("adaptive") is not None else None
        plans = dict(body.get("plans") or {})
        minimum = plans.get("min_workers", 0)
        if isinstance(minimum, bool) or not isinstance(minimum, int) or not 0 <= minimum <= MAX_WORKERS:
            raise AgentMessageError(f"plans.min_workers = {minimum!r} is not a worker count 0..{MAX_WORKERS}")
        predicted = _rates(dict(plans.get("samples_per_s") or {}), "plans.samples_per_s")
        memory = body.get("memory_gib")
        if memory is not None and (
            isinstance(memory, bool)
            or not isinstance(memory, (int, float))
            or not math.isfinite(memory)
            or not 0 <= memory <= MAX_MEMORY_GIB
        ):
            raise AgentMessageError(
                f"memory_gib = {memory!r} is not the device memory one worker peaked at: give GiB from 0 to "
                f"{MAX_MEMORY_GIB} (e.g. 12.5), or leave it out when unknown"
            )
        return cls(
            size,
            generation,
            target,
            throughput,
            tuple(satellites),
            history,
            received_at,
            adaptive,
            minimum,
            predicted,
            None if memory is None else float(memory),
        )


def _rates(table: Mapping[Any, Any], name: str) -> dict[int, float]:
    """A ``{"<size>": samples/s}`` table checked (``name`` for the message).

    Raises:
        AgentMessageError: a key that is not a worker count, or a value that is not a finite rate >= 0.
    """
    rates: dict[int, float] = {}
    for key, value in table.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and 0 < int(key) <= MAX_WORKERS):
            raise AgentMessageError(f'{name} key {key!r} is not a worker count like "4"')
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise AgentMessageError(f"{name}[{key!r}] = {value!r} is not a rate (a finite number >= 0)")
        rates[int(key)] = float(value)
    return rates


#: Weight of a new sample in a job's measured rates (an exponential moving average): the runtime's rate is already
#: its recent steps' (the latest progress of rank 0), so two samples in a row carry most of a change.
RATE_EMA_WEIGHT = 0.5


@dataclasses.dataclass
class MeasuredRates:
    """A job's own speeds alone and beside each type of partner (``JobInfo.solo_rate``, ``JobInfo.shared_rates``).

    Each new report's throughput at the job's size is one sample, attributed to "alone" or "beside a job of type T"
    by what the daemon's own shares say of that moment (:meth:`~slurm_amoeba.daemon.ledger.Ledger.attribute_rates`),
    and only when the job had that partner (or none) at the same size since its previous sample as well: the rate a
    runtime reports is measured over its recent steps, and a sample taken across a change mixes both. Samples are
    smoothed by :data:`RATE_EMA_WEIGHT`. Kept in the daemon's memory only: after a restart a job learns them again.

    Attributes:
        solo: workers -> samples per second alone.
        shared: (workers, partner's job type) -> samples per second beside a job of that type.
        seen_at: when the last report taken as a sample was received.
        last_state: (workers, partner type or None) of the previous sample; None after one that could not be
            attributed.
        version: counts the changes of ``solo`` and ``shared`` (the snapshot cache's test).
        grew_at_a_loss: the job once trained slower with workers beside a host than with its own alone
            (:meth:`lost_by_growing`); it grows beside no host again.
    """

    solo: dict[int, float] = dataclasses.field(default_factory=dict)
    shared: dict[tuple[int, str], float] = dataclasses.field(default_factory=dict)
    seen_at: float = -math.inf
    last_state: tuple[int, str | None] | None = None
    version: int = 0
    grew_at_a_loss: bool = False

    def observe(self, report: Report, partner: str | None, settled: bool) -> bool:
        """Take ``report`` as a sample (once per report) beside ``partner`` (None: alone).

        Args:
            report: the job's latest report.
            partner: the job type of the job its workers share GPUs with now, or None when they share with nobody.
            settled: whether that pairing is in place (no share being placed or taken back, no size in flight,
                one partner of a known type).

        Returns:
            Whether the sample was kept.
        """
        if report.received_at <= self.seen_at:
            return False
        self.seen_at = report.received_at
        state = (report.size, partner) if settled and not report.resizing else None
        stable = state is not None and state == self.last_state
        self.last_state = state
        rate = report.throughput.get(report.size)
        if not stable or rate is None or rate <= 0.0:
            return False
        if partner is None:
            self.solo[report.size] = _smoothed(self.solo.get(report.size), rate)
        else:
            key = (report.size, partner)
            self.shared[key] = _smoothed(self.shared.get(key), rate)
        self.version += 1
        return True

    def lost_by_growing(self, own: int, size: int, margin: float) -> tuple[float, float] | None:
        """Whether the job trains slower at ``size`` workers, some beside a host, than it did alone with its ``own``.

        Args:
            own: its workers on GPUs of its own.
            size: its size with those beside the host.
            margin: the share of its speed alone it may lose before it counts (the samples' noise).

        Returns:
            ``(rate beside, rate alone)`` when both were measured (settled samples) and the rate beside is below
            ``(1 - margin)`` of the rate alone; None otherwise.
        """
        alone = self.solo.get(own)
        beside = [rate for (workers, _), rate in self.shared.items() if workers == size]
        if alone is None or not beside or min(beside) >= (1.0 - margin) * alone:
            return None
        return min(beside), alone

    def at(self, workers: int) -> tuple[float | None, dict[str, float]]:
        """The solo rate and the shared rates (partner type -> rate) measured at ``workers`` workers."""
        shared = {partner: rate for (size, partner), rate in self.shared.items() if size == workers}
        return self.solo.get(workers), shared


def _smoothed(old: float | None, sample: float) -> float:
    return sample if old is None else old + RATE_EMA_WEIGHT * (sample - old)


@dataclasses.dataclass
class InFlight:
    """A resize the daemon ordered and the job has not yet reached.

    Attributes:
        target: the ordered size.
        ordered_at: when it was ordered (the daemon's clock).
        source: ``policy``, ``ctl`` or ``drain``.
        reason: why, as sent to the agent.
        acknowledged: the agent accepted it (False while the directive is still being sent).
        acknowledged_at: when the acceptance came back (the daemon's clock; 0 before).
        batch: the global batch the policy chose for ``target`` workers (an adaptive job), or None.
        batch_only: the order changes the batch only (``target`` was the job's size): no resize latency to count.
    """

    target: int
    ordered_at: float
    source: str
    reason: str
    acknowledged: bool = False
    acknowledged_at: float = 0.0
    batch: int | None = None
    batch_only: bool = False


@dataclasses.dataclass
class AgentRecord:
    """One registered elastic job.

    Attributes:
        registration: what the agent registered with.
        uid: the job owner's uid (the only uid whose reports are accepted).
        user: the owner's user name.
        registered_at: when the agent (last) registered.
        report: the agent's latest report, or None before its first.
        history: the latest events of the job, newest last.
        in_flight: a resize ordered and not yet reached, or None.
        backoff_until: the policy leaves the job alone until then (after a refused or unanswered directive).
        adaptive: the latest adaptive-batch statistics its agent reported (kept while later reports carry none,
            e.g. after a restart, before the runtime's first step), or None for a fixed-batch job.
        beside: the share the daemon ordered of the job (its workers beside another job's), or None.
        rates: its speeds measured alone and beside partners (:class:`MeasuredRates`).
    """

    registration: Registration
    uid: int
    user: str
    registered_at: float
    report: Report | None = None
    history: collections.deque[Any] = dataclasses.field(default_factory=lambda: collections.deque(maxlen=HISTORY_KEPT))
    in_flight: InFlight | None = None
    backoff_until: float = 0.0
    adaptive: AdaptiveStats | None = None
    beside: Beside | None = None
    rates: MeasuredRates = dataclasses.field(default_factory=MeasuredRates)

    @property
    def job_id(self) -> str:
        """The job's Slurm id."""
        return self.registration.job_id

    def accept_report(self, report: Report) -> None:
        """Keep ``report`` as the latest and take its history (and its adaptive statistics, when it has some)."""
        self.report = report
        if report.adaptive is not None:
            self.adaptive = report.adaptive
        self.history.clear()
        self.history.extend(report.history)

    def is_fresh(self, now: float, stale_after_s: float) -> bool:
        """Whether the agent has reported within ``stale_after_s``."""
        return self.report is not None and now - self.report.received_at <= stale_after_s

    def summary(self, now: float, pinned: bool, history: int = HISTORY_KEPT) -> dict[str, Any]:
        """The job as ``amoebactl jobs`` shows it (JSON-ready), with its latest ``history`` events."""
        reg = self.registration
        report = self.report
        return {
            "job_id": reg.job_id,
            "user": self.user,
            "uid": self.uid,
            "min_workers": reg.min_workers,
            "max_workers": reg.max_workers,
            "gpus_per_worker": reg.gpus_per_worker,
            "size": report.size if report else None,
            "target": report.target if report else None,
            "generation": report.generation if report else None,
            "throughput": {str(k): v for k, v in sorted(report.throughput.items())} if report else {},
            "adaptive": self.adaptive.summary() if self.adaptive else None,
            "satellites": list(report.satellites) if report else [],
            "history": list(self.history)[-history:] if history > 0 else [],
            "pinned": pinned,
            "in_flight": dataclasses.asdict(self.in_flight) if self.in_flight else None,
            "last_report_age_s": round(now - report.received_at, 3) if report else None,
            "endpoint": reg.endpoint,
        }
