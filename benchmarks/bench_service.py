"""Speed of the HTTP service on loopback, with a model trained on MNIST.

Starts ``mbn serve`` (or uses ``--url``) and measures, client side:

- single-vector fast ``/embed``: latency p50 / p99 (target p50 < 3 ms);
- batches of 256 rows, fast mode: rows/s with JSON (pixels as JSON integers 0..255, and as
  JSON floats in [0, 1]) and with base64 float32 in and out (targets >= 20,000 and >= 100,000),
  one request at a time, then from ``--batch-clients`` concurrent connections (throughput);
- 32 concurrent clients sending single vectors: p50 / p99 and requests/s;
- exact mode: latency of one row and of a batch of 16 (the full MBN; bounded pool).

Then it says where the time goes: server compute time (the X-Compute-Time-Ms header) against
the client's latency, and an in-process breakdown of one 256-row request (parsing, conversion,
ONNX, serialisation) using the service's own functions.

Examples::

    # The lead's figures: a model from `mbn train` on 60,000 MNIST images
    python benchmarks/bench_service.py --model-dir /path/to/models
    # A brief check on a small model (trains one on 3,000 images first, about a minute)
    python benchmarks/bench_service.py --quick

The server gets MBN_ONNX_THREADS from ``--onnx-threads`` (default 1). Run on a quiet machine:
figures on a shared one mostly measure the neighbours.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from bench_data import load_mnist
from bench_server import free_port, wait_until_ready

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- setup


def load_mnist_float(path: str | None) -> tuple[np.ndarray, np.ndarray]:
    x, y = load_mnist(path)
    # Raw pixels 0..255: MBN is scale-free, and the compressor maps the MLP's input itself.
    return x.astype(np.float32), y.astype(np.int64)


def train_model(
    model_dir: Path, x: np.ndarray, y: np.ndarray, *, n_train: int, params: dict[str, Any]
) -> str:
    from mbn_core.pipeline.training import train_bundle

    model_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    path = train_bundle(
        x[:n_train], model_dir / "mnist-bench", name="mnist-bench", params=params, y=y[:n_train]
    )
    print(f"trained {path.name} on {n_train} MNIST images in {time.perf_counter() - started:.0f} s")
    return path.name


def start_server(
    model_dir: Path,
    data_dir: Path,
    onnx_threads: int | None = None,
    processes: int = 1,
    settings: dict[str, str] | None = None,
    cpus: set[int] | None = None,
    ready: bool = True,
) -> tuple[Any, str]:
    """``mbn serve`` on ``model_dir`` (no demo model, no worker), ready (unless ``ready`` is
    False: a replica with no model never is); ``settings``: more ``MBN_*`` variables. None
    for ``onnx_threads`` keeps the service's default; ``cpus`` pins the server (and every
    thread it starts) to those CPUs."""
    port = free_port()
    env = {
        **os.environ,
        "MBN_DATA_DIR": str(data_dir),
        "MBN_MODEL_DIR": str(model_dir),
        "MBN_DEMO_MODEL": "false",
        "MBN_EMBEDDED_WORKER": "false",
        "MBN_LOG_LEVEL": "warning",
        **(settings or {}),
    }
    if onnx_threads is not None:
        env["MBN_ONNX_THREADS"] = str(onnx_threads)
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [str(Path(sys.executable).with_name("mbn")), "serve", "--port", str(port)]
    command += ["--workers", str(processes)]
    log = (data_dir / "server.log").open("wb")
    pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin)
    url = f"http://127.0.0.1:{port}"
    if ready:
        wait_until_ready(proc, url, data_dir / "server.log", "server")
    return proc, url


# ---------------------------------------------------------------------------- measuring


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


class Connection:
    """A minimal keep-alive HTTP/1.1 client (POST /embed only), so that the figures measure
    the server rather than a Python HTTP library (client and server share the machine)."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    def post(self, body: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        self.sock.sendall(
            b"POST /embed HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        status = int(self.file.readline().split(b" ", 2)[1])
        headers = {}
        while (line := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return status, headers, self.file.read(int(headers[b"content-length"]))

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def timed_requests(
    url: str, bodies: list[bytes], *, warmup: int
) -> tuple[list[float], list[float]]:
    """Client latency and server compute time (ms) of each request, one after the other."""
    connection = Connection(url)
    try:
        for body in bodies[:warmup]:
            connection.post(body)
        latencies, computes = [], []
        for body in bodies[warmup:]:
            started = time.perf_counter()
            status, headers, content = connection.post(body)
            latencies.append((time.perf_counter() - started) * 1000)
            if status != 200:
                sys.exit(f"status {status}: {content[:300]!r}")
            computes.append(float(headers[b"x-compute-time-ms"]))
    finally:
        connection.close()
    return latencies, computes


def bodies_for(x: np.ndarray, batch: int, count: int, form: str, mode: str = "fast") -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        rows = x[rng.integers(0, len(x), batch)]
        request: dict[str, Any] = {"mode": mode, "return_clusters": False}
        if form == "json-int":
            request["inputs"] = rows.astype(np.int64).tolist()
        elif form == "json-float":
            request["inputs"] = (rows / 255.0).tolist()  # what a client holding floats sends
        else:
            request["inputs_b64"] = base64.b64encode(rows.astype("<f4").tobytes()).decode()
            request["dim"] = rows.shape[1]
            request["encoding_format"] = "base64"
        out.append(json.dumps(request).encode())
    return out


async def concurrent_clients(
    url: str, bodies: list[bytes], clients: int, seconds: float
) -> tuple[list[float], int]:
    """``clients`` keep-alive connections, each sending one request after the other.

    A minimal HTTP/1.1 client on asyncio streams: httpx's async client costs more CPU per
    request than the server does, and client and server share the machine.
    """
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def one(index: int) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        i = index
        try:
            while time.perf_counter() < stop_at:
                body = bodies[i % len(bodies)]
                started = time.perf_counter()
                writer.write(
                    b"POST /embed HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                latencies.append((time.perf_counter() - started) * 1000)
                if status != 200:
                    raise RuntimeError(f"status {status}")
                i += clients
        finally:
            writer.close()

    await asyncio.gather(*(one(i) for i in range(clients)))
    return latencies, len(latencies)


def breakdown(model_path: Path, x: np.ndarray, onnx_threads: int) -> list[tuple[str, float]]:
    """Milliseconds of each step of one 256-row fast request, in process."""
    import msgspec

    from mbn_core.bundle import load_bundle
    from service.arrays import bytes_to_matrix, matrix_to_b64, rows_to_matrix
    from service.json_object import parse_base64, split_object
    from service.json_rows import parse_number_rows
    from service.schemas import LARGE_GIVEN, EmbedRequest

    known = tuple(EmbedRequest.model_fields)
    large = ("inputs", "inputs_b64")

    def split_member(body: bytes, name: str) -> tuple[bytes, memoryview]:
        split = split_object(body, known=known, large=large)
        return split.small, split.large[name]

    bundle = load_bundle(model_path, threads=onnx_threads)
    rows = x[:256]
    json_body = json.dumps({"inputs": rows.astype(np.int64).tolist()}).encode()
    float_body = json.dumps({"inputs": (rows / 255.0).tolist()}).encode()
    b64_body = json.dumps(
        {"inputs_b64": base64.b64encode(rows.astype("<f4").tobytes()).decode(), "dim": 784}
    ).encode()
    split = split_member(json_body, "inputs")
    float_split = split_member(float_body, "inputs")
    b64_split = split_member(b64_body, "inputs_b64")

    def best(func: Callable[[], object], repeat: int = 15) -> float:
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            func()
            times.append((time.perf_counter() - started) * 1000)
        return min(times)

    request = EmbedRequest.model_validate_json(json_body)
    b64_request = EmbedRequest.model_validate_json(b64_body)
    inputs, inputs_b64 = request.inputs, b64_request.inputs_b64
    assert inputs is not None and inputs_b64 is not None
    matrix = rows_to_matrix(inputs, expected_dim=784, max_rows=8192, what="inputs")
    embedding = bundle.embed(matrix)
    return [
        ("JSON body -> top-level members placed and checked, rows as raw JSON (numba)",
         best(lambda: split_member(json_body, "inputs"))),
        ("raw JSON rows -> float32 matrix (numba), integers 0..255",
         best(lambda: parse_number_rows(split[1]))),
        ("raw JSON rows -> float32 matrix (numba), floats in [0, 1]",
         best(lambda: parse_number_rows(float_split[1]))),
        ("the other members -> request model (pydantic)",
         best(lambda: EmbedRequest.model_validate_json(
             split[0], context={LARGE_GIVEN: frozenset({"inputs"})}))),
        ("for comparison, the general path: JSON body -> request model (pydantic)",
         best(lambda: EmbedRequest.model_validate_json(json_body))),
        ("for comparison, the general path: rows -> float32 matrix + checks",
         best(lambda: rows_to_matrix(inputs, expected_dim=784, max_rows=8192, what="inputs"))),
        ("base64 body -> top-level members placed and checked (numba)",
         best(lambda: split_member(b64_body, "inputs_b64"))),
        ("raw base64 string -> bytes (pybase64)",
         best(lambda: parse_base64(b64_split[1], what="inputs_b64"))),
        ("for comparison, the general path: base64 body -> request model (pydantic)",
         best(lambda: EmbedRequest.model_validate_json(b64_body))),
        ("bytes -> float32 matrix + checks",
         best(lambda: bytes_to_matrix(inputs_b64, dim=784, expected_dim=784, max_rows=8192,
                                      what="x"))),
        ("ONNX compressor (256 rows)", best(lambda: bundle.embed(matrix))),
        ("embeddings -> JSON floats (msgspec)",
         best(lambda: msgspec.json.encode(embedding.tolist()))),
        ("embeddings -> base64", best(lambda: matrix_to_b64(embedding))),
    ]  # fmt: skip


# ---------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data", help="MNIST .npz (default: bench_data.load_mnist's search)")
    parser.add_argument("--model-dir", type=Path, help="bundles to serve (default: train one)")
    parser.add_argument("--model", help="model id or name to use (default: the default model)")
    parser.add_argument("--url", help="benchmark a running server instead of starting one")
    parser.add_argument("--n-train", type=int, default=10_000, help="images to train on")
    parser.add_argument("--n-clusterings", type=int, default=100, help="V of the trained MBN")
    parser.add_argument("--max-epochs", type=int, default=40, help="of the compressor")
    parser.add_argument("--onnx-threads", type=int, default=1)
    parser.add_argument("--server-workers", type=int, default=1, help="uvicorn processes")
    parser.add_argument("--requests", type=int, default=2000, help="single-vector requests")
    parser.add_argument("--batches", type=int, default=200, help="256-row requests per form")
    parser.add_argument("--seconds", type=float, default=10.0, help="of each concurrent run")
    parser.add_argument(
        "--batch-clients", type=int, default=4,
        help="concurrent connections sending 256-row batches (0: skip that measure)",
    )  # fmt: skip
    parser.add_argument("--exact", type=int, default=30, help="exact-mode requests")
    parser.add_argument(
        "--quick", action="store_true",
        help="a brief check: small model (3,000 images, V=20), few requests",
    )  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.n_train, args.n_clusterings, args.max_epochs = 3000, 20, 5
        args.requests, args.batches, args.seconds, args.exact = 300, 30, 3.0, 5

    x, y = load_mnist_float(args.data)
    test = x[60_000:]
    work = Path(tempfile.mkdtemp(prefix="mbn-bench-"))
    model_dir = args.model_dir
    if model_dir is None and args.url is None:
        model_dir = work / "models"
        params = {
            "n_clusterings": args.n_clusterings,
            "max_epochs": args.max_epochs,
            "random_state": 0,
        }
        args.model = train_model(model_dir, x, y, n_train=args.n_train, params=params)

    proc = None
    url = args.url
    if url is None:
        assert model_dir is not None
        proc, url = start_server(model_dir, work, args.onnx_threads, args.server_workers)
    rows: list[tuple[str, str]] = []
    batch_forms = [
        ("json-int", "JSON integers"),
        ("json-float", "JSON floats"),
        ("b64", "base64 float32"),
    ]
    batch_bodies: dict[str, list[bytes]] = {}
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            models = client.get("/models").json()
            model_id = args.model or models["default"]
            info = client.get(f"/models/{model_id}").json()
            # An exported fast path (e.g. modular_kpca) has no compressor to describe.
            compressor = info["hyperparameters"].get("compressor", {})
            print(
                f"model {info['id']} ({info['name']}, {info.get('method', 'mbn')}): "
                f"{info['input_dim']} -> {info['output_dim']}, trained on "
                f"{info['training']['n_samples']} points, "
                f"hidden layers {compressor.get('hidden_layer_sizes', 'none (exported)')}"
            )

            def with_model(bodies: list[bytes]) -> list[bytes]:
                out = []
                for body in bodies:
                    request = json.loads(body)
                    request["model"] = info["id"]
                    out.append(json.dumps(request).encode())
                return out

            single = with_model(bodies_for(test, 1, args.requests + 50, "json-float"))
            lat, comp = timed_requests(url, single, warmup=50)
            rows.append(
                (
                    "fast, 1 row, JSON: latency p50 / p99",
                    f"{percentile(lat, 50):.2f} / {percentile(lat, 99):.2f} ms "
                    f"(compute p50 {percentile(comp, 50):.3f} ms)",
                )
            )
            for form, label in batch_forms:
                bodies = batch_bodies[form] = with_model(
                    bodies_for(test, 256, args.batches + 5, form)
                )
                lat, comp = timed_requests(url, bodies, warmup=5)
                rate = 256 * len(lat) / (sum(lat) / 1000)
                rows.append(
                    (
                        f"fast, 256 rows, {label}: rows/s",
                        f"{rate:,.0f} rows/s (p50 {percentile(lat, 50):.1f} ms, of which "
                        f"compute {percentile(comp, 50):.1f} ms; "
                        f"{len(bodies[0]) / 1e6:.2f} MB/request)",
                    )
                )
            exact1 = with_model(bodies_for(test, 1, args.exact + 2, "json-float", "exact"))
            lat, comp = timed_requests(url, exact1, warmup=2)
            rows.append(
                (
                    "exact, 1 row: latency p50 / p99",
                    f"{percentile(lat, 50):.1f} / {percentile(lat, 99):.1f} ms",
                )
            )
            exact16 = with_model(bodies_for(test, 16, args.exact + 1, "json-float", "exact"))
            lat, comp = timed_requests(url, exact16, warmup=1)
            rows.append(
                (
                    "exact, 16 rows: latency p50 / p99",
                    f"{percentile(lat, 50):.1f} / {percentile(lat, 99):.1f} ms",
                )
            )
        lat, count = asyncio.run(concurrent_clients(url, single, 32, args.seconds))
        rows.append(
            (
                "fast, 1 row, 32 concurrent clients: p50 / p99",
                f"{percentile(lat, 50):.2f} / {percentile(lat, 99):.2f} ms "
                f"({count / args.seconds:,.0f} requests/s)",
            )
        )
        for form, label in batch_forms if args.batch_clients else ():
            lat, count = asyncio.run(
                concurrent_clients(url, batch_bodies[form], args.batch_clients, args.seconds)
            )
            rows.append(
                (
                    f"fast, 256 rows, {label}, {args.batch_clients} concurrent clients: rows/s",
                    f"{256 * count / args.seconds:,.0f} rows/s "
                    f"(p50 {percentile(lat, 50):.1f} / p99 {percentile(lat, 99):.1f} ms)",
                )
            )
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)

    print()
    print(
        f"| measure ({os.cpu_count()} CPUs, {args.server_workers} server process(es), "
        f"onnx threads {args.onnx_threads}) | result |"
    )
    print("|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    if model_dir is not None:
        path = model_dir / info["id"]
        print()
        print("Where the time of one 256-row fast request goes (in process, best of 15):")
        print()
        print("| step | ms |")
        print("|---|---|")
        for name, ms in breakdown(path, test, args.onnx_threads):
            print(f"| {name} | {ms:.2f} |")
        print()
        print(
            "The rest of the client latency is HTTP: uvicorn, the body transfer and the "
            "client itself."
        )
    print(f"\n(work dir {work})")


if __name__ == "__main__":
    main()
