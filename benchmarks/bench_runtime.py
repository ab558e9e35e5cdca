"""The exact runtime's targets, each against a real ``mbn serve``, with MNIST test rows.

    python benchmarks/bench_runtime.py --model-dir MODELS all
    python benchmarks/bench_runtime.py --model-dir MODELS latency --rounds 5
    python benchmarks/bench_runtime.py --model-dir MODELS memory --workers 2

``--model-dir`` holds one bundle (the model all measures use); MNIST's last 10,000 images are
the rows (``bench_data.load_mnist``: ``MBN_MNIST`` or the cache), none of them seen by the model.
Each measure starts servers of its own, with the service's defaults unless said:

- ``latency``: the fast path's one-row p99, alone and while 2 clients (processes of their
  own) send one-row exact requests back to back, in blocks that take turns within a round
  on the same server; the ratio of the two p99s (target <= 1.1), median over ``--rounds``;
- ``throughput``: exact rows/s answered to 16 concurrent one-row clients for ``--seconds``,
  against the library's one-row-at-a-time ``transform`` rate on one thread measured in the
  same run just before (target >= 3x);
- ``memory``: PSS (``/proc/PID/smaps_rollup``) of every process of ``mbn serve --workers 2``
  (its main process, the API processes, the exact runtime) before any exact request and after
  exact requests have reached both API processes, the runtime counted from its PSS in a
  replica with no model (a replica with one loads its default's exact model at start); the
  difference over the size of ``exact.npz`` (target <= 1.5x);
- ``cancel``: 3 clients send 1,000-row exact requests and leave once they are computing; the
  latency of a one-row exact request sent then (target <= 3 s), beside that of one sent
  alone just before (what the machine's load alone costs it);
- ``kill``: ``kill -9`` of the runtime while a client sends fast requests; every fast answer
  counted, and the time until an exact request is answered again (target <= 20 s);
- ``equal``: exact answers (base64, the float32 bits) against the library's ``transform`` of
  each request alone, sent alone and by 12 clients at once with rows of different sizes
  (target: every bit equal);
- ``sizes`` (not part of ``all``): the library's ``transform`` time per row for calls of 1 to
  256 rows on one thread, what a step of that many merged rows costs each of them (no
  server; ``--rounds`` passes, median).

Prints one table per measure, with the medians and ranges over rounds.
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from bench_data import load_mnist
from bench_service import Connection, percentile, start_server
from threadpoolctl import threadpool_limits

from mbn_core.bundle import load_bundle


def row_body(row: np.ndarray, mode: str) -> bytes:
    return json.dumps({"inputs": [row.astype(np.int64).tolist()], "mode": mode}).encode()


def figure(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return 0.0


def wait(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.02)


# MBN_* settings of every server (--setting KEY=VALUE).
SETTINGS: dict[str, str] = {}


class Serving:
    """``mbn serve`` on the model, stopped on leaving."""

    def __init__(
        self, model_dir: Path, workers: int = 1, ready: bool = True, **settings: str
    ) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="bench-runtime-"))
        self.proc, self.url = start_server(
            model_dir,
            self.work / "data",
            processes=workers,
            settings={**SETTINGS, **settings},
            ready=ready,
        )

    def __enter__(self) -> Serving:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def runtime_pid(self) -> int:
        def described() -> str:
            # A 503 (say, while the replica is still warming) has no such member.
            answer = httpx.get(f"{self.url}/health/ready", timeout=30).json()
            return str(answer.get("exact_runtime", ""))

        wait(lambda: described().startswith("running (process "), 120, "the runtime")
        return int(described().split()[2].rstrip(","))

    def warm(self, x: np.ndarray) -> None:
        """The model mapped and its kernels compiled for one row and a batch."""
        connection = Connection(self.url)
        try:
            for rows in (x[:1], x[:40], x[:1]):
                body = json.dumps({"inputs": rows.astype(np.int64).tolist(), "mode": "exact"})
                status, _, content = connection.post(body.encode())
                if status != 200:
                    sys.exit(f"exact warm-up: {status} {content[:300]!r}")
        finally:
            connection.close()


# ---------------------------------------------------------------------------- measures


def fast_latencies(url: str, x: np.ndarray, count: int) -> list[float]:
    """One-row fast requests one after the other, the latency of each after 50 unmeasured
    (ms); the bodies are made before the clock starts."""
    bodies = [row_body(x[i % len(x)], "fast") for i in range(count + 50)]
    connection = Connection(url)
    latencies = []
    try:
        for i, body in enumerate(bodies):
            started = time.perf_counter()
            status, _, _ = connection.post(body)
            if status != 200:
                sys.exit(f"fast request: {status}")
            if i >= 50:
                latencies.append((time.perf_counter() - started) * 1000)
    finally:
        connection.close()
    return latencies


def _exact_client(url: str, rows: np.ndarray, sending: Event, done: Event, counts: Any) -> None:
    """A process sending one-row exact requests back to back while ``sending`` is set, until
    ``done``; ``counts`` holds (answers, answers not 200). Each spell of sending opens its own
    connection: the server closes one left idle past its keep-alive."""
    bodies = [row_body(row, "exact") for row in rows]
    connection: Connection | None = None
    i = 0
    try:
        while not done.is_set():
            if not sending.wait(0.05):
                if connection is not None:
                    connection.close()
                    connection = None
                continue
            if connection is None:
                connection = Connection(url)
            status = connection.post(bodies[i % len(bodies)])[0]
            with counts.get_lock():
                counts[0] += 1
                counts[1] += status != 200
            i += 1
    finally:
        if connection is not None:
            connection.close()


class ExactClients:
    """``n`` processes sending one-row exact requests (rows of their own from ``x``) back to
    back while ``sending`` is set; ``answered`` and ``refused`` count their answers. Processes,
    as other clients would be: threads would take the measuring process's interpreter lock."""

    def __init__(self, url: str, x: np.ndarray, n: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.sending, self._done = context.Event(), context.Event()
        self._counts = context.Array("q", 2)
        rows = x[: max(n, 400)]
        self._processes = [
            context.Process(
                target=_exact_client,
                args=(url, rows[i::n], self.sending, self._done, self._counts),
                daemon=True,
            )
            for i in range(n)
        ]

    @property
    def answered(self) -> int:
        return int(self._counts[0])

    @property
    def refused(self) -> int:
        return int(self._counts[1])

    def __enter__(self) -> ExactClients:
        for process in self._processes:
            process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        for process in self._processes:
            process.join(10)


def measure_latency(
    model_dir: Path, x: np.ndarray, rounds: int, count: int, blocks: int = 10
) -> list[str]:
    """Per round, ``blocks`` pairs of blocks of ``count / blocks`` fast requests, one alone and
    one while 2 clients send exact requests, taking turns (a busy neighbour's load then
    weighs on both alike); the p99 of each condition over the round."""
    ratios, alone_p99, busy_p99 = [], [], []
    per_block = max(1, count // blocks)
    with Serving(model_dir) as server, ExactClients(server.url, x[5000:], 2) as clients:
        server.warm(x)
        for _ in range(rounds):
            alone, busy = [], []
            answered_before, refused_before = clients.answered, clients.refused
            for block in range(2 * blocks):
                if block % 2 == 0:
                    alone += fast_latencies(server.url, x, per_block)
                    continue
                clients.sending.set()
                time.sleep(0.2)  # both are sending: a request queued, one computing
                busy += fast_latencies(server.url, x, per_block)
                clients.sending.clear()
                time.sleep(0.5)  # their last requests end
            answered = clients.answered - answered_before
            refused = clients.refused - refused_before
            if answered < 2:
                sys.exit("the exact clients got no answers")
            a, b = percentile(alone, 99), percentile(busy, 99)
            alone_p99.append(a)
            busy_p99.append(b)
            ratios.append(b / a)
            print(f"  round: p99 alone {a:.2f} ms, with 2 exact clients {b:.2f} ms "
                  f"(p50 {percentile(alone, 50):.2f} / {percentile(busy, 50):.2f}); "
                  f"{answered} exact answers, {refused} not 200", flush=True)  # fmt: skip
    return [
        "| fast one-row p99: with 2 exact clients / alone (median of rounds) | "
        f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f}); "
        f"p99 {statistics.median(alone_p99):.2f} / {statistics.median(busy_p99):.2f} ms | "
        "<= 1.1x |"
    ]


