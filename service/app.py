"""The application factory: ``create_app(settings)``.

Nothing lives in module globals: the lifespan builds the job store, the model registry, the
door to the replica's exact runtime and (by default) an embedded worker, and puts them on
``app.state``; routes reach the handlers built on them (``service.handlers``) through the
``service.deps`` aliases.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import State

from mbn_core.distribution import version
from service import json_rows, routes
from service.admission import ReadBudget, RowBudget
from service.auth import ApiKeys
from service.config import Settings
from service.errors import Unavailable, install_error_handlers
from service.exact.frontend import ExactFrontend, runtime_config
from service.exact.process import RuntimeConfig
from service.expectations import ExpectMiddleware
from service.handlers import (
    EmbedHandler,
    JobsHandler,
    MapsHandler,
    ModelsHandler,
    RuntimeHandler,
    TrainingHandler,
)
from service.jobs import JobFiles, JobStore
from service.limits import AdmissionMiddleware, BodyLimitMiddleware, BodyPace
from service.metrics import Metrics, MetricsMiddleware
from service.monitor import LiveMonitor
from service.readiness import ReadinessMonitor
from service.registry import ModelRegistry
from service.submission import DEMO_JOB_ID, Submitter
from service.warmup import DefaultModelWarmer
from service.worker import Worker

log = logging.getLogger(__name__)

# How long start-up waits for the job store (PostgreSQL may come up after the API).
STORE_WAIT_SECONDS = 60.0
# Readiness is checked this often, beside the traffic; older than the second, not ready.
READINESS_INTERVAL = 0.5
READINESS_STALE = 10.0


def open_store(settings: Settings, *, wait: float = STORE_WAIT_SECONDS) -> JobStore:
    """Connect to the job store and create its table, retrying while it is unreachable."""
    store = JobStore(settings.db_url, retry_after=settings.retry_after_seconds)
    deadline = time.monotonic() + wait
    while True:
        try:
            store.create_schema()
            return store
        except Unavailable:
            if time.monotonic() > deadline:
                store.dispose()
                raise
            log.warning("job store unreachable; retrying")
            time.sleep(1.0)


@dataclass
class Runtime:
    """Everything the lifespan starts, in start order."""

    settings: Settings
    store: JobStore
    files: JobFiles
    registry: ModelRegistry
    submitter: Submitter
    exact: ExactFrontend
    worker: Worker | None
    monitor: LiveMonitor
    # Seconds every /embed slot has been taken without a break (the row budget's).
    saturated_for: Callable[[], float] = lambda: 0.0
    initialized: bool = False
    # Warms the default model before readiness says so (service.warmup).
    warmer: DefaultModelWarmer = field(init=False)

    def __post_init__(self) -> None:
        self.warmer = DefaultModelWarmer(self.exact)

    @classmethod
    def start(cls, settings: Settings, metrics: Metrics) -> Runtime:
        settings.make_directories()
        store = open_store(settings)
        files = JobFiles(settings.jobs_path)
        registry = ModelRegistry(
            settings.models_path,
            onnx_threads=settings.onnx_threads,
            default_ref=settings.default_model,
        )
        exact = exact_frontend(settings, registry)
        worker = None
        if settings.embedded_worker:
            worker = Worker(settings, store, on_model=registry.add)
            worker.start()
        metrics.watch(job_counts=store.count_by_status, models=lambda: len(registry))
        metrics.watch_exact(lambda: exact.state)
        monitor = LiveMonitor(
            exact,
            fraction=settings.shadow_fraction,
            window=settings.monitor_window,
            replica=settings.replica_name or socket.gethostname(),
            max_delay=settings.shadow_max_delay,
        )
        metrics.watch_monitor(monitor.gauges, monitor.replica)
        registry.on_removed(monitor.forget)
        log.info(
            "started: models in %s, job store %s, %s",
            settings.models_path,
            store.engine.url.render_as_string(hide_password=True),
            "embedded worker" if worker else "no embedded worker",
        )
        return cls(
            settings,
            store,
            files,
            registry,
            Submitter(settings, store, files),
            exact,
            worker,
            monitor,
        )

    def first_scan(self) -> None:
        """Load every bundle; queue the demo model's training when there are none."""
        json_rows.warm_up()  # compiled before ready, not in the first request
        self.registry.rescan()
        log.info("%d model(s) loaded", len(self.registry))
        # The libraries and models loaded so far are about 200,000 long-lived objects that
        # every full collection would walk again, stopping all threads for 100-200 ms at a
        # time under load (the requests' short-lived lists trigger collections often). They
        # live as long as the process: leave them out of the collector's work (garbage first,
        # so none of it is kept).
        gc.collect()
        gc.freeze()
        if len(self.registry) == 0 and self.settings.demo_model:
            try:
                if self.submitter.submit_demo() is not None and self.worker is not None:
                    self.worker.wake()
            except Exception:
                log.exception("could not queue the demo model's training")
        self.initialized = True

    def readiness(self) -> tuple[dict[str, bool], list[str]]:
        store_problems = self.store.problems()
        disk_problems = self._disk_problems()
        checks = {
            "store": not store_problems,
            "disk": not disk_problems,
            "models_scanned": self.initialized,
        }
        snapshot = self.registry.snapshot
        # Ready means /embed can answer a request that names no model, without paying for
        # the model's first run: its fast path is warmed first (its exact model is loaded
        # beside, and said, never waited for).
        checks["model_available"] = snapshot.default is not None
        fast_warm, exact_loaded = self.warmer.status(snapshot.default)
        checks["default_fast_warm"] = fast_warm
        checks["default_exact_loaded"] = exact_loaded
        problems = store_problems + disk_problems
        # Reported, never a reason to be unready: an exact outage must not take the fast
        # path's traffic off the replica (exact requests get 503 meanwhile, which a load
        # balancer retries elsewhere).
        exact_state = self.exact.state
        checks["exact_runtime"] = exact_state is None or (
            exact_state.connected and exact_state.device != "none"
        )
        saturated = self.saturated_for()
        checks["embed_capacity"] = saturated <= self.settings.saturated_after_seconds
        if not checks["embed_capacity"]:
            slots = self.settings.max_inflight_requests
            problems.append(
                f"every /embed slot (MBN_MAX_INFLIGHT_REQUESTS={slots}) has been taken for "
                f"{saturated:.0f} s; new /embed requests are refused"
            )
        if not checks["models_scanned"]:
            problems.append("model directory not scanned yet")
        elif not checks["model_available"]:
            demo = self.store.get(DEMO_JOB_ID) if checks["store"] else None
            if demo is not None and not demo.finished:
                problems.append(f"demo model still training (job {demo.id}, {demo.status})")
            else:
                problems.append(snapshot.default_problem or "no usable model; train one")
        return checks, problems

    def _disk_problems(self) -> list[str]:
        settings = self.settings
        problems = []
        watched = (
            ("data", settings.data_dir),
            ("model", settings.models_path),
            ("upload spool", settings.spool_path),
        )
        for what, path in watched:
            try:
                stats = os.statvfs(path)
            except OSError as exc:
                problems.append(f"{what} directory unusable ({exc.strerror})")
                continue
            free = stats.f_bavail * stats.f_frsize
            if free < settings.min_free_bytes:
                problems.append(
                    f"{what} directory's disk is full ({free} bytes free, "
                    f"MBN_MIN_FREE_BYTES={settings.min_free_bytes})"
                )
            elif stats.f_flag & os.ST_RDONLY or not os.access(path, os.W_OK):
                problems.append(f"{what} directory is read-only")
        return sorted(set(problems))

    def stop(self) -> None:
        if self.worker is not None:
            # Stops its training processes and gives their jobs back to the queue.
            self.worker.stop(timeout=30)
        self.monitor.shutdown()
        self.store.dispose()


