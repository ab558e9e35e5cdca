"""Exact nearest centers for a bottom clustering of many rows against many centers, through
a coarse pass that rules most centers out before any is scored in full.

The integer path (``_integer_scores.integer_codes``) scores every (row, center) pair on
every chosen dimension, at the integer GEMM's peak. With thousands of centers, nearly all of
those pairs are far from a row's nearest. Here, for uint8 rows and Euclidean distance:

1. the centers' m principal directions (float64 covariance) are rounded to float32, ``P``;
2. rows and centers are projected on them (float32 GEMMs) and the projections rounded to
   8-bit levels of one scale ``s``: ``r = rint(y / s)``;
3. an integer GEMM of depth m (u8 x s8, as the integer path's) gives every pair's squared
   distance between levels;
4. per row, the center nearest in levels is scored exactly, and its squared distance ``d``
   bounds the nearest's; only centers that can be as near are scored exactly, and the
   nearest of them, lowest index on ties, is the code.

Why step 4 loses no center. For any vector v, ``|P^T v| <= sigma |v|`` (``sigma`` is
``P``'s largest singular value, 1 up to float32's rounding). Each level is within
``1/2 + e`` of the exact ``y / s``, where ``e`` bounds float32's error in computing ``y`` and
dividing it (``_level_error``), so ``|P^T (x - w)| / s >= |r_x - r_w| - sqrt(m) (1 + 2 e)``.
A center at distance at most ``sqrt(d)`` therefore has
``|r_x - r_w| <= sigma sqrt(d) / s + sqrt(m) (1 + 2 e)``, and every such center is scored.
The nearest center and every center tied with it are among them, so the codes are the
integer path's, bit for bit; tests compare the two.

Where it pays (``pays``) is measured by ``benchmarks/experiments/probe_coarse_pass.py`` and
recorded in docs/decisions/0038-bottom-layer-coarse-pass.md.
"""

from __future__ import annotations

import numpy as np

from mbn_core.mbn import _coarse_kernels
from mbn_core.mbn._integer_scores import (
    BlockGemm,
    IntegerCenters,
    IntegerRows,
    gather_columns,
)

# Directions of the coarse pass: its GEMM costs m / d of the full one, and fewer directions
# leave more centers to score exactly (MNIST, k1 = 8,000: 32 leave 1.3% of the pairs, 64
# leave 0.4%, 80 0.3% for a dearer GEMM).
DIMENSIONS = 64
# Where it pays, against the integer path (MNIST, one thread, 1,000-8,000 centers and
# 10,000-70,000 rows): it saves about 1.35 ns per (row, center) pair, and costs about as much
# per row as ROW_CENTERS centers' pairs (the projection, the passes over the coarse
# distances, the exact scoring of the nearest) and per call as CALL_PAIRS pairs (the
# directions, the packed GEMM).
ROW_CENTERS = 1600
CALL_PAIRS = 20_000_000
# Rows per block of the integer GEMM: their (rows, k) int32 products stay in a core's cache
# for the pass that reads them.
BLOCK_ROWS = 32
# Rows per block of the float32 projection.
_PROJECT_ROWS = 1024
# The levels: r in [-LEVELS, LEVELS], so that r + 128 is a uint8 and r an int8.
LEVELS = 126
# Beyond this error in levels, the bound would leave too many centers to be worth it.
_MAX_LEVEL_ERROR = 0.25
_UNIT_ROUNDOFF = 2.0**-24  # float32


def pays(n_rows: int, centers: IntegerCenters) -> bool:
    """Whether ``coarse_codes`` should encode ``n_rows`` rows against ``centers``: Euclidean,
    exact in int32, enough dimensions to project, and enough rows and centers that the
    pairs it saves outweigh its cost per row and per call."""
    n_chosen, k = centers.b.shape
    exact_in_int32 = n_chosen * 255**2 < 2**31
    return (
        centers.metric == "euclidean"
        and exact_in_int32
        and n_chosen >= 2 * DIMENSIONS
        and n_rows * (k - ROW_CENTERS) > CALL_PAIRS
    )