def library_rate(path: Path, x: np.ndarray, rows: int) -> float:
    """Rows/s of the library's exact ``transform``, one row at a time on one thread."""
    estimator = load_bundle(path).load_exact().estimator
    with threadpool_limits(limits=1):
        estimator.transform(x[:1].astype(np.float32))
        started = time.perf_counter()
        for i in range(rows):
            estimator.transform(x[i : i + 1].astype(np.float32))
        return rows / (time.perf_counter() - started)


def measure_throughput(
    model_dir: Path, path: Path, x: np.ndarray, rounds: int, seconds: float
) -> list[str]:
    ratios, served_rates, library_rates, batch_means = [], [], [], []
    with Serving(model_dir) as server, ExactClients(server.url, x[3000:], 16) as clients:
        server.warm(x)
        for _ in range(rounds):
            library = library_rate(path, x[2000:], 40)
            before_rows = figure(server.url, "mbn_exact_rows_total")
            before_batches = figure(server.url, "mbn_exact_batch_rows_count")
            refused_before = clients.refused
            clients.sending.set()
            time.sleep(2)  # the 16 clients' loop settles
            counted = clients.answered
            started = time.perf_counter()
            time.sleep(seconds)
            served = (clients.answered - counted) / (time.perf_counter() - started)
            clients.sending.clear()
            time.sleep(3)
            rows = figure(server.url, "mbn_exact_rows_total") - before_rows
            batches = figure(server.url, "mbn_exact_batch_rows_count") - before_batches
            refused = clients.refused - refused_before
            ratios.append(served / library)
            served_rates.append(served)
            library_rates.append(library)
            batch_means.append(rows / max(batches, 1))
            print(f"  round: served {served:.1f} rows/s, library {library:.1f} rows/s one at a "
                  f"time ({served / library:.2f}x); {refused} not 200; {rows / max(batches, 1):.1f}"
                  " rows per step", flush=True)  # fmt: skip
    return [
        "| exact rows/s to 16 one-row clients / library one row at a time, one thread | "
        f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f}); "
        f"{statistics.median(served_rates):.1f} / {statistics.median(library_rates):.1f} rows/s, "
        f"{statistics.median(batch_means):.1f} rows per step | >= 3x |"
    ]


