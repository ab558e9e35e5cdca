"""How soon a fresh install answers with its demo model: ``mbn serve`` on an empty data
directory, timed from the process's start until ``/health/ready`` answers 200 (the demo
model trained and loaded; before that readiness says the demo is still training).

    python benchmarks/bench_demo_start.py [--repeats 3]

Each repeat starts its own server on a new empty directory (SQLite, local disk) and stops
it after. Prints each repeat's seconds and the median.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_report import print_measures
from bench_server import free_port, wait_until_ready


def demo_ready_seconds(work: Path) -> float:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = work / "server.log"
    env = {**os.environ, "MBN_DATA_DIR": str(work / "data")}
    started = time.perf_counter()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mbn_core.cli", "serve", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until_ready(proc, url, log, "mbn serve", timeout=600)
        return time.perf_counter() - started
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    seconds = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            seconds.append(demo_ready_seconds(Path(tmp)))
        print(f"repeat {repeat}: demo model ready {seconds[-1]:.1f} s after start")
    median = statistics.median(seconds)
    rows = [
        (f"start to ready with the demo model, median of {args.repeats}", f"{median:.1f} s"),
        ("range", f"{min(seconds):.1f}-{max(seconds):.1f} s"),
    ]
    print_measures("mbn serve on an empty data directory", "bench_demo_start.py", rows)


if __name__ == "__main__":
    main()
