"""Quality, speed and scale of mbn_core.MBN (issue 2). Prints markdown tables.

    python benchmarks/bench_mbn.py quality [--datasets mnist5k digits wine] [--seeds N]
    python benchmarks/bench_mbn.py speed [--repeats N]
    python benchmarks/bench_mbn.py scale [--sizes 5000 20000 70000] [--k-max 8000]

Quality follows the papers' protocol (Table 7 of mbn-compressive): embedding dimension = number
of classes, k-means run 50 times keeping the lowest inertia, NMI against the labels; mean and
standard deviation over seeds (MNIST: over 5,000-image subsets with 500 images per digit).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
from bench_data import load_mnist
from sklearn.cluster import KMeans
from sklearn.datasets import load_digits, load_wine
from sklearn.decomposition import PCA
from sklearn.metrics import normalized_mutual_info_score
from threadpoolctl import threadpool_limits

from mbn_core import MBN


def mnist_subset(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """5,000 images, 500 per digit, as in the paper's MNIST (small) subsets."""
    X, y = load_mnist()
    rng = np.random.default_rng(seed)
    rows = np.concatenate(
        [rng.choice(np.flatnonzero(y == d), 500, replace=False) for d in range(10)]
    )
    return X[rows], y[rows]


def kmeans_nmi(Z: np.ndarray, y: np.ndarray, seed: int) -> float:
    n_classes = len(np.unique(y))
    labels = KMeans(n_classes, n_init=50, random_state=seed).fit_predict(Z)
    return float(normalized_mutual_info_score(y, labels))


def embed_mbn(X, y, seed, **params):
    c = len(np.unique(y))
    return MBN(n_components=c, n_classes=c, random_state=seed, **params).fit_transform(X)


def embed_raw(X, y, seed):
    return np.asarray(X, dtype=np.float64)


def embed_pca(X, y, seed):
    # The papers' PCA + k-means keeps the components holding 98% of the variance.
    return PCA(n_components=0.98, svd_solver="full").fit_transform(np.asarray(X, dtype=np.float64))


def embed_umap(X, y, seed):
    import umap  # optional benchmark extra: pip install -e ".[bench]"

    c = len(np.unique(y))
    return umap.UMAP(n_components=c, random_state=seed).fit_transform(np.asarray(X, np.float32))


METHODS: dict[str, Callable] = {
    "MBN": embed_mbn,
    "k-means on raw": embed_raw,
    "PCA + k-means": embed_pca,
    "UMAP + k-means": embed_umap,
}


def datasets(names, n_seeds):
    for name in names:
        if name == "mnist5k":
            yield name, [(seed, *mnist_subset(seed)) for seed in range(n_seeds)]
        elif name == "digits":
            X, y = load_digits(return_X_y=True)
            yield name, [(seed, X, y) for seed in range(n_seeds)]
        elif name == "wine":
            X, y = load_wine(return_X_y=True)
            yield name, [(seed, X, y) for seed in range(n_seeds)]
        else:
            raise SystemExit(f"unknown dataset {name!r}")


def quality(args) -> None:
    print(f"| data | n | {' | '.join(METHODS)} |")
    print(f"|---|---|{'---|' * len(METHODS)}")
    for name, runs in datasets(args.datasets, args.seeds):
        cells = []
        for embed in METHODS.values():
            scores, seconds = [], []
            for seed, X, y in runs:
                start = time.perf_counter()
                try:
                    Z = embed(X, y, seed)
                except ImportError:
                    break
                seconds.append(time.perf_counter() - start)
                scores.append(kmeans_nmi(Z, y, seed))
            if scores:
                cells.append(
                    f"{np.mean(scores):.4f} ± {np.std(scores):.4f} ({np.mean(seconds):.1f} s)"
                )
            else:
                cells.append("not installed")
        print(
            f"| {name} ({len(runs)} runs) | {len(runs[0][1])} | {' | '.join(cells)} |", flush=True
        )


def bare_bottom_gemms(n: int, d_chosen: int, k: int, V: int) -> float:
    """Seconds for V float32 products of the bottom layer's shapes, default BLAS threads."""
    rng = np.random.default_rng(0)
    A = rng.random((n, d_chosen + 1), dtype=np.float32)
    B = rng.random((d_chosen + 1, k), dtype=np.float32)
    A @ B
    start = time.perf_counter()
    for _ in range(V):
        A @ B
    return time.perf_counter() - start


