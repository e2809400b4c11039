"""Prometheus metrics of the daemon, in the text exposition format, over the standard library's HTTP server.

The daemon's loop updates counters, gauges and histograms (jobs, workers, decisions, resize latency, policy time);
:class:`MetricsServer` serves them at ``/metrics`` on its own thread (and ``/healthz`` for a liveness probe). No
third-party client library: the format is a few lines of text.
"""

from __future__ import annotations

import bisect
import http.server
import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

logger = logging.getLogger(__name__)

LabelKey = tuple[tuple[str, str], ...]

#: Buckets (seconds) for resize latency: a grow waits for Slurm to start a satellite and workers to join.
RESIZE_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
#: Buckets (seconds) for the policy's decision time and the loop's round time.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _key(labels: Mapping[str, str] | None) -> LabelKey:
    return tuple(sorted((labels or {}).items()))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(key: LabelKey, extra: Iterable[tuple[str, str]] = ()) -> str:
    pairs = [*key, *extra]
    if not pairs:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in pairs) + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Metric:
    kind = "untyped"

    def __init__(self, name: str, help_text: str, lock: threading.Lock) -> None:
        self.name = name
        self.help = help_text
        self._lock = lock

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        with self._lock:
            lines.extend(self._samples())
        return lines

    def _samples(self) -> list[str]:
        return []


_MetricT = TypeVar("_MetricT", bound=_Metric)


class Counter(_Metric):
    """A value that only goes up (per label set)."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, lock: threading.Lock) -> None:
        super().__init__(name, help_text, lock)
        self._values: dict[LabelKey, float] = {}

    def inc(self, amount: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        """Add ``amount`` (at least 0) to the counter of ``labels``."""
        if amount < 0:
            raise ValueError(f"counter {self.name} cannot go down by {amount}")
        with self._lock:
            key = _key(labels)
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, labels: Mapping[str, str] | None = None) -> float:
        """The counter of ``labels`` (0 when never incremented)."""
        with self._lock:
            return self._values.get(_key(labels), 0.0)

    def total(self) -> float:
        """The sum over every label set."""
        with self._lock:
            return sum(self._values.values())

    def _samples(self) -> list[str]:
        return [f"{self.name}{_labels(key)} {_number(value)}" for key, value in sorted(self._values.items())]


class Gauge(_Metric):
    """A value that goes up and down; :meth:`replace` swaps a whole labelled family at once."""

    kind = "gauge"

    def __init__(self, name: str, help_text: str, lock: threading.Lock) -> None:
        super().__init__(name, help_text, lock)
        self._values: dict[LabelKey, float] = {}

    def set(self, value: float, labels: Mapping[str, str] | None = None) -> None:
        """Set the gauge of ``labels``."""
        with self._lock:
            self._values[_key(labels)] = float(value)

    def replace(self, values: Iterable[tuple[Mapping[str, str], float]]) -> None:
        """Replace every label set by ``values`` (label sets not named disappear)."""
        fresh = {_key(labels): float(value) for labels, value in values}
        with self._lock:
            self._values = fresh

    def value(self, labels: Mapping[str, str] | None = None) -> float:
        """The gauge of ``labels`` (0 when never set)."""
        with self._lock:
            return self._values.get(_key(labels), 0.0)

    def _samples(self) -> list[str]:
        return [f"{self.name}{_labels(key)} {_number(value)}" for key, value in sorted(self._values.items())]


class Histogram(_Metric):
    """Observations counted into cumulative buckets, with their sum and count."""

    kind = "histogram"

    def __init__(self, name: str, help_text: str, lock: threading.Lock, buckets: Sequence[float]) -> None:
        super().__init__(name, help_text, lock)
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"histogram {name}: buckets {list(buckets)} must be increasing and not empty")
        self.buckets = tuple(buckets)
        self._counts = [0] * (len(self.buckets) + 1)
        self._sum = 0.0
        self._count = 0

    def observe(self, value: float) -> None:
        """Count one observation."""
        with self._lock:
            self._counts[bisect.bisect_left(self.buckets, value)] += 1
            self._sum += value
            self._count += 1

    @property
    def count(self) -> int:
        """Observations so far."""
        with self._lock:
            return self._count

    def _samples(self) -> list[str]:
        lines: list[str] = []
        running = 0
        for bound, count in zip((*self.buckets, math.inf), self._counts, strict=True):
            running += count
            lines.append(f"{self.name}_bucket{_labels((), [('le', _number(bound))])} {running}")
        lines.append(f"{self.name}_sum {_number(self._sum)}")
        lines.append(f"{self.name}_count {self._count}")
        return lines


class Registry:
    """The daemon's metrics, rendered in registration order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: list[_Metric] = []

    def counter(self, name: str, help_text: str) -> Counter:
        """Register a counter."""
        return self._add(Counter(name, help_text, self._lock))

    def gauge(self, name: str, help_text: str) -> Gauge:
        """Register a gauge."""
        return self._add(Gauge(name, help_text, self._lock))

    def histogram(self, name: str, help_text: str, buckets: Sequence[float]) -> Histogram:
        """Register a histogram with the given bucket bounds."""
        return self._add(Histogram(name, help_text, self._lock, buckets))

    def _add(self, metric: _MetricT) -> _MetricT:
        if any(existing.name == metric.name for existing in self._metrics):
            raise ValueError(f"metric {metric.name} is registered twice")
        self._metrics.append(metric)
        return metric

    def render(self) -> str:
        """Every metric in the Prometheus text format (version 0.0.4)."""
        lines: list[str] = []
        for metric in self._metrics:
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"


