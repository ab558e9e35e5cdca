"""The whole training job, not only the fit: ``mbn train`` with its defaults, timed by step.

    python benchmarks/bench_train_job.py [--data digits | mnist-60k] [--rows N] [--repeats 3]
        [--n-jobs N] [--option KEY=JSON ...] [--cli]

Trains a bundle from the data with ``mbn train``'s defaults (``train_bundle``, as the command
and the service's worker do) and reports the median of the repeats for each step: the
teacher's fit, the MLP, the cross-fitted (or held-out) report, the wait for the 2-D map (and
its layout's own time, spent beside the report), the rest of the export, and the job's total;
the report and the map as multiples of the teacher's fit (same run, so they hold on a shared
machine). ``--cli`` also times the ``mbn train`` command itself,
process start and imports included. MNIST reads ``MBN_MNIST`` (bench_data.load_mnist).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
from bench_report import add_training_option, print_measures
from sklearn.datasets import load_digits

from mbn_core.pipeline.training import train_bundle


def load(name: str) -> tuple[np.ndarray, np.ndarray]:
    if name == "digits":
        digits = load_digits()
        return digits.data.astype(np.float32), digits.target
    from bench_data import load_mnist

    X, y = load_mnist()
    return X[:60_000], y[:60_000]


def timed_job(X, y, params: dict, out: Path) -> dict[str, float]:
    """Seconds of each step of one ``train_bundle`` job, as its manifest records them (the
    teacher's fit, the MLP's, the head and report, the map), the rest of it and the total."""
    started, cpu = time.perf_counter(), time.process_time()
    path = train_bundle(X, out, name="bench", params=params, y=y, overwrite=True)
    total, cpu = time.perf_counter() - started, time.process_time() - cpu
    manifest = json.loads((path / "manifest.json").read_text())
    recorded = manifest["training"]["seconds"]
    seconds = {
        "teacher": float(recorded["teacher"]),
        "mlp": float(recorded["compressor"]),
        "report": float(recorded["evaluation"]),
    }
    mapped = manifest.get("map", {})
    # What the job waited for the map (its layout runs beside the report where it can);
    # the layout's own time is told apart, it is not part of the sum.
    seconds["map wait"] = float(mapped.get("waited_seconds", mapped.get("seconds", 0.0)))
    seconds["rest"] = total - sum(seconds.values())
    seconds["map layout"] = float(mapped.get("seconds", 0.0))
    seconds["total"] = total
    seconds["cpu"] = cpu
    return seconds


def cli_seconds(data: Path, out: Path, params: dict) -> float:
    options = [f"--{key.replace('_', '-')}={value}" for key, value in params.items()]
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "mbn_core.cli", "train", str(data), "--out", str(out), "--force",
         "--quiet", *options],
        check=True,
    )  # fmt: skip
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("digits", "mnist-60k"), default="digits")
    parser.add_argument("--rows", type=int, default=None, help="the first N rows only")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-jobs", type=int, default=None, help="default: mbn train's")
    parser.add_argument("--cli", action="store_true", help="also time the mbn train command")
    add_training_option(parser, "map_points=2000")
    args = parser.parse_args()
    X, y = load(args.data)
    if args.rows is not None:
        X, y = X[: args.rows], y[: args.rows]
    params = dict(args.option)
    if args.n_jobs is not None:
        params["n_jobs"] = args.n_jobs
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        train_bundle(X[:300], Path(tmp) / "warm", name="warm", params={**params, "map_points": 0})
        data = Path(tmp) / "data.npz"
        np.savez(data, x=X, y=y)
        for repeat in range(args.repeats):
            seconds = timed_job(X, y, params, Path(tmp) / "model")
            if args.cli:
                seconds["cli"] = cli_seconds(data, Path(tmp) / "cli-model", params)
            print(f"repeat {repeat}: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
            for key, value in seconds.items():
                runs.setdefault(key, []).append(value)
    median = {key: statistics.median(values) for key, values in runs.items()}
    fit = median["teacher"]
    rows = [(f"{key} (median of {args.repeats}), s", f"{v:.2f}") for key, v in median.items()]
    rows += [
        ("report / fit", f"{median['report'] / fit:.2f}x"),
        ("map wait / fit", f"{median['map wait'] / fit:.2f}x"),
        ("whole job / fit", f"{median['total'] / fit:.2f}x"),
        ("whole job / (teacher + MLP)", f"{median['total'] / (fit + median['mlp']):.2f}x"),
    ]
    title = f"mbn train on {args.data} ({X.shape[0]} x {X.shape[1]})"
    print_measures(title, "bench_train_job.py", rows)


if __name__ == "__main__":
    main()
