"""Exact mode over HTTP, and the fast path while exact requests run.

    python benchmarks/bench_exact_http.py --model-dir benchmarks/out/models60k

Serves ``--model-dir`` with ``mbn serve`` (one process, onnxruntime and the exact model on
one thread each, the service's defaults otherwise) and measures, with MNIST's last 10,000
images (rows no model here was trained on), one row at a time:

1. ``--rows`` rows through the exact model in this process (``transform`` of the row,
   after ``Bundle.load_exact``) and through its bottom layer alone (``encode(row, layer=0)``:
   the arithmetic a single row cannot avoid), interleaved; then the same rows as
   ``POST /embed`` with ``mode="exact"`` (client latency, and the server's own compute time
   from ``X-Compute-Time-Ms``). The p50 ratios are the targets: whole / bottom
   <= 1.5 and HTTP - in process <= 10 ms;
2. the fast path's single-row latency p50 / p99 alone, then again while ``--exact-clients``
   connections send exact requests back to back (exact must never slow the fast path);
   exact answers refused with 429 (the exact runtime's queue, ``MBN_EXACT_QUEUE_REQUESTS``)
   are counted. ``benchmarks/bench_runtime.py`` measures the exact runtime's targets.

Raw pixels (JSON integers 0..255) are sent, as the model was trained on them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from bench_data import load_mnist
from bench_report import print_measures
from bench_service import Connection, percentile, start_server
from threadpoolctl import threadpool_limits

from mbn_core.bundle import load_bundle


def body(row: np.ndarray, model: str, mode: str) -> bytes:
    request = {"model": model, "mode": mode, "inputs": [row.astype(np.int64).tolist()]}
    return json.dumps(request).encode()


def one_row_figures(url: str, path: Path, model: str, X: np.ndarray, rows: int) -> list:
    exact = load_bundle(path).load_exact().estimator
    connection = Connection(url)
    whole, bottom, http, compute = [], [], [], []
    try:
        with threadpool_limits(limits=1):
            # In process first, then over HTTP, each on the same rows: the model's arrays
            # (a copy in each process) are read from memory at every row, and a pass of
            # one process evicts the other's from the cache, as a busy neighbour would.
            # Within the process, whole and bottom take turns at going first.
            for i in range(rows + 2):  # the first two warm up
                row = X[i : i + 1]
                for step in ("whole", "bottom") if i % 2 else ("bottom", "whole"):
                    started = time.perf_counter()
                    if step == "whole":
                        exact.transform(row)
                    else:
                        exact.encode(row, layer=0)
                    if i >= 2:
                        (whole if step == "whole" else bottom).append(
                            (time.perf_counter() - started) * 1e3
                        )
            for i in range(rows + 2):
                started = time.perf_counter()
                status, headers, content = connection.post(body(X[i], model, "exact"))
                if status != 200:
                    sys.exit(f"exact request: status {status}: {content[:300]!r}")
                if i >= 2:
                    http.append((time.perf_counter() - started) * 1e3)
                    compute.append(float(headers[b"x-compute-time-ms"]))
    finally:
        connection.close()
    p = {name: percentile(values, 50) for name, values in
         (("whole", whole), ("bottom", bottom), ("http", http), ("compute", compute))}  # fmt: skip
    return [
        ("exact, one row in process: p50 / p90",
         f"{p['whole']:.1f} / {percentile(whole, 90):.1f} ms"),
        ("its bottom layer alone: p50 / p90",
         f"{p['bottom']:.1f} / {percentile(bottom, 90):.1f} ms"),
        ("**whole / bottom layer (p50)**", f"**{p['whole'] / p['bottom']:.2f}**"),
        ("exact, one row over HTTP: p50 / p90 (server compute p50)",
         f"{p['http']:.1f} / {percentile(http, 90):.1f} ms ({p['compute']:.1f} ms)"),
        ("**HTTP - in process (p50)**", f"**{p['http'] - p['whole']:+.1f} ms**"),
    ]  # fmt: skip


def fast_latencies(url: str, bodies: list[bytes]) -> list[float]:
    connection = Connection(url)
    try:
        for warm in bodies[:20]:
            connection.post(warm)
        latencies = []
        for request in bodies[20:]:
            started = time.perf_counter()
            status, _, content = connection.post(request)
            latencies.append((time.perf_counter() - started) * 1e3)
            if status != 200:
                sys.exit(f"fast request: status {status}: {content[:300]!r}")
    finally:
        connection.close()
    return latencies


def fast_under_exact(url: str, model: str, X: np.ndarray, args: argparse.Namespace) -> list:
    fast = [body(X[i % len(X)], model, "fast") for i in range(args.fast_requests + 20)]
    alone = fast_latencies(url, fast)
    stop = threading.Event()
    answers = {"ok": 0, "busy": 0}
    lock = threading.Lock()

    def exact_client(index: int) -> None:
        connection = Connection(url)
        i = index
        try:
            while not stop.is_set():
                status, _, content = connection.post(body(X[i % len(X)], model, "exact"))
                if status not in (200, 429):
                    raise RuntimeError(f"exact request: status {status}: {content[:300]!r}")
                with lock:
                    answers["ok" if status == 200 else "busy"] += 1
                if status == 429:
                    time.sleep(0.05)  # as a client honouring Retry-After would, briefly
                i += args.exact_clients
        finally:
            connection.close()

    threads = [threading.Thread(target=exact_client, args=(i,)) for i in range(args.exact_clients)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # let the exact requests get going
    started = time.perf_counter()
    loaded = fast_latencies(url, fast)
    seconds = time.perf_counter() - started
    stop.set()
    for thread in threads:
        thread.join()
    return [
        ("fast, one row, alone: p50 / p99",
         f"{percentile(alone, 50):.2f} / {percentile(alone, 99):.2f} ms"),
        (f"fast, one row, with {args.exact_clients} exact clients: p50 / p99",
         f"{percentile(loaded, 50):.2f} / {percentile(loaded, 99):.2f} ms"),
        ("exact answers meanwhile: 200 / 429",
         f"{answers['ok']} / {answers['busy']} in {seconds:.1f} s"),
    ]  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="bundles to serve")
    parser.add_argument("--model", help="model id (default: the server's default model)")
    parser.add_argument("--rows", type=int, default=30, help="one-row exact requests")
    parser.add_argument("--fast-requests", type=int, default=1000)
    parser.add_argument("--exact-clients", type=int, default=2)
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        help="KEY=VALUE for the server, e.g. MBN_EXACT_QUEUE_REQUESTS=1 (repeatable)",
    )
    parser.add_argument("--data", help="MNIST .npz (default: bench_data.load_mnist's search)")
    args = parser.parse_args(argv)
    os.environ.update(item.split("=", 1) for item in args.env)
    X, _ = load_mnist(args.data)
    X_test = X[-10_000:].astype(np.float32)
    with tempfile.TemporaryDirectory() as scratch:
        proc, url = start_server(args.model_dir, Path(scratch), onnx_threads=1, processes=1)
        try:
            with httpx.Client(base_url=url, timeout=60) as client:
                model = args.model or client.get("/models").json()["default"]
                info = client.get(f"/models/{model}").json()
            rows = [("model", f"{info['id']}: layers {info['training']['ks']}")]
            rows += one_row_figures(url, args.model_dir / model, model, X_test, args.rows)
            rows += fast_under_exact(url, model, X_test, args)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print_measures("Exact mode over HTTP", "bench_exact_http.py", rows, argv)


if __name__ == "__main__":
    main()
