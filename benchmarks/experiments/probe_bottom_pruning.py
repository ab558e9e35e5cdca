"""How much of the bottom layer's search exact pruning could skip, and what it would cost.

    MBN_MNIST=path/to/mnist70k.npz python benchmarks/experiments/probe_bottom_pruning.py \\
        [--rows 2000] [--k1 8000] [--clusterings 4]

For clusterings drawn as a fit draws them (half of MNIST's 784 pixels, k1 random rows as
centers), every row's nearest center is found exactly, and then each rule's *best case*
is counted: what a rule that already knew the winning distance d* would still have to score.
A real search knows less (it must first find a center near d*), so these are bounds on what
pruning can save:

- norm bound: |x - w|^2 >= (|x| - |w|)^2; centers whose bound exceeds d* are skipped;
- partial distances: the squared distance summed over the dimensions in a fixed order stops
  once it exceeds d*; the share of the products still summed;
- coarse pass: rows and centers projected on their first m principal directions (fitted on
  the centers); |x - w|^2 >= |P(x - w)|^2, so centers whose projected distance exceeds d*
  are skipped, after m / d of the full work for every pair. "coarse m, real" is what a
  search can do without knowing d*: the coarse pass's best candidate scored exactly gives
  an upper bound of d*, and every center whose projected distance is within it survives.

It also times the integer GEMM that every rule competes with (u8 x s8 products of the same
shapes through ONNX Runtime, as the fit runs them, one thread) against a per-row float32
scoring of the same number of (row, center) pairs gathered as a pruned search would gather
them, so the break-even share of surviving pairs is measured here, not assumed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_data import load_mnist

from mbn_core.mbn._integer_scores import BlockGemm, integer_centers, kernel_is_exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--k1", type=int, default=8000)
    parser.add_argument("--clusterings", type=int, default=4)
    args = parser.parse_args()
    X_all, _ = load_mnist()
    rng = np.random.default_rng(0)
    n_all, d = X_all.shape
    rows = X_all[rng.choice(n_all, args.rows, replace=False)].astype(np.float64)
    shares: dict[str, list[float]] = {
        "norm": [], "partial": [], "coarse 32": [], "coarse 64": [],
        "coarse 32, real": [], "coarse 64, real": [],
    }  # fmt: skip
    for _ in range(args.clusterings):
        features = np.sort(rng.choice(d, d // 2, replace=False))
        centers = X_all[rng.choice(n_all, args.k1, replace=False)][:, features].astype(np.float64)
        x = rows[:, features]
        distances = (
            (x**2).sum(1)[:, None] - 2 * x @ centers.T + (centers**2).sum(1)[None, :]
        ).clip(min=0)
        best = distances.min(axis=1)
        x_norm = np.sqrt((x**2).sum(1))
        w_norm = np.sqrt((centers**2).sum(1))
        bound = (x_norm[:, None] - w_norm[None, :]) ** 2
        shares["norm"].append(float((bound <= best[:, None]).mean()))
        # Partial distances in the features' order: terms summed until the sum passes d*
        # (on the first 200 rows: the running sums are rows x centers x features).
        summed = 0
        partial_rows = min(200, len(x))
        for i in range(0, partial_rows, 2):
            terms = (x[i : i + 2, None, :] - centers[None, :, :]) ** 2
            running = np.cumsum(terms, axis=2)
            over = running > best[i : i + 2, None, None]
            stop = np.where(over.any(axis=2), over.argmax(axis=2) + 1, x.shape[1])
            summed += stop.sum()
        shares["partial"].append(summed / (partial_rows * len(centers) * x.shape[1]))
        mean = centers.mean(0)
        _, _, vt = np.linalg.svd(centers - mean, full_matrices=False)
        for m in (32, 64):
            p = vt[:m]
            px, pw = (x - mean) @ p.T, (centers - mean) @ p.T
            coarse = ((px**2).sum(1)[:, None] - 2 * px @ pw.T + (pw**2).sum(1)[None, :]).clip(min=0)
            survive = (coarse <= best[:, None] * (1 + 1e-9)).mean()
            shares[f"coarse {m}"].append(float(survive + m / x.shape[1]))
            upper = distances[np.arange(len(x)), coarse.argmin(axis=1)]
            real = (coarse <= upper[:, None] * (1 + 1e-9)).mean()
            shares[f"coarse {m}, real"].append(float(real + m / x.shape[1]))
    print(f"MNIST {args.rows} rows x {args.k1} centers, {d // 2} of {d} pixels, "
          f"{args.clusterings} clusterings: work left by each rule knowing d* (share of the "
          "full scoring's products)")  # fmt: skip
    for rule, values in shares.items():
        print(
            f"  {rule:10s} {np.mean(values):.3f} (clusterings {min(values):.3f}-{max(values):.3f})"
        )
    gemm, gathered = time_kernels(X_all, args.k1, rng)
    print(f"1,000 rows x {args.k1} centers: integer GEMM {gemm * 1e3:.1f} ms; the same pairs "
          f"scored row by row (float32 GEMV, every center) {gathered * 1e3:.1f} ms: a pruned "
          f"search scoring row by row must skip all but {gemm / gathered:.3f} of the pairs "
          "to break even (before any cost of its own)")  # fmt: skip


def time_kernels(X_all: np.ndarray, k1: int, rng) -> tuple[float, float]:
    """(integer GEMM seconds, gathered per-row float32 seconds) for 1,000 rows x k1 centers."""
    n_all, d = X_all.shape
    features = np.sort(rng.choice(d, d // 2, replace=False))
    center_rows = rng.choice(n_all, k1, replace=False)
    rows = X_all[rng.choice(n_all, 1000, replace=False)][:, features]
    if not kernel_is_exact():
        return float("nan"), float("nan")
    centers = integer_centers(X_all, center_rows, features, 0, "euclidean")
    gemm = BlockGemm(centers.b, 1000, packed=True)
    gemm.rows(1000)[:] = rows
    gemm.run(1000)
    start = time.perf_counter()
    for _ in range(5):
        gemm.run(1000)
    gemm_seconds = (time.perf_counter() - start) / 5
    values = X_all[center_rows][:, features].astype(np.float32)
    x = rows.astype(np.float32)
    start = time.perf_counter()
    for i in range(len(x)):  # every center of each row, as a per-row search scores its own
        np.dot(values, x[i])
    gathered_seconds = time.perf_counter() - start
    return gemm_seconds, gathered_seconds


if __name__ == "__main__":
    main()
