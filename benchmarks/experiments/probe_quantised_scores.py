"""Would int8-quantised bottom-layer scores plus an exact re-rank pay on float data?

For one clustering of the bottom layer (k centers drawn from the rows, every feature), the
float scores ``2 x.w - |w|^2`` are compared with int8 ones: each feature scaled to [-127, 127]
over the rows (the scale folded into the centers), the centers quantised with one scale,
integer dot products. A row keeps the quantised arg-max only when the gap between its best
and runner-up quantised scores exceeds the worst-case quantisation error of both
(``2 * (0.5 * s_w * sum|x~| + 0.5 * sum|w~| + 0.25 * s_w * d)`` per score); every other row
must be re-ranked in float64, as the float path re-ranks near ties. The probe prints, per
data set and k, the share of rows to re-rank and whether the quantised arg-max was right on
the rows it kept (it must be: the bound is worst-case).

    MBN_MNIST=path/to/mnist70k.npz python benchmarks/experiments/probe_quantised_scores.py

Decision: docs/decisions/0023-gpu-backend-and-integer-bottom.md ("Not adopted").
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_breast_cancer, make_blobs
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def data_sets() -> dict[str, np.ndarray]:
    sets = {
        "breast cancer, standardised (569 x 30)": StandardScaler().fit_transform(
            load_breast_cancer().data
        ),
        "blobs, 20 features (5,000 x 20)": make_blobs(5000, 20, centers=10, random_state=0)[0],
    }
    if os.environ.get("MBN_MNIST"):
        from bench_data import load_mnist

        X, _ = load_mnist()
        sample = X[np.random.default_rng(0).choice(len(X), 10_000, replace=False)]
        sets["MNIST PCA-50, floats (10,000 x 50)"] = PCA(50, random_state=0).fit_transform(
            sample.astype(np.float64)
        )
    return sets


def probe(X: np.ndarray, k: int, rng: np.random.Generator) -> tuple[float, bool]:
    """(share of rows needing the exact re-rank, whether every kept arg-max was right)."""
    W = X[rng.choice(len(X), k, replace=False)]
    exact = 2 * X @ W.T - np.sum(W * W, axis=1)
    feature_scale = np.maximum(np.abs(X).max(axis=0), 1e-300) / 127
    x_t = X / feature_scale  # in [-127, 127]
    w_t = W * feature_scale
    w_scale = np.abs(w_t).max() / 127
    x_q = np.rint(x_t)
    w_q = np.rint(w_t / w_scale)
    dots = (x_q @ w_q.T) * w_scale  # the integer GEMM, rescaled
    quantised = 2 * dots - np.sum(W * W, axis=1)
    d = X.shape[1]
    bound = 0.5 * w_scale * np.abs(x_t).sum(axis=1)[:, None] + (
        0.5 * np.abs(w_t).sum(axis=1)[None, :] + 0.25 * w_scale * d
    )
    order = np.argsort(-quantised, axis=1)[:, :2]
    rows = np.arange(len(X))
    best, second = order[:, 0], order[:, 1]
    gap = quantised[rows, best] - quantised[rows, second]
    # A rival beats the best only if their quantised scores' errors can close the gap.
    slack = 2 * (bound[rows, best] + bound.max(axis=1))
    rerank = gap <= slack
    kept_right = bool(np.all(np.argmax(exact, axis=1)[~rerank] == best[~rerank]))
    return float(np.mean(rerank)), kept_right


def main() -> None:
    rng = np.random.default_rng(0)
    print("| data | k | rows to re-rank | kept arg-max right |")
    print("|---|---|---|---|")
    for name, X in data_sets().items():
        for k in (16, 256, 2500):
            if k >= len(X):
                continue
            share, right = probe(np.asarray(X, dtype=np.float64), k, rng)
            print(f"| {name} | {k} | {share:.1%} | {right} |")


if __name__ == "__main__":
    main()
