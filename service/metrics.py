"""Prometheus metrics, one registry per app (no process globals: several apps can coexist).

- ``mbn_http_requests_total`` / ``mbn_http_request_duration_seconds``: by route template
  (never the raw path, which would explode cardinality), method, status and embed mode;
- ``mbn_jobs``: jobs by status, read from the shared store at scrape time (so every replica
  reports the same, true numbers);
- ``mbn_models_loaded``;
- ``mbn_exact_*``: the replica's exact runtime (``service.exact``), as this process last heard
  from it: whether it is up, its restarts and device, its queue, the rows of its steps
  (a histogram), each request's wait and each step's compute time (histograms), requests,
  rows, cancellations, abandoned steps, time-outs and refusals since the replica started;
- ``mbn_rejected_total``: requests refused for overload, by reason;
- ``mbn_live_fidelity_r2``, ``mbn_live_fidelity_cosine`` (median), ``mbn_input_novelty_share``,
  ``mbn_input_out_of_range_share``: the live monitor's figures by model and replica
  (``service.monitor``), each replica its own window.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.exact import wire
from service.exact.client import RuntimeState, totals
from service.schemas import JobStatus

log = logging.getLogger(__name__)

MODE_SCOPE_KEY = "mbn.mode"
_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_JOB_STATUSES: tuple[JobStatus, ...] = ("queued", "running", "succeeded", "failed", "cancelled")


class _JobsCollector(Collector):
    def __init__(self, counts: Callable[[], dict[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("mbn_jobs", "Training jobs by status", labels=["status"])
        try:
            counts = self._counts()
        except Exception as exc:  # a scrape must not fail because the store is down
            log.warning("job counts unavailable for /metrics: %s", exc)
            return
        for status in _JOB_STATUSES:
            family.add_metric([status], counts.get(status, 0))
        yield family


# The live monitor's gauges (``service.monitor.LiveMonitor.gauges``) and their help.
MONITOR_GAUGES = {
    "mbn_live_fidelity_r2": "R^2 of fast against exact embeddings on this replica's shadow rows",
    "mbn_live_fidelity_cosine": "Median cosine of fast and exact embeddings on the shadow rows",
    "mbn_input_novelty_share": "Share of sampled rows above the model's novelty threshold",
    "mbn_input_out_of_range_share": "Share of sampled rows outside the training range",
}


class _MonitorCollector(Collector):
    def __init__(
        self, gauges: Callable[[], list[tuple[str, str, dict[str, float]]]], replica: str
    ) -> None:
        self._gauges = gauges
        self._replica = replica

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {
            name: GaugeMetricFamily(name, help_text, labels=["model", "replica"])
            for name, help_text in MONITOR_GAUGES.items()
        }
        try:
            values = self._gauges()
        except Exception as exc:  # a scrape must not fail because of the monitor
            log.warning("monitor gauges unavailable for /metrics: %s", exc)
            return
        for model_id, _, gauges in values:
            for name, value in gauges.items():
                families[name].add_metric([model_id, self._replica], value)
        yield from families.values()


class _ExactCollector(Collector):
    """The exact runtime's figures, read from what this process last heard (never blocks)."""

    def __init__(self, state: Callable[[], RuntimeState | None]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state()
        up = GaugeMetricFamily(
            "mbn_exact_runtime_up", "Whether the replica's exact runtime is connected (1) or not"
        )
        up.add_metric([], 1.0 if state is not None and state.connected else 0.0)
        yield up
        if state is None:
            return  # not started: this process has not used exact mode yet
        restarts = CounterMetricFamily(
            "mbn_exact_runtime_restarts", "Times the exact runtime was started again"
        )
        restarts.add_metric([], max(0, state.generation - 1))
        yield restarts
        device = GaugeMetricFamily(
            "mbn_exact_device", "Where the exact runtime computes (the label)", labels=["device"]
        )
        if state.device:
            device.add_metric([state.device], 1.0)
        yield device
        stats = state.stats
        gauges = {
            "mbn_exact_queue_requests": ("Exact requests in the queue", "queued_requests"),
            "mbn_exact_queue_rows": ("Exact rows waiting for a step", "queued_rows"),
            "mbn_exact_running_rows": ("Exact rows in the step being computed", "running_rows"),
            "mbn_exact_models_loaded": ("Exact models the runtime holds", "models_loaded"),
            "mbn_exact_model_bytes": ("Bytes of the held models' arrays", "model_bytes"),
        }  # fmt: skip
        for name, (help_text, field) in gauges.items():
            gauge = GaugeMetricFamily(name, help_text)
            gauge.add_metric([], float(getattr(stats, field)) if stats is not None else 0.0)
            yield gauge
        total = totals(state)
        counters = {
            "mbn_exact_requests": ("Exact requests answered", "requests"),
            "mbn_exact_rows": ("Exact rows answered", "rows"),
            "mbn_exact_cancelled": ("Exact requests dropped: their client left", "cancelled"),
            "mbn_exact_abandoned": ("Exact steps stopped: nobody waited for them", "abandoned"),
            "mbn_exact_timed_out": ("Exact requests dropped past their deadline", "timed_out"),
            "mbn_exact_rejected": ("Exact requests refused: the queue was full", "rejected"),
        }
        for name, (help_text, field) in counters.items():
            counter = CounterMetricFamily(name, help_text)
            counter.add_metric([], float(total[field]))
            yield counter
        histograms = (
            ("mbn_exact_batch_rows", "Rows per step of the exact runtime", "batch_rows",
             wire.BATCH_ROWS_BOUNDS),
            ("mbn_exact_wait_seconds", "Time an exact request waited for its first step",
             "wait", wire.SECONDS_BOUNDS),
            ("mbn_exact_compute_seconds", "Time a step of the exact runtime computed",
             "compute", wire.SECONDS_BOUNDS),
        )  # fmt: skip
        for name, help_text, field, bounds in histograms:
            buckets = total[f"{field}_buckets"]
            if buckets is None:
                continue
            cumulative, running = [], 0
            for bound, count in zip((*bounds, float("inf")), buckets, strict=True):
                running += count
                cumulative.append((_le(bound), running))
            histogram = HistogramMetricFamily(name, help_text)
            histogram.add_metric([], cumulative, sum_value=float(total[f"{field}_sum"]))
            yield histogram


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))


