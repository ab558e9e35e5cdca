"""The first requests after ``/health/ready`` says 200, against a real ``mbn serve``.

A new user met a ready replica whose first fast request took seconds and whose first exact
one took longer still: the model's first run and the exact model's read were paid by them.
For each run a fresh server (one uvicorn process, a small digits model, no training worker)
is started and, once ready:

- ``--when ready``: one fast and one exact request at once, as a client that trusts the
  readiness probe sends them;
- ``--when exact-loaded``: the same once ``/health/ready`` says ``default_exact_loaded``
  (the time from ready to it is reported too).

Each request's wall time is reported, the median over the runs. ``--source`` runs another
checkout's code (e.g. a commit before the warm-up) with the same model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from bench_bounded_json import write_model
from bench_server import start_serve, wait_until_ready


def one_run(source: Path, data_dir: Path, models: Path, when: str, run: int) -> dict[str, float]:
    log = data_dir / f"run{run}.log"
    proc, url = start_serve(
        source,
        {
            "MBN_DATA_DIR": str(data_dir / f"run{run}"),
            "MBN_MODEL_DIR": str(models),
            "MBN_DEMO_MODEL": "false",
            "MBN_EMBEDDED_WORKER": "false",
        },
        log,
    )
    figures: dict[str, float] = {}
    try:
        wait_until_ready(proc, url, log, f"run {run}", timeout=300)
        with httpx.Client(base_url=url, timeout=300) as client:
            if when == "exact-loaded":
                started = time.perf_counter()
                while not client.get("/health/ready").json()["checks"].get("default_exact_loaded"):
                    if time.perf_counter() - started > 300:
                        sys.exit("the default's exact model was not loaded within 300 s")
                    time.sleep(0.1)
                figures["ready_to_exact_loaded_s"] = time.perf_counter() - started
            row = [[0.5] * 64]
            for mode in ("fast", "exact"):
                started = time.perf_counter()
                answer = client.post("/embed", json={"inputs": row, "mode": mode})
                figures[f"first_{mode}_s"] = time.perf_counter() - started
                assert answer.status_code == 200, answer.text
    finally:
        proc.terminate()
        proc.wait(60)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--when", choices=["ready", "exact-loaded"], default="ready")
    parser.add_argument("--source", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        write_model(data_dir / "models")
        runs = [
            one_run(args.source.resolve(), data_dir, data_dir / "models", args.when, run)
            for run in range(args.runs)
        ]
    print(f"{args.runs} runs, requests sent when {args.when}; median (min-max):")
    for key in runs[0]:
        values = [run[key] for run in runs]
        spread = f"{min(values):.3f}-{max(values):.3f}"
        print(f"  {key:<26} {statistics.median(values):7.3f} s ({spread})")


if __name__ == "__main__":
    main()
