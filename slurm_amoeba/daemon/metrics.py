"""Prometheus metrics of the daemon, through ``prometheus_client``, served over the standard library's HTTP server.

The daemon's loop updates counters, gauges and histograms (jobs, workers, decisions, resize latency, policy time);
:class:`MetricsServer` serves them at ``/metrics`` on its own thread, bound to the configured address (and
``/healthz`` for a liveness probe). Names follow Prometheus' conventions: counters end in ``_total``, a gauge never
does, units are in the name (``_seconds``); the page also carries ``process_*`` (CPU, memory, file descriptors),
``python_info`` and ``amoeba_build_info{version}``. Each :class:`DaemonMetrics` has a registry of its own, so that
several daemons in one process (the tests) do not share values.
"""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

import prometheus_client
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import slurm_amoeba

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Buckets (seconds) for resize latency: a grow waits for Slurm to start a satellite and workers to join.
RESIZE_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
#: Buckets (seconds) for the policy's decision time and the loop's round time.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _check_labels(name: str, declared: Sequence[str], labels: Mapping[str, str] | None) -> dict[str, str]:
    given = dict(labels or {})
    if sorted(given) != sorted(declared):
        raise ValueError(f"metric {name}: labels {sorted(given)} given, {sorted(declared)} declared")
    return given


class Counter:
    """A value that only goes up, per label set (``prometheus_client.Counter``; the name ends in ``_total``)."""

    def __init__(
        self, registry: prometheus_client.CollectorRegistry, name: str, help_text: str, labels: Sequence[str]
    ) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name}: a counter's name ends in _total, e.g. {name}_total")
        self.name = name
        self.labels = tuple(labels)
        self._registry = registry
        self._counter = prometheus_client.Counter(name, help_text, self.labels, registry=registry)

    def inc(self, amount: float = 1.0, labels: Mapping[str, str] | None = None) -> None:
        """Add ``amount`` (at least 0) to the counter of ``labels``."""
        if amount < 0:
            raise ValueError(f"counter {self.name} cannot go down by {amount}")
        given = _check_labels(self.name, self.labels, labels)
        (self._counter.labels(**given) if self.labels else self._counter).inc(amount)

    def value(self, labels: Mapping[str, str] | None = None) -> float:
        """The counter of ``labels`` (0 when never incremented)."""
        return self._registry.get_sample_value(self.name, dict(labels or {})) or 0.0

    def total(self) -> float:
        """The sum over every label set."""
        return sum(
            sample.value for metric in self._counter.collect() for sample in metric.samples if sample.name == self.name
        )


class Gauge(Collector):
    """A value that goes up and down, per label set; :meth:`replace` swaps a whole labelled family at once.

    A collector of its own (not ``prometheus_client.Gauge``) so that a scrape never sees half a replacement.
    """

    def __init__(
        self, registry: prometheus_client.CollectorRegistry, name: str, help_text: str, labels: Sequence[str]
    ) -> None:
        if name.endswith("_total"):
            raise ValueError(f"gauge {name}: _total is for counters; name the gauge {name.removesuffix('_total')}")
        self.name = name
        self.help = help_text
        self.labels = tuple(labels)
        self._lock = threading.Lock()
        self._values: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def _key(self, labels: Mapping[str, str] | None) -> tuple[str, ...]:
        given = _check_labels(self.name, self.labels, labels)
        return tuple(str(given[name]) for name in self.labels)

    def set(self, value: float, labels: Mapping[str, str] | None = None) -> None:
        """Set the gauge of ``labels``."""
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def replace(self, values: Iterable[tuple[Mapping[str, str], float]]) -> None:
        """Replace every label set by ``values`` (label sets not named disappear)."""
        fresh = {self._key(labels): float(value) for labels, value in values}
        with self._lock:
            self._values = fresh

    def value(self, labels: Mapping[str, str] | None = None) -> float:
        """The gauge of ``labels`` (0 when never set)."""
        key = self._key(labels)
        with self._lock:
            return self._values.get(key, 0.0)

    def describe(self) -> Iterable[Metric]:
        """The family without samples (registration checks the name once)."""
        return [GaugeMetricFamily(self.name, self.help, labels=self.labels)]

    def collect(self) -> Iterator[Metric]:
        """The family with every label set's value (called by each scrape)."""
        family = GaugeMetricFamily(self.name, self.help, labels=self.labels)
        with self._lock:
            items = sorted(self._values.items())
        for key, value in items:
            family.add_metric(list(key), value)
        yield family


