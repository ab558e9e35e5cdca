"""The supervisor of a replica's exact runtime: starts the process, restarts it when it dies.

The supervisor owns the runtime's listening socket (a Unix socket in a private directory) and
hands it to each process it starts: API processes connect to one path for the replica's whole
life, and a connection made during a restart waits in the socket's backlog for the new
process. A process that dies (``kill -9``, the kernel's OOM killer, a crash) is started again
at once, then after longer pauses while it keeps dying young (0.5 s doubling to 10 s), so a
runtime that cannot start does not spin. The supervisor removes the shared memory segments
that processes which are gone left behind, at each start and every minute.

``mbn serve`` starts one supervisor per replica, in its main process, before the API
processes (they learn the socket's path from ``MBN_EXACT_RUNTIME_SOCKET``). An app built
without that setting (one process, tests) starts its own on first use. The supervisor is a
thread of the process that starts it: the runtime is killed by the kernel when it goes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from service.exact import segments
from service.exact.process import RuntimeConfig

log = logging.getLogger(__name__)

SOCKET_NAME = "exact.sock"
# Restart pauses for a runtime that keeps dying within YOUNG_SECONDS of its start.
FIRST_PAUSE = 0.5
LONGEST_PAUSE = 10.0
YOUNG_SECONDS = 10.0
# How long a stopping runtime gets before it is killed.
STOP_SECONDS = 5.0
# How often segments left by API processes that are gone are removed.
SWEEP_SECONDS = 60.0
_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")
# glibc's allocator keeps what a thread frees for that thread's next allocations: an arena per
# thread, and an mmap threshold that rises after each large free, so the transient arrays of
# the lanes' steps stayed resident once freed (a third of the runtime's memory on the
# MNIST-10k model). A fixed threshold returns every large array to the kernel when freed.
# An operator's own MALLOC_* settings win.
_ALLOCATOR = {
    "MALLOC_ARENA_MAX": "2",
    "MALLOC_MMAP_THRESHOLD_": str(128 << 10),
    "MALLOC_TRIM_THRESHOLD_": str(128 << 10),
}


class Supervisor:
    """Runs ``service.exact.process`` with ``config`` (its ``listen_fd``, ``generation`` and
    ``parent_pid`` are filled in here) and keeps it running until ``stop``."""

    def __init__(self, config: RuntimeConfig) -> None:
        self._config = config
        self._directory = Path(tempfile.mkdtemp(prefix="mbn-exact-"))
        self.socket_path = self._directory / SOCKET_NAME
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        self._listener.listen(128)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self.generation = 0
        self.restarts = 0
        self.last_exit: str | None = None  # how the last process ended, for the logs

    def start(self) -> Supervisor:
        """Start the runtime (on the supervisor's own thread, which the process's lifetime
        is tied to) and return at once."""
        self._thread = threading.Thread(target=self._run, name="mbn-exact-supervisor", daemon=True)
        self._thread.start()
        return self

    @property
    def pid(self) -> int | None:
        with self._lock:
            process = self._process
        return None if process is None or process.poll() is not None else process.pid

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """Stop the runtime (SIGTERM, then SIGKILL after ``timeout``) and remove its socket.
        Held requests are answered 503 by the runtime as it stops."""
        self._stopping.set()
        with self._lock:
            process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the exact runtime did not stop within %.0f s; killing it", timeout)
                process.kill()
                process.wait()
        if self._thread is not None:
            self._thread.join(timeout)
        self._listener.close()
        shutil.rmtree(self._directory, ignore_errors=True)

    def _run(self) -> None:
        pause = FIRST_PAUSE
        while not self._stopping.is_set():
            segments.sweep(segments.directory())
            started = time.monotonic()
            try:
                process = self._spawn()
            except OSError as error:
                log.error("could not start the exact runtime: %s", error)
                process = None
            if process is not None:
                code = self._wait(process)
                if self._stopping.is_set():
                    return
                self.last_exit = _describe_exit(code)
                log.error(
                    "the exact runtime (process %d) %s; restarting it", process.pid, self.last_exit
                )
                self.restarts += 1
            young = time.monotonic() - started < YOUNG_SECONDS
            delay = pause if young else 0.0
            pause = min(LONGEST_PAUSE, pause * 2) if young else FIRST_PAUSE
            if self._stopping.wait(delay):
                return

    def _wait(self, process: subprocess.Popen[bytes]) -> int:
        """Wait for ``process`` to end, sweeping the segments of API processes that are gone
        (killed with their requests in flight) every ``SWEEP_SECONDS`` meanwhile."""
        while True:
            try:
                return process.wait(SWEEP_SECONDS)
            except subprocess.TimeoutExpired:
                segments.sweep(segments.directory())

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.generation += 1
        config = replace(
            self._config,
            listen_fd=self._listener.fileno(),
            generation=self.generation,
            parent_pid=os.getpid(),
        )
        command = [sys.executable, "-m", "service.exact.process", config.to_json()]
        # BLAS at one thread from the start: the runtime's lanes are its parallelism, and a
        # process-wide setting cannot be raced by lanes entering and leaving a limit.
        env = {**_ALLOCATOR, **os.environ, **dict.fromkeys(_BLAS_THREADS, "1")}
        process = subprocess.Popen(
            command, pass_fds=[self._listener.fileno()], close_fds=True, env=env
        )
        with self._lock:
            self._process = process
        log.info("exact runtime started (process %d, generation %d)", process.pid, self.generation)
        return process


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"
