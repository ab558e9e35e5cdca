"""What shadowing costs fast-mode requests: latency with and without the live monitor.

Starts two ``mbn serve`` processes side by side on the same model, one with
``MBN_SHADOW_FRACTION=0`` (no monitor) and one with the fraction under test (default: the
service's default), warms both up, and measures fast-mode single-vector ``/embed`` latency
client side: one request at a time, then from ``--clients`` concurrent connections. The two
servers take turns in ``--blocks`` alternating blocks, so both see the same machine moment by
moment (on a shared machine the load moves more between minutes than shadowing costs). Both
servers are pinned to one CPU and the load generator to the others (``--no-pin`` leaves
them free), and the whole comparison is repeated for ``--rounds`` pairs of fresh processes,
started in alternating order, because two processes differ by several percent with nothing
changed; the figures are the median change over rounds. The last rows give the shadowed
server's monitor counters per round.

Run: ``MBN_MNIST=path/to/mnist70k.npz python benchmarks/bench_shadow.py [--model-dir DIR]``
(without ``--model-dir`` it first trains a model on ``--train`` MNIST images).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from bench_report import add_training_option, print_measures
from bench_service import (
    bodies_for,
    concurrent_clients,
    load_mnist_float,
    percentile,
    start_server,
    timed_requests,
    train_model,
)

from service.config import Settings


def warm_up(url: str, single: list[bytes], shadowed: bool) -> None:
    # One exact request first, in both configurations: it reads the exact model and compiles
    # its kernels in the API process. Then the same warm-up traffic to both, and (shadowed)
    # until the shadow process, started by the first sample, has answered once: its start-up
    # is a one-off, not what a running service pays per request.
    httpx.post(f"{url}/embed", content=single[0].replace(b'"fast"', b'"exact"'), timeout=600,
               headers={"content-type": "application/json"})  # fmt: skip
    timed_requests(url, single[:1000], warmup=0)
    if not shadowed:
        return
    deadline = time.monotonic() + 300
    while monitor_of(url)["shadow_rows"] == 0:
        if time.monotonic() > deadline:
            raise SystemExit("no row was shadowed within 300 s of warm-up traffic")
        # Pauses between small bursts: the shadow process starts (imports, kernels
        # compiled) only on cycles nobody else wants.
        time.sleep(2)
        timed_requests(url, single[:100], warmup=0)


def monitor_of(url: str) -> dict:
    model = httpx.get(f"{url}/models").json()["default"]
    return httpx.get(f"{url}/models/{model}/monitor", timeout=60).json()


def interleaved(urls: list[str], single: list[bytes], blocks: int) -> list[list[float]]:
    """Sequential latencies of each server, its requests interleaved with the other's in
    ``blocks`` alternating blocks (so that both see the same machine, moment by moment)."""
    latencies: list[list[float]] = [[] for _ in urls]
    size = max(1, len(single) // blocks)
    for block in range(blocks):
        part = single[block * size : (block + 1) * size]
        order = range(len(urls)) if block % 2 == 0 else reversed(range(len(urls)))
        for index in order:
            latencies[index] += timed_requests(urls[index], part, warmup=0)[0]
    return latencies


def concurrent_interleaved(
    urls: list[str], single: list[bytes], clients: int, seconds: float, blocks: int
) -> list[list[float]]:
    """Latencies under ``clients`` concurrent connections, alternating between the servers
    in windows of ``seconds / blocks``."""
    latencies: list[list[float]] = [[] for _ in urls]
    for block in range(blocks):
        order = range(len(urls)) if block % 2 == 0 else reversed(range(len(urls)))
        for index in order:
            window, _ = asyncio.run(
                concurrent_clients(urls[index], single, clients, seconds / blocks)
            )
            latencies[index] += window
    return latencies


def one_round(
    model_dir: Path,
    root: Path,
    single: list[bytes],
    fractions: tuple[float, float],
    first: int,
    cpus: set[int] | None,
    args: argparse.Namespace,
) -> tuple[list[list[float]], list[list[float]], dict]:
    """Both servers started (server ``first`` first), warmed up and measured side by side:
    (sequential latencies, concurrent latencies, the shadowed server's monitor)."""
    servers: list[Any] = [None, None]
    try:
        for index in (first, 1 - first):
            servers[index] = start_server(
                model_dir,
                root / f"data-{index}",
                settings={"MBN_SHADOW_FRACTION": str(fractions[index])},
                cpus=cpus,
            )
        urls = [url for _, url in servers]
        for url, fraction in zip(urls, fractions, strict=True):
            warm_up(url, single, fraction > 0)
        sequential = interleaved(urls, single, args.blocks)
        concurrent = concurrent_interleaved(urls, single, args.clients, args.seconds, args.blocks)
        return sequential, concurrent, monitor_of(urls[1])
    finally:
        for server in servers:
            if server is not None:
                server[0].send_signal(signal.SIGTERM)
                server[0].wait(60)


def pin_cpus(pin: bool) -> set[int] | None:
    """With ``pin`` and two CPUs or more: the servers' CPU (the last one), and this process
    (the load generator) moved to the others. Both servers then run on the same core, as
    one replica with one core to itself."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return None
    os.sched_setaffinity(0, set(cpus[:-1]))
    return {cpus[-1]}


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
    parser.add_argument("--requests", type=int, default=10_000, help="sequential, per server")
    parser.add_argument("--blocks", type=int, default=20, help="alternations of the servers")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0, help="concurrent, per server")
    parser.add_argument(
        "--rounds", type=int, default=3, help="pairs of fresh servers, their start order swapped"
    )
    parser.add_argument(
        "--no-pin", action="store_true", help="leave the servers and the load on any CPU"
    )
    add_training_option(parser, "n_clusterings=100")
    args = parser.parse_args(argv)
    x, y = load_mnist_float(None)
    cpus = pin_cpus(not args.no_pin)
    fractions = (0.0, args.fraction)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = args.model_dir
        if model_dir is None:
            model_dir = root / "models"
            params = {"map_points": 0, **args.option}
            train_model(model_dir, x, y, n_train=args.train, params=params)
        single = bodies_for(x[60_000:], 1, args.requests, "json-int")
        for number in range(args.rounds):
            rounds.append(
                one_round(model_dir, root / f"round-{number}", single, fractions, number % 2,
                          cpus, args)
            )  # fmt: skip

    rows = []
    for what, which in (("sequential", 0), (f"{args.clients} clients", 1)):
        for q in (50, 99):
            pairs = [[percentile(values, q) for values in one[which]] for one in rounds]
            changes = [(on / off - 1) * 100 for off, on in pairs]
            rows.append(
                (f"{what} p{q}: change at fraction {args.fraction}, median (rounds)",
                 f"{np.median(changes):+.1f}% ("
                 + ", ".join(f"{change:+.1f}%" for change in changes) + "); off "
                 + ", ".join(f"{off:.3f}" for off, _ in pairs) + " ms")
            )  # fmt: skip
    counts = [(len(one[0][0]), len(one[1][0]), len(one[1][1])) for one in rounds]
    rows.append(
        ("requests measured per server and round (sequential, concurrent off / on)",
         "; ".join(f"{a}, {b} / {c}" for a, b, c in counts))
    )  # fmt: skip
    for number, (_, _, monitor) in enumerate(rounds):
        rows.append(
            (f"round {number + 1}: monitor of the shadowed server",
             f"rows seen {monitor.get('rows_seen')}, sampled {monitor.get('rows_sampled')}, "
             f"shadow rows {monitor.get('shadow_rows')}, pending {monitor.get('pending_rows')}, "
             f"skipped (exact busy) {monitor.get('skipped_exact_busy')}, dropped (behind) "
             f"{monitor.get('dropped_behind')}, live R^2 {monitor.get('live', {}).get('r2')}")
        )  # fmt: skip
    rows.append(("servers pinned to CPU", str(sorted(cpus)) if cpus else "no"))
    print_measures("Cost of shadowing, fast mode", "bench_shadow.py", rows, argv)


if __name__ == "__main__":
    main()