def pss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def family(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    found, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError):
                continue
            if ppid == parent:
                found.append(int(entry.name))
                frontier.append(int(entry.name))
    return found


def measure_memory(model_dir: Path, path: Path, x: np.ndarray, workers: int) -> list[str]:
    size = (path / "exact.npz").stat().st_size
    # The runtime before any model: a replica with no model at all, since a replica with one
    # has its runtime load the default's exact model at start (the warm-up), before any
    # request could be measured against.
    empty = Path(tempfile.mkdtemp(prefix="bench-runtime-empty-"))
    with Serving(empty, workers=workers, ready=False) as server:
        # Never ready (no model), so the runtime is found among the replica's processes.
        def runtimes() -> list[int]:
            return [
                pid
                for pid in family(server.proc.pid)
                if b"service.exact.process" in Path(f"/proc/{pid}/cmdline").read_bytes()
            ]

        wait(runtimes, 120, "the runtime of a replica with no model")
        time.sleep(5)
        runtime_idle = pss(runtimes()[0])
    with Serving(model_dir, workers=workers) as server:
        runtime = server.runtime_pid()
        time.sleep(3)
        processes = family(server.proc.pid)
        before = sum(pss(pid) for pid in processes)
        runtime_before = pss(runtime)
        for i in range(40):  # a connection each: the kernel spreads them over the processes
            connection = Connection(server.url)
            rows = x[i * 10 : i * 10 + (1 if i % 2 else 100)]
            body = json.dumps({"inputs": rows.astype(np.int64).tolist(), "mode": "exact"})
            status, _, _ = connection.post(body.encode())
            connection.close()
            if status != 200:
                sys.exit(f"exact request: {status}")
        time.sleep(3)
        after = sum(pss(pid) for pid in family(server.proc.pid))
        runtime_after = pss(runtime)
    # Before any exact work: the API processes as measured, the runtime as it is idle.
    added = after - (before - runtime_before + runtime_idle)
    print(f"  replica PSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB; runtime idle "
          f"{runtime_idle / 2**20:.0f}, at the first measure {runtime_before / 2**20:.0f}, "
          f"after {runtime_after / 2**20:.0f} MiB; exact.npz {size / 2**20:.0f} MiB; "
          f"{len(processes)} processes")  # fmt: skip
    return [
        f"| PSS exact mode adds to `--workers {workers}` (every process; the runtime from "
        f"idle) / `exact.npz` | **{added / size:.2f}x** ({added / 2**20:.0f} of "
        f"{size / 2**20:.0f} MiB); the runtime idle {runtime_idle / 2**20:.0f} MiB, at the "
        f"first measure {runtime_before / 2**20:.0f}, after {runtime_after / 2**20:.0f} | "
        "<= 1.5x |"
    ]


