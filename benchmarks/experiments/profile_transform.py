"""Where a transform's upper layers spend their time: the walk against the new-point scan.

    MBN_MNIST=path/to/mnist70k.npz python benchmarks/experiments/profile_transform.py \\
        --model-dir BUNDLE [--rows 300,1000,3000,6000] [--threads 2] [--repeats 2]

Embeds MNIST's last rows (never seen by a model trained on its first ones) with a bundle's
exact MBN, and for every upper layer and batch size times both ways of coding the batch: the
posting-list walk over every clustering (``mbn_core.mbn.upper``) and the candidate scan of new
points (``mbn_core.mbn.neighbour_scan.new_point_codes``), each the fastest of the repeats; it
checks that both give the same codes. The rule that chooses between them
(``NEW_POINTS_PER_CENTER``) was read off this table; docs/decisions/0032-training-speed.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from bench_data import load_mnist

from mbn_core.bundle import load_bundle
from mbn_core.mbn.backends.local import LocalBackend
from mbn_core.mbn.encoders import upper_encoder
from mbn_core.mbn.neighbour_scan import NEW_POINTS_PER_CENTER, new_point_codes


def fastest(run, repeats: int) -> tuple[float, np.ndarray]:
    """The fewest seconds of ``repeats`` calls of ``run``, and its result."""
    best, result = np.inf, None
    for _ in range(repeats):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="an MBN model's bundle")
    parser.add_argument("--rows", default="300,1000,3000,6000")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    model = load_bundle(args.model_dir).load_exact().estimator
    X, _ = load_mnist()
    sizes = [int(size) for size in args.rows.split(",")]
    new_rows = X[-max(sizes) :].astype(np.float32)
    print(f"{'rows':>6} {'layer':>5} {'k':>5} {'walk s':>7} {'scan s':>7}  chosen")
    for n in sizes:
        with LocalBackend(n_jobs=args.threads) as backend:
            codes = backend.bottom_codes(model.bottom_layer_, new_rows[:n])
            for index, layer in enumerate(model.upper_layers_, start=1):
                V, k = layer.centers.shape

                def walk(codes=codes, layer=layer, index=index, V=V, k=k) -> np.ndarray:
                    encode = upper_encoder(layer, codes, backend.pool)
                    return backend.map_clusterings(index, V, encode, codes.shape[0], k)

                def scan(codes=codes, layer=layer) -> np.ndarray:
                    return new_point_codes(layer, codes, backend.pool, backend.n_threads)

                walk_seconds, walked = fastest(walk, args.repeats)
                scan_seconds, scanned = fastest(scan, args.repeats)
                if not np.array_equal(walked, scanned):
                    raise SystemExit(f"layer {index}: the scan's codes differ from the walk's")
                chosen = "scan" if n <= NEW_POINTS_PER_CENTER * k else "walk"
                times = f"{walk_seconds:>7.3f} {scan_seconds:>7.3f}"
                print(f"{n:>6} {index:>5} {k:>5} {times}  {chosen}")
                codes = walked


if __name__ == "__main__":
    main()
