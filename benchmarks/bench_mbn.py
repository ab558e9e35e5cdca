"""Quality, speed and scale of mbn_core.MBN: the benchmarks behind docs/BENCHMARKS.md.

    python benchmarks/bench_mbn.py quality [--datasets digits iris ...] [--methods ...] [--seeds N]
    python benchmarks/bench_mbn.py paper [--datasets mnist5k digits wine] [--seeds N]
    python benchmarks/bench_mbn.py heldout [--datasets moons ...] [--seeds 3] [--methods ...]
    python benchmarks/bench_mbn.py speed [--repeats N]
    python benchmarks/bench_mbn.py scale [--sizes 5000 ...] [--k-max N] [--metric cosine] [--seed 0]
        [--output umap] [--new-rows N]

``quality`` compares MBN with UMAP and PCA on small, low-dimensional and tabular data and MNIST:
every method embeds into c dimensions (c = number of classes), k-means with c clusters keeps the
lowest inertia of 20 runs, NMI against the labels, mean and standard deviation over seeds (the
methods' random_state; MNIST: a 5,000-image subset per seed). Beside the NMI, the label-free
report every model carries: trustworthiness and continuity (k = 10) of the embedding against
the input, on up to 1,000 of its rows. ``--methods`` also takes the variants the decision
records measured (``harness.MBN_VARIANTS``), and ``--datasets`` the validation sets
(``harness.VALIDATION_DATA``).

``heldout`` measures what a user of the service gets: each method is fitted on a random 80% of
the rows, k-means with c clusters (lowest inertia of 20 runs) on that embedding, and the
held-out 20% are embedded by ``transform`` and assigned to the nearest centroid; NMI on the
held-out rows only, with their trustworthiness / continuity (k = 10).

``paper`` follows the papers' protocol (Table 7 of mbn-compressive): k-means run 50 times
keeping the lowest inertia, PCA keeping 98% of the variance.

``speed`` times a fit of MNIST-5k against the bare float32 GEMMs of its bottom layer, and the
upper layers against the bottom one. ``scale`` fits the first n MNIST images (each size in its
own process, for its peak RSS) and reports the fit, the model's size and the NMI; with
``--new-rows`` also the NMI of MNIST's last rows (other writers) embedded by ``transform``.

The probes that decided MBN's "auto" rules (``restarts``, ``affinities``, ``cells``,
``orphans``, ``features``, ``outputs``, ``progress``) are in ``experiments/mbn_probes.py``.
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
from harness import (
    MBN_MODELS,
    QUALITY_DATA,
    QUALITY_DEFAULT_METHODS,
    QUALITY_METHODS,
    SeedScores,
    kmeans_nmi,
    mnist_subset,
    quality_data,
    split_rows,
)
from sklearn.cluster import KMeans
from sklearn.datasets import load_digits, load_wine
from sklearn.decomposition import PCA
from sklearn.metrics import normalized_mutual_info_score
from threadpoolctl import threadpool_limits

from mbn_core import MBN
from mbn_core.mbn.estimator import METRICS, OUTPUTS


def embed_mbn(X, y, seed, **params):
    c = len(np.unique(y))
    params = {"output": "pca", **params}  # the papers' output
    return MBN(n_components=c, n_classes=c, random_state=seed, **params).fit_transform(X)


def embed_raw(X, y, seed):
    return np.asarray(X, dtype=np.float64)


def embed_pca(X, y, seed):
    # The papers' PCA + k-means keeps the components holding 98% of the variance.
    return PCA(n_components=0.98, svd_solver="full").fit_transform(np.asarray(X, dtype=np.float64))


def embed_umap(X, y, seed):
    import umap

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


def paper(args) -> None:
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


def quality(args) -> None:
    methods = {name: QUALITY_METHODS[name] for name in args.methods}
    print(
        f"{len(args.datasets)} data sets, {args.seeds} seeds; cell: NMI mean ± sd "
        "(seconds per embedding; trustworthiness / continuity, k = 10)"
    )
    print()
    print(f"| data | n x d | {' | '.join(methods)} |")
    print(f"|---|---|{'---|' * len(methods)}")
    for name in args.datasets:
        runs = [(seed, *quality_data(name, seed)) for seed in range(args.seeds)]
        cells = []
        for method, embed in methods.items():
            scores, seconds = SeedScores(), []
            for seed, X, y in runs:
                c = len(np.unique(y))
                start = time.perf_counter()
                try:
                    Z = embed(X, c, seed)
                except ImportError:
                    break
                seconds.append(time.perf_counter() - start)
                scores.add(kmeans_nmi(Z, y, seed, n_init=20), X, Z, seed)
                print(f"{name} {method} seed {seed}: NMI {scores.nmi[-1]:.4f}", file=sys.stderr)
            cells.append(scores.cell(f"{np.median(seconds):.1f} s; " if seconds else ""))
        shape = runs[0][1].shape
        print(f"| {name} | {shape[0]:,} x {shape[1]} | {' | '.join(cells)} |", flush=True)


HELDOUT_METHODS: dict[str, Callable] = {
    "MBN, new defaults": MBN_MODELS["MBN, new defaults"],
    "MBN, PCA output": MBN_MODELS["MBN, PCA output"],
    "MBN, UMAP output": MBN_MODELS["MBN, UMAP output"],
    "MBN, cosine": MBN_MODELS["MBN, cosine"],
    "UMAP": lambda c, seed: __import__("umap").UMAP(n_components=c, random_state=seed),
    "PCA": lambda c, seed: PCA(n_components=c, random_state=seed),
}


def heldout(args) -> None:
    print(
        f"{args.seeds} seeds, 80/20 split per seed; cell: held-out NMI mean ± sd "
        "(held-out trustworthiness / continuity, k = 10)"
    )
    print()
    methods = {name: HELDOUT_METHODS[name] for name in args.methods}
    print(f"| data | {' | '.join(methods)} |")
    print(f"|---|{'---|' * len(methods)}")
    for name in args.datasets:
        cells = []
        for method, make in methods.items():
            scores = SeedScores()
            for seed in range(args.seeds):
                X, y = quality_data(name, seed)
                X = np.asarray(X, np.float32)
                c = len(np.unique(y))
                fit_rows, new_rows = split_rows(len(X), seed)
                try:
                    model = make(min(c, X.shape[1]) if method == "PCA" else c, seed)
                except ImportError:
                    break
                kmeans = KMeans(c, n_init=20, random_state=seed)
                kmeans.fit(model.fit_transform(X[fit_rows]))
                Z_new = model.transform(X[new_rows])
                nmi = normalized_mutual_info_score(y[new_rows], kmeans.predict(Z_new))
                scores.add(nmi, X[new_rows], Z_new, seed)
                print(f"{name} {method} seed {seed}: NMI {nmi:.4f}", file=sys.stderr)
            cells.append(scores.cell())
        print(f"| {name} | {' | '.join(cells)} |", flush=True)


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
    d_chosen = model.network().bottom_features(X, np.random.RandomState(0))
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
        print(f"| {i} | {g:.1f} s | {f:.1f} s | {f / g:.2f} | {b / g:.2f} | {u / b:.1%} |")
    print(
        f"| **median** | {np.median(gemm):.1f} s | {np.median(fit):.1f} s | "
        f"**{np.median(fit / gemm):.2f}** (target <= 1.5) | {np.median(bottom / gemm):.2f} | "
        f"**{np.median(upper / bottom):.1%}** (target <= 25%) |"
    )
    print()
    print(f"PCA and projection: {np.median(fit - bottom - upper):.1f} s (median)")


def scale_one(n: int, k_max: int, metric: str, seed: int, output: str, new_rows: int) -> dict:
    """Fit on MNIST's first n images; with ``new_rows``, also embed its last ``new_rows``
    images (never fitted when n + new_rows <= 70,000) and score them with the fitted rows'
    k-means centroids."""
    X_all, y_all = load_mnist()
    if new_rows and n + new_rows > len(X_all):
        raise ValueError(f"{n} fitted + {new_rows} new rows > {len(X_all)} images")
    X, y = X_all[:n], y_all[:n]
    layer_ends: list[float] = []

    def on_progress(layer: int, done: int, total: int) -> bool:
        if done == total:
            layer_ends.append(time.perf_counter())
        return False

    model = MBN(k_max=k_max, metric=metric, output=output, random_state=seed, callback=on_progress)
    start = time.perf_counter()
    Z = model.fit_transform(X)
    end = time.perf_counter()
    kmeans = KMeans(10, n_init=50, random_state=seed).fit(Z)
    result = {
        "n": n,
        "ks": model.ks_,
        "fit_s": end - start,
        # The layers' seconds, then the output's (from the top layer's end to the embedding).
        "layer_s": np.diff([start, *layer_ends]).round(1).tolist(),
        "output_s": end - layer_ends[-1],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "model_mb": model.nbytes / 1e6,
        "nmi": float(normalized_mutual_info_score(y, kmeans.labels_)),
    }
    if new_rows:
        start = time.perf_counter()
        Z_new = model.transform(X_all[-new_rows:])
        result["new_ms_per_row"] = 1000 * (time.perf_counter() - start) / new_rows
        labels = kmeans.predict(Z_new)
        result["new_nmi"] = float(normalized_mutual_info_score(y_all[-new_rows:], labels))
    return result


def scale(args) -> None:
    print(
        f"MNIST first n images, defaults with k_max={args.k_max}, V=400, metric={args.metric}, "
        f"output={args.output}, random_state={args.seed}, one process per size"
        + (f"; new rows: MNIST's last {args.new_rows:,}" if args.new_rows else "")
    )
    print()
    print(
        "| n | ks | fit (bottom layer / upper layers / output) | peak RSS | model size "
        "| NMI (k-means, 10 clusters) | new rows: NMI (fitted rows' centroids), ms per row |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in args.sizes:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "scale-one",
                str(n),
                str(args.k_max),
                args.metric,
                str(args.seed),
                args.output,
                str(args.new_rows),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        new = f"{r['new_nmi']:.4f}, {r['new_ms_per_row']:.2f} ms" if "new_nmi" in r else ""
        print(
            f"| {r['n']:,} | {'-'.join(map(str, r['ks']))} | {r['fit_s']:.0f} s "
            f"({r['layer_s'][0]:.0f} s / {sum(r['layer_s'][1:]):.0f} s / {r['output_s']:.0f} s) | "
            f"{r['peak_rss_mb']:.0f} MB | {r['model_mb']:.0f} MB | {r['nmi']:.4f} | {new} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--datasets", nargs="+", default=[*QUALITY_DATA, "mnist5k"])
    q.add_argument(
        "--methods", nargs="+", choices=list(QUALITY_METHODS), default=QUALITY_DEFAULT_METHODS
    )
    q.add_argument("--seeds", type=int, default=5)
    p = sub.add_parser("paper")
    p.add_argument("--datasets", nargs="+", default=["mnist5k", "digits", "wine"])
    p.add_argument("--seeds", type=int, default=5)
    s = sub.add_parser("speed")
    s.add_argument("--repeats", type=int, default=3)
    c = sub.add_parser("scale")
    c.add_argument("--sizes", nargs="+", type=int, default=[5000, 20000, 70000])
    c.add_argument("--k-max", type=int, default=8000)
    c.add_argument("--metric", choices=METRICS, default="euclidean")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--output", choices=OUTPUTS, default="pca")
    c.add_argument("--new-rows", type=int, default=0)
    h = sub.add_parser("heldout")
    h.add_argument("--datasets", nargs="+", default=[*QUALITY_DATA, "mnist5k"])
    h.add_argument("--seeds", type=int, default=3)
    h.add_argument("--methods", nargs="+", default=list(HELDOUT_METHODS))
    one = sub.add_parser("scale-one")
    one.add_argument("n", type=int)
    one.add_argument("k_max", type=int)
    one.add_argument("metric", choices=METRICS)
    one.add_argument("seed", type=int)
    one.add_argument("output", choices=OUTPUTS)
    one.add_argument("new_rows", type=int)
    args = parser.parse_args()
    if args.command == "quality":
        quality(args)
    elif args.command == "paper":
        paper(args)
    elif args.command == "speed":
        speed(args)
    elif args.command == "scale":
        scale(args)
    elif args.command == "heldout":
        heldout(args)
    else:
        with threadpool_limits(limits=None):
            result = scale_one(
                args.n, args.k_max, args.metric, args.seed, args.output, args.new_rows
            )
            print(json.dumps(result))


if __name__ == "__main__":
    main()
