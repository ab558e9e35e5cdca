"""Does service/json_rows.py (a numba float parser) earn its place against msgspec?

Two servers on the same model, identical but for how ``POST /embed`` turns the JSON rows of
``inputs`` into a float32 matrix:

- ``numba``: the service as it is (``service.json_rows.parse_number_rows``);
- ``msgspec``: ``msgspec.json.Decoder(list[list[float]])`` then ``np.asarray(..., float32)``,
  the well-kept-library alternative (same bits: both parse to the nearest float64, then round).

Batches of 256 MNIST rows, as JSON integers (pixels 0..255) and as JSON floats (pixels / 255),
sent one at a time over a keep-alive connection. Rounds alternate the servers (A B, B A, ...),
so both see the same machine load; the figure is the median over rounds of the same-round
ratio of rows/s. The rule: keep the numba parser only if it is more than 1.3x faster
end to end. An in-process timing of the two parsers alone is printed too.

    python benchmarks/bench_json_rows.py            # trains a small MNIST model first
    python benchmarks/bench_json_rows.py --model-dir /path/to/models --rounds 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import numpy as np
from bench_data import load_mnist
from bench_server import free_port, wait_until_ready
from bench_service import bodies_for, timed_requests

REPO = Path(__file__).resolve().parents[1]
BATCH = 256
_ROWS = msgspec.json.Decoder(list[list[float]])


def msgspec_rows(raw: bytes) -> np.ndarray | None:
    """The alternative parser: msgspec to lists of floats, then one numpy conversion; None
    (the general path words the error) for anything but a non-empty rectangle of numbers."""
    try:
        rows = _ROWS.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not rows or any(len(row) != len(rows[0]) for row in rows) or not rows[0]:
        return None
    return np.asarray(rows, dtype=np.float32)


def serve_variant(parser: str, port: int) -> None:
    """Run the service with the chosen parser (the child process of ``start``)."""
    import uvicorn

    import service.routes.embed as embed_route
    from service.app import create_app
    from service.config import Settings

    if parser == "msgspec":
        embed_route.parse_number_rows = msgspec_rows  # type: ignore[assignment]
    uvicorn.run(create_app(Settings()), host="127.0.0.1", port=port, log_level="warning")


def start(parser: str, model_dir: Path, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    data_dir = work / parser
    data_dir.mkdir()
    env = {
        **os.environ,
        "MBN_DATA_DIR": str(data_dir),
        "MBN_MODEL_DIR": str(model_dir),
        "MBN_DEMO_MODEL": "false",
        "MBN_EMBEDDED_WORKER": "false",
        "MBN_LOG_LEVEL": "warning",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    log = (data_dir / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", parser, "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(proc, url, data_dir / "server.log", f"{parser} server")
    return proc, url


def in_process(bodies: list[bytes]) -> dict[str, float]:
    """Median ms to turn one body's ``inputs`` into a matrix, each parser alone."""
    from service.json_object import split_object
    from service.json_rows import parse_number_rows

    members = [
        bytes(split_object(body, known=("inputs",), large=("inputs",)).large["inputs"])
        for body in bodies
    ]
    out = {}
    for name, parse in (("numba", parse_number_rows), ("msgspec", msgspec_rows)):
        parse(members[0])  # compile / warm up
        times = []
        for member in members:
            started = time.perf_counter()
            matrix = parse(member)
            times.append((time.perf_counter() - started) * 1000)
            assert matrix is not None and matrix.shape[0] == BATCH
        out[name] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data", help="MNIST .npz (default: bench_data.load_mnist's search)")
    parser.add_argument("--model-dir", type=Path, help="bundles to serve (default: train one)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=100, help="per round, server and form")
    parser.add_argument("--serve", choices=["numba", "msgspec"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_variant(args.serve, args.port)
        return

    x, y = load_mnist(args.data)
    x = x.astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = args.model_dir
        if model_dir is None:
            from mbn_core.pipeline.training import train_bundle

            model_dir = work / "models"
            model_dir.mkdir()
            params = {"n_clusterings": 50, "k1": 500, "max_epochs": 20, "n_clusters": 10}
            train_bundle(x[:5000], model_dir / "mnist", name="mnist", params=params, y=y[:5000])
        servers = {name: start(name, model_dir, work) for name in ("numba", "msgspec")}
        try:
            report(servers, x, args)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(30)


def report(servers, x: np.ndarray, args: argparse.Namespace) -> None:
    for form in ("json-int", "json-float"):
        bodies = bodies_for(x[60_000:], BATCH, args.requests + 5, form)
        parse_ms = in_process(bodies)
        rates: dict[str, list[float]] = {"numba": [], "msgspec": []}
        ratios = []
        for round_index in range(args.rounds):
            order = ["numba", "msgspec"] if round_index % 2 == 0 else ["msgspec", "numba"]
            this_round = {}
            for name in order:
                latencies, _ = timed_requests(servers[name][1], bodies, warmup=5)
                this_round[name] = BATCH * len(latencies) / (sum(latencies) / 1000)
                rates[name].append(this_round[name])
            ratios.append(this_round["numba"] / this_round["msgspec"])
        print(
            f"{form}: rows/s median numba {statistics.median(rates['numba']):,.0f}, "
            f"msgspec {statistics.median(rates['msgspec']):,.0f}; same-round ratio "
            f"numba/msgspec median {statistics.median(ratios):.2f} "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f}, {args.rounds} rounds); "
            f"parsing alone per 256-row body: numba {parse_ms['numba']:.2f} ms, "
            f"msgspec {parse_ms['msgspec']:.2f} ms"
        )


if __name__ == "__main__":
    main()
