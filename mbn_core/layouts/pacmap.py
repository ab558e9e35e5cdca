"""PaCMAP (Wang, Huang, Rudin and Shaposhnik 2021), with its ``transform`` as exact map.

PaCMAP's ``transform`` pairs each new row with its nearest training rows (the basis) and moves
it, alone, by the attraction of those pairs against the fixed layout; rows do not act on one
another, so a row's place does not depend on the rows sent with it. The library keeps an
approximate index (HNSW) of the basis; here the basis is searched exactly, and the fitted
preprocessing (scaling, PCA) is kept as plain arrays, so a model rebuilt from them places rows
as the fitted one did.
"""

from __future__ import annotations

from numbers import Integral, Real
from types import ModuleType
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from mbn_core.layouts.base import LayoutMethod, matrix_array
from mbn_core.params import Interval, StrOptions

_SEED_RANGE = 2**31 - 1
# PaCMAP's phases: the first two iterations counts are fixed (its default schedule).
_PHASES = (100, 100)


class PaCMAP(LayoutMethod):
    """PaCMAP, as a transformer whose ``transform`` is PaCMAP's with the training rows as basis.

    Parameters
    ----------
    n_components : int, default=2
        Dimension of the layout.
    n_neighbors : int, default=10
        Near pairs per row (needs n_neighbors + 2 rows).
    MN_ratio : float, default=0.5
        Mid-near pairs per row, as a share of ``n_neighbors``.
    FP_ratio : float, default=2.0
        Further pairs per row, as a share of ``n_neighbors``.
    distance : {"euclidean", "manhattan", "angular"}, default="euclidean"
        Distance between input rows.
    layout_learning_rate : float, default=1.0
        Adam's step size of the layout.
    num_iters : int, default=450
        Iterations of the layout (the last phase gets all but the first 200).
    apply_pca : bool, default=True
        Project input wider than 100 features onto its first 100 principal components
        first (else the input is scaled to [0, 1] and centred).
    init : {"pca", "random"}, default="pca"
        Starting positions of the layout.
    random_state : int, RandomState instance or None, default=None
        Seed of the pair sampling; set, the neighbour search runs on one thread.
    n_jobs : int or None, default=None
        Threads; None means one.
    """

    title = "PaCMAP"
    library = "pacmap"
    distribution = "pacmap"

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, 100, closed="both")],
        "n_neighbors": [Interval(Integral, 1, 10_000, closed="both")],
        "MN_ratio": [Interval(Real, 0, 100, closed="left")],
        "FP_ratio": [Interval(Real, 0, 100, closed="left")],
        "distance": [StrOptions({"euclidean", "manhattan", "angular"})],
        "layout_learning_rate": [Interval(Real, 0, 1e4, closed="neither")],
        "num_iters": [Interval(Integral, sum(_PHASES) + 1, 100_000, closed="both")],
        "apply_pca": ["boolean"],
        "init": [StrOptions({"pca", "random"})],
        "random_state": ["random_state"],
        "n_jobs": [Interval(Integral, 1, None, closed="left"), None],
    }

    def __init__(
        self,
        n_components: int = 2,
        n_neighbors: int = 10,
        MN_ratio: float = 0.5,
        FP_ratio: float = 2.0,
        distance: str = "euclidean",
        layout_learning_rate: float = 1.0,
        num_iters: int = 450,
        apply_pca: bool = True,
        init: str = "pca",
        random_state: int | np.random.RandomState | None = None,
        n_jobs: int | None = None,
    ) -> None:
        self.n_components = n_components
        self.n_neighbors = n_neighbors
        self.MN_ratio = MN_ratio
        self.FP_ratio = FP_ratio
        self.distance = distance
        self.layout_learning_rate = layout_learning_rate
        self.num_iters = num_iters
        self.apply_pca = apply_pca
        self.init = init
        self.random_state = random_state
        self.n_jobs = n_jobs

    def _rows_needed(self) -> tuple[int, str]:
        # Each row needs n_neighbors near pairs and at least one further row to sample.
        return max(self.n_neighbors + 2, self.n_components + 2, 4), (
            f"n_neighbors={self.n_neighbors}"
        )

    def _check_features(self, n_features: int) -> None:
        # PaCMAP fits a PCA of n_components on narrow input whatever the start.
        self._check_pca_start(n_features, "PaCMAP")

    def _reducer(self, module: ModuleType) -> Any:
        seed = self.random_state
        if seed is not None and not isinstance(seed, Integral):
            seed = int(check_random_state(seed).randint(_SEED_RANGE))
        return module.PaCMAP(
            n_components=self.n_components,
            n_neighbors=self.n_neighbors,
            MN_ratio=self.MN_ratio,
            FP_ratio=self.FP_ratio,
            distance=self.distance,
            lr=self.layout_learning_rate,
            num_iters=(*_PHASES, self.num_iters - sum(_PHASES)),
            apply_pca=self.apply_pca,
            random_state=None if seed is None else int(seed),
            save_tree=False,
            verbose=False,
        )

    def _fit_layout(self, module: ModuleType, X: np.ndarray) -> np.ndarray:
        _quiet(module)
        reducer = self._reducer(module)
        embedding = reducer.fit_transform(X.copy(), init=self.init)
        # The fitted preprocessing as arrays: scaling, and a projection (PCA's, or for the
        # start only) as mean and components.
        projection = reducer.tsvd_transformer
        self.prep_ = {
            "pca_solution": np.array([bool(reducer.pca_solution)]),
            "xmin": np.array([float(reducer.xmin)], dtype=np.float32),
            "xmax": np.array([float(reducer.xmax)], dtype=np.float32),
            "xmean": np.asarray(reducer.xmean, dtype=np.float32).reshape(1, -1),
            "projection_mean": np.asarray(
                getattr(projection, "mean_", np.zeros(X.shape[1])), dtype=np.float32
            ).reshape(1, -1),
            "projection": np.asarray(projection.components_, dtype=np.float32),
        }
        self.embedding_ = np.asarray(embedding, dtype=np.float32)
        self.basis_ = self._preprocess(module, X)
        return self.embedding_

    def _preprocess(self, module: ModuleType, X: np.ndarray) -> np.ndarray:
        """Rows as PaCMAP's search sees them (its preprocessing of new rows)."""
        return np.ascontiguousarray(
            module.pacmap.preprocess_X_new(
                X.copy(),
                self.distance,
                float(self.prep_["xmin"][0]),
                float(self.prep_["xmax"][0]),
                self.prep_["xmean"][0],
                _Projection(self.prep_["projection_mean"][0], self.prep_["projection"]),
                self.apply_pca,
                False,
            ),
            dtype=np.float32,
        )

    def _transform(self, module: ModuleType, X: np.ndarray) -> np.ndarray:
        import faiss

        _quiet(module)
        reducer = self._reducer(module)
        reducer.embedding_ = self.embedding_
        reducer.xmin = float(self.prep_["xmin"][0])
        reducer.xmax = float(self.prep_["xmax"][0])
        reducer.xmean = self.prep_["xmean"][0]
        reducer.tsvd_transformer = _Projection(
            self.prep_["projection_mean"][0], self.prep_["projection"]
        )
        reducer.pca_solution = bool(self.prep_["pca_solution"][0])
        reducer.intermediate = False
        reducer.tree = _exact_tree(faiss, self.basis_, self.distance)
        faiss.omp_set_num_threads(1 if self.n_jobs is None else int(self.n_jobs))
        placed = reducer.transform(X.copy(), init=self.init, save_pairs=False)
        return np.asarray(placed, dtype=np.float32)

    def _state(self) -> dict[str, np.ndarray]:
        return {"embedding": self.embedding_, "basis": self.basis_} | {
            f"prep.{key}": value for key, value in self.prep_.items()
        }

    def _restore(self, arrays: dict[str, np.ndarray]) -> None:
        basis = matrix_array(arrays, "basis", columns=_basis_width(arrays))
        self.basis_ = np.ascontiguousarray(basis, dtype=np.float32)
        embedding = matrix_array(arrays, "embedding", rows=len(basis), columns=self.n_components_)
        self.embedding_ = np.ascontiguousarray(embedding, dtype=np.float32)
        prep = {}
        for key in ("pca_solution", "xmin", "xmax", "xmean", "projection_mean", "projection"):
            name = f"prep.{key}"
            if name not in arrays:
                raise ValueError(f"array {name!r} is missing")
            prep[key] = np.asarray(arrays[name])
        d = self.n_features_in_
        if prep["xmean"].shape != (1, d) or prep["projection_mean"].shape != (1, d):
            raise ValueError(f"arrays 'prep.xmean' and 'prep.projection_mean' must be 1 x {d}")
        if prep["projection"].ndim != 2 or prep["projection"].shape[1] != d:
            raise ValueError(f"array 'prep.projection' must have {d} columns")
        self.prep_ = prep


