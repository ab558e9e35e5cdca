"""Exact rows/s over HTTP with the exact runtime on a GPU, against the CPU, in one run.

The prepared command for a machine with a card (the ``gpu`` extra installed), a few minutes:

    MBN_MNIST=/path/to/mnist70k.npz python benchmarks/bench_gpu_http.py \\
        --model-dir benchmarks/out/models60k --devices cuda cpu --rows 1000 --clients 4

For each device (``MBN_EXACT_DEVICE``), ``mbn serve`` (the service's defaults otherwise) on
the one bundle of ``--model-dir``; ``--clients`` connections send ``--rows``-row exact
requests of MNIST's last 10,000 images (JSON integers, as the model was trained on raw
pixels) back to back for ``--seconds`` after a warm-up (the model mapped, the kernels
compiled). Prints rows/s per device, the device the runtime reports, and whether every
answer of one request set is the same, bit for bit, on every device (base64 answers).

Without a GPU, ``--devices cpu`` is the check that the script runs (the tests run it on a
digits model); ``--devices auto`` shows the fallback the runtime reports.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from bench_data import load_mnist
from bench_service import Connection, start_server
from sklearn.datasets import load_digits


def rows_of(data: str, mnist: str | None) -> np.ndarray:
    if data == "digits":
        return load_digits().data.astype(np.int64)
    return load_mnist(mnist)[0][-10_000:].astype(np.int64)


def measure(model_dir: Path, device: str, x: np.ndarray, args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-http-"))
    proc, url = start_server(model_dir, work / "data", settings={"MBN_EXACT_DEVICE": device})
    try:
        requests = [x[i : i + args.rows] for i in range(0, len(x) - args.rows + 1, args.rows)]
        body = {"mode": "exact", "encoding_format": "base64"}
        bodies = [json.dumps({**body, "inputs": rows.tolist()}).encode() for rows in requests]
        warm = Connection(url)
        status, _, content = warm.post(bodies[0])  # maps the model, compiles the kernels
        if status != 200:
            sys.exit(f"{device}: exact request answered {status}: {content[:300]!r}")
        answers = [json.loads(warm.post(body)[2]) for body in bodies[: args.check]]
        warm.close()
        described = httpx.get(f"{url}/health/ready", timeout=30).json()["exact_runtime"]
        done, stop = [0], threading.Event()

        def client(offset: int) -> None:
            connection = Connection(url)
            i = offset
            while not stop.is_set():
                status, _, _ = connection.post(bodies[i % len(bodies)])
                if status != 200:
                    sys.exit(f"{device}: status {status}")
                done[0] += args.rows
                i += args.clients
            connection.close()

        threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
        for thread in threads:
            thread.start()
        time.sleep(args.warmup)
        before, started = done[0], time.perf_counter()
        time.sleep(args.seconds)
        rate = (done[0] - before) / (time.perf_counter() - started)
        stop.set()
        for thread in threads:
            thread.join()
        return {"device": device, "runtime": described, "rows_per_s": rate, "answers": answers}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--devices", nargs="+", default=["cuda", "cpu"],
                        choices=["cuda", "cpu", "auto"])  # fmt: skip
    parser.add_argument("--data", choices=["mnist", "digits"], default="mnist")
    parser.add_argument("--mnist", default=None)
    parser.add_argument("--rows", type=int, default=1000, help="rows per request")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--check", type=int, default=3, help="requests compared across devices")
    args = parser.parse_args()
    x = rows_of(args.data, args.mnist)
    results = [measure(args.model_dir, device, x, args) for device in args.devices]

    def bits(answer: dict) -> bytes:
        return base64.b64decode(answer["embeddings_b64"])

    same = all(
        [bits(a) for a in result["answers"]] == [bits(a) for a in results[0]["answers"]]
        for result in results
    )
    print("| MBN_EXACT_DEVICE | the runtime | exact rows/s over HTTP |")
    print("|---|---|---|")
    for result in results:
        print(f"| {result['device']} | {result['runtime']} | {result['rows_per_s']:.0f} |")
    print(f"answers equal on every device, bit for bit: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