def exact_frontend(settings: Settings, registry: ModelRegistry) -> ExactFrontend:
    """The API process's door to the replica's exact runtime: the one ``mbn serve`` started
    (``MBN_EXACT_RUNTIME_SOCKET``), else one of its own, started when first needed."""
    return ExactFrontend(
        socket_path=settings.exact_runtime_socket,
        config=runtime_settings(settings),
        mark_damaged=registry.mark_damaged,
        timeout=settings.exact_timeout_seconds,
        retry_after=settings.retry_after_seconds,
    )


def runtime_settings(settings: Settings) -> RuntimeConfig:
    """The exact runtime's configuration from the service's settings."""
    return runtime_config(
        model_dir=settings.models_path,
        lanes=settings.exact_thread_count,
        device=settings.exact_device,
        cache_size=settings.exact_cache_size,
        max_requests=settings.exact_queue_requests,
        max_rows=settings.exact_queue_rows,
        batch_rows=settings.exact_batch_rows,
        max_wait=settings.exact_max_wait_ms / 1000.0,
        # Rows travel through shared memory when large; over the socket they never pass
        # what a body can carry (a JSON number takes at least two bytes, a float32 four).
        max_payload=max(256 << 20, 4 * settings.max_body_bytes),
        log_level=settings.log_level,
        niceness=settings.exact_niceness,
    )


def _install_handlers(state: State, runtime: Runtime) -> None:
    """Build the handlers the routes use (``service.deps``) on the started runtime."""
    settings, registry, worker = runtime.settings, runtime.registry, runtime.worker
    state.embed_handler = EmbedHandler(
        registry,
        runtime.exact,
        state.row_budget,
        settings.inline_fast_rows,
        settings.max_rows_per_request,
        monitor=runtime.monitor,
    )
    state.monitor = runtime.monitor
    state.training_handler = TrainingHandler(
        runtime.submitter, wake=None if worker is None else worker.wake, registry=registry
    )
    state.jobs_handler = JobsHandler(runtime.store, runtime.files)
    state.models_handler = ModelsHandler(registry)
    state.runtime_handler = RuntimeHandler(runtime.exact)
    state.maps_handler = MapsHandler(registry, max_rows=settings.max_rows_per_request)


