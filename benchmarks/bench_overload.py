"""Backpressure of ``POST /embed`` under overload, on loopback.

1. Capacity: ``--capacity-clients`` closed-loop clients send fast-mode batches of ``--rows``
   rows (JSON, 64-dimensional digits rows, the demo model's shape) for ``--seconds``;
   capacity = completed requests per second.
2. Overload: open-loop arrivals at ``--factor`` x capacity (a fixed schedule, each request
   on a connection of its own, client timeout ``--timeout``) for ``--seconds``, while a
   prober asks ``/health/ready`` every 50 ms on its own connection.

Reported: offered and served rates, answers by status (200, 429, other, client timeouts),
latency p50 / p99 / max of the accepted (200) and of the refused (429) requests, health
probe latency p50 / p99 / max (the prober runs in a process of its own, as a kubelet would,
so the load generator's busy event loop is not counted as the server's latency).
Targets: 0 timeouts, health p99 < 100 ms, excess refused with 429 at once,
accepted p99 bounded.

Example::

    python benchmarks/bench_overload.py --rows 8192 --factor 4 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import numpy as np
from bench_server import free_port, wait_until_ready

REPO = Path(__file__).resolve().parents[1]


def train_model(model_dir: Path) -> None:
    from sklearn.datasets import load_digits

    from mbn_core.pipeline.training import train_bundle

    x, y = load_digits(return_X_y=True)
    params = {"n_clusterings": 50, "hidden_layer_sizes": [128, 128], "max_epochs": 30}
    train_bundle(x.astype(np.float32), model_dir / "digits", name="digits", params=params, y=y)


def start_server(data_dir: Path, env_extra: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {
        **os.environ,
        "MBN_DATA_DIR": str(data_dir),
        "MBN_DEMO_MODEL": "false",
        "MBN_EMBEDDED_WORKER": "false",
        "MBN_LOG_LEVEL": "warning",
        **env_extra,
    }
    command = [sys.executable, "-m", "service", "serve", "--port", str(port)]
    log = (data_dir / "server.log").open("wb")
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(proc, url, data_dir / "server.log", "server")
    return proc, url


async def request(port: int, raw: bytes, timeout: float) -> tuple[int, float]:
    """One HTTP/1.1 request on a new connection: (status or -1 on timeout/-2 on error, s)."""
    started = time.perf_counter()
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw)
            await writer.drain()
            status_line = await reader.readline()
            status = int(status_line.split(b" ", 2)[1])
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
    except TimeoutError:
        return -1, time.perf_counter() - started
    except (OSError, ValueError, IndexError, asyncio.IncompleteReadError):
        return -2, time.perf_counter() - started
    finally:
        if writer is not None:
            writer.close()
    return status, time.perf_counter() - started


def raw_post(body: bytes) -> bytes:
    return (
        b"POST /embed HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )


RAW_READY = b"GET /health/ready HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"


async def capacity(port: int, raw: bytes, clients: int, seconds: float) -> float:
    done = 0
    deadline = time.monotonic() + seconds

    async def client() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            status, _ = await request(port, raw, 60)
            done += status == 200

    started = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return done / (time.monotonic() - started)


def probe_once(port: int, timeout: float) -> float:
    """Seconds for one ``/health/ready`` answer (inf when it fails or is not 200)."""
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(RAW_READY)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except OSError:
        return float("inf")
    ok = answer.startswith(b"HTTP/1.1 200")
    return time.perf_counter() - started if ok else float("inf")


def prober(port: int, timeout: float, stop: EventType, out: Connection) -> None:
    """A probe every 50 ms, in a process of its own (as a kubelet or load balancer probes):
    the load generator's busy event loop must not be part of the health latency."""
    latencies = []
    while not stop.is_set():
        latencies.append(probe_once(port, timeout))
        time.sleep(0.05)
    out.send(latencies)


async def overload(
    port: int, raw: bytes, rate: float, seconds: float, timeout: float
) -> tuple[list[tuple[int, float]], list[float]]:
    results: list[tuple[int, float]] = []

    async def one() -> None:
        results.append(await request(port, raw, timeout))

    stop = multiprocessing.Event()
    receiver, sender = multiprocessing.Pipe(duplex=False)
    probe = multiprocessing.Process(target=prober, args=(port, timeout, stop, sender))
    probe.start()
    tasks = []
    start = time.monotonic()
    n = int(rate * seconds)
    for i in range(n):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    stop.set()
    health = receiver.recv()
    probe.join()
    return results, health


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--capacity-clients", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()

    from sklearn.datasets import load_digits

    x = load_digits().data.astype(np.float32)
    rows = np.resize(x, (args.rows, x.shape[1]))
    body = json.dumps({"inputs": rows.astype(int).tolist()}).encode()
    raw = raw_post(body)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        (data_dir / "models").mkdir()
        train_model(data_dir / "models")
        proc, url = start_server(data_dir, {})
        port = int(url.rsplit(":", 1)[1])
        try:
            cap = asyncio.run(capacity(port, raw, args.capacity_clients, args.seconds))
            rate = cap * args.factor
            print(f"capacity: {cap:.2f} requests/s of {args.rows} rows ({len(body)} bytes)")
            results, health = asyncio.run(overload(port, raw, rate, args.seconds, args.timeout))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    by_status: dict[int, list[float]] = {}
    for status, latency in results:
        by_status.setdefault(status, []).append(latency)
    ok, refused = by_status.get(200, []), by_status.get(429, [])
    finite_health = [h for h in health if h != float("inf")]
    report = {
        "rows": args.rows,
        "body_bytes": len(body),
        "capacity_rps": cap,
        "offered_rps": rate,
        "seconds": args.seconds,
        "sent": len(results),
        "status_counts": {str(k): len(v) for k, v in sorted(by_status.items())},
        "timeouts": len(by_status.get(-1, [])),
        "errors": len(by_status.get(-2, [])),
        "served_rps": len(ok) / args.seconds,
        "accepted_ms": {"p50": pct(ok, 50), "p99": pct(ok, 99), "max": pct(ok, 100)},
        "refused_ms": {"p50": pct(refused, 50), "p99": pct(refused, 99), "max": pct(refused, 100)},
        "health_ms": {
            "n": len(health),
            "failed": len(health) - len(finite_health),
            "p50": pct(finite_health, 50),
            "p99": pct(finite_health, 99),
            "max": pct(finite_health, 100),
        },
    }
    print(json.dumps(report, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
