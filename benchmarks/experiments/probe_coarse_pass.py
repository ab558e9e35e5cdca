"""The bottom layer's coarse pass against the integer GEMM it replaces, clustering by clustering.

    MBN_MNIST=path/to/mnist70k.npz python benchmarks/experiments/probe_coarse_pass.py \\
        [--rows 70000] [--k1 8000] [--clusterings 2] [--dims 32] [--integer-dims 48 64 80]

For clusterings drawn as ``probe_bottom_pruning.py`` draws them (half of MNIST's 784 pixels,
k1 random rows as centers), on one thread (a fit runs clusterings side by side, one thread
each), it times ``integer_codes`` and then two coarse passes, checking every code against
the integer path's:

- ``--integer-dims``: the library's pass (``mbn_core.mbn.coarse_pass``, decision 0038) with
  that many directions: projections rounded to 8-bit levels, an integer GEMM of that depth;
- ``--dims``: the same pass with the projections kept in float32 and a float32 GEMM, the
  alternative it was measured against, built here: per block, the projected squared
  distances (lowered by a margin for float32's rounding) bound the true ones from below;
  each row's nearest in projection is scored exactly, and every center whose bound is
  within that distance.

Prints each pass's seconds (the float32 pass by step), its ratio to the integer path, and
the share of (row, center) pairs scored exactly.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_data import load_mnist

from mbn_core.mbn import _coarse_kernels, coarse_pass
from mbn_core.mbn._integer_scores import integer_centers, integer_codes, integer_rows
from mbn_core.utils.blas import limited_threads

# Rows per block of projected distances: the (block, k1) float32 products stay in cache.
BLOCK_ROWS = 128
# The lower bounds are lowered by this share of themselves and of |y_x|^2 + |y_w|^2, and by 1
# (squared distances are whole numbers): the float32 directions are orthonormal to about 1e-5
# of a distance, and float32 GEMMs of depth m and the norms' sums err by a few units in the
# last place of those terms, far below either share.
ROUNDING_MARGIN = 1e-4


@njit(nogil=True, cache=False)
def first_limits(x_rows, w_rows, nearest, row_terms, limits, best, best_at):
    """Each row's exact squared distance to its projected-nearest center, and from it the
    limit its centers' shifted bounds must not pass to be scored exactly."""
    for i in range(x_rows.shape[0]):
        distance = _coarse_kernels.squared_distance(x_rows[i], w_rows[nearest[i]])
        best[i] = distance
        best_at[i] = nearest[i]
        limits[i] = np.float32(distance) - row_terms[i]


# Centers tested for a candidate at once: a vector's worth of bounds, whose any-test
# vectorises; the few chunks holding a candidate are then read center by center.
CHUNK = 16


@njit(nogil=True, cache=False)
def score_candidates(shifted, limits, x_rows, w_rows, best, best_at):
    """The exact nearest of each row among the centers whose shifted bound is within its
    limit (lowest index on ties); returns how many were scored."""
    n_rows, k = shifted.shape
    scored = 0
    for i in range(n_rows):
        row = shifted[i]
        limit = limits[i]
        for base in range(0, k, CHUNK):
            stop = min(base + CHUNK, k)
            hits = 0
            if stop - base == CHUNK:
                for j in range(base, base + CHUNK):
                    hits |= row[j] <= limit
            else:
                hits = 1
            if hits == 0:
                continue
            for j in range(base, stop):
                if row[j] <= limit:
                    scored += 1
                    distance = _coarse_kernels.squared_distance(x_rows[i], w_rows[j])
                    if distance < best[i] or (distance == best[i] and j < best_at[i]):
                        best[i] = distance
                        best_at[i] = j
    return scored