class Histogram:
    """Observations counted into cumulative buckets, with their sum and count (``prometheus_client.Histogram``)."""

    def __init__(
        self, registry: prometheus_client.CollectorRegistry, name: str, help_text: str, buckets: Sequence[float]
    ) -> None:
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"histogram {name}: buckets {list(buckets)} must be increasing and not empty")
        self.name = name
        self.buckets = tuple(buckets)
        self._registry = registry
        self._histogram = prometheus_client.Histogram(name, help_text, buckets=self.buckets, registry=registry)

    def observe(self, value: float) -> None:
        """Count one observation."""
        self._histogram.observe(value)

    @property
    def count(self) -> int:
        """Observations so far."""
        return int(self._registry.get_sample_value(f"{self.name}_count") or 0)


class Registry:
    """One set of metrics (a ``prometheus_client.CollectorRegistry`` of its own), rendered in the text format.

    Args:
        process: also export ``process_*`` and ``python_info`` (the daemon does; tests of the format do not).
    """

    def __init__(self, *, process: bool = False) -> None:
        self.collectors = prometheus_client.CollectorRegistry()
        if process:
            prometheus_client.ProcessCollector(registry=self.collectors)
            prometheus_client.PlatformCollector(registry=self.collectors)

    def counter(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Counter:
        """Register a counter (its name ends in ``_total``).

        Raises:
            ValueError: the name is taken, or does not end in ``_total``.
        """
        return self._checked(name, lambda: Counter(self.collectors, name, help_text, labels))

    def gauge(self, name: str, help_text: str, labels: Sequence[str] = ()) -> Gauge:
        """Register a gauge.

        Raises:
            ValueError: the name is taken, or ends in ``_total``.
        """
        return self._checked(name, lambda: Gauge(self.collectors, name, help_text, labels))

    def histogram(self, name: str, help_text: str, buckets: Sequence[float]) -> Histogram:
        """Register a histogram with the given bucket bounds.

        Raises:
            ValueError: the name is taken, or the buckets are not increasing.
        """
        return self._checked(name, lambda: Histogram(self.collectors, name, help_text, buckets))

    def info(self, name: str, help_text: str, values: Mapping[str, str]) -> None:
        """Register ``NAME_info{values} 1`` (e.g. ``amoeba_build_info{version="0.1.0"}``)."""
        self._checked(name, lambda: prometheus_client.Info(name, help_text, registry=self.collectors)).info(
            dict(values)
        )

    @staticmethod
    def _checked(name: str, make: Callable[[], _T]) -> _T:
        try:
            return make()
        except ValueError as exc:
            if "Duplicated timeseries" in str(exc):
                raise ValueError(f"metric {name} is registered twice") from None
            raise

    def render(self) -> str:
        """Every metric in the Prometheus text format (version 0.0.4)."""
        return prometheus_client.generate_latest(self.collectors).decode()


class DaemonMetrics:
    """The metrics ``amoebad`` exports, by name.

    Attributes:
        registry: where they are registered (rendered by :class:`MetricsServer`).
    """

    def __init__(self) -> None:
        self.registry = Registry(process=True)
        r = self.registry
        r.info("amoeba_build", "The daemon's slurm-amoeba version.", {"version": slurm_amoeba.__version__})
        self.jobs = r.gauge(
            "amoeba_jobs", "Jobs the daemon sees, by kind (elastic, regular_running, regular_pending).", ["kind"]
        )
        self.agents = r.gauge("amoeba_agents_registered", "Elastic jobs whose agent has registered.")
        self.workers = r.gauge("amoeba_workers", "Workers of each elastic job, as its agent reports.", ["job"])
        # A total and its parts are two gauges, so that sum(amoeba_gpus) is the capacity and nothing counts twice.
        self.gpus_capacity = r.gauge("amoeba_gpus_capacity", "GPUs of the managed partitions' nodes, in all.")
        self.gpus = r.gauge(
            "amoeba_gpus", "GPUs of the managed partitions' nodes, by state (free, allocated); they add up.", ["state"]
        )
        self.decisions = r.counter(
            "amoeba_decisions_total", "Resize directives ordered, by kind and source.", ["kind", "source"]
        )
        self.directive_failures = r.counter(
            "amoeba_directive_failures_total", "Directives an agent refused or never answered, by reason.", ["reason"]
        )
        self.resize_latency = r.histogram(
            "amoeba_resize_latency_seconds", "From a resize order to the agent reporting the new size.", RESIZE_BUCKETS
        )
        self.policy_time = r.histogram("amoeba_policy_seconds", "Time the policy took to decide.", FAST_BUCKETS)
        self.loop_time = r.histogram("amoeba_loop_seconds", "Time of one observe-decide-act round.", FAST_BUCKETS)
        self.requests = r.counter("amoeba_requests_total", "Requests answered, by kind.", ["kind"])
        self.refusals = r.counter("amoeba_refusals_total", "Requests refused, by kind and reason.", ["kind", "reason"])
        self.in_flight = r.gauge("amoeba_resizes_in_flight", "Resizes ordered and not yet completed.")
        self.orphans = r.gauge("amoeba_orphan_satellites", "Satellite jobs whose parent job is gone.")
        self.observe_failures = r.counter("amoeba_observe_failures_total", "Rounds skipped: Slurm did not answer.")
        self.draining = r.gauge("amoeba_draining", "1 while an operator has drained every elastic job to its minimum.")
        self.last_round = r.gauge("amoeba_last_round_timestamp_seconds", "Unix time of the last completed round.")
        self.unreadable = r.counter(
            "amoeba_unreadable_messages_total", "Messages refused before a handler: bad credential, frames or JSON."
        )
        self.loop_errors = r.counter("amoeba_loop_errors_total", "Errors the daemon's loop caught and went past.")
        self.queue_updates = r.counter(
            "amoeba_queue_updates_total",
            "scontrol calls of queue ordering, by action (priority, revert) and outcome (ok, vanished, failed).",
            ["action", "outcome"],
        )
        self.queue_deferred = r.counter(
            "amoeba_queue_deferred_total",
            "Priority changes left for a later round (queue_order.max_updates_per_round).",
        )
        self.queue_jobs = r.gauge(
            "amoeba_queue_jobs", "Pending jobs queue ordering sees, by 2D-LAS queue (0 is served first).", ["queue"]
        )
        self.admission_decisions = r.counter(
            "amoeba_admission_decisions_total",
            "Holds and releases of admission at the requested size, by action (hold, release, starved, undo) and "
            "outcome (ok, vanished, failed); clear and priority count only when they fail.",
            ["action", "outcome"],
        )
        self.admission_held = r.gauge(
            "amoeba_admission_held", "Pending elastic jobs the daemon holds until their requested size is available."
        )
        self.slurm_actions = r.counter(
            "amoeba_slurm_actions_total",
            "Starts and preemptions the policy answered with, which Slurm does itself (recorded, not sent).",
            ["action"],
        )
        self.config_loaded = r.gauge(
            "amoeba_config_loaded",
            "1 for the configuration the daemon runs with: its file and the SHA-256 of its text (first 12 digits).",
            ["source", "digest"],
        )
        self.config_loaded_at = r.gauge(
            "amoeba_config_loaded_timestamp_seconds", "Unix time the running configuration was loaded."
        )
        self.ha_role = r.gauge(
            "amoeba_ha_role",
            "1 for the role of this daemon: active or standby of a standby pair (ha.lease_dir), single when alone.",
            ["role"],
        )
        self.lease_generation = r.gauge(
            "amoeba_lease_generation", "The lease generation this daemon holds (active) or last saw (standby)."
        )
        self.config_reloads = r.counter(
            "amoeba_config_reloads_total",
            "SIGHUP reloads of the configuration, by outcome (applied, invalid, needs_restart).",
            ["outcome"],
        )


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
        self.address = address
        self.port: int = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="amoebad-metrics", daemon=True)

    def start(self) -> None:
        """Start serving."""
        self._thread.start()
        logger.info("[daemon/metrics] Prometheus metrics at http://%s:%d/metrics", self.address, self.port)

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()


#: Seconds a metrics connection may stay silent before it is closed (an idle client holds no thread for longer).
CONNECTION_TIMEOUT_S = 10.0


def _make_handler(render: Callable[[], str]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = CONNECTION_TIMEOUT_S

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] == "/metrics":
                body = render().encode()
                self._reply(200, prometheus_client.CONTENT_TYPE_PLAIN_0_0_4, body)
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
