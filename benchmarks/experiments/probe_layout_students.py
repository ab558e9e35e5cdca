"""Which student places unseen rows where a layout method would: regression or atoms.

    python benchmarks/experiments/probe_layout_students.py --methods tsne,umap,mbn
    python benchmarks/experiments/probe_layout_students.py --methods umap --atoms 50,100,200

Each method lays out the first 10,000 MNIST images (``bench_data.load_mnist``; ``mbn`` is MBN
with the training defaults, for comparison). A seeded 2,000 of those rows are held out of the
students (not of the layout: a layout method places only the rows it is fitted on), and each
student is trained on the other 8,000 rows' input (PCA to 32 dimensions, one scale) and
layout, then predicts the 2,000 held-out rows. Scores against the layout of those rows:
k-means NMI against the digits (10 clusters, lowest inertia of 10 restarts), R^2 (variance
weighted) and 10-NN overlap.

Students:

- ``regressor``: an MLP (256, 256) regressing the layout (squared error), as the distiller
  trained every student so far;
- ``knn-1``, ``knn-10``: a k-NN regressor from the same input (distance weighted), the
  references: one neighbour commits to where the layout put it, ten average over them;
- ``atoms-K``: k-means finds K atoms in the training rows' layout; an MLP (256, 256)
  classifies each row's atom (cross-entropy) and the prediction is the probability-weighted
  mean of the atoms, with the probabilities sharpened by a temperature T (p^(1/T),
  renormalised; T = 1 as trained).

The question it answers: a layout has tight clusters and wide gaps; a regressor trained on
squared error puts a row it is unsure of between the clusters it could belong to, where no
layout row lies, while k-NN with one neighbour does not lose NMI at all.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA
from sklearn.metrics import normalized_mutual_info_score, r2_score
from sklearn.neighbors import KNeighborsRegressor
from sklearn.neural_network import MLPClassifier, MLPRegressor
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_data import load_mnist

from mbn_core.pipeline.fidelity import knn_overlap

N_ROWS = 10_000
N_HELD_OUT = 2_000
HIDDEN = (256, 256)
EPOCHS = 40
TEMPERATURES = (1.0, 0.5, 0.25)


def layout(name: str, X: np.ndarray, seed: int, threads: int) -> np.ndarray:
    if name == "mbn":
        from mbn_core import MBN

        return MBN(random_state=seed, k_max=2000, n_jobs=threads).fit_transform(X)
    import mbn_core.layouts as layouts

    classes = {
        "tsne": layouts.TSNE,
        "umap": layouts.UMAP,
        "densmap": layouts.DensMAP,
        "pacmap": layouts.PaCMAP,
        "trimap": layouts.TriMap,
    }
    return classes[name](random_state=seed, n_jobs=threads).fit_transform(X)


def scores(truth: np.ndarray, predicted: np.ndarray, y: np.ndarray, seed: int) -> dict:
    labels = KMeans(10, n_init=10, random_state=seed).fit_predict(predicted)
    return {
        "nmi": round(float(normalized_mutual_info_score(y, labels)), 4),
        "r2": round(float(r2_score(truth, predicted, multioutput="variance_weighted")), 4),
        "knn": round(float(knn_overlap(truth, predicted)), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="tsne,umap,mbn")
    parser.add_argument("--atoms", default="100", help="numbers of atoms K, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    X, y = load_mnist()
    X, y = X[:N_ROWS].astype(np.float32) / 255, y[:N_ROWS]
    order = np.random.RandomState(args.seed).permutation(N_ROWS)
    held, train = order[:N_HELD_OUT], order[N_HELD_OUT:]
    pca = PCA(32, random_state=args.seed).fit(X[train])
    scale = pca.transform(X[train]).std()
    Z_train, Z_held = pca.transform(X[train]) / scale, pca.transform(X[held]) / scale
    for name in args.methods.split(","):
        with threadpool_limits(args.threads):
            started = time.perf_counter()
            E = np.asarray(layout(name, X, args.seed, args.threads), dtype=np.float64)
            row: dict = {"method": name, "layout_seconds": round(time.perf_counter() - started)}
            row["layout"] = {"nmi": scores(E[held], E[held], y[held], args.seed)["nmi"]}
            for k in (1, 10):
                knn = KNeighborsRegressor(k, weights="distance").fit(Z_train, E[train])
                row[f"knn-{k}"] = scores(E[held], knn.predict(Z_held), y[held], args.seed)
            mean = E[train].mean(axis=0)
            spread = float(np.sqrt(np.mean((E[train] - mean) ** 2)))
            regressor = MLPRegressor(
                hidden_layer_sizes=HIDDEN, max_iter=EPOCHS, random_state=args.seed
            ).fit(Z_train, (E[train] - mean) / spread)
            predicted = regressor.predict(Z_held) * spread + mean
            row["regressor"] = scores(E[held], predicted, y[held], args.seed)
            for n_atoms in (int(k) for k in args.atoms.split(",")):
                kmeans = KMeans(n_atoms, n_init=3, random_state=args.seed).fit(E[train])
                classifier = MLPClassifier(
                    hidden_layer_sizes=HIDDEN, max_iter=EPOCHS, random_state=args.seed
                ).fit(Z_train, kmeans.labels_)
                atoms = kmeans.cluster_centers_[classifier.classes_]
                log_p = np.log(np.maximum(classifier.predict_proba(Z_held), 1e-300))
                for temperature in TEMPERATURES:
                    weights = np.exp((log_p - log_p.max(axis=1, keepdims=True)) / temperature)
                    weights /= weights.sum(axis=1, keepdims=True)
                    row[f"atoms-{n_atoms}, T={temperature:g}"] = scores(
                        E[held], weights @ atoms, y[held], args.seed
                    )
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