class _Projection:
    """A fitted PCA or truncated SVD as PaCMAP uses it: ``transform`` only."""

    def __init__(self, mean: np.ndarray, components: np.ndarray) -> None:
        self.mean, self.components = mean, components

    def transform(self, X: np.ndarray) -> np.ndarray:
        return (X - self.mean) @ self.components.T


def _basis_width(arrays: dict[str, np.ndarray]) -> int:
    basis = np.asarray(arrays.get("basis", np.zeros((0, 0))))
    return int(basis.shape[1]) if basis.ndim == 2 else -1


def _exact_tree(faiss: ModuleType, basis: np.ndarray, distance: str) -> Any:
    """A faiss index that searches the basis exactly, as PaCMAP's query code reads it."""
    dim = basis.shape[1]
    if distance == "angular":
        tree = faiss.IndexFlatIP(dim)
        normed = basis.copy()
        faiss.normalize_L2(normed)
        tree.add(normed)
    elif distance == "manhattan":
        tree = faiss.IndexFlat(dim, faiss.METRIC_L1)
        tree.add(basis)
    else:
        tree = faiss.IndexFlatL2(dim)
        tree.add(basis)
    return tree


def _quiet(module: ModuleType) -> None:
    # PaCMAP logs a warning whenever a seed is set.
    import logging

    logging.getLogger(module.pacmap.__name__).setLevel(logging.ERROR)