async def _rescan_forever(runtime: Runtime) -> None:
    """First scan, then a rescan every ``rescan_seconds`` (bundles of other replicas)."""
    try:
        await run_in_threadpool(runtime.first_scan)
    except Exception:
        log.exception("scanning the model directory failed")
        runtime.initialized = True  # not ready would not heal it; the log says why
    while True:
        await asyncio.sleep(runtime.settings.rescan_seconds)
        try:
            await run_in_threadpool(runtime.registry.rescan)
        except Exception:
            log.exception("rescanning the model directory failed")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service. ``settings`` default to the ``MBN_*`` environment."""
    settings = settings or Settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await run_in_threadpool(Runtime.start, settings, metrics)
        state = app.state
        runtime.saturated_for = state.row_budget.saturated_for
        state.store, state.files, state.registry = runtime.store, runtime.files, runtime.registry
        state.submitter, state.exact, state.worker = (
            runtime.submitter,
            runtime.exact,
            runtime.worker,
        )
        await runtime.exact.start()
        monitor = ReadinessMonitor(
            runtime.readiness, interval=READINESS_INTERVAL, stale_after=READINESS_STALE
        )
        _install_handlers(state, runtime)
        readiness: Callable[[], tuple[dict[str, bool], list[str]]] = monitor.current
        state.readiness = readiness
        rescans = asyncio.create_task(_rescan_forever(runtime), name="mbn-rescan")
        watch = asyncio.create_task(monitor.run_forever(), name="mbn-readiness")
        try:
            yield
        finally:
            log.info("shutting down")
            state.readiness = None
            for task in (rescans, watch):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            monitor.shutdown()
            runtime.monitor.shutdown()
            await runtime.exact.close()
            await run_in_threadpool(runtime.stop)
            log.info("stopped")

    app = FastAPI(
        title="MBN embedding service",
        version=_version(),
        description=(
            "Embeddings from Multilayer Bootstrap Networks: fast (ONNX compressor) or exact "
            "(full MBN), training jobs, model registry. Errors have one shape: "
            '{"error": {"type": ..., "message": ...}}.'
        ),
        lifespan=lifespan,
        # /docs and /redoc come from routes.console, with their assets served from the package.
        docs_url=None,
        redoc_url=None,
        # /train/ is not /train: a 404, not a 307 that clients would follow without their
        # body (or their key, across hosts).
        redirect_slashes=False,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.api_keys = ApiKeys(settings.api_keys)
    app.state.row_budget = RowBudget(
        max_rows=settings.max_inflight_rows,
        max_requests=settings.max_inflight_requests,
        retry_after=settings.retry_after_seconds,
        on_reject=lambda reason: metrics.rejected.labels(f"embed_{reason}").inc(),
        threads=settings.fast_threads,
        max_buffered_bytes=settings.max_buffered_body_bytes,
    )
    app.state.read_budget = ReadBudget(
        max_reads=settings.max_inflight_reads,
        retry_after=settings.retry_after_seconds,
        on_reject=lambda what: metrics.rejected.labels(f"read_{what}").inc(),
    )
    install_error_handlers(app)
    app.add_middleware(AdmissionMiddleware, budget=app.state.row_budget)
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        max_upload_bytes=settings.max_upload_bytes,
        pace=BodyPace(timeout=settings.body_timeout_seconds, min_rate=settings.min_body_rate),
    )
    # Before anything reads a body: a wrong key answers an Expect: 100-continue at once.
    app.add_middleware(ExpectMiddleware)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: times everything
    for module in (
        routes.embed,
        routes.jobs,
        routes.models,
        routes.maps,
        routes.monitor,
        routes.runtime,
        routes.health,
    ):
        app.include_router(module.router)
    routes.console.install_console(app)
    _document_auth(app, settings)
    return app


def _document_auth(app: FastAPI, settings: Settings) -> None:
    """Make the OpenAPI document say what this server asks for: the bearer key is required
    only where a key is checked (keys configured; /metrics only with MBN_METRICS_REQUIRE_KEY),
    elsewhere optional (``{}`` in the security list), so clients and schema checkers are told
    the truth."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = generate()  # cached by FastAPI: edited once, in place
        for path, item in document["paths"].items():
            if settings.api_keys and (path != "/metrics" or settings.metrics_require_key):
                continue
            for operation in item.values():
                if "security" in operation:
                    operation["security"] = [{}, *operation["security"]]
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def _version() -> str:
    return version() or "0"
