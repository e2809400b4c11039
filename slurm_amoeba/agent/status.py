"""The agent's record of its job: event history, size series, and the status document built from them.

The status document is what ``job.history()``, ``amoebactl`` and the daemon's reports read (the agent writes it to
``<state_dir>/agent-status.json`` and answers ``status`` directives with it): size, target, worker groups,
generations with their pauses, throughput per size, an adaptive-batch job's statistics (:func:`adaptive_fields`),
a sharing job's device memory per worker (:func:`memory_gib`), the agent's events and a time series of size and
speed.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from slurm_amoeba.agent.groups import WorkerGroup
from slurm_amoeba.agent.plan import JobFailed, NodeFailing, ReleaseSatellite
from slurm_amoeba.core.messages import (
    MAX_BATCH,
    MAX_EVENT_BYTES,
    MAX_LABEL,
    MAX_MEMORY_GIB,
    MAX_MESSAGE_BYTES,
    MAX_NOISE_SCALE,
    MAX_STEP_S,
    MAX_STEP_TIMES,
    ProtocolError,
    check_adaptive,
    quote,
)
from slurm_amoeba.core.spec import ElasticSpec
from slurm_amoeba.runtime.errors import RuntimeConfigError
from slurm_amoeba.runtime.plans import read_plan_report
from slurm_amoeba.runtime.view import CoordinatorView

log = logging.getLogger(__name__)

SERIES_LIMIT = 5000
HISTORY_LIMIT = 200  # events x MAX_EVENT_BYTES each: at most ~400 kB, well inside one message
FIELD_CHARS = 256  # a string field of an event (an error, a reason) is cut to this, quoted
#: What a ``status`` reply's document may take of the message limit (the envelope and the reply's fields fit beside).
STATUS_BUDGET = MAX_MESSAGE_BYTES - 16384
#: The largest world size a step-time entry may name (the daemon's bound on a registration's worker range).
REPORT_WORKERS = 100_000


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def bounded_event(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` cut to fit :data:`~slurm_amoeba.core.messages.MAX_EVENT_BYTES` encoded: long strings quoted and cut,
    and if it still does not fit, only its time and name with ``truncated: true``."""
    out = {k: (quote(v, FIELD_CHARS) if isinstance(v, str) and len(v) > FIELD_CHARS else v) for k, v in event.items()}
    if _size(out) <= MAX_EVENT_BYTES:
        return out
    return {"t": event["t"], "event": event["event"], "truncated": True}  # the name is the agent's own word


