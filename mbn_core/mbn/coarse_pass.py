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
dividing it (``_level_error``; the rows' values are whole numbers, so nothing underflows),
so ``|P^T (x - w)| / s >= |r_x - r_w| - sqrt(m) (1 + 2 e)``.
A center at distance at most ``sqrt(d)`` therefore has
``|r_x - r_w| <= sigma sqrt(d) / s + sqrt(m) (1 + 2 e)``, and every such center is scored.
The nearest center and every center tied with it are among them, so the codes are the
integer path's, bit for bit; tests compare the two.

Data the projection does not separate (noise-like rows, where most centers stay within
reach) would cost more than the full GEMM: once a few thousand rows show that more than
``MAX_SCORED_SHARE`` of their pairs needed scoring, the rest of the rows take the integer
path, which gives the same codes.

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
    integer_codes,
)

# Directions of the coarse pass: its GEMM costs m / d of the full one, and fewer directions
# leave more centers to score exactly (MNIST, k1 = 8,000: 32 leave 1.3% of the pairs, 64
# leave 0.4%, 80 0.3% for a dearer GEMM).
DIMENSIONS = 64
# Chosen dimensions it takes: from 4 m (at 2 m, 128, image-like rows ran 1.2x the integer
# path's time; at 392, MNIST's half, 0.55-0.9x) up to where the directions' float64
# eigenproblem (d^3) stays small next to a clustering (0.3 s at 1,024 on one thread).
MIN_CHOSEN = 4 * DIMENSIONS
MAX_CHOSEN = 1024
# Where it pays, against the integer path (MNIST, one thread, 1,000-8,000 centers and
# 10,000-70,000 rows): it saves about 1.35 ns per (row, center) pair, and costs about as much
# per row as ROW_CENTERS centers' pairs (the projection, the passes over the coarse
# distances, the exact scoring of the nearest) and per call as CALL_PAIRS pairs (the
# directions, the packed GEMM).
ROW_CENTERS = 1600
CALL_PAIRS = 20_000_000
# Scoring a pair exactly costs about a dozen pairs of the full GEMM (its center's row is
# fetched from cache), so past this share of pairs scored the pass no longer pays; it is
# judged on the rows done once there are CHECKED_ROWS of them.
MAX_SCORED_SHARE = 0.04
CHECKED_ROWS = 2048
# Rows per block of the integer GEMM: their (rows, k) int32 products stay in a core's cache
# for the pass that reads them.
BLOCK_ROWS = 32
# Rows per block of the float32 projection.
PROJECT_ROWS = 1024
# The largest level: r in [-MAX_LEVEL, MAX_LEVEL], so that r + 128 is a uint8 and r an int8,
# and m r^2 sums exactly in float32 for any m up to 1,056.
MAX_LEVEL = 126
# Beyond this error in levels, the bound would leave too many centers to be worth it.
MAX_LEVEL_ERROR = 0.25
_UNIT_ROUNDOFF = 2.0**-24  # float32


def pays(n_rows: int, centers: IntegerCenters) -> bool:
    """Whether ``coarse_codes`` should encode ``n_rows`` rows against ``centers``: Euclidean,
    a measured range of chosen dimensions, and enough rows and centers that the pairs it
    saves outweigh its cost per row and per call."""
    n_chosen, k = centers.b.shape
    return (
        centers.metric == "euclidean"
        and MIN_CHOSEN <= n_chosen <= MAX_CHOSEN
        and n_rows * (k - ROW_CENTERS) > CALL_PAIRS
    )


