"""What shadowing costs fast-mode requests: latency with and without the live monitor.

Starts ``mbn serve`` alternately with ``MBN_SHADOW_FRACTION=0`` (no monitor) and with the
fraction under test (default: the service's default), ``--rounds`` times each, and measures
fast-mode single-vector ``/embed`` latency client side: one request at a time, then from
``--clients`` concurrent connections. Each configuration's p50 and p99 are the medians over
its rounds; the last rows give the monitor's counters after the shadowed rounds (rows seen,
shadow rows, rows whose exact embedding was skipped because exact work was running).

Run: ``MBN_MNIST=path/to/mnist70k.npz python benchmarks/bench_shadow.py [--model-dir DIR]``
(without ``--model-dir`` it first trains a model on ``--train`` MNIST images).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
from pathlib import Path

import httpx
import numpy as np
from bench_report import print_measures
from bench_server import free_port, wait_until_ready
from bench_service import (
    bodies_for,
    concurrent_clients,
    load_mnist_float,
    percentile,
    timed_requests,
    train_model,
)

from service.config import Settings


def serve(model_dir: Path, data_dir: Path, fraction: float):
    import subprocess
    import sys

    port = free_port()
    env = {
        **os.environ,
        "MBN_DATA_DIR": str(data_dir),
        "MBN_MODEL_DIR": str(model_dir),
        "MBN_DEMO_MODEL": "false",
        "MBN_EMBEDDED_WORKER": "false",
        "MBN_LOG_LEVEL": "warning",
        "MBN_SHADOW_FRACTION": str(fraction),
    }
    command = [sys.executable, "-m", "service", "serve", "--port", str(port)]
    data_dir.mkdir(parents=True, exist_ok=True)
    log = (data_dir / "server.log").open("wb")
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(proc, url, data_dir / "server.log", "server")
    return proc, url


def measure(url: str, single: list[bytes], clients: int, seconds: float) -> dict[str, float]:
    latencies, _ = timed_requests(url, single, warmup=50)
    concurrent, _ = asyncio.run(concurrent_clients(url, single, clients, seconds))
    return {
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "c_p50": percentile(concurrent, 50),
        "c_p99": percentile(concurrent, 99),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="models to serve (default: train one)")
    parser.add_argument("--train", type=int, default=3_000, help="MNIST images to train on")
    parser.add_argument(
        "--fraction",
        type=float,
        default=Settings.model_fields["shadow_fraction"].default,
        help="the shadow fraction under test",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2_000, help="sequential, per round")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="concurrent, per round")
    args = parser.parse_args(argv)
    x, y = load_mnist_float(None)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = args.model_dir
        if model_dir is None:
            model_dir = root / "models"
            train_model(model_dir, x, y, n_train=args.train, params={"map_points": 0})
        held_out = x[60_000:]
        single = bodies_for(held_out, 1, args.requests + 50, "json-int")
        results: dict[float, list[dict[str, float]]] = {0.0: [], args.fraction: []}
        monitor = {}
        for round_ in range(args.rounds):
            for fraction in (0.0, args.fraction):
                proc, url = serve(model_dir, root / f"data-{round_}-{fraction}", fraction)
                try:
                    results[fraction].append(measure(url, single, args.clients, args.seconds))
                    if fraction:
                        model = httpx.get(f"{url}/models").json()["default"]
                        monitor = httpx.get(f"{url}/models/{model}/monitor", timeout=60).json()
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)

    def median(fraction: float, key: str) -> float:
        return float(np.median([r[key] for r in results[fraction]]))

    rows = []
    for key, what in (
        ("p50", "sequential p50"),
        ("p99", "sequential p99"),
        ("c_p50", f"{args.clients} clients p50"),
        ("c_p99", f"{args.clients} clients p99"),
    ):
        off, on = median(0.0, key), median(args.fraction, key)
        rows.append(
            (f"{what}, ms: off / fraction {args.fraction}", f"{off:.3f} / {on:.3f} "
             f"({(on / off - 1) * 100:+.1f}%)")
        )  # fmt: skip
    rows.append(
        ("monitor after the last shadowed round",
         f"rows seen {monitor.get('rows_seen')}, sampled {monitor.get('rows_sampled')}, "
         f"shadow rows {monitor.get('shadow_rows')}, skipped (exact busy) "
         f"{monitor.get('skipped_exact_busy')}, dropped (behind) {monitor.get('dropped_behind')}, "
         f"live R^2 {monitor.get('live', {}).get('r2')}")
    )  # fmt: skip
    print_measures("Cost of shadowing, fast mode", "bench_shadow.py", rows, argv)


if __name__ == "__main__":
    main()
