"""TriMap (Amid and Warmuth 2019): a layout that keeps the order of distances in triplets.

TriMap samples triplets (a row, a near row, a farther row) and moves the layout until each
near row is nearer than the far one, weighted by how clear the order is in the input. The
library has no procedure to place new rows ("run TriMap from scratch", its authors say), so
the distilled network is the only way to embed them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from numbers import Integral, Real
from types import ModuleType

import numpy as np
from sklearn.utils import check_random_state

from mbn_core.layouts.base import LayoutMethod
from mbn_core.params import Interval, StrOptions

_SEED_RANGE = 2**31 - 1


class TriMap(LayoutMethod):
    """TriMap, as a transformer with no ``transform`` of its own.

    Parameters
    ----------
    n_components : int, default=2
        Dimension of the layout (at least 2).
    n_inliers : int, default=12
        Near rows per row in the triplets (needs n_inliers + n_outliers + 2 rows).
    n_outliers : int, default=4
        Far rows sampled per near row.
    n_random : int, default=3
        Random triplets per row.
    distance : {"euclidean", "manhattan", "angular"}, default="euclidean"
        Distance between input rows.
    layout_learning_rate : float, default=0.1
        Step size of the layout.
    n_iters : int, default=400
        Iterations of the layout.
    apply_pca : bool, default=True
        Project input wider than 100 features onto its first 100 principal components
        first.
    opt_method : {"dbd", "sd", "momentum"}, default="dbd"
        Optimiser: delta-bar-delta, plain gradient descent or momentum.
    random_state : int, RandomState instance or None, default=None
        Seed of the triplet sampling (reproducible with one thread).
    n_jobs : int or None, default=None
        Threads; None means one.
    """

    title = "TriMap"
    library = "trimap"
    distribution = "trimap"
    exact_map = (
        "TriMap has no procedure to place new rows in its layout (only a new fit on all rows "
        "would); embed them with the fast path, the network distilled from the layout "
        "(mode 'fast')"
    )

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 2, 100, closed="both")],
        "n_inliers": [Interval(Integral, 1, 1000, closed="both")],
        "n_outliers": [Interval(Integral, 1, 1000, closed="both")],
        "n_random": [Interval(Integral, 0, 1000, closed="both")],
        "distance": [StrOptions({"euclidean", "manhattan", "angular"})],
        "layout_learning_rate": [Interval(Real, 0, 1e4, closed="neither")],
        "n_iters": [Interval(Integral, 1, 100_000, closed="both")],
        "apply_pca": ["boolean"],
        "opt_method": [StrOptions({"dbd", "sd", "momentum"})],
        "random_state": ["random_state"],
        "n_jobs": [Interval(Integral, 1, None, closed="left"), None],
    }

    def __init__(
        self,
        n_components: int = 2,
        n_inliers: int = 12,
        n_outliers: int = 4,
        n_random: int = 3,
        distance: str = "euclidean",
        layout_learning_rate: float = 0.1,
        n_iters: int = 400,
        apply_pca: bool = True,
        opt_method: str = "dbd",
        random_state: int | np.random.RandomState | None = None,
        n_jobs: int | None = None,
    ) -> None:
        self.n_components = n_components
        self.n_inliers = n_inliers
        self.n_outliers = n_outliers
        self.n_random = n_random
        self.distance = distance
        self.layout_learning_rate = layout_learning_rate
        self.n_iters = n_iters
        self.apply_pca = apply_pca
        self.opt_method = opt_method
        self.random_state = random_state
        self.n_jobs = n_jobs

    def _rows_needed(self) -> tuple[int, str]:
        # A row's n_inliers + 1 neighbours (itself first) and n_outliers others beyond them.
        return self.n_inliers + self.n_outliers + 2, (
            f"n_inliers={self.n_inliers} with n_outliers={self.n_outliers}"
        )

    def _check_features(self, n_features: int) -> None:
        # TriMap starts from the principal components of its input.
        self._check_pca_start(n_features, "TriMap")

    def _fit_layout(self, module: ModuleType, X: np.ndarray) -> np.ndarray:
        reducer = module.TRIMAP(
            n_dims=self.n_components,
            n_inliers=self.n_inliers,
            n_outliers=self.n_outliers,
            n_random=self.n_random,
            distance=self.distance,
            lr=self.layout_learning_rate,
            n_iters=self.n_iters,
            apply_pca=self.apply_pca,
            opt_method=self.opt_method,
            verbose=False,
        )
        with _seeded(self.random_state):
            return np.asarray(reducer.fit_transform(X), dtype=np.float32)


@contextmanager
def _seeded(random_state) -> Iterator[None]:
    """TriMap draws from NumPy's global generator and numba's: seed both (when a seed is
    given), and give NumPy's back its state after."""
    if random_state is None:
        yield
        return
    seed = int(check_random_state(random_state).randint(_SEED_RANGE))
    state = np.random.get_state()  # noqa: NPY002 - TriMap draws from the global one
    np.random.seed(seed)  # noqa: NPY002
    _seed_numba(seed)
    try:
        yield
    finally:
        np.random.set_state(state)  # noqa: NPY002


def _seed_numba(seed: int) -> None:
    import numba

    @numba.njit(cache=False)
    def seed_generator(value):  # pragma: no cover - compiled
        np.random.seed(value)  # noqa: NPY002 - numba's own generator

    seed_generator(seed)
