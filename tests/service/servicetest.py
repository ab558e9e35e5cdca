"""Helpers of the service tests: real server and worker processes, polling.

(Imported by the tests as ``servicetest``; a plain module, not a package, because a
``tests/service`` package would shadow the ``service`` package itself.)
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from service.app import create_app
from service.config import Settings

with warnings.catch_warnings():
    # Starlette's TestClient announces a future switch to another httpx package.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

REPO = Path(__file__).resolve().parents[2]
# `mbn` with the service's commands, as its entry points give them once installed; run through
# the package so a development environment installed before a new command still has it.
MBN_COMMAND = [sys.executable, "-m", "service"]

# Training parameters that make a digits model in a few seconds on one core.
TINY_PARAMS: dict[str, Any] = {
    "n_clusterings": 20,
    "hidden_layer_sizes": [32],
    "max_epochs": 5,
    "n_clusters": 10,
    "map_points": 300,
}
# Training parameters that keep a job running for minutes: a job to catch running, cancel,
# kill or restart servers under.
LONG_PARAMS: dict[str, Any] = {"n_clusterings": 3000, "hidden_layer_sizes": [16], "max_epochs": 2}
# Points of the ``digits_map`` fixture's map.
MAP_POINTS = 300
# Fast-reacting job machinery, so recovery tests take seconds.
FAST_JOBS_ENV = {
    "MBN_HEARTBEAT_SECONDS": "0.3",
    "MBN_STALE_AFTER_SECONDS": "2",
    "MBN_POLL_INTERVAL_SECONDS": "0.2",
    "MBN_RESCAN_SECONDS": "1",
    "MBN_TRAIN_THREADS": "1",
    "MBN_LOG_LEVEL": "info",
}


def fuzz_parsers() -> Any:
    """``benchmarks/fuzz_parsers.py`` (its seeds and mutations), loaded once per process."""
    if "fuzz_parsers" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "fuzz_parsers", REPO / "benchmarks" / "fuzz_parsers.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["fuzz_parsers"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules["fuzz_parsers"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Process:
    """A service process (``mbn serve`` or ``mbn worker``) with its log in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.args = args
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
        )
        log.close()
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.args} did not stop within {timeout} s") from None

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


class Server(Process):
    """``mbn serve`` on a free loopback port."""

    def __init__(self, env: dict[str, str], log_path: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        super().__init__(
            [*MBN_COMMAND, "serve", "--host", "127.0.0.1", "--port", str(self.port)], env, log_path
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self, wait: float = 60.0) -> Server:
        super().start()
        # A hang detector: a busy machine takes minutes to import and start a server.
        deadline = time.monotonic() + max(wait, BUSY_MACHINE_SECONDS)
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"server exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health/live", timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        self.stop(signal.SIGKILL)
        raise AssertionError(f"server did not come up:\n{self.log_tail()}")

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kwargs)


@contextlib.contextmanager
def serving(
    env: dict[str, str],
    log_path: Path,
    *,
    ready: bool = True,
    wait: float = 60.0,
    clean_log: bool = False,
) -> Iterator[Server]:
    """``mbn serve`` with ``env``: started (within ``wait`` seconds on a quiet machine, and,
    with ``ready``, answering ``/health/ready`` 200), stopped on leaving. A failure inside
    prints the server's log tail; with ``clean_log`` its log must hold no traceback once it
    stopped (an unhandled error is a 500)."""
    server = Server(env, log_path).start(wait=wait)
    try:
        if ready:
            with server.client() as client:
                wait_for(lambda: client.get("/health/ready").status_code == 200, 60, "ready")
        yield server
    except BaseException:
        print(server.log_tail())  # noqa: T201 - shown by pytest on failure
        raise
    finally:
        server.stop()
    if clean_log:
        assert "Traceback" not in server.log_path.read_text(), server.log_tail()


def read_answer(sock: socket.socket) -> bytes:
    """Everything the server sends on a raw connection, until it closes it."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


# The shortest deadline of a wait: each wait ends as soon as its condition holds, so the
# deadline only detects a hang, and a busy machine (load 6 on 2 cores) needs minutes where a
# quiet one needs seconds.
BUSY_MACHINE_SECONDS = 120.0


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll until ``condition()`` is truthy; return its value or fail naming ``what``.

    ``timeout`` is what a quiet machine needs; the wait allows at least
    ``BUSY_MACHINE_SECONDS``.
    """
    timeout = max(timeout, BUSY_MACHINE_SECONDS)
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def wait_for_job(client: httpx.Client, job_id: str, statuses: set[str], timeout: float) -> dict:
    def done() -> dict | None:
        job = client.get(f"/jobs/{job_id}").json()
        return job if job["status"] in statuses else None

    return wait_for(done, timeout, f"job {job_id} to reach {sorted(statuses)}")


def wait_for_progress(client: httpx.Client, job_id: str, timeout: float = 60) -> dict:
    """Poll until the job runs and has reported progress; return it."""

    def running() -> dict | None:
        job = client.get(f"/jobs/{job_id}").json()
        return job if job["status"] == "running" and job["progress"] > 0 else None

    return wait_for(running, timeout, f"job {job_id} to make progress")


def assert_error(response: Any, status: int, error_type: str | None = None) -> dict[str, str]:
    """The response is the one error shape with this status (and type)."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message"}, body
    if error_type is not None:
        assert body["error"]["type"] == error_type, body
    return body["error"]


def make_settings(data_dir: Path, **overrides: Any) -> Settings:
    """Settings rooted in ``data_dir``: no demo, fast job machinery."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "demo_model": False,
        "heartbeat_seconds": 0.3,
        "stale_after_seconds": 2.0,
        "poll_interval_seconds": 0.2,
        "rescan_seconds": 1.0,
    }
    values.update(overrides)
    return Settings(**values)


@contextlib.contextmanager
def running_app(
    settings: Settings, write_bundle: Callable[..., Path] | None
) -> Iterator[TestClient]:
    """The real app in-process, lifespan included, after its first model scan; with the
    model ``m-digits`` (name "digits", 64 -> 10, clustering head) unless ``write_bundle`` is
    None."""
    if write_bundle is not None:
        write_bundle(settings.models_path, "m-digits", "digits")
    try:
        with TestClient(create_app(settings)) as client:
            wait_for(lambda: _initialized(client), 30, "the app's first model scan", 0.05)
            yield client
    finally:
        # The app froze the collector's view of this (shared) test process at start-up;
        # thaw it so what the app held can be collected once it is gone.
        gc.unfreeze()


def _initialized(client: TestClient) -> bool:
    checks, _ = client.app.state.readiness()  # type: ignore[attr-defined]
    return bool(checks["models_scanned"])
