"""Writes the reference codes, embeddings and bundles that the redesign must reproduce bit for bit.

Run once, on the code before the redesign (commit 458bad1), from the repository root:

    OPENBLAS_CORETYPE=SkylakeX python tests/data/golden/make_golden.py

(the embeddings' last bits depend on OpenBLAS's kernels: ``scripts/test`` runs these ones).

It is kept as the record of how ``codes.npz`` and ``bundles/`` were made; tests/mbn_core/
test_golden.py checks today's code against them. It uses only the public API.

``bundles/retrained.npz`` is not written here: it holds what the modular KPCA bundle, retrained
since its fit runs at one BLAS thread, embeds (docs/decisions/0035-modular-kpca-one-blas-thread.md).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import load_digits, make_moons

from mbn_core import MBN
from mbn_core.bundle import load_bundle

HERE = Path(__file__).parent

# name -> (MBN parameters, data set). Each is fitted on the first rows and asked for every
# layer's codes and the embedding of both the training rows and unseen rows.
CONFIGS = {
    "digits_pca": ({"n_clusterings": 40, "random_state": 0}, "digits"),
    "digits_cosine": ({"n_clusterings": 30, "metric": "cosine", "random_state": 1}, "digits"),
    "digits_shift": (
        {"n_clusterings": 30, "shift_fraction": 0.5, "k1": 0.3, "random_state": 2},
        "digits",
    ),
    "digits_umap": (
        {"n_clusterings": 30, "output": "umap", "delta": 0.5, "random_state": 3},
        "digits",
    ),
    "digits_float": ({"n_clusterings": 40, "random_state": 0}, "digits_float"),
    "moons_auto": ({"n_clusterings": 400, "random_state": 4}, "moons"),
    "sparse_cosine": ({"n_clusterings": 30, "metric": "cosine", "random_state": 5}, "sparse"),
    "sparse_euclidean": ({"n_clusterings": 30, "random_state": 6}, "sparse"),
}

BUNDLE_PARAMS = {
    "mbn": {"n_clusterings": 20, "k1": 0.1, "hidden_layer_sizes": [32], "max_epochs": 4,
            "n_clusters": 4, "random_state": 0},
    "mbn_spectral": {"n_clusterings": 20, "k1": 0.1, "output": "spectral",
                     "hidden_layer_sizes": [16], "max_epochs": 2, "random_state": 0},
    "mbn_leave_self_out": {"n_clusterings": 20, "k1": 0.1, "targets": "leave-self-out",
                           "hidden_layer_sizes": [16], "max_epochs": 2, "random_state": 0},
    "modular_kpca": {"method": "modular_kpca", "random_state": 0, "max_epochs": 5},
    "multilevel": {"method": "multilevel", "random_state": 0, "hidden_layer_sizes": [16],
                   "max_epochs": 2},
}  # fmt: skip


def data(name: str):
    """(fit rows, unseen rows) of a data set."""
    if name in ("digits", "digits_float"):
        X = load_digits().data[:800]
        if name == "digits_float":
            X = (X / 16.0).astype(np.float32)
        return X[:600], X[600:]
    if name == "moons":
        X, _ = make_moons(500, noise=0.05, random_state=0)
        return X[:400], X[400:]
    rng = np.random.default_rng(7)
    X = sp.random(500, 300, density=0.03, format="csr", random_state=rng, dtype=np.float64)
    X.data = np.round(X.data * 5) + 1
    return X[:400], X[400:]


def main() -> None:
    if not (HERE / "codes.npz").exists():
        write_codes()
    write_bundles()


def write_codes() -> None:
    arrays = {}
    for name, (params, source) in CONFIGS.items():
        fit_rows, new_rows = data(source)
        model = MBN(**params).fit(fit_rows)
        arrays[f"{name}/ks"] = np.asarray(model.ks_)
        arrays[f"{name}/output"] = np.asarray(model.output_)
        for layer in range(len(model.ks_)):
            arrays[f"{name}/fit_codes_{layer}"] = model.encode(fit_rows, layer=layer)
            arrays[f"{name}/new_codes_{layer}"] = model.encode(new_rows, layer=layer)
        arrays[f"{name}/fit_embedding"] = model.transform(fit_rows)
        arrays[f"{name}/new_embedding"] = model.transform(new_rows)
        print(name, model.ks_, model.output_)  # noqa: T201
    np.savez_compressed(HERE / "codes.npz", **arrays)


def write_bundles() -> None:
    from mbn_core.pipeline.training import train_bundle  # mbn_core.training before the redesign

    out = HERE / "bundles"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    X, y = load_digits(return_X_y=True)
    rows = X[1000:1100]
    np.save(out / "rows.npy", rows)
    expected = {}
    for name, params in BUNDLE_PARAMS.items():
        path = train_bundle(X[:300], out / name, name=name, params=params, y=y[:300])
        bundle = load_bundle(path)
        expected[f"{name}/fast"] = bundle.embed(rows, mode="fast")
        expected[f"{name}/exact"] = bundle.embed(rows, mode="exact")
        print(name, json.loads((path / "manifest.json").read_text())["method"])  # noqa: T201
    np.savez_compressed(out / "expected.npz", **expected)


if __name__ == "__main__":
    main()