def coarse_codes(
    rows: IntegerRows, features: np.ndarray, centers: IntegerCenters
) -> np.ndarray | None:
    """Nearest center of every row (lowest index on ties), as ``integer_codes`` gives it.

    Parameters
    ----------
    rows : IntegerRows
    features : ndarray of shape (d_chosen,)
        The clustering's chosen input dimensions.
    centers : IntegerCenters
        The clustering's Euclidean centers (``integer_centers``, with ``rows.low``).

    Returns
    -------
    codes : ndarray of shape (n,), int32, or None
        None where the projection cannot bound distances usefully, for the caller to take
        the integer path: rows and centers alike in every direction, or float32's error
        above ``MAX_LEVEL_ERROR`` of a level (rows spread over very few values).
    """
    n_rows = rows.shape[0]
    # The centers in the rows' uint8 shift, one center per row (b holds w' - 128).
    w = np.ascontiguousarray((centers.b.T.astype(np.int16) + 128).astype(np.uint8))
    n_chosen = w.shape[1]
    if n_chosen * 255**2 >= 2**31:
        raise ValueError(f"{n_chosen} dimensions overflow the exact int32 squared distances")
    m = min(DIMENSIONS, n_chosen)
    directions = _principal_directions(w, m)
    shift = np.round(w.mean(axis=0, dtype=np.float64)).astype(np.float32)
    y, largest_row_norm = _projected(rows, features, shift, directions)
    w_shifted = w.astype(np.float32) - shift
    y_w = w_shifted @ directions
    center_norms = np.einsum("ij,ij->i", w_shifted, w_shifted, dtype=np.float64)
    largest_norm = max(largest_row_norm, float(np.sqrt(center_norms.max())))
    # The largest magnitude, without an |y| the size of y.
    top = float(max(y.max(initial=0.0), -y.min(initial=0.0), np.abs(y_w).max(initial=0.0)))
    if top == 0.0:
        return None
    scale = np.float32(top / MAX_LEVEL)
    exact_directions = directions.astype(np.float64)  # the float32 values, for the bound
    error = _level_error(n_chosen, exact_directions, largest_norm, float(scale))
    if error > MAX_LEVEL_ERROR:
        return None
    sigma = float(np.linalg.norm(exact_directions, 2))
    # Within reach of a row whose nearest-in-levels center is at squared distance d_ub:
    # |r_x - r_w| <= sqrt(d_ub) * per_distance + slack (the module's bound).
    per_distance = sigma * (1 + 1e-9) / float(scale)
    slack = float(np.sqrt(m) * (1 + 2 * error))
    # The rows' levels in place of their projections (whole numbers of at most MAX_LEVEL).
    r = np.rint(np.divide(y, scale, out=y), out=y)
    row_terms = np.einsum("ij,ij->i", r, r).astype(np.int64)
    levels = np.empty(r.shape, dtype=np.uint8)
    np.add(r, 128, out=levels, casting="unsafe")
    r_w = np.rint(y_w / scale).astype(np.int32)
    # |r_x - r_w|^2 = |r_x|^2 - 2 (r_x + 128).r_w + |r_w|^2 + 256 sum(r_w): the GEMM takes
    # r_x + 128 (uint8) and r_w (int8).
    center_terms = (np.einsum("ij,ij->i", r_w, r_w) + 256 * r_w.sum(axis=1)).astype(np.int32)
    gemm = BlockGemm(np.ascontiguousarray(r_w.T.astype(np.int8)), BLOCK_ROWS, packed=True)
    x = np.empty((BLOCK_ROWS, n_chosen), dtype=np.uint8)
    codes = np.empty(n_rows, dtype=np.int32)
    scored = 0
    for start in range(0, n_rows, BLOCK_ROWS):
        if start >= CHECKED_ROWS and scored > MAX_SCORED_SHARE * start * len(w):
            rest = IntegerRows(shifted=rows.shifted[start:], low=rows.low)
            codes[start:] = integer_codes(rest, features, centers)
            break
        stop = min(start + BLOCK_ROWS, n_rows)
        gemm.rows(stop - start)[:] = levels[start:stop]
        dots = gemm.run(stop - start)
        # Gathered again (``_projected`` gathered them once): holding every row's chosen
        # values would cost n * d bytes per thread, the block costs a few kilobytes.
        gather_columns(rows.shifted, start, features, x[: stop - start])
        scored += _coarse_kernels.nearest_within_reach(
            dots, center_terms, row_terms[start:stop], per_distance, slack, x[: stop - start],
            w, codes[start:stop],
        )  # fmt: skip
    return codes


def _principal_directions(w: np.ndarray, m: int) -> np.ndarray:
    """(d, m) float32: the centers' m leading principal directions (any orthonormal
    directions keep the bound; these leave the fewest centers to score)."""
    values = w.astype(np.float64)
    values -= values.mean(axis=0)
    _, vectors = np.linalg.eigh(values.T @ values)
    return np.ascontiguousarray(vectors[:, ::-1][:, :m], dtype=np.float32)


def _projected(
    rows: IntegerRows, features: np.ndarray, shift: np.ndarray, directions: np.ndarray
) -> tuple[np.ndarray, float]:
    """((n, m) float32 ``(x - shift) @ directions``, the largest ``|x - shift|``), a block of
    rows at a time on the chosen ``features`` (``x - shift`` is whole numbers of at most 255
    in magnitude, exact in float32)."""
    n_rows = rows.shape[0]
    y = np.empty((n_rows, directions.shape[1]), dtype=np.float32)
    gathered = np.empty((PROJECT_ROWS, len(features)), dtype=np.uint8)
    block = np.empty((PROJECT_ROWS, len(features)), dtype=np.float32)
    largest = 0.0
    for start in range(0, n_rows, PROJECT_ROWS):
        stop = min(start + PROJECT_ROWS, n_rows)
        part = block[: stop - start]
        gather_columns(rows.shifted, start, features, gathered[: stop - start])
        np.subtract(gathered[: stop - start], shift, out=part)
        # Squared norms of whole numbers, exact in float64.
        norms = np.einsum("ij,ij->i", part, part, dtype=np.float64)
        largest = max(largest, float(norms.max()))
        np.matmul(part, directions, out=y[start:stop])
    return y, float(np.sqrt(largest))


def _level_error(n_chosen: int, directions: np.ndarray, largest_norm: float, scale: float) -> float:
    """A bound, in levels, on how far float32 puts ``y / s`` from its exact value.

    A float32 dot product of length d errs by at most ``gamma_d`` times the sum of its terms'
    magnitudes (in any order of summation), which Cauchy-Schwarz bounds by
    ``|x - shift| |P_k|``, at most ``largest_norm`` times the largest column norm of ``P``;
    the division adds one rounding, at most ``MAX_LEVEL + 1`` units of roundoff in levels.
    ``directions`` are ``P``'s float32 values in float64.
    """
    gamma = n_chosen * _UNIT_ROUNDOFF / (1 - n_chosen * _UNIT_ROUNDOFF)
    column_norm = float(np.sqrt((directions**2).sum(axis=0)).max())
    # Rounded up a little: the bound's own float64 arithmetic.
    dot_error = gamma * largest_norm * column_norm * (1 + 1e-9)
    return dot_error / scale + (MAX_LEVEL + 1) * _UNIT_ROUNDOFF
