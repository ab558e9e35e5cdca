"""What ``mbn serve`` and ``mbn worker`` run (their command-line side is ``service/cli.py``)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType

import uvicorn
from fastapi import FastAPI

from service import protocol
from service.app import create_app, open_store, runtime_settings
from service.config import Settings
from service.exact.supervisor import Supervisor
from service.worker import Worker

log = logging.getLogger(__name__)


def configure_logging(level: str) -> None:
    """Log the service's and the library's messages at ``level`` (the CLI may have set up
    the root logger for its own, quieter, needs: only a handler is added if none exists)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("service", "mbn_core"):
        logging.getLogger(name).setLevel(level.upper())


def serve(
    host: str = "127.0.0.1", port: int = 8000, workers: int = 1, settings: Settings | None = None
) -> None:
    """Run the API with uvicorn until SIGTERM/SIGINT (then: stop accepting, finish in-flight
    requests for up to MBN_SHUTDOWN_GRACE_SECONDS, give running jobs back to the queue)."""
    settings = settings or Settings()
    configure_logging(settings.log_level)
    # Before uvicorn starts: a directory that cannot be made is the caller's error (OSError,
    # one line from ``mbn serve``), not a failed application start-up with a traceback.
    settings.make_directories()
    configure_protocol(settings)
    configure_interpreter()
    supervisor = None
    if settings.exact_runtime_socket is None:
        # One exact runtime for the replica, whatever its number of API processes, started
        # now so that the first exact request finds it ready.
        supervisor = Supervisor(runtime_settings(settings)).start()
        settings = settings.model_copy(update={"exact_runtime_socket": supervisor.socket_path})
    try:
        _run_uvicorn(host, port, workers, settings)
    finally:
        if supervisor is not None:
            supervisor.stop()


def _run_uvicorn(host: str, port: int, workers: int, settings: Settings) -> None:
    options = {
        "host": host,
        "port": port,
        "log_level": settings.log_level,
        "timeout_graceful_shutdown": max(1, round(settings.shutdown_grace_seconds)),
        "server_header": False,
        # Request heads bounded in size and time, malformed requests answered in JSON.
        "http": protocol.GuardedHttpProtocol,
    }
    if workers <= 1:
        uvicorn.run(create_app(settings), **options)  # type: ignore[arg-type]
        return
    # Several processes build the app themselves, from the environment.
    os.environ.update(settings_to_env(settings))
    uvicorn.run(
        "service.main:app_from_env",
        factory=True,
        workers=workers,
        # uvicorn kills a process that has not answered its health ping within this time as
        # hung, and a new one starts: a process still importing the numerical libraries on a
        # loaded host (beside the exact runtime starting) was killed over and over at 5 s.
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_SECONDS,
        **options,  # type: ignore[arg-type]
    )


# How long uvicorn waits for an API process's answer to its health ping (see above).
WORKER_HEALTHCHECK_SECONDS = 60


def app_from_env() -> FastAPI:
    """The app of one uvicorn worker process when ``serve`` runs several."""
    settings = Settings()
    configure_logging(settings.log_level)
    configure_protocol(settings)
    configure_interpreter()
    return create_app(settings)


# How long a thread waiting for the interpreter lock lets its holder run before asking for it
# (CPython's default is 5 ms). The event loop answers probes and refusals in microseconds but
# shares the lock with the request threads; at 5 ms, every lock it waits for under load can
# add up to 5 ms to a probe.
SWITCH_INTERVAL_SECONDS = 0.001


def configure_interpreter() -> None:
    """This process's interpreter settings for serving."""
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)


def configure_protocol(settings: Settings) -> None:
    """The request-head limits of the connections this process accepts."""
    protocol.configure(
        max_head_bytes=settings.max_header_bytes, head_timeout=settings.header_timeout_seconds
    )


def run_worker(settings: Settings | None = None) -> None:
    """A stand-alone training worker (several replicas share a PostgreSQL job store and
    the model directory). SIGTERM/SIGINT stop it cleanly: running jobs go back to the queue."""
    settings = settings or Settings()
    configure_logging(settings.log_level)
    settings.make_directories()
    store = open_store(settings)
    worker = Worker(settings, store)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: stopping the worker", signum)
        worker.stop()  # sets flags only: the loop below, in this thread, winds down

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        worker.run()
    finally:
        store.dispose()


def settings_to_env(settings: Settings) -> dict[str, str]:
    """``MBN_*`` variables that rebuild ``settings`` in another process."""
    env = {}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if name == "api_keys":
            text = ",".join(key.get_secret_value() for key in settings.api_keys)
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        env[f"MBN_{name.upper()}"] = text
    return env