def float_coarse_codes(
    x: np.ndarray, w: np.ndarray, m: int
) -> tuple[np.ndarray, dict[str, float], float]:
    """(codes, seconds by step, share of pairs scored exactly) for uint8 rows ``x`` and
    centers ``w`` on the clustering's chosen pixels.

    The bound of row i and center j, lowered by the rounding margin ``e``, is
    ``(1 - 2e) |y_j|^2 - 2 (1 - e) y_i.y_j + (1 - 2e) |y_i|^2 - 1``: one GEMM of depth m + 1
    gives every term but the row's, ``shifted[i, j]``, and center j is scored exactly where
    ``shifted[i, j] <= d_ub(i) - row_term(i)``.
    """
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    w64 = w.astype(np.float64)
    mean = w64.mean(axis=0)
    centered = w64 - mean
    _, vectors = np.linalg.eigh(centered.T @ centered)
    directions = np.ascontiguousarray(vectors[:, ::-1][:, :m], dtype=np.float32)
    seconds["directions"] = time.perf_counter() - start
    start = time.perf_counter()
    # Shifted by the whole-number mean: x - shift is exact in float32.
    shift = np.round(mean).astype(np.float32)
    y = np.empty((len(x), m + 1), dtype=np.float32)
    for first in range(0, len(x), 4096):
        part = x[first : first + 4096].astype(np.float32) - shift
        y[first : first + 4096, :m] = part @ directions
    y[:, m] = 1.0
    y_w = (w.astype(np.float32) - shift) @ directions
    margin = ROUNDING_MARGIN
    y_norms = np.einsum("ij,ij->i", y[:, :m], y[:, :m])
    row_terms = ((1 - 2 * margin) * y_norms - 1).astype(np.float32)
    w_side = np.empty((m + 1, len(w)), dtype=np.float32)
    w_side[:m] = -2 * (1 - margin) * y_w.T
    w_side[m] = (1 - 2 * margin) * np.einsum("ij,ij->i", y_w, y_w)
    seconds["projection"] = time.perf_counter() - start
    codes = np.empty(len(x), dtype=np.int32)
    best = np.empty(BLOCK_ROWS, dtype=np.int32)
    limits = np.empty(BLOCK_ROWS, dtype=np.float32)
    products = np.empty((BLOCK_ROWS, len(w)), dtype=np.float32)
    scored = 0
    for name in ("coarse GEMM", "nearest", "candidates"):
        seconds[name] = 0.0
    for first in range(0, len(x), BLOCK_ROWS):
        last = min(first + BLOCK_ROWS, len(x))
        n = last - first
        block = products[:n]
        start = time.perf_counter()
        np.matmul(y[first:last], w_side, out=block)
        middle = time.perf_counter()
        seconds["coarse GEMM"] += middle - start
        nearest = block.argmin(axis=1)
        first_limits(x[first:last], w, nearest, row_terms[first:last], limits[:n], best[:n],
                     codes[first:last])  # fmt: skip
        start = time.perf_counter()
        seconds["nearest"] += start - middle
        scored += n + score_candidates(block, limits[:n], x[first:last], w, best[:n],
                                       codes[first:last])  # fmt: skip
        seconds["candidates"] += time.perf_counter() - start
    return codes, seconds, scored / (len(x) * len(w))


def integer_pass(rows, features, centers, m: int) -> tuple[np.ndarray, float]:
    """(codes, share of pairs scored exactly) of the library's pass with m directions."""
    scored = []
    kernel = _coarse_kernels.nearest_within_reach

    def counted(*args):
        scored.append(kernel(*args))
        return scored[-1]

    saved = coarse_pass.DIMENSIONS
    coarse_pass.DIMENSIONS = m
    _coarse_kernels.nearest_within_reach = counted
    try:
        codes = coarse_pass.coarse_codes(rows, features, centers)
    finally:
        coarse_pass.DIMENSIONS = saved
        _coarse_kernels.nearest_within_reach = kernel
    assert codes is not None
    return codes, sum(scored) / (rows.shape[0] * centers.b.shape[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=70000)
    parser.add_argument("--k1", type=int, default=8000)
    parser.add_argument("--clusterings", type=int, default=2)
    parser.add_argument("--dims", type=int, nargs="*", default=[32])
    parser.add_argument("--integer-dims", type=int, nargs="*", default=[48, 64, 80])
    args = parser.parse_args()
    X_all, _ = load_mnist()
    X = np.ascontiguousarray(X_all[: args.rows])
    rng = np.random.default_rng(0)
    n, d = X.shape
    rows = integer_rows(X, X)
    if rows is None:
        raise SystemExit("no exact integer kernel on this machine, or the rows are not uint8")
    with limited_threads(1):
        # Compile and load first, on a small problem.
        small = np.ascontiguousarray(rows.shifted[:300, :50])
        float_coarse_codes(small, small[:40], 4)
        warm = integer_centers(X, np.arange(40), np.arange(300), rows.low, "euclidean")
        integer_pass(rows, np.arange(300), warm, 8)
        print(f"MNIST {n} rows x {args.k1} centers, {d // 2} of {d} pixels, one thread; "
              "seconds per clustering")  # fmt: skip
        for clustering in range(args.clusterings):
            features = np.sort(rng.choice(d, d // 2, replace=False))
            center_rows = rng.choice(n, args.k1, replace=False)
            start = time.perf_counter()
            centers = integer_centers(X, center_rows, features, rows.low, "euclidean")
            reference = integer_codes(rows, features, centers)
            gemm_seconds = time.perf_counter() - start
            print(f"  clustering {clustering}: integer GEMM path {gemm_seconds:.2f} s")
            x = np.ascontiguousarray(rows.shifted[:, features])
            w = np.ascontiguousarray(rows.shifted[center_rows][:, features])
            for m in args.dims:
                start = time.perf_counter()
                codes, seconds, share = float_coarse_codes(x, w, m)
                total = time.perf_counter() - start
                steps = ", ".join(f"{name} {value:.2f}" for name, value in seconds.items())
                _report("float32", m, total, gemm_seconds, share, codes, reference, steps)
            for m in args.integer_dims:
                start = time.perf_counter()
                codes, share = integer_pass(rows, features, centers, m)
                total = time.perf_counter() - start
                _report("int8 (the library's)", m, total, gemm_seconds, share, codes, reference)


def _report(kind, m, total, gemm_seconds, share, codes, reference, steps="") -> None:
    same = np.array_equal(codes, reference)
    detail = f"; {steps}" if steps else ""
    print(f"    {kind} coarse m={m}: {total:.2f} s ({total / gemm_seconds:.2f}x{detail}); "
          f"scored exactly {share:.4f} of pairs; codes identical: {same}")  # fmt: skip


if __name__ == "__main__":
    main()
