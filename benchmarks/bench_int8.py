"""The whole MBN fit on uint8 images against the bare float32 GEMMs of its bottom layer.

On MNIST-5k as raw uint8 pixels (the paper's subset: 500 images per digit), one run measures
side by side, on the same threads:

- ``gemm``: the bottom layer's float32 GEMMs alone, (n x (a*d + 1)) by ((a*d + 1) x k1) once
  per clustering, run as the fit runs them (one BLAS thread per worker thread);
- ``fit``: the whole default fit (``MBN(n_clusterings=400)``), whose bottom layer scores the
  uint8 pixels in integer arithmetic (``mbn_core.mbn._integer_scores``);
- ``fit (float path)``: the same fit with the integer path switched off, for reference.

It prints the medians of ``--repeats`` runs and the median of each run's ratio to its own
``gemm``, and checks that both fits give the same embedding bit for bit.

    MBN_MNIST=/path/to/mnist70k.npz python benchmarks/bench_int8.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from bench_data import load_mnist
from threadpoolctl import threadpool_limits

from mbn_core import MBN
from mbn_core.mbn import bottom


def mnist_5k(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    X, y = load_mnist()
    rng = np.random.default_rng(seed)
    rows = np.concatenate(
        [rng.choice(np.flatnonzero(y == d), 500, replace=False) for d in range(10)]
    )
    return X[rows], y[rows]


def bare_gemms(X: np.ndarray, n_clusterings: int, k: int, threads: int, seed: int) -> float:
    """Seconds for the bottom layer's float32 GEMMs alone (operands built beforehand: eight
    distinct clusterings, cycled)."""
    rng = np.random.default_rng(seed)
    n, d = X.shape
    n_chosen = round(0.5 * d)
    operands = []
    for _ in range(8):
        features = rng.choice(d, n_chosen, replace=False)
        A = np.ones((n, n_chosen + 1), dtype=np.float32)
        A[:, :n_chosen] = X[:, features]
        W = np.asarray(A[rng.choice(n, k, replace=False)].T, dtype=np.float32, order="C")
        operands.append((A, W, np.empty((n, k), dtype=np.float32)))
    outputs = [np.empty((n, k), dtype=np.float32) for _ in range(threads)]

    def gemm(v: int) -> None:
        A, W, _ = operands[v % len(operands)]
        np.matmul(A, W, out=outputs[v % threads])

    with threadpool_limits(limits=1, user_api="blas"), ThreadPoolExecutor(threads) as pool:
        start = time.perf_counter()
        list(pool.map(gemm, range(n_clusterings)))
        return time.perf_counter() - start


def timed_fit(X: np.ndarray, params: dict, integer: bool) -> tuple[float, np.ndarray]:
    original = bottom.integer_rows
    if not integer:
        bottom.integer_rows = lambda *args: None
    try:
        start = time.perf_counter()
        embedding = MBN(**params).fit_transform(X)
        return time.perf_counter() - start, embedding
    finally:
        bottom.integer_rows = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clusterings", type=int, default=400)
    parser.add_argument("--threads", type=int, default=None, help="default: every core")
    parser.add_argument("--no-float", action="store_true", help="skip the float-path fit")
    args = parser.parse_args()
    threads = args.threads or len(os.sched_getaffinity(0))
    X, _ = mnist_5k()
    params = {"n_clusterings": args.clusterings, "random_state": 0, "n_jobs": threads}
    k = MBN(**params).layer_sizes(len(X))[0]
    timed_fit(X[:300], {**params, "n_clusterings": 4}, True)  # compile the kernels first
    gemm, fit, fit_float = [], [], []
    identical = True
    for repeat in range(args.repeats):
        gemm.append(bare_gemms(X, args.clusterings, k, threads, repeat))
        seconds, embedding = timed_fit(X, params, True)
        fit.append(seconds)
        if not args.no_float:
            seconds, reference = timed_fit(X, params, False)
            fit_float.append(seconds)
            identical &= bool(np.array_equal(embedding, reference))
        print(
            f"repeat {repeat}: gemm {gemm[-1]:.2f} s, fit {fit[-1]:.2f} s"
            + (f", fit (float path) {fit_float[-1]:.2f} s" if fit_float else ""),
            flush=True,
        )
    g = statistics.median(gemm)
    print(f"MNIST-5k uint8, V={args.clusterings}, k1={k}, {threads} threads, {args.repeats} runs")
    print(f"bare fp32 GEMMs of the bottom layer: {g:.2f} s (median)")
    # Each run's ratio is taken within the run, so a slow spell of the shared machine moves
    # both of its terms; the median of those ratios is the figure.
    print(f"whole fit, integer bottom layer:     {statistics.median(fit):.2f} s; "
          f"{_ratio(fit, gemm)} the GEMMs")  # fmt: skip
    if fit_float:
        print(f"whole fit, float path:               {statistics.median(fit_float):.2f} s; "
              f"{_ratio(fit_float, gemm)} the GEMMs")  # fmt: skip
        print(f"embeddings identical: {identical}")


def _ratio(seconds: list[float], gemm: list[float]) -> str:
    """The median of per-run ratios and their range, as text."""
    ratios = [s / g for s, g in zip(seconds, gemm, strict=True)]
    return f"{statistics.median(ratios):.2f}x (runs {min(ratios):.2f}-{max(ratios):.2f}x)"


if __name__ == "__main__":
    main()