class DaemonMetrics:
    """The metrics ``amoebad`` exports, by name.

    Attributes:
        registry: where they are registered (rendered by :class:`MetricsServer`).
    """

    def __init__(self) -> None:
        self.registry = Registry()
        r = self.registry
        self.jobs = r.gauge("amoeba_jobs", "Jobs the daemon sees, by kind (elastic, regular_running, regular_pending).")
        self.agents = r.gauge("amoeba_agents_registered", "Elastic jobs whose agent has registered.")
        self.workers = r.gauge("amoeba_workers", "Workers of each elastic job, as its agent reports.")
        self.workers_total = r.gauge("amoeba_workers_total", "Workers of all elastic jobs together.")
        self.gpus = r.gauge("amoeba_gpus", "GPUs of the managed partitions' nodes, by state (total, free).")
        self.decisions = r.counter("amoeba_decisions_total", "Resize directives ordered, by kind and source.")
        self.directive_failures = r.counter(
            "amoeba_directive_failures_total", "Directives an agent refused or never answered, by reason."
        )
        self.resize_latency = r.histogram(
            "amoeba_resize_latency_seconds", "From a resize order to the agent reporting the new size.", RESIZE_BUCKETS
        )
        self.policy_time = r.histogram("amoeba_policy_seconds", "Time the policy took to decide.", FAST_BUCKETS)
        self.loop_time = r.histogram("amoeba_loop_seconds", "Time of one observe-decide-act round.", FAST_BUCKETS)
        self.requests = r.counter("amoeba_requests_total", "Requests answered, by kind.")
        self.refusals = r.counter("amoeba_refusals_total", "Requests refused, by kind and reason.")
        self.in_flight = r.gauge("amoeba_resizes_in_flight", "Resizes ordered and not yet completed.")
        self.orphans = r.gauge("amoeba_orphan_satellites", "Satellite jobs whose parent job is gone.")
        self.observe_failures = r.counter("amoeba_observe_failures_total", "Rounds skipped: Slurm did not answer.")
        self.draining = r.gauge("amoeba_draining", "1 while an operator has drained every elastic job to its minimum.")
        self.last_round = r.gauge("amoeba_last_round_timestamp_seconds", "Unix time of the last completed round.")


class MetricsServer:
    """Serves a render function at ``/metrics`` on a background thread.

    Args:
        address: the IP address to listen on.
        port: the TCP port; 0 picks a free one (read :attr:`port`).
        render: returns the page's text.
    """

    def __init__(self, address: str, port: int, render: Callable[[], str]) -> None:
        handler = _make_handler(render)
        self._server = http.server.ThreadingHTTPServer((address, port), handler)
        self._server.daemon_threads = True
        self.port: int = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="amoebad-metrics", daemon=True)

    def start(self) -> None:
        """Start serving."""
        self._thread.start()
        logger.info("[daemon/metrics] Prometheus metrics on port %d at /metrics", self.port)

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()


def _make_handler(render: Callable[[], str]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] == "/metrics":
                body = render().encode()
                self._reply(200, "text/plain; version=0.0.4; charset=utf-8", body)
            elif self.path == "/healthz":
                self._reply(200, "text/plain", b"ok\n")
            else:
                self._reply(404, "text/plain", b"not found: try /metrics\n")

        def _reply(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            logger.debug("[daemon/metrics] %s " + format, self.address_string(), *args)

    return Handler
