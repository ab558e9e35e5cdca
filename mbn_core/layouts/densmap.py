"""densMAP by umap-learn (Narayan, Berger and Cho 2021): UMAP that keeps local density.

densMAP adds to UMAP's objective a term that makes each point's local radius in the layout
follow its radius in the input, so dense clusters stay small and sparse ones wide.
umap-learn has no procedure to place new rows in a densMAP layout (its ``transform``
refuses), so the distilled network is the only way to embed them.
"""

from __future__ import annotations

from numbers import Real

import numpy as np

from mbn_core.layouts.umap import UMAPLayout
from mbn_core.params import Interval


class DensMAP(UMAPLayout):
    """densMAP by umap-learn, as a transformer with no ``transform`` of its own.

    Parameters
    ----------
    n_neighbors : int, default=15
        Neighbours of each row in the fuzzy graph (needs n_neighbors + 1 rows).
    n_components : int, default=2
        Dimension of the layout.
    min_dist : float, default=0.1
        Closest distance of points in the layout.
    spread : float, default=1.0
        Scale of the layout's distances, with ``min_dist``.
    metric : {"euclidean", "cosine", "manhattan", "correlation"}, default="euclidean"
        Distance between input rows.
    n_epochs : int or None, default=None
        Epochs of the layout; None is 500 below 10,000 rows and 200 above.
    init : {"spectral", "pca", "random"}, default="spectral"
        Starting positions of the layout.
    layout_learning_rate : float, default=1.0
        First step size of the layout's optimisation.
    repulsion_strength : float, default=1.0
        Weight of the negative samples' repulsion.
    negative_sample_rate : int, default=5
        Negative samples per positive edge and epoch.
    local_connectivity : float, default=1.0
        Neighbours each row is assumed connected to.
    set_op_mix_ratio : float, default=1.0
        Fuzzy union (1) or intersection (0) of the directed graphs.
    dens_lambda : float, default=2.0
        Weight of the density term against UMAP's own.
    dens_frac : float, default=0.3
        Share of the epochs, the last ones, that include the density term.
    dens_var_shift : float, default=0.1
        Small constant added to the variance of the local radii, for stability.
    random_state : int, RandomState instance or None, default=None
        Seed; set, the fit runs on one thread and is reproducible.
    n_jobs : int or None, default=None
        Threads when ``random_state`` is None; None means one.
    """

    title = "densMAP (umap-learn)"
    densmap = True
    exact_map = (
        "densMAP has no procedure to place new rows in its layout (umap-learn refuses to "
        "transform with densMAP); embed them with the fast path, the network distilled from "
        "the layout (mode 'fast')"
    )

    _parameter_constraints: dict = {
        **UMAPLayout._parameter_constraints,
        "dens_lambda": [Interval(Real, 0, 1e4, closed="left")],
        "dens_frac": [Interval(Real, 0, 1, closed="both")],
        "dens_var_shift": [Interval(Real, 0, 1e4, closed="left")],
    }

    def __init__(
        self,
        n_neighbors: int = 15,
        n_components: int = 2,
        min_dist: float = 0.1,
        spread: float = 1.0,
        metric: str = "euclidean",
        n_epochs: int | None = None,
        init: str = "spectral",
        layout_learning_rate: float = 1.0,
        repulsion_strength: float = 1.0,
        negative_sample_rate: int = 5,
        local_connectivity: float = 1.0,
        set_op_mix_ratio: float = 1.0,
        dens_lambda: float = 2.0,
        dens_frac: float = 0.3,
        dens_var_shift: float = 0.1,
        random_state: int | np.random.RandomState | None = None,
        n_jobs: int | None = None,
    ) -> None:
        self.n_neighbors = n_neighbors
        self.n_components = n_components
        self.min_dist = min_dist
        self.spread = spread
        self.metric = metric
        self.n_epochs = n_epochs
        self.init = init
        self.layout_learning_rate = layout_learning_rate
        self.repulsion_strength = repulsion_strength
        self.negative_sample_rate = negative_sample_rate
        self.local_connectivity = local_connectivity
        self.set_op_mix_ratio = set_op_mix_ratio
        self.dens_lambda = dens_lambda
        self.dens_frac = dens_frac
        self.dens_var_shift = dens_var_shift
        self.random_state = random_state
        self.n_jobs = n_jobs

    def _library_params(self):
        return {
            **super()._library_params(),
            "dens_lambda": self.dens_lambda,
            "dens_frac": self.dens_frac,
            "dens_var_shift": self.dens_var_shift,
        }
