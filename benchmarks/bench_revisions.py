"""Two revisions of this code serving the same bundle, measured side by side in one run.

    MBN_MNIST=path/to/mnist70k.npz python benchmarks/bench_revisions.py --old REV [--new REV]

"Same or better than before" needs both in the same run: on shared cores the machine moves
more between hours than most changes do. ``--old`` (and ``--new``; default: this working
tree) are checked out with ``git worktree`` into a temporary folder. A model is trained on
``--train`` MNIST images with the old revision's own ``mbn train`` (so that both revisions
read its bundle), and each revision serves it from one ``mbn serve`` process: the same
interpreter and packages, only the code differs (``PYTHONPATH``). The live monitor is off in
both (``MBN_SHADOW_FRACTION=0``; an old revision ignores the variable), so the figures compare
the request path itself.

Each of ``--rounds`` rounds measures both servers, in alternating order: ``--requests``
single-row ``/embed`` requests in JSON floats (latency p50 and p99), then ``--batches``
256-row requests in JSON integers (rows per second), one request at a time. The figure is the
median over rounds of each round's new / old ratio. ``--old HEAD --new HEAD`` is the A/A
run: what two processes of the same code differ by.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from bench_data import load_mnist
from bench_report import print_measures
from bench_service import bodies_for, percentile, start_server, timed_requests

REPO = Path(__file__).resolve().parents[1]
MEASURES = ("1 row p50 (ms)", "1 row p99 (ms)", "256-row JSON integers (rows/s)")


@contextlib.contextmanager
def checkout(revision: str | None, folder: Path) -> Iterator[Path]:
    """The code of ``revision`` (None: this working tree) in a folder, removed afterwards."""
    if revision is None:
        yield REPO
        return
    git = ["git", "-C", str(REPO)]
    subprocess.run([*git, "worktree", "add", "--detach", str(folder), revision], check=True,
                   capture_output=True)  # fmt: skip
    try:
        yield folder
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(folder)], check=False)


def train_with(code: Path, x: np.ndarray, model_dir: Path, work: Path) -> None:
    data = work / "train.npy"
    np.save(data, x)
    model_dir.mkdir(parents=True, exist_ok=True)
    mbn = Path(sys.executable).with_name("mbn")
    command = [str(mbn), "train", str(data), "--out", str(model_dir / "bench"), "--name", "bench",
               "--n-clusterings", "100", "--random-state", "0", "--quiet"]  # fmt: skip
    subprocess.run(command, check=True, env={**os.environ, "PYTHONPATH": str(code)})


def measure(url: str, single: list[bytes], batches: list[bytes]) -> tuple[float, float, float]:
    latencies, _ = timed_requests(url, single, warmup=50)
    batch_latencies, _ = timed_requests(url, batches, warmup=5)
    rate = 256 * len(batch_latencies) / (sum(batch_latencies) / 1000)
    return percentile(latencies, 50), percentile(latencies, 99), rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", required=True, help="the revision to compare against")
    parser.add_argument("--new", help="the revision measured (default: this working tree)")
    parser.add_argument("--train", type=int, default=10_000, help="MNIST images to train on")
    parser.add_argument("--rounds", type=int, default=14)
    parser.add_argument("--requests", type=int, default=1_000, help="single-row, per round")
    parser.add_argument("--batches", type=int, default=100, help="256-row, per round")
    args = parser.parse_args()

    x, _ = load_mnist(None)
    x = x.astype(np.float32)
    test = x[60_000:]
    single = bodies_for(test, 1, args.requests + 50, "json-float")
    batches = bodies_for(test, 256, args.batches + 5, "json-int")
    work = Path(tempfile.mkdtemp(prefix="mbn-revisions-"))
    ratios: list[np.ndarray] = []
    with (
        checkout(args.old, work / "old") as old_code,
        checkout(args.new, work / "new") as new_code,
    ):
        model_dir = work / "models"
        train_with(old_code, x[: args.train], model_dir, work)
        servers = []
        try:
            for name, code in (("old", old_code), ("new", new_code)):
                settings = {"MBN_SHADOW_FRACTION": "0", "PYTHONPATH": str(code)}
                servers.append(start_server(model_dir, work / name, 1, 1, settings))
            for round_ in range(args.rounds):
                order = (0, 1) if round_ % 2 == 0 else (1, 0)
                figures: dict[int, tuple[float, float, float]] = {}
                for index in order:
                    figures[index] = measure(servers[index][1], single, batches)
                ratios.append(np.asarray(figures[1]) / np.asarray(figures[0]))
                print(f"round {round_ + 1}: old {figures[0]}, new {figures[1]}", flush=True)
        finally:
            for proc, _ in servers:
                proc.terminate()
                proc.wait(timeout=30)
    table = np.vstack(ratios)
    rows = [("old / new", f"{args.old} / {args.new or 'working tree'}")]
    for column, label in enumerate(MEASURES):
        values = table[:, column]
        rows.append(
            (
                f"new / old, {label}",
                f"{np.median(values):.3f} (range {values.min():.2f}-{values.max():.2f})",
            )
        )
    print_measures("Two revisions side by side", "bench_revisions.py", rows)


if __name__ == "__main__":
    main()
