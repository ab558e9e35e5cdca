"""A training job's progress fraction against the clock. Prints a markdown table.

    python benchmarks/experiments/bench_job_progress.py [--datasets swiss-roll digits]

Each set is trained with ``train_bundle`` and ``mbn train``'s defaults (``TrainingParams``
with ``n_classes`` = its number of classes, so small sets get the cross-fitted report), in
this process, one after the other. From the job's events (what the service's job progress
and ``mbn train``'s bars show): the job's seconds, the largest lead and lag of the reported
fraction against the share of the job's time gone, and the longest stretch without a report
with the fraction the bar stood at meanwhile.

Decision record: docs/decisions/0024-training-progress.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared harness

from harness import quality_data

from mbn_core.pipeline.training import TrainingParams, train_bundle


def job_progress(name: str) -> dict:
    X, y = quality_data(name, 0)
    params = TrainingParams.from_dict({"n_classes": len(np.unique(y))})
    stamps: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        train_bundle(
            X, Path(scratch) / "m", name=name, params=params,
            events=lambda event: stamps.append((time.perf_counter() - start, event.fraction)),
        )  # fmt: skip
        seconds = time.perf_counter() - start
    times = np.array([0.0, *(t for t, _ in stamps)])
    fractions = np.array([0.0, *(f for _, f in stamps)])
    gaps = fractions - times / seconds
    silence = int(np.argmax(np.diff(times)))
    return {
        "seconds": seconds,
        "ahead": float(gaps.max()),
        "behind": float(-gaps.min()),
        "silence": float(times[silence + 1] - times[silence]),
        "silent_at": float(fractions[silence]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--datasets", nargs="+", default=["swiss-roll", "digits"])
    args = parser.parse_args()
    print("| data | job | bar ahead / behind the clock | longest silence (bar at) |")
    print("|---|---|---|---|")
    for name in args.datasets:
        r = job_progress(name)
        print(
            f"| {name} | {r['seconds']:.1f} s | {r['ahead']:.2f} / {r['behind']:.2f} | "
            f"{r['silence']:.1f} s ({r['silent_at']:.2f}) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
