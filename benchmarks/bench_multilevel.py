"""Multilevel manifold learning (paper B) against the paper's figures and plain scikit-learn.

Subcommands (each prints Markdown rows; current figures in docs/BENCHMARKS.md):

* ``manifolds``: swiss roll and S-curve (2,000 points, k = 8, fixed order, simple weights):
  level sizes and |Spearman| of each aligned axis with (t, height) for r = 1..4.
* ``savings``: time of plain sklearn Isomap / LLE / SpectralEmbedding against multilevel r = 2, 3, 4
  on generated substitutes of the paper's image sets (Sculpture, Frey, Teapot), built from MNIST
  digits with scipy.ndimage.
* ``clustering``: purity, entropy and NMI of K-means on raw data, plain DR + K-means and multilevel
  DR + multilevel K-means on the ORL-like and UMIST-like substitutes and on digits.
* ``mnist``: multilevel Isomap on all 70,000 MNIST digits (time, peak memory, NMI);
  ``plain-isomap --n N``: sklearn Isomap on N digits (time, peak memory), one size per process so
  the peak memory is that size's own.

Run with ``MBN_MNIST=path/to/mnist70k.npz`` (see bench_data.py).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
from scipy import ndimage
from scipy.linalg import orthogonal_procrustes
from scipy.stats import spearmanr
from sklearn.cluster import KMeans
from sklearn.datasets import load_digits, make_s_curve, make_swiss_roll
from sklearn.manifold import Isomap, LocallyLinearEmbedding, SpectralEmbedding
from sklearn.metrics import normalized_mutual_info_score
from sklearn.metrics.cluster import contingency_matrix
from sklearn.neighbors import kneighbors_graph

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_data import load_mnist

from mbn_core import MultilevelEmbedding, MultilevelKMeans
from mbn_core.multilevel.neighbors import knn_graph

PLAIN = {
    "isomap": lambda k, d, seed: Isomap(n_neighbors=k, n_components=d),
    "lle": lambda k, d, seed: LocallyLinearEmbedding(
        n_neighbors=k, n_components=d, random_state=seed
    ),
    "eigenmaps": lambda k, d, seed: SpectralEmbedding(
        n_components=d, affinity="nearest_neighbors", n_neighbors=k, random_state=seed
    ),
}


# ---------------------------------------------------------------------- substitutes


def _digit(images: np.ndarray, index: int) -> np.ndarray:
    return images[index].reshape(28, 28).astype(np.float64) / 255.0


def _canvas(image: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """The image scaled to fit a canvas of ``shape`` (keeping its aspect) and centred."""
    scale = min(shape[0] / image.shape[0], shape[1] / image.shape[1]) * 0.8
    zoomed = ndimage.zoom(image, scale, order=1)
    out = np.zeros(shape)
    top = (shape[0] - zoomed.shape[0]) // 2
    left = (shape[1] - zoomed.shape[1]) // 2
    out[top : top + zoomed.shape[0], left : left + zoomed.shape[1]] = zoomed
    return out


def sculpture_like(images, rng, n=698):
    """698 x 64x64: x-shift, y-shift and the angle of a lighting gradient (3 DOF)."""
    base = _canvas(_digit(images, 0), (64, 64))
    yy, xx = np.mgrid[0:64, 0:64] / 63.0 - 0.5
    rows = []
    for dx, dy, angle in rng.uniform([-8, -8, 0], [8, 8, np.pi], size=(n, 3)):
        light = 1.0 + 0.8 * (np.cos(angle) * xx + np.sin(angle) * yy)
        rows.append((ndimage.shift(base, (dy, dx), order=1) * light).ravel())
    return np.array(rows)


def frey_like(images, rng, n=1965):
    """1,965 x 20x28 = 560: rotation within +-30 degrees and an x-shift (2 DOF)."""
    base = _canvas(_digit(images, 1), (28, 20))
    rows = []
    for angle, dx in rng.uniform([-30, -3], [30, 3], size=(n, 2)):
        turned = ndimage.rotate(base, angle, reshape=False, order=1)
        rows.append(ndimage.shift(turned, (0, dx), order=1).ravel())
    return np.array(rows)


def teapot_like(images, rng, n=400):
    """400 x 76x101x3 = 23,028: one closed DOF, a rotation over 360 degrees."""
    base = _canvas(_digit(images, 2), (76, 101))
    tint = np.array([1.0, 0.7, 0.4])
    rows = []
    for angle in np.linspace(0, 360, n, endpoint=False):
        turned = ndimage.rotate(base, angle, reshape=False, order=1)
        rows.append((turned[:, :, None] * tint).ravel())
    return np.array(rows)


def _variant(base, rng, rotation, shift, scale, noise):
    out = ndimage.rotate(base, rotation, reshape=False, order=1)
    out = ndimage.shift(out, shift, order=1)
    zoomed = ndimage.zoom(out, scale, order=1)
    canvas = np.zeros_like(base)
    h, w = min(zoomed.shape[0], base.shape[0]), min(zoomed.shape[1], base.shape[1])
    top, left = (base.shape[0] - h) // 2, (base.shape[1] - w) // 2
    ztop, zleft = (zoomed.shape[0] - h) // 2, (zoomed.shape[1] - w) // 2
    canvas[top : top + h, left : left + w] = zoomed[ztop : ztop + h, zleft : zleft + w]
    return canvas + noise * rng.normal(size=base.shape)


def orl_like(images, labels, rng):
    """400 x 112x92: 40 identities (distinct digit images), 10 variants each; K = 40."""
    picks = rng.choice(len(images), 40, replace=False)
    rows, y = [], []
    for identity, index in enumerate(picks):
        base = _canvas(_digit(images, index), (112, 92))
        for _ in range(10):
            rotation = rng.uniform(-10, 10)
            shift = rng.uniform(-2, 2, size=2)
            rows.append(_variant(base, rng, rotation, shift, rng.uniform(0.9, 1.1), 0.05).ravel())
            y.append(identity)
    return np.array(rows), np.array(y)


def umist_like(images, labels, rng):
    """565 x 112x92: 20 identities, 19-48 images each along a pose (rotation -60..60); K = 20."""
    picks = rng.choice(len(images), 20, replace=False)
    counts = rng.randint(19, 49, size=20)
    counts = np.maximum(19, np.round(counts * 565 / counts.sum()).astype(int))
    counts[-1] += 565 - counts.sum()
    rows, y = [], []
    for identity, (index, count) in enumerate(zip(picks, counts, strict=True)):
        base = _canvas(_digit(images, index), (112, 92))
        for pose in np.linspace(-60, 60, count):
            rows.append(_variant(base, rng, pose, (0.0, 0.0), 1.0, 0.05).ravel())
            y.append(identity)
    return np.array(rows), np.array(y)


# ---------------------------------------------------------------------- metrics


def purity_entropy(labels_true, labels_pred) -> tuple[float, float]:
    """The paper's purity and entropy (log base K), clusters weighted by size."""
    table = contingency_matrix(labels_pred, labels_true)  # rows: clusters
    sizes = table.sum(axis=1)
    n = sizes.sum()
    purity = float((table.max(axis=1)).sum() / n)
    k = table.shape[1]
    fractions = table / sizes[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(fractions > 0, fractions * np.log(fractions) / np.log(k), 0.0)
    entropy = float((sizes / n * -terms.sum(axis=1)).sum())
    return purity, entropy


def aligned_spearman(Y, truth):
    Y = (Y - Y.mean(0)) / Y.std(0)
    truth = (truth - truth.mean(0)) / truth.std(0)
    rotation, _ = orthogonal_procrustes(Y, truth)
    Z = Y @ rotation
    return [abs(spearmanr(Z[:, a], truth[:, a])[0]) for a in range(truth.shape[1])]


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def cpu_seconds() -> float:
    """CPU time of this process (all threads): the figure a busy shared machine distorts least."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------- experiments


def manifolds(args) -> None:
    print("| data | r | level sizes | Isomap (t, h) | LLE (t, h) | eigenmaps (t, h) |")
    print("|---|---|---|---|---|---|")
    for name, make in (("swiss roll", make_swiss_roll), ("S-curve", make_s_curve)):
        X, t = make(2000, random_state=args.seed)
        truth = np.c_[t, X[:, 1]]
        for r in (1, 2, 3, 4):
            cells, sizes = [], None
            for method in ("isomap", "lle", "eigenmaps"):
                model = MultilevelEmbedding(
                    method=method, n_neighbors=8, n_levels=r, order="fixed", weights="simple"
                )
                Y = model.fit_transform(X)
                sizes = model.level_sizes_
                rho = aligned_spearman(Y, truth)
                cells.append(f"{rho[0]:.3f}, {rho[1]:.3f}")
            print(f"| {name} | {r} | {'/'.join(map(str, sizes))} | {' | '.join(cells)} |")


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def _clocked(fn) -> tuple[float, float]:
    """Wall and CPU seconds (all threads of this process) of one call."""
    cpu = cpu_seconds()
    wall, _ = _timed(fn)
    return wall, cpu_seconds() - cpu


def _median_clocks(fn, repeats: int) -> tuple[float, float]:
    clocks = np.array([_clocked(fn) for _ in range(repeats)])
    return float(np.median(clocks[:, 0])), float(np.median(clocks[:, 1]))


def savings(args) -> None:
    """Plain sklearn against multilevel r = 2, 3, 4: medians of wall and CPU seconds.

    "saved" is 1 - multilevel / plain in CPU seconds, which a machine shared with other jobs
    distorts less than wall time (a niced run waits while others run). The k-NN columns time
    our exact k-NN graph (part of every multilevel fit) and sklearn's ``kneighbors_graph``
    (what the plain methods start with) alone.
    """
    images, _ = load_mnist()
    rng = np.random.RandomState(args.seed)
    sets = {
        "Sculpture-like (698 x 4,096, k=6)": (sculpture_like(images, rng), 6),
        "Frey-like (1,965 x 560, k=12)": (frey_like(images, rng), 12),
        "Teapot-like (400 x 23,028, k=10)": (teapot_like(images, rng), 10),
    }
    print(
        "| data | method | plain CPU s (wall) | kNN CPU s ours / sklearn "
        "| r=2 CPU s (saved, wall) | r=3 CPU s (saved, wall) | r=4 CPU s (saved, wall) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, (X, k) in sets.items():
        if args.only and args.only not in name:
            continue
        knn_graph(X[: k + 2], k)  # compile the k-NN kernels outside the timings
        _, ours = _median_clocks(lambda X=X, k=k: knn_graph(X, k), args.repeats)
        _, theirs = _median_clocks(
            lambda X=X, k=k: kneighbors_graph(X, k, mode="distance"), args.repeats
        )
        for method in ("isomap", "lle", "eigenmaps"):
            plain_wall, plain_cpu = _median_clocks(
                lambda X=X, k=k, m=method: PLAIN[m](k, 2, 0).fit_transform(X), args.repeats
            )
            cells = []
            for r in (2, 3, 4):
                clocks, sizes = [], []
                for rep in range(args.repeats):
                    model = MultilevelEmbedding(
                        method=method, n_neighbors=k, n_levels=r, random_state=rep
                    )
                    clocks.append(_clocked(lambda X=X, model=model: model.fit(X)))
                    sizes.append(model.level_sizes_[-1])
                wall, cpu = np.median(clocks, axis=0)
                cells.append(
                    f"{cpu:.3f} ({1 - cpu / plain_cpu:.0%}, {wall:.3f}; "
                    f"bottom {np.median(sizes):.0f})"
                )
            print(
                f"| {name} | {method} | {plain_cpu:.3f} ({plain_wall:.3f}) | "
                f"{ours:.3f} / {theirs:.3f} | {' | '.join(cells)} |"
            )


def clustering(args) -> None:
    images, labels = load_mnist()
    rng = np.random.RandomState(args.seed)
    digits = load_digits()
    sets = {
        "ORL-like (400, K=40, k=5, d=30)": (*orl_like(images, labels, rng), 40, 5, 30),
        "UMIST-like (565, K=20, k=7, d=15)": (*umist_like(images, labels, rng), 20, 7, 15),
        "digits (1,797, K=10, k=10, d=10)": (digits.data, digits.target, 10, 10, 10),
    }
    print("| data | method | iterations | seconds | purity | entropy | NMI |")
    print("|---|---|---|---|---|---|---|")
    for name, (X, y, K, k, d) in sets.items():
        rows = {}

        def record(key, seconds, n_iter, pred, rows=rows, y=y):
            purity, entropy = purity_entropy(y, pred)
            nmi = normalized_mutual_info_score(y, pred)
            rows.setdefault(key, []).append((n_iter, seconds, purity, entropy, nmi))

        for seed in range(args.runs):
            seconds, km = _timed(
                lambda seed=seed, X=X, K=K: KMeans(
                    K, init="random", n_init=1, random_state=seed
                ).fit(X)
            )
            record("K-means", seconds, km.n_iter_, km.labels_)
            for method in ("isomap", "lle", "eigenmaps"):

                def plain_fit(method=method, seed=seed, X=X, K=K, k=k, d=d):
                    Y = PLAIN[method](k, d, seed).fit_transform(X)
                    return KMeans(K, init="random", n_init=1, random_state=seed).fit(Y)

                seconds, km = _timed(plain_fit)
                record(method, seconds, km.n_iter_, km.labels_)
                model = MultilevelKMeans(
                    n_clusters=K, method=method, n_neighbors=k, n_components=d, random_state=seed
                )
                seconds, _ = _timed(lambda model=model, X=X: model.fit(X))
                record(f"m-{method}", seconds, model.n_iter_, model.labels_)
        for key, values in rows.items():
            it, sec, pur, ent, nmi = np.mean(values, axis=0)
            print(f"| {name} | {key} | {it:.2f} | {sec:.3f} | {pur:.3f} | {ent:.3f} | {nmi:.3f} |")


def mnist(args) -> None:
    images, labels = load_mnist()
    X = images[: args.n].astype(np.float64)
    y = labels[: args.n]
    model = MultilevelEmbedding(
        method="isomap",
        n_neighbors=args.k,
        n_components=args.d,
        n_levels=None,
        max_coarse_size=args.max_coarse_size,
        random_state=0,
        callback=lambda stage, done, total: print(
            f"  {time.strftime('%H:%M:%S')} stage {stage} {done}/{total}", flush=True
        ),
    )
    cpu = cpu_seconds()
    seconds, Y = _timed(lambda: model.fit_transform(X))
    cpu = cpu_seconds() - cpu
    km = KMeans(10, n_init=10, random_state=0).fit(Y)
    nmi = normalized_mutual_info_score(y, km.labels_)
    print(
        f"| multilevel Isomap | {args.n:,} | {'/'.join(map(str, model.level_sizes_))} | "
        f"{seconds:.1f} | {cpu:.1f} | {peak_rss_gib():.2f} | {nmi:.4f} |"
    )


def plain_isomap(args) -> None:
    images, labels = load_mnist()
    X = images[: args.n].astype(np.float64)
    y = labels[: args.n]
    cpu = cpu_seconds()
    seconds, Y = _timed(
        lambda: Isomap(n_neighbors=args.k, n_components=args.d, path_method="D").fit_transform(X)
    )
    cpu = cpu_seconds() - cpu
    km = KMeans(10, n_init=10, random_state=0).fit(Y)
    nmi = normalized_mutual_info_score(y, km.labels_)
    projected = peak_rss_gib() * (70_000 / args.n) ** 2
    print(
        f"| plain sklearn Isomap | {args.n:,} | - | {seconds:.1f} | {cpu:.1f} | "
        f"{peak_rss_gib():.2f} "
        f"(x(70k/n)^2 = {projected:.0f} at 70k) | {nmi:.4f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "experiment", choices=["manifolds", "savings", "clustering", "mnist", "plain-isomap"]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runs", type=int, default=10, help="seeds per clustering method")
    parser.add_argument("--n", type=int, default=70_000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--max-coarse-size", type=int, default=3000)
    parser.add_argument("--only", default="", help="savings: only the data sets naming this")
    args = parser.parse_args()
    {
        "manifolds": manifolds,
        "savings": savings,
        "clustering": clustering,
        "mnist": mnist,
        "plain-isomap": plain_isomap,
    }[args.experiment](args)


if __name__ == "__main__":
    main()
