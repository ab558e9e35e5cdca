"""Starting the service for a benchmark: a free loopback port, and waiting until it is ready."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_ready(
    proc: subprocess.Popen, url: str, log: Path, what: str = "server", timeout: float = 300
) -> None:
    """Return once ``url``'s /health/ready answers 200; exit the benchmark, with the end of
    the server's log, when the process dies or the time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited:\n" + log.read_text(errors="replace")[-3000:])
        try:
            if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"{what} did not become ready in {timeout:.0f} s")


def start_serve(source: Path, settings: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    """``mbn serve`` from the checkout at ``source`` on a free loopback port, with the
    environment plus ``settings``, its output in ``log``: (the process, its base URL)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(source), **settings}
    with log.open("w") as handle:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=env, cwd=source, stdout=handle, stderr=subprocess.STDOUT,
        )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"