def speed(args) -> None:
    X, _ = mnist_subset(0)
    model = MBN(random_state=0)
    ks = model.layer_sizes(len(X))
    d_chosen = model._n_bottom_features(X.shape[1])
    rows = []
    for repeat in range(args.repeats):
        gemm = bare_bottom_gemms(len(X), d_chosen, ks[0], model.n_clusterings)
        ends: dict[int, float] = {}

        def callback(layer, done, total, ends=ends):
            ends[layer] = time.perf_counter()

        start = time.perf_counter()
        MBN(random_state=repeat, callback=callback).fit(X)
        fit = time.perf_counter() - start
        bottom = ends[0] - start
        upper = ends[len(ks) - 1] - ends[0]
        rows.append((gemm, fit, bottom, upper))
        print(
            f"repeat {repeat}: bare GEMMs {gemm:.1f} s, fit {fit:.1f} s "
            f"(bottom {bottom:.1f} s, upper {upper:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
    runs = np.array(rows)
    gemm, fit, bottom, upper = runs.T
    # Ratios within each run (same machine state), then their median: the machine is shared.
    print(f"MNIST 5,000 x 784, defaults (ks={ks}, V=400, a=0.5), {args.repeats} runs")
    print()
    print("| run | bare GEMMs | fit | fit / GEMMs | bottom / GEMMs | upper / bottom |")
    print("|---|---|---|---|---|---|")
    for i, (g, f, b, u) in enumerate(runs):
        print(f"| {i} | {g:.1f} s | {f:.1f} s | {f / g:.2f} | {b / g:.2f} | {u / b:.0%} |")
    print(
        f"| **median** | {np.median(gemm):.1f} s | {np.median(fit):.1f} s | "
        f"**{np.median(fit / gemm):.2f}** (target <= 1.5) | {np.median(bottom / gemm):.2f} | "
        f"**{np.median(upper / bottom):.0%}** (target <= 25%) |"
    )
    print()
    print(f"PCA and projection: {np.median(fit - bottom - upper):.1f} s (median)")


def scale_one(n: int, k_max: int) -> dict:
    X, y = load_mnist()
    X, y = X[:n], y[:n]
    model = MBN(k_max=k_max, random_state=0)
    start = time.perf_counter()
    Z = model.fit_transform(X)
    fit = time.perf_counter() - start
    return {
        "n": n,
        "ks": model.ks_,
        "fit_s": fit,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "model_mb": model.nbytes / 1e6,
        "nmi": kmeans_nmi(Z, y, 0),
    }


def scale(args) -> None:
    print(f"MNIST first n images, defaults with k_max={args.k_max}, V=400, one process per size")
    print()
    print("| n | ks | fit | peak RSS | model size | NMI (k-means, 10 clusters) |")
    print("|---|---|---|---|---|---|")
    for n in args.sizes:
        out = subprocess.run(
            [sys.executable, __file__, "scale-one", str(n), str(args.k_max)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"| {r['n']:,} | {'-'.join(map(str, r['ks']))} | {r['fit_s']:.0f} s | "
            f"{r['peak_rss_mb']:.0f} MB | {r['model_mb']:.0f} MB | {r['nmi']:.4f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--datasets", nargs="+", default=["mnist5k", "digits", "wine"])
    q.add_argument("--seeds", type=int, default=5)
    s = sub.add_parser("speed")
    s.add_argument("--repeats", type=int, default=3)
    c = sub.add_parser("scale")
    c.add_argument("--sizes", nargs="+", type=int, default=[5000, 20000, 70000])
    c.add_argument("--k-max", type=int, default=8000)
    one = sub.add_parser("scale-one")
    one.add_argument("n", type=int)
    one.add_argument("k_max", type=int)
    args = parser.parse_args()
    if args.command == "quality":
        quality(args)
    elif args.command == "speed":
        speed(args)
    elif args.command == "scale":
        scale(args)
    else:
        with threadpool_limits(limits=None):
            print(json.dumps(scale_one(args.n, args.k_max)))


if __name__ == "__main__":
    main()