def measure_cancel(model_dir: Path, x: np.ndarray, rounds: int) -> list[str]:
    """Per round, a one-row exact request with nothing else sent (the baseline, what the
    machine's load alone costs it), then the same after 3 clients left 1,000-row requests."""
    latencies, baselines = [], []
    with Serving(model_dir) as server:
        server.warm(x)
        host, port = server.url.removeprefix("http://").split(":")
        big = json.dumps({"inputs": x[:1000].astype(np.int64).tolist(), "mode": "exact"})
        head = (f"POST /embed HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(big)}\r\n\r\n").encode()  # fmt: skip
        for _ in range(rounds):
            connection = Connection(server.url)
            started = time.perf_counter()
            status, _, _ = connection.post(row_body(x[5001], "exact"))
            baselines.append(time.perf_counter() - started)
            connection.close()
            if status != 200:
                sys.exit(f"one-row exact request: {status}")
            socks = [socket.create_connection((host, int(port))) for _ in range(3)]
            for sock in socks:
                sock.sendall(head + big.encode())
            wait(lambda: figure(server.url, "mbn_exact_queue_requests") >= 3, 60, "3 queued")
            for sock in socks:
                sock.close()
            connection = Connection(server.url)
            started = time.perf_counter()
            status, _, _ = connection.post(row_body(x[5000], "exact"))
            latencies.append(time.perf_counter() - started)
            connection.close()
            if status != 200:
                sys.exit(f"one-row exact request: {status}")
            print(f"  round: one row answered in {latencies[-1]:.2f} s (alone before: "
                  f"{baselines[-1]:.2f} s)", flush=True)  # fmt: skip
            wait(lambda: figure(server.url, "mbn_exact_queue_requests") == 0, 60, "empty")
    return [
        "| one-row exact request after 3 clients left 1,000-row requests (median, max) | "
        f"**{statistics.median(latencies):.2f} s** (max {max(latencies):.2f}); the same "
        f"request with nothing left behind: {statistics.median(baselines):.2f} s "
        f"(max {max(baselines):.2f}) | <= 3 s |"
    ]


def measure_kill(model_dir: Path, x: np.ndarray, rounds: int) -> list[str]:
    downtimes, lost = [], 0
    fast_total = 0
    with Serving(model_dir) as server:
        server.warm(x)
        for _ in range(rounds):
            pid = server.runtime_pid()
            stop, statuses = threading.Event(), list[int]()

            def fast(stop: threading.Event = stop, statuses: list[int] = statuses) -> None:
                connection = Connection(server.url)
                try:
                    i = 0
                    while not stop.is_set():
                        statuses.append(connection.post(row_body(x[i % len(x)], "fast"))[0])
                        i += 1
                finally:
                    connection.close()

            thread = threading.Thread(target=fast)
            thread.start()
            time.sleep(0.5)
            os.kill(pid, signal.SIGKILL)
            killed = time.perf_counter()
            connection = Connection(server.url)
            while connection.post(row_body(x[7000], "exact"))[0] != 200:
                time.sleep(0.05)
            downtimes.append(time.perf_counter() - killed)
            connection.close()
            time.sleep(0.5)
            stop.set()
            thread.join()
            lost += sum(s != 200 for s in statuses)
            fast_total += len(statuses)
            print(
                f"  round: exact again after {downtimes[-1]:.1f} s; {len(statuses)} fast "
                f"requests, {sum(s != 200 for s in statuses)} not 200",
                flush=True,
            )
    return [
        f"| kill -9 of the runtime: fast requests not answered 200 (of {fast_total}) | "
        f"**{lost}** | 0 |",
        "| kill -9 of the runtime: exact answered again after (median, max) | "
        f"**{statistics.median(downtimes):.1f} s** (max {max(downtimes):.1f}) | <= 20 s |",
    ]