def coarse_codes(
    rows: IntegerRows, features: np.ndarray, centers: IntegerCenters
) -> np.ndarray | None:
    """Nearest center of every row (lowest index on ties), as ``integer_codes`` gives it,
    or None where the projection cannot bound the distances usefully (all rows and centers
    alike in every direction), for the caller to take the integer path.

    Parameters
    ----------
    rows : IntegerRows
    features : ndarray of shape (d_chosen,)
        The clustering's chosen input dimensions.
    centers : IntegerCenters
        The clustering's Euclidean centers (``integer_centers``, with ``rows.low``).
    """
    n_rows = rows.shape[0]
    # The centers in the rows' uint8 shift, one center per row (b holds w' - 128).
    w = np.ascontiguousarray((centers.b.T.astype(np.int16) + 128).astype(np.uint8))
    n_chosen = w.shape[1]
    m = min(DIMENSIONS, n_chosen)
    directions = _principal_directions(w, m)
    shift = np.round(w.mean(axis=0, dtype=np.float64)).astype(np.float32)
    x = np.empty((n_rows, n_chosen), dtype=np.uint8)
    gather_columns(rows.shifted, 0, features, x)
    y = _projected(x, shift, directions)
    y_w = (w.astype(np.float32) - shift) @ directions
    # The largest magnitude, without an |y| the size of y.
    top = float(max(y.max(initial=0.0), -y.min(initial=0.0), np.abs(y_w).max(initial=0.0)))
    if top == 0.0:
        return None
    scale = np.float32(top / LEVELS)
    error = _level_error(n_chosen, directions, float(scale))
    if error > _MAX_LEVEL_ERROR:
        return None
    sigma = float(np.linalg.norm(directions.astype(np.float64), 2))
    reach = np.array([sigma * (1 + 1e-9) / float(scale), np.sqrt(m) * (1 + 2 * error)])
    # The rows' levels in place of their projections; whole numbers of at most LEVELS, so
    # their squares' sums over m <= 64 directions are exact in float32 (below 2**24).
    r = np.rint(np.divide(y, scale, out=y), out=y)
    row_terms = np.einsum("ij,ij->i", r, r).astype(np.int64)
    levels = np.empty(r.shape, dtype=np.uint8)
    np.add(r, 128, out=levels, casting="unsafe")
    r_w = np.rint(y_w / scale).astype(np.int32)
    # |r_x - r_w|^2 = |r_x|^2 - 2 (r_x + 128).r_w + |r_w|^2 + 256 sum(r_w): the GEMM takes
    # r_x + 128 (uint8) and r_w (int8).
    center_terms = (np.einsum("ij,ij->i", r_w, r_w) + 256 * r_w.sum(axis=1)).astype(np.int32)
    gemm = BlockGemm(np.ascontiguousarray(r_w.T.astype(np.int8)), BLOCK_ROWS, packed=True)
    codes = np.empty(n_rows, dtype=np.int32)
    for start in range(0, n_rows, BLOCK_ROWS):
        stop = min(start + BLOCK_ROWS, n_rows)
        gemm.rows(stop - start)[:] = levels[start:stop]
        dots = gemm.run(stop - start)
        _coarse_kernels.nearest_within_reach(
            dots, center_terms, row_terms[start:stop], reach, x[start:stop], w,
            codes[start:stop],
        )  # fmt: skip
    return codes


def _principal_directions(w: np.ndarray, m: int) -> np.ndarray:
    """(d, m) float32: the centers' m leading principal directions (any orthonormal
    directions keep the bound; these leave the fewest centers to score)."""
    values = w.astype(np.float64)
    values -= values.mean(axis=0)
    _, vectors = np.linalg.eigh(values.T @ values)
    return np.ascontiguousarray(vectors[:, ::-1][:, :m], dtype=np.float32)


def _projected(x: np.ndarray, shift: np.ndarray, directions: np.ndarray) -> np.ndarray:
    """(n, m) float32 ``(x - shift) @ directions``, a block of rows at a time (``x - shift``
    is whole numbers of at most 255 in magnitude, exact in float32)."""
    y = np.empty((x.shape[0], directions.shape[1]), dtype=np.float32)
    block = np.empty((_PROJECT_ROWS, x.shape[1]), dtype=np.float32)
    for start in range(0, x.shape[0], _PROJECT_ROWS):
        stop = min(start + _PROJECT_ROWS, x.shape[0])
        part = block[: stop - start]
        np.subtract(x[start:stop], shift, out=part)
        np.matmul(part, directions, out=y[start:stop])
    return y


def _level_error(n_chosen: int, directions: np.ndarray, scale: float) -> float:
    """A bound, in levels, on how far float32 puts ``y / s`` from its exact value.

    A float32 dot product of length d errs by at most ``gamma_d`` times the sum of its terms'
    magnitudes (in any order of summation), which Cauchy-Schwarz bounds by
    ``|x - shift| |P_k| <= 255 sqrt(d) |P_k|``; the division adds one rounding, at most
    ``LEVELS + 1`` units of roundoff in levels.
    """
    gamma = n_chosen * _UNIT_ROUNDOFF / (1 - n_chosen * _UNIT_ROUNDOFF)
    column_norm = float(np.sqrt((directions.astype(np.float64) ** 2).sum(axis=0)).max())
    dot_error = gamma * 255.0 * np.sqrt(n_chosen) * column_norm
    return dot_error / scale + (LEVELS + 1) * _UNIT_ROUNDOFF