def fit_status(doc: dict[str, Any], budget: int = STATUS_BUDGET) -> dict[str, Any]:
    """The status document cut to ``budget`` bytes encoded: the oldest series points, events and generations go
    first (halving each list in turn); ``truncated`` says that something went. A small document is returned as is."""
    if _size(doc) <= budget:
        return doc
    out = dict(doc, truncated=True)
    while _size(out) > budget:
        longest = max(("series", "history", "generations"), key=lambda k: len(out.get(k) or []))
        items = list(out.get(longest) or [])
        if not items:
            return {k: out[k] for k in ("job_id", "phase", "size", "target", "generation", "truncated") if k in out}
        out[longest] = items[len(items) // 2 + (len(items) % 2) :] if len(items) > 1 else []
    return out


def _count(value: object, low: int, high: int) -> int | None:
    """``value`` when it is an integer (not a bool) in ``low..high``, else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def _number(value: object, low: float, high: float) -> float | None:
    """``value`` as a float when it is a finite number (not a bool) in ``low..high``, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        return None
    return float(value)


def adaptive_fields(progress: Mapping[str, Any]) -> dict[str, Any] | None:
    """The adaptive-batch statistics of rank 0's progress report (``progress["adaptive"]``,
    :class:`~slurm_amoeba.runtime.adaptive.AdaptiveBatch`) as a report's ``adaptive`` field, or None.

    Only the fields of :data:`~slurm_amoeba.core.messages.ADAPTIVE_FIELDS`, each checked, within the daemon's
    bounds: a noise scale above the bound is sent as the bound (as good as infinite), step-time entries out of range
    are left out
    and at most the :data:`~slurm_amoeba.core.messages.MAX_STEP_TIMES` most measured are kept; statistics whose
    batches are not ``1 <= base <= global <= max`` (a fixed batch, a report the agent cannot read) give None.
    """
    raw = progress.get("adaptive")
    if not isinstance(raw, Mapping):
        return None
    base, batch, top = (_count(raw.get(k), 1, MAX_BATCH) for k in ("base_batch", "global_batch", "max_batch"))
    if base is None or batch is None or top is None or not base <= batch <= top:
        return None
    phi = _number(raw.get("noise_scale"), 0.0, float("inf"))
    times: list[list[Any]] = []
    for entry in raw.get("step_time_s") or []:
        if isinstance(entry, list | tuple) and len(entry) == 4:
            w, b, t, n = _count(entry[0], 1, REPORT_WORKERS), _count(entry[1], 1, MAX_BATCH), entry[2], entry[3]
            seconds, steps = _number(t, 1e-9, MAX_STEP_S), _count(n, 0, 1 << 52)
            if w is not None and b is not None and seconds is not None and steps is not None:
                times.append([w, b, seconds, steps])
    times = sorted(sorted(times, key=lambda e: -e[3])[:MAX_STEP_TIMES])
    fields: dict[str, Any] = {
        "global_batch": batch,
        "base_batch": base,
        "max_batch": top,
        "noise_scale": None if phi is None else min(phi, MAX_NOISE_SCALE),
        "step_time_s": times,
        "efficiency": _number(raw.get("efficiency"), 0.0, 1e6),
        "measured_steps": _count(raw.get("measured_steps"), 0, 1 << 52) or 0,
        "policy_batch": _count(raw.get("policy_batch"), 1, MAX_BATCH),
    }
    source = raw.get("batch_source")
    if isinstance(source, str) and source.isalpha() and len(source) <= MAX_LABEL:
        fields["batch_source"] = source
    try:
        check_adaptive(fields)
    except ProtocolError as exc:  # a bug here must cost the statistics only, not the report
        log.warning("adaptive statistics not reported: %s", exc)
        return None
    return fields


def plan_fields(progress: Mapping[str, Any]) -> dict[str, Any] | None:
    """A planned job's smallest feasible size and predicted speed per size (rank 0's ``progress["plans"]``,
    :meth:`~slurm_amoeba.runtime.plans.PlanSpace.report`) as a report's ``plans`` field, or None (no plans, or a
    report the agent cannot read)."""
    raw = progress.get("plans")
    if not isinstance(raw, Mapping):
        return None
    try:
        minimum, rates = read_plan_report(raw)
    except RuntimeConfigError as exc:
        log.warning("plans not reported: %s", exc)
        return None
    kept = {str(n): rate for n, rate in sorted(rates.items()) if n <= REPORT_WORKERS}
    return {"min_workers": minimum, "samples_per_s": kept}


def memory_gib(progress: Mapping[str, Any]) -> float | None:
    """The device memory one worker of a sharing job peaked at, in GiB, as a report's ``memory_gib``, or None.

    Read from rank 0's ``progress["share"]["memory_peak_bytes"]``
    (:attr:`~slurm_amoeba.runtime.shared_device.SharedDevice.memory_peak_bytes`: on a GPU what torch's caching
    allocator held over its last window, on a CPU one measured step); rounded up to a whole MiB, so that a report
    never states less than the worker holds. None when the job does not share, nothing was measured yet, or the
    value is not a byte count the daemon takes (:data:`~slurm_amoeba.core.messages.MAX_MEMORY_GIB`).
    """
    share = progress.get("share")
    if not isinstance(share, Mapping):
        return None
    peak = _count(share.get("memory_peak_bytes"), 0, MAX_MEMORY_GIB << 30)
    if peak is None:
        return None
    return math.ceil(peak / (1 << 20)) / 1024


class Journal:
    """The agent's bounded event history and size/speed series.

    Args:
        clock: wall-clock time (Unix seconds) for the entries.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.history: list[dict[str, Any]] = []
        self.series: list[dict[str, Any]] = []
        self._clock = clock
        self._mono0 = time.monotonic()
        self._wall0 = clock()
        self._seen_generations = 0

    def event(self, event: str, **fields: Any) -> None:
        """Add ``{"t", "event", **fields}`` to the history (bounded in bytes: :func:`bounded_event`; the oldest
        entries go past the count limit)."""
        self.history.append(bounded_event({"t": round(self._clock(), 3), "event": event, **fields}))
        del self.history[:-HISTORY_LIMIT]

    def wall(self, mono: float | None) -> float | None:
        """A coordinator time (``time.monotonic``) as wall-clock time."""
        return None if mono is None else round(self._wall0 + (mono - self._mono0), 3)

    def sample(self, view: CoordinatorView, target: int) -> None:
        """Add a point to the series, and a ``generation`` event for every generation formed since the last one."""
        progress = view.progress
        self.series.append(
            {
                "t": round(self._clock(), 3),
                "size": view.world_size,
                "target": target,
                "generation": view.generation,
                "samples_per_s": float(progress.get("samples_per_s") or 0.0),
                "step": progress.get("step"),
            }
        )
        del self.series[:-SERIES_LIMIT]
        if view.generation != self._seen_generations:
            for entry in view.history[self._seen_generations :]:
                self.event(
                    "generation",
                    generation=entry.plan.generation,
                    size=len(entry.plan.members),
                    reason=entry.plan.reason,
                    rollback=entry.plan.rollback,
                )
            self._seen_generations = len(view.history)

    def generations(self, view: CoordinatorView) -> list[dict[str, Any]]:
        """The formed generations as JSON, each with the pause since the previous one ended."""
        generations = []
        previous_end: float | None = None
        for entry in view.history:
            pause = None if previous_end is None else round(entry.formed_at - previous_end, 3)
            generations.append(
                {
                    "generation": entry.plan.generation,
                    "size": len(entry.plan.members),
                    "members": list(entry.plan.members),
                    "formed_at": self.wall(entry.formed_at),
                    "ended_at": self.wall(entry.ended_at),
                    "end_reason": entry.end_reason,
                    "reason": entry.plan.reason,
                    "rollback": entry.plan.rollback,
                    "pause_s": pause,
                    "start_step": entry.plan.start_step,
                }
            )
            previous_end = entry.ended_at
        return generations

    def status(
        self,
        *,
        job_id: str,
        endpoint: str,
        spec: ElasticSpec,
        target: int,
        groups: Sequence[WorkerGroup],
        view: CoordinatorView,
    ) -> dict[str, Any]:
        """The job's status document (see the module docstring)."""
        return {
            "job_id": job_id,
            "endpoint": endpoint,
            "phase": view.phase.value,
            "size": view.world_size,
            "target": target,
            "generation": view.generation,
            "min_workers": spec.min_workers,
            "max_workers": spec.max_workers,
            "workers": {w: v.status.value for w, v in view.workers.items()},
            "groups": [g.to_json() for g in groups],
            "generations": self.generations(view),
            "throughput": {str(size): round(s.samples_per_s, 3) for size, s in sorted(view.throughput.items())},
            "adaptive": adaptive_fields(view.progress),
            "plans": plan_fields(view.progress),
            "memory_gib": memory_gib(view.progress),
            "history": list(self.history),
            "series": list(self.series),
            "updated_at": self._clock(),
        }

    def announce_failure(self, action: JobFailed, prefix: str, out: TextIO | None = None) -> None:
        """Say why the job ends on a failure that a retry repeats: a ``job_failed`` event with its class in the history
        (``job.history()``, the daemon's reports), and in the job's output (the agent's stdout: the batch step's) the
        reason and the traceback of the error behind it."""
        error = action.error
        self.event(
            "job_failed",
            failure=action.failure.value,
            reason=action.reason,
            worker=error.worker if error else None,
            error=error.error if error else None,
            step=error.step if error else None,
        )
        log.error("%s the job ends: %s", prefix, action.reason)
        stream = out if out is not None else sys.stdout
        lines = [f"{prefix} the job failed ({action.failure.value} error, not retried): {action.reason}"]
        if error is not None:
            lines.append(f"{prefix} {error.worker} at step {error.step}: {error.message}")
            lines.append(error.traceback.rstrip() or "(no traceback was sent)")
        stream.write("\n".join(lines) + "\n")
        stream.flush()

    def note_node_failing(self, action: NodeFailing, prefix: str) -> None:
        """Record that the job lost workers on one node repeatedly: a ``node_failing`` event, which the agent's reports
        carry to the daemon (``amoebactl jobs`` lists the node)."""
        log.warning("%s node %s failed under this job %d times", prefix, action.node, action.failures)
        self.event("node_failing", node=action.node, failures=action.failures)


def release_fields(action: ReleaseSatellite) -> dict[str, Any]:
    """The fields of a ``satellite_released`` event: the group, its Slurm job, why, and the class of the failure
    that took its workers (None: a shrink, the end of training, a preemption)."""
    failure = action.failure.value if action.failure is not None else None
    return {"group": action.group, "slurm_job": action.slurm_job, "reason": action.reason, "failure": failure}
