"""Degenerate data and edge-value parameters through ``train_bundle`` and ``Bundle.embed``.

    python benchmarks/fuzz_training.py data
    python benchmarks/fuzz_training.py params --seeds 60

Each case runs in a child process, so a crash inside a compiled library (t-SNE's Barnes-Hut
code once ended the process on a constant embedding) is reported instead of ending the run.
Every case must end in one of two ways: it trains and both modes embed its first rows to
finite values, or it is refused with a ``ValueError``. Anything else (another exception, a
signal, a timeout, NaN in an embedding) is a defect, and the exit status is 1.

- ``data``: fixed degenerate training sets (too few rows, one column, constant rows, rows that
  differ below float32's precision, values near float32's limits, one-hot rows, duplicates,
  integer, boolean and float16 dtypes, NaN; sparse matrices: empty rows, all zeros, entries
  listed twice, 100,000 columns) for every method, with default parameters.
- ``params``: random data shapes (4 to 120 rows, 1 to 20 columns) with one to four
  parameters set to edge values, for every method; ``--seeds`` cases per method.

The ``ValueError`` messages are printed, grouped, so that a reader can check that each names
the problem.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

METHODS = ("mbn", "modular_kpca", "multilevel", "tsne", "umap", "densmap", "pacmap", "trimap")
# The layout methods' fits, shortened for the fuzz (a case is about the edges, not the layout).
SHORT_LAYOUTS = {
    "tsne": {"early_exaggeration_iter": 20, "n_iter": 30},
    "umap": {"n_epochs": 20},
    "densmap": {"n_epochs": 20},
    "pacmap": {"num_iters": 210},
    "trimap": {"n_iters": 20},
}
CASE_TIMEOUT_SECONDS = 300


_RNG = np.random.default_rng(0)
_BASE = _RNG.normal(size=(60, 5))
# The degenerate training sets, by name (built on demand: the wide one is 36,000 values).
DEGENERATE_SETS: dict[str, Callable[[], np.ndarray]] = {
    "1 row": lambda: _BASE[:1],
    "3 rows": lambda: _BASE[:3],
    "10 rows": lambda: _BASE[:10],
    "1 column": lambda: _BASE[:, :1],
    "a constant column": lambda: np.column_stack([_BASE[:, :2], np.zeros(60)]),
    "constant rows": lambda: np.ones((60, 5)),
    "zeros": lambda: np.zeros((60, 5)),
    "differing below float32 precision": lambda: 1e6 + 1e-6 * _BASE,
    "values of 1e30": lambda: 1e30 * _BASE,
    "values of 3.4e38": lambda: np.full((60, 5), 3.4e38) * np.sign(_BASE),
    "values of 1e200 (beyond float32)": lambda: 1e200 * _BASE,
    "spread of 1e-30": lambda: 1e-30 * _BASE,
    "spread of 1e-14": lambda: 1e-14 * _BASE,
    "values of 1e14": lambda: 1e14 * _BASE,
    "one-hot rows": lambda: np.eye(60),
    "3 distinct rows": lambda: np.repeat(_BASE[:3], 20, axis=0),
    "2 distinct rows": lambda: np.repeat(np.eye(2), 30, axis=0),
    "int64": lambda: (10 * _BASE).astype(np.int64),
    "uint8": lambda: (50 * np.abs(_BASE)).astype(np.uint8),
    "bool": lambda: _BASE > 0,
    "float16": lambda: _BASE.astype(np.float16),
    "wide (12 x 3,000)": lambda: np.random.default_rng(1).normal(size=(12, 3000)),
    "NaN": lambda: np.where(_BASE > 2, np.nan, _BASE),
    "infinity": lambda: np.where(_BASE > 2, np.inf, _BASE),
    # Sparse input (MBN takes it; the other methods must refuse it by name).
    "sparse": lambda: _sparse(60, 200),
    "sparse, empty rows": lambda: _sparse(60, 200, empty_rows=20),
    "sparse, all zeros": lambda: sp.csr_matrix((60, 50)),
    "sparse, one column set": lambda: sp.csr_matrix(
        np.column_stack([_BASE[:, 0], np.zeros((60, 49))])
    ),
    "sparse, entries listed twice and explicit zeros": lambda: _listed_twice(_sparse(60, 200)),
    "sparse, wide (40 x 100,000)": lambda: _sparse(40, 100_000),
}


def _sparse(n_rows: int, n_columns: int, empty_rows: int = 0) -> sp.csr_matrix:
    """Random counts, 5 or so a row, as a bag-of-words has; the first ``empty_rows`` empty."""
    rng = np.random.default_rng(2)
    counts = np.where(np.arange(n_rows) < empty_rows, 0, rng.poisson(5, n_rows) + 1)
    rows = np.repeat(np.arange(n_rows), counts)
    columns = rng.integers(0, n_columns, len(rows))
    return sp.csr_matrix((np.ones(len(rows)), (rows, columns)), shape=(n_rows, n_columns))


def _listed_twice(X: sp.csr_matrix) -> sp.csr_matrix:
    """The same matrix with every entry stored as two halves and an explicit zero per row."""
    data, indices, indptr = [], [], [0]
    for i in range(X.shape[0]):
        begin, end = X.indptr[i], X.indptr[i + 1]
        extra = X.indices[begin : begin + 1]
        data += [X.data[begin:end] / 2, X.data[begin:end] / 2, np.zeros(len(extra))]
        indices += [X.indices[begin:end], X.indices[begin:end], extra]
        indptr.append(indptr[-1] + 2 * (end - begin) + len(extra))
    return sp.csr_matrix(
        (np.concatenate(data), np.concatenate(indices), np.array(indptr)), shape=X.shape
    )


# Values at or beyond each parameter's edge (some valid, some not: both must end cleanly).
EDGE_VALUES: dict[str, list] = {
    "n_components": [1, 2, 3, 5, 50], "n_clusterings": [1, 2, 3],
    "feature_fraction": [1e-6, 0.01, 1.0, "auto"], "k1": [1, 2, 0.01, 0.99, 1.0, "auto"],
    "delta": [0.01, 0.99, "auto"], "n_classes": [1, 2, 50], "k_max": [1, 2],
    "metric": ["cosine"], "output": ["umap", "umap-bottom"], "shift_fraction": [0.99, 1.0],
    "hidden_layer_sizes": [[1], [1, 1, 1], []], "max_epochs": [1], "batch_size": [1, 10**6],
    "learning_rate": [1e-9, 10.0], "alpha": [0.0, 100.0], "n_iter_no_change": [1],
    "input_noise": [0.0, 100.0], "input_components": [1, 1000], "tol": [0.0, 1e9],
    "validation_fraction": [0.01, 0.5, 0.99], "report_folds": [2, 10, "auto"],
    "targets": ["in-sample"], "holdout_fraction": [0.01, 0.5, 0.99],
    "map_points": [0, 1, 2, 3, 4], "n_modules": [1, 2], "module_dim": [1, 100],
    "diversity": [0.0, 1.0, "validate"], "n_landmarks": [1, 2, 5000], "gamma": [1e-12, 1e12],
    "epsilon": [0.0, 1e6], "coarse_method": ["lle", "eigenmaps"], "n_neighbors": [1, 2, 3],
    "n_levels": [1, 5], "max_coarse_size": [1, 2, 3], "order": ["fixed"],
    "weights": ["simple"],
    # The layout methods' (t-SNE, UMAP, densMAP, PaCMAP, TriMap) and the student's head.
    "perplexity": [1e-3, 1.0, 5.0, 9999.0], "early_exaggeration": [1e-3, 9999.0],
    "early_exaggeration_iter": [0, 1], "n_iter": [1, 2], "exaggeration": [1e-3, 9999.0, None],
    "dof": [1e-3, 99.0], "layout_learning_rate": [1e-9, 9999.0, "auto"],
    "initialization": ["pca", "spectral", "random"],
    "neighbors": ["exact", "annoy", "pynndescent", "auto"],
    "transform_perplexity": [1e-3, 9999.0], "transform_iter": [0, 1],
    "min_dist": [0.0, 5.0, 1e9], "spread": [1e-9, 1e9], "n_epochs": [1, None],
    "init": ["pca", "spectral", "random"], "repulsion_strength": [1e-9, 9999.0],
    "negative_sample_rate": [1, 1000], "local_connectivity": [1e-9, 9999.0],
    "set_op_mix_ratio": [0.0, 1.0], "dens_lambda": [0.0, 9999.0], "dens_frac": [0.0, 1.0],
    "dens_var_shift": [0.0, 9999.0], "MN_ratio": [0.0, 99.0], "FP_ratio": [0.0, 99.0],
    "distance": ["angular", "manhattan"], "num_iters": [201, 202], "apply_pca": [True, False],
    "n_inliers": [1, 1000], "n_outliers": [1, 1000], "n_random": [0, 1000],
    "opt_method": ["sd", "momentum", "dbd"], "n_iters": [1, 2],
    "student_head": ["regression", "atoms", "auto"], "n_atoms": [3, 10**6],
}  # fmt: skip


def params_case(method: str, seed: int) -> tuple[np.ndarray, dict]:
    from mbn_core.methods import get_method
    from mbn_core.pipeline.options import options

    rng = np.random.default_rng(seed)
    n = int(rng.choice([4, 5, 6, 8, 12, 20, 40, 120]))
    d = int(rng.choice([1, 2, 3, 7, 20]))
    X = rng.normal(size=(n, d))
    if rng.random() < 0.3:
        X = np.round(X)  # duplicate rows
    names = [p.name for p in options(get_method(method)) if p.name in EDGE_VALUES]
    chosen = rng.choice(names, size=int(rng.integers(1, 5)), replace=False)
    params: dict = {"method": method, "max_epochs": 2, "map_points": 20}
    if method == "mbn":  # small enough to be quick, and past the default 10 components
        params.update(n_clusterings=20, n_classes=2)
    params.update(SHORT_LAYOUTS.get(method, {}))
    for name in chosen:
        values = EDGE_VALUES[str(name)]
        params[str(name)] = values[int(rng.integers(len(values)))]
    return X, params


def run_case(X, params: dict) -> str:
    """One case in this process: "OK", or "ValueError: ..." (other failures propagate)."""
    from mbn_core.bundle import load_bundle
    from mbn_core.pipeline.training import train_bundle

    with tempfile.TemporaryDirectory() as directory:
        try:
            path = train_bundle(X, f"{directory}/m", name="fuzz", params=params)
        except ValueError as error:
            return f"ValueError: {error}".replace("\n", " ")[:200]
        bundle = load_bundle(path)
        rows = X[:3].astype(np.float64) if sp.issparse(X) else np.asarray(X[:3], np.float64)
        for mode in ("fast", "exact"):
            try:
                embedding = bundle.embed(rows, mode=mode)
            except ValueError as error:  # OutOfRangeInput, or the rows themselves refused
                return f"trained; {mode}: ValueError: {error}".replace("\n", " ")[:200]
            if not np.isfinite(embedding).all():
                raise AssertionError(f"{mode} embedding is not finite")
    return "OK"


def child(argv: list[str]) -> None:
    kind, method, key = argv
    if kind == "data":
        X = DEGENERATE_SETS[key]()
        params = {
            "method": method,
            "max_epochs": 2,
            "map_points": 30,
            **SHORT_LAYOUTS.get(method, {}),
        }
    else:
        X, params = params_case(method, int(key))
    print(json.dumps({"params": params, "shape": list(X.shape), "result": run_case(X, params)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["data", "params"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seeds", type=int, default=40, help="params: cases per method")
    parser.add_argument("--first-seed", type=int, default=1)
    args = parser.parse_args()
    keys = (
        list(DEGENERATE_SETS)
        if args.kind == "data"
        else [str(s) for s in range(args.first_seed, args.first_seed + args.seeds)]
    )
    refusals: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    defects = []
    for method in args.methods:
        for key in keys:
            label = f"{method} / {key}"
            try:
                done = subprocess.run(
                    [sys.executable, "-X", "faulthandler", __file__, "--child", args.kind,
                     method, key],
                    capture_output=True, text=True, timeout=CASE_TIMEOUT_SECONDS,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                defects.append(f"{label}: timed out after {CASE_TIMEOUT_SECONDS} s")
                continue
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                defects.append(f"{label}: exit status {done.returncode}: {last}")
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])["result"]
            if result == "OK":
                counts["trained and embedded"] += 1
            else:
                counts["refused with a ValueError"] += 1
                refusals[f"{method}: {result}"] += 1
            print(f"{label}: {result}", flush=True)
    print("\nRefusals (each must name its problem):")
    for message, number in sorted(refusals.items()):
        print(f"  {number} x {message}")
    print(f"\n{dict(counts)}; defects: {len(defects)}")
    for defect in defects:
        print(f"  DEFECT {defect}")
    sys.exit(1 if defects else 0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