class Metrics:
    """The service's metrics and their registry."""

    def __init__(self) -> None:
        self._jobs_collector: _JobsCollector | None = None
        self._monitor_collector: _MonitorCollector | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "mbn_http_requests",
            "HTTP requests by route template, method, status and embed mode",
            ["route", "method", "status", "mode"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "mbn_http_request_duration_seconds",
            "Time from request start to the end of the response, by route and embed mode",
            ["route", "method", "mode"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.rejected = Counter(
            "mbn_rejected",
            "Requests refused because of overload (429), by reason",
            ["reason"],
            registry=self.registry,
        )
        self.models_loaded = Gauge(
            "mbn_models_loaded", "Verified models in the registry", registry=self.registry
        )
        self._exact_collector: _ExactCollector | None = None

    def watch(
        self,
        *,
        job_counts: Callable[[], dict[str, int]],
        models: Callable[[], int],
    ) -> None:
        """Connect the gauges read at scrape time to their sources (again, replacing the old
        ones, when an app's lifespan runs a second time)."""
        if self._jobs_collector is not None:
            self.registry.unregister(self._jobs_collector)
        self._jobs_collector = _JobsCollector(job_counts)
        self.registry.register(self._jobs_collector)
        self.models_loaded.set_function(models)

    def watch_exact(self, state: Callable[[], RuntimeState | None]) -> None:
        """Connect the exact runtime's figures (read at scrape time)."""
        if self._exact_collector is not None:
            self.registry.unregister(self._exact_collector)
        self._exact_collector = _ExactCollector(state)
        self.registry.register(self._exact_collector)

    def watch_monitor(
        self, gauges: Callable[[], list[tuple[str, str, dict[str, float]]]], replica: str
    ) -> None:
        """Connect the live monitor's gauges (read at scrape time)."""
        if self._monitor_collector is not None:
            self.registry.unregister(self._monitor_collector)
        self._monitor_collector = _MonitorCollector(gauges, replica)
        self.registry.register(self._monitor_collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)


# The status nginx logs for a request whose client left before the answer.
CLIENT_CLOSED_REQUEST = 499


def route_template(scope: Scope) -> str:
    """The route a request went to, as its path template: a route's own, a mounted app's
    prefix with ``{path}`` (the console's static assets), or "unmatched"."""
    route = scope.get("route")
    template = getattr(route, "path", None)
    if template:
        return template
    if "app_root_path" in scope and scope.get("endpoint") is not None:  # set by a Mount
        prefix = scope.get("root_path", "")[len(scope["app_root_path"]) :]
        if prefix:
            return f"{prefix}/{{path}}"
    return "unmatched"


class MetricsMiddleware:
    """Pure ASGI middleware (no body buffering) timing every HTTP request."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: int | None = None
        failed = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException:
            failed = True
            raise
        finally:
            if status is None:
                # No answer: a failure, or a client that left before there was one to give
                # (499, nginx's "client closed request"), which is no server error.
                status = 500 if failed else CLIENT_CLOSED_REQUEST
            template = route_template(scope)
            mode = scope.get(MODE_SCOPE_KEY, "")
            method = scope["method"]
            self.metrics.requests.labels(template, method, str(status), mode).inc()
            self.metrics.latency.labels(template, method, mode).observe(time.perf_counter() - start)
