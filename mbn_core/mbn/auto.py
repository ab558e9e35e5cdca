"""What MBN's "auto" settings measure on the training data (never on labels).

A bottom-layer clustering codes every point by its nearest center on the clustering's chosen
input dimensions. The papers choose half of them (a = 0.5): on redundant inputs (pixels, most
tabular data) any half ranks a point's neighbours as all of them do, and the random halves
decorrelate the clusterings, which lowers the ensemble's estimation error (Theorem 1 of the
later MBN paper). On inputs without that redundancy (a 2-D or 3-D manifold, a few unrelated
measurements) a random half ranks neighbours by something else, and a clustering on it codes
noise: a 1-D projection of two concentric circles cannot tell them apart.

``bottom_feature_count`` therefore measures the redundancy. It draws random subsets of the
dimensions and scores how well the neighbourhoods on a subset are those on all dimensions
(scikit-learn's trustworthiness of the projection, k = 10, on a sample of rows, whose own
ranks ``mbn_core.utils.trust`` computes once for all subsets); it keeps the paper's half
when the subsets are faithful, and otherwise grows the subsets until they are. The threshold
``FAITHFUL`` lies in the gap between redundant inputs (images, tabular data) and
low-dimensional manifolds (docs/decisions/0002-feature-fraction-auto.md).

Redundancy is a property of what the inputs say, not of their units, so the sample's inputs are
scored at unit standard deviation. Scored as given, one input of a much larger scale sets every
neighbourhood, subsets without it look unfaithful, and the choice follows which subsets the
seed drew. The clusterings themselves still see the inputs as given.

A clustering sees at least two inputs when there are two. On one input it cuts a line into
intervals, so the ensemble's similarity becomes a sum of one-axis similarities, and groups that
overlap on each axis but not jointly (two touching blobs side by side on a diagonal) share
cells in every clustering. Trustworthiness misses this when the overlap is a small share of
the rows: single inputs of four stretched blobs pass ``FAITHFUL``, yet clusterings of one
input each mix two of the blobs.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from numba import njit
from sklearn.preprocessing import StandardScaler

from mbn_core.mbn._draws import choose_rows, uniform_below
from mbn_core.mbn.coassociation import expected_pairs
from mbn_core.utils.trust import Trustworthiness

# Mean trustworthiness of random subsets above which they count as faithful.
FAITHFUL = 0.9
# Rows and subsets scored per candidate size: trustworthiness ranks all pairs of rows.
SAMPLE_ROWS = 500
N_SUBSETS = 8
N_NEIGHBORS = 10
# Candidate sizes, as fractions of the dimensions: the paper's half first.
FRACTIONS = (0.5, 0.625, 0.75, 0.875, 1.0)


def least_bottom_features(n_features: int) -> int:
    """The paper's half of the inputs, and never fewer than two of them (one input sees no
    joint structure)."""
    return max(min(2, n_features), round(0.5 * n_features))


def unit_scale(sample: np.ndarray) -> np.ndarray:
    """The sample with each input centred at unit standard deviation. scikit-learn's scaler
    leaves an input constant up to rounding unscaled: divided by its rounding error, a
    constant 0.7 would become noise that outweighs every other input."""
    return StandardScaler().fit_transform(sample)


def bottom_feature_count(X, rng: np.random.RandomState) -> int:
    """Dimensions each bottom-layer clustering chooses under ``feature_fraction="auto"``.

    Parameters
    ----------
    X : ndarray or sparse matrix of shape (n_samples, n_features)
        The training data (validated).
    rng : RandomState
        A copy of it draws the sample of rows and the subsets: the caller's stream is left
        as it was, so the rest of the fit draws what it would with the fraction given.

    Returns
    -------
    int
        ``round(0.5 * d)`` (at least ``min(2, d)``) when random subsets of that size keep the
        neighbourhoods of the full input (every input at unit scale), else the smallest
        larger candidate that does, else ``d``. Sparse input (bag-of-words text, thousands
        of dimensions) and samples too small to rank neighbours (at most 20 rows) keep the
        half.
    """
    n_samples, n_features = X.shape
    local = np.random.RandomState()
    local.set_state(rng.get_state())
    half = least_bottom_features(n_features)
    n_rows = min(n_samples, SAMPLE_ROWS)
    # sklearn needs k < n / 2; fewer rows than that would rank neighbours by chance.
    if half == n_features or sp.issparse(X) or n_rows <= 2 * N_NEIGHBORS:
        return half
    rows = local.choice(n_samples, n_rows, replace=False)
    sample = unit_scale(np.asarray(X[rows], dtype=np.float64))
    # The sample's own neighbour ranks, once for every subset scored against them.
    faithful = Trustworthiness(sample, N_NEIGHBORS)
    sizes = sorted({max(half, round(f * n_features)) for f in FRACTIONS})
    for size in sizes:
        if size == n_features:
            break
        scores = [
            faithful.of(sample[:, local.choice(n_features, size, replace=False)])
            for _ in range(N_SUBSETS)
        ]
        if np.mean(scores) >= FAITHFUL:
            return size
    return n_features


# ---------------------------------------------------------------------- delta

# Candidate shrink factors of "auto" delta: the paper's default first, then the larger
# values it advises for very nonlinear data.
DELTAS = (0.5, 0.7, 0.9)
# Largest share of (point, clustering) pairs a layer may leave sharing no chosen code with
# any of its centers. Such a point's code is a guess (it gets center 0), and guesses shared
# by distant points glue them together in every layer above. The bound lies in the gap
# between thin manifolds (two moons, rings, rolls) and images or tabular data, so the choice
# is the data's, not the seed's (docs/decisions/0003-delta-auto.md).
MAX_ORPHANS = 0.01
# Enough pairs that the estimate's spread (about 0.04% at 1%) is small beside that gap.
ORPHAN_ROWS = 2000
ORPHAN_TRIALS = 32
# Clusterings the rate is measured over (all of them when fewer). The bound was set at the
# papers' V = 400, and each further clustering is one more chance to share a code: over all
# of a larger V the thin manifolds would pass at 0.5, and collapse there.
ORPHAN_CLUSTERINGS = 400


def orphan_rate(
    codes: np.ndarray,
    k: int,
    fraction: float,
    rng: np.random.RandomState,
    *,
    n_rows: int = ORPHAN_ROWS,
    n_trials: int = ORPHAN_TRIALS,
) -> float:
    """Share of points that a layer of k centers over ``codes`` would leave sharing nothing.

    Draws ``n_trials`` trial clusterings as ``fit`` draws them (k random training points as
    centers, each one-hot dimension kept with probability ``fraction``) and counts, on a
    sample of ``n_rows`` rows, those that share no kept code with any center.
    """
    n_samples, n_clusterings = codes.shape
    rows = rng.choice(n_samples, min(n_samples, n_rows), replace=False)
    row_codes = codes[rows]
    # held[v, c]: some center has code c in clustering v. A point shares a code with a
    # center exactly when its own code is held in a clustering where it is kept.
    held = np.zeros((n_clusterings, int(codes.max()) + 1), dtype=bool)
    orphans = 0
    for _ in range(n_trials):
        # NumPy's draws (the same numbers, in compiled code): rng.choice(n_samples, k,
        # replace=False), then rng.random_sample(row_codes.shape) < fraction.
        centers = choose_rows(rng, n_samples, k, 1)[0]
        kept = uniform_below(rng, row_codes.shape, fraction)  # this point's dimensions
        _hold(codes, centers, held)
        orphans += _count_orphans(row_codes, kept, held)
    return orphans / (n_trials * len(rows))


@njit(nogil=True, cache=True)
def _hold(codes, centers, held):
    """held[v, c] = some center (a row of ``codes`` in ``centers``) has code c in v."""
    held[:] = False
    for j in range(centers.shape[0]):
        for v in range(codes.shape[1]):
            held[v, codes[centers[j], v]] = True


@njit(nogil=True, cache=True)
def _count_orphans(row_codes, kept, held):
    """Rows i with no clustering v where ``kept[i, v]`` and ``held[v, row_codes[i, v]]``
    (a row stops at its first shared code: most share one early)."""
    orphans = 0
    for i in range(row_codes.shape[0]):
        shares = False
        for v in range(row_codes.shape[1]):
            if kept[i, v] and held[v, row_codes[i, v]]:
                shares = True
                break
        orphans += not shares
    return orphans


def choose_delta(
    codes: np.ndarray, k1: int, fraction: float, min_k: float, rng: np.random.RandomState
) -> float:
    """The smallest of ``DELTAS`` whose second layer leaves few points sharing nothing.

    High-dimensional data (images, text) gives every point many code-sharing neighbours,
    so the paper's 0.5 passes; a thin manifold (two rings, two moons) gives each point few,
    and halving the centers per layer leaves some points with no center among them. A
    larger delta keeps more centers per layer (and adds layers). Returns the largest
    candidate when none passes, and 0.5 when no second layer would be built. Networks of
    more than ``ORPHAN_CLUSTERINGS`` clusterings are measured on a random subset of that many,
    so the decision does not drift with V.
    """
    local = np.random.RandomState()
    local.set_state(rng.get_state())
    n_clusterings = codes.shape[1]
    if n_clusterings > ORPHAN_CLUSTERINGS:
        subset = np.sort(local.choice(n_clusterings, ORPHAN_CLUSTERINGS, replace=False))
        codes = codes[:, subset]
    for delta in DELTAS:
        k = int(delta * k1)
        if k < min_k:
            return delta
        if orphan_rate(codes, k, fraction, local) <= MAX_ORPHANS:
            return delta
    return DELTAS[-1]


# ---------------------------------------------------------------------- output

# Most co-association pairs (``expected_pairs``' estimate) for which "auto" may pick the UMAP
# output: about all of MNIST at k1 = 8,000, where the output is a small part of the fit. The
# fit visits every pair, so beyond that the PCA output serves. (The model keeps n V bottom
# codes, and "umap" n V top codes too.)
UMAP_OUTPUT_MAX_PAIRS = 250_000_000


def thin_manifold_is_measurable(n_samples: int, n_clusterings: int, k1: int) -> bool:
    """Whether ``choose_delta``'s measurement can tell a thin manifold from other data, and
    the UMAP output is affordable, for a network of this size.

    The orphan bound was measured at the papers' V = 400 clusterings and k1 = n / 2. Fewer
    clusterings give every point fewer chances to share a code, and more bottom centers leave
    fewer rows per cell, so images orphan too (digits at V = 40, or at k1 = n, where no two
    rows share a cell); there the output stays the papers' PCA.
    """
    return (
        n_clusterings >= ORPHAN_CLUSTERINGS
        and k1 <= round(0.5 * n_samples)
        and expected_pairs(n_samples, n_clusterings, k1) <= UMAP_OUTPUT_MAX_PAIRS
    )


def choose_output(delta: float, upper_layers_given: bool = False) -> str:
    """The output of ``output="auto"`` where ``thin_manifold_is_measurable``: "umap-bottom"
    on a thin manifold, else "pca". Where the caller gave the upper layers (a number for
    delta, several ks), a thin manifold keeps them and gets "umap", which lays out the
    bottom x top co-association.

    ``delta`` is ``choose_delta``'s measurement: above the paper's 0.5 when that would leave
    more than ``MAX_ORPHANS`` of the points sharing no code with the second layer's centers.
    That happens when each point has few code-sharing neighbours (two moons, rings, rolls,
    unlike images and tabular data), and there the coarse layers' clusters straddle the
    manifold's branches. PCA of the top codes keeps those merges, and so does any
    similarity that weighs the top layer; UMAP's layout of the bottom layer's local cells
    alone keeps the branches apart (docs/decisions/0004-output-auto.md).
    """
    if delta <= DELTAS[0]:
        return "pca"
    return "umap" if upper_layers_given else "umap-bottom"