def measure_equal(model_dir: Path, path: Path, x: np.ndarray) -> list[str]:
    bundle = load_bundle(path)
    sizes = [1, 3, 1, 7, 20, 1, 2, 64, 300, 1, 5, 33]
    starts = np.cumsum([0, *sizes[:-1]])
    requests = [x[s : s + n] for s, n in zip(starts, sizes, strict=True)]
    expected = [bundle.embed(rows.astype(np.float32), mode="exact") for rows in requests]

    def decoded(answer: dict) -> np.ndarray:
        raw = base64.b64decode(answer["embeddings_b64"])
        return np.frombuffer(raw, dtype="<f4").reshape(answer["n"], answer["dim"])

    def body(rows: np.ndarray) -> dict:
        return {"inputs": rows.astype(np.int64).tolist(), "mode": "exact",
                "encoding_format": "base64"}  # fmt: skip

    together: list[dict] = [{} for _ in sizes]
    with Serving(model_dir) as server:
        server.warm(x)
        barrier = threading.Barrier(len(sizes))

        def send(i: int) -> None:
            with httpx.Client(base_url=server.url, timeout=600) as client:
                barrier.wait()
                together[i] = client.post("/embed", json=body(requests[i])).json()

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(sizes))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with httpx.Client(base_url=server.url, timeout=600) as client:
            alone = [client.post("/embed", json=body(rows)).json() for rows in requests]
    failed = [a for a in (*together, *alone) if "embeddings_b64" not in a]
    if failed:  # an error answer (a time-out on a starved machine): said, not compared
        sys.exit(f"exact answers that are errors: {failed}")
    differ_together = sum(
        not np.array_equal(decoded(a), e) for a, e in zip(together, expected, strict=True)
    )
    differ_alone = sum(
        not np.array_equal(decoded(a), e) for a, e in zip(alone, expected, strict=True)
    )
    return [
        f"| exact answers unequal to the library's transform, bit for bit: alone / 12 clients "
        f"at once ({sum(sizes)} rows in requests of 1-300) | **{differ_alone} / "
        f"{differ_together}** of {len(sizes)} | 0 / 0 |"
    ]


def measure_sizes(path: Path, x: np.ndarray, rounds: int) -> list[str]:
    estimator = load_bundle(path).load_exact().estimator
    # 2-64 rows: the small-batch kernel; 65 and more: the GEMM path.
    sizes = (1, 2, 4, 8, 16, 32, 64, 65, 128, 256)
    per_row: dict[int, list[float]] = {n: [] for n in sizes}
    with threadpool_limits(limits=1):
        estimator.transform(x[:1].astype(np.float32))
        estimator.transform(x[:32].astype(np.float32))
        estimator.transform(x[:64].astype(np.float32))
        for _ in range(rounds):
            for n in sizes:
                calls = max(1, 64 // n)
                started = time.perf_counter()
                for call in range(calls):
                    estimator.transform(x[call * n : (call + 1) * n].astype(np.float32))
                per_row[n].append((time.perf_counter() - started) * 1000 / (calls * n))
            print("  round: " + ", ".join(f"{n}: {v[-1]:.0f}" for n, v in per_row.items())
                  + " ms per row", flush=True)  # fmt: skip
    one = statistics.median(per_row[1])
    return [
        f"| library transform, one thread, ms per row in a call of {n} rows (median) | "
        f"**{statistics.median(v):.0f}** ({one / statistics.median(v):.1f}x cheaper than one "
        "row) | |"
        for n, v in per_row.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--mnist", default=None, help="MNIST .npz (else MBN_MNIST / the cache)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000, help="fast requests per p99")
    parser.add_argument("--seconds", type=float, default=30.0, help="of 16 clients")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                        help="an MBN_* setting of the servers (repeatable)")  # fmt: skip
    parser.add_argument("measures", nargs="+",
                        choices=["all", "latency", "throughput", "memory", "cancel", "kill",
                                 "equal", "sizes"])  # fmt: skip
    args = parser.parse_args()
    SETTINGS.update(item.split("=", 1) for item in args.setting)
    bundles = [p for p in args.model_dir.iterdir() if (p / "manifest.json").is_file()]
    if len(bundles) != 1:
        sys.exit(f"{args.model_dir} must hold exactly one bundle")
    path = bundles[0]
    x = load_mnist(args.mnist)[0][-10_000:]
    chosen = set(args.measures)
    if "all" in chosen:
        chosen = {"latency", "throughput", "memory", "cancel", "kill", "equal"}
    lines = []
    for name in ("latency", "throughput", "memory", "cancel", "kill", "equal", "sizes"):
        if name not in chosen:
            continue
        print(f"{name}:", flush=True)
        if name == "latency":
            lines += measure_latency(args.model_dir, x, args.rounds, args.requests)
        elif name == "throughput":
            lines += measure_throughput(args.model_dir, path, x, args.rounds, args.seconds)
        elif name == "memory":
            lines += measure_memory(args.model_dir, path, x, args.workers)
        elif name == "cancel":
            lines += measure_cancel(args.model_dir, x, max(args.rounds, 3))
        elif name == "kill":
            lines += measure_kill(args.model_dir, x, args.rounds)
        elif name == "equal":
            lines += measure_equal(args.model_dir, path, x)
        else:
            lines += measure_sizes(path, x, args.rounds)
    print("| measure | value | target |")
    print("|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
