"""Hot loops of MBN's bottom layer, compiled with numba: scores of rows against centers and
the nearest center with its near ties flagged.

Pure functions only: no estimator state, no validation ("prior validation of data is
assumed"). Every kernel releases the GIL so the estimator can run clusterings on several
threads, and none starts threads of its own.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from mbn_core.mbn._prefetch import prefetch_row


@njit(inline="always")
def _ordered(bits):
    """Map float32 bit patterns to int32 keys with the same order (an involution).

    Integer max reductions vectorise where float ones (NaN semantics) do not.
    """
    return bits ^ ((bits >> np.int32(31)) & np.int32(0x7FFFFFFF))


@njit(nogil=True, cache=True)
def best_scores(scores, tolerance, best, near_tie):
    """Row-wise argmax of ``scores`` and a flag for rows whose runner-up is within tolerance.

    ``best[i]`` is the lowest index holding the row maximum. ``near_tie[i]`` is set when
    another entry lies within ``tolerance[i]`` of the maximum: float32 rounding could have
    reordered such rows, so the caller re-ranks them exactly. Scores must be finite.
    """
    n_rows, n_cols = scores.shape
    bits = scores.view(np.int32)
    top_bits = np.empty(1, np.int32)
    top_value = top_bits.view(np.float32)
    for i in range(n_rows):
        keys = bits[i]
        top = _ordered(keys[0])
        for j in range(1, n_cols):
            top = max(top, _ordered(keys[j]))
        top_bits[0] = _ordered(top)
        floor = top_value[0] - tolerance[i]
        row = scores[i]
        close = np.int32(0)
        first = np.int32(n_cols)
        for j in range(n_cols):
            close += np.int32(row[j] >= floor)
            first = min(first, np.int32(j) if _ordered(keys[j]) == top else np.int32(n_cols))
        best[i] = first
        near_tie[i] = close > 1


@njit(nogil=True, cache=True)
def gather_rows(data, rows, columns, out):
    """out[i, c] = data[rows[i], columns[c]] as float32 (``np.ix_`` indexing, without its cost)."""
    for i in range(rows.shape[0]):
        r = rows[i]
        for c in range(columns.shape[0]):
            out[i, c] = np.float32(data[r, columns[c]])


@njit(nogil=True, cache=True)
def squared_norms(values, out):
    """float64 squared norms of the rows of float32 ``values``, each summed in index order."""
    for j in range(values.shape[0]):
        total = 0.0
        for f in range(values.shape[1]):
            value = np.float64(values[j, f])
            total += value * value
        out[j] = total


# Reassociation lets the dot products vectorise. The caller's rounding-error bound holds for
# any summation order, and near ties are re-ranked exactly, so the codes do not change.
@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def bottom_scores_direct(X_chosen, center_data, rows, mask, shifted, cosine, scores, sq_norms):
    """Float32 scores of a few rows against one bottom clustering's centers.

    Computes what the GEMM of ``bottom_clustering_codes`` computes (x.w - |w|^2 / 2, or the
    cosine similarity) straight from the stored center rows, without gathering the (k, d)
    center matrix. ``X_chosen`` is the input with the dimensions not chosen zeroed (``mask``
    is 1 on the chosen ones); the dimensions listed in ``shifted`` take the previous
    center's value (the random reconstruction). ``sq_norms`` receives the centers' squared
    norms on the chosen dimensions.
    """
    n_points, k = scores.shape
    d = center_data.shape[1]
    values = np.empty(d, np.float32)
    for j in range(k):
        r = rows[j]
        sq = 0.0
        if shifted.shape[0] == 0:
            # One pass over the stored row: the first point's score and the norm together.
            acc = np.float32(0.0)
            for f in range(d):
                value = np.float32(center_data[r, f])
                acc += X_chosen[0, f] * value
                sq += np.float64(value * mask[f]) * np.float64(value)
            first = acc
            if n_points > 1:
                for f in range(d):
                    values[f] = np.float32(center_data[r, f])
        else:
            previous = rows[j - 1] if j > 0 else rows[k - 1]
            for f in range(d):
                values[f] = np.float32(center_data[r, f])
            for f in shifted:
                values[f] = np.float32(center_data[previous, f])
            for f in range(d):
                sq += np.float64(values[f] * mask[f]) * np.float64(values[f])
            first = np.float32(0.0)
            for f in range(d):
                first += X_chosen[0, f] * values[f]
        sq_norms[j] = sq
        safe = np.sqrt(sq) if sq > 0 else 1.0
        bias = np.float32(0.0) if cosine else np.float32(-0.5 * sq)
        for i in range(n_points):
            if i == 0:
                acc = first
            else:
                acc = np.float32(0.0)
                for f in range(d):
                    acc += X_chosen[i, f] * values[f]
            scores[i, j] = np.float32(acc / safe) if cosine else acc + bias


@njit(nogil=True, cache=True)
def bottom_center_norms(center_data, centers, masks, out):
    """out[v, j]: float64 squared norm of clustering v's center j on its chosen dimensions,
    summed as ``bottom_scores_direct`` sums it."""
    V, k = centers.shape
    d = center_data.shape[1]
    for v in range(V):
        for j in range(k):
            r = centers[v, j]
            sq = 0.0
            for f in range(d):
                value = np.float32(center_data[r, f])
                sq += np.float64(value * np.float32(masks[v, f])) * np.float64(value)
            out[v, j] = sq


# Reassociation lets the dot products vectorise. The rounding-error bound holds for any
# summation order, and near ties are re-ranked exactly, so the codes do not change.
@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def bottom_codes_few(
    X, center_data, row_start, pairs, masks, sq_norms, cosine, tolerance_scale, row_norms,
    codes, near_tie,
):  # fmt: skip
    """Nearest center of a few rows in every bottom clustering, straight from the stored rows.

    ``X`` is the dense input (n, d); ``masks[v]`` is 1 on clustering v's chosen dimensions
    and 0 elsewhere; ``row_start`` / ``pairs`` list, for each stored center row, the
    (clustering, center) pairs that use it (``build_row_pairs``); ``sq_norms`` comes from
    ``bottom_center_norms``. Each stored row is read once, in order, and scored against
    every clustering that uses it: the layer's V x k center rows are mostly the same few
    thousand rows, so this reads ``center_data`` once instead of V x k random rows. Scores
    are ``bottom_scores_direct``'s (float32, any summation order: the error bound holds for
    all); ``near_tie[i, v]`` flags a runner-up within the rounding-error bound times
    ``tolerance_scale``, which the caller re-ranks exactly. Without random reconstruction.
    """
    n_points, d = X.shape
    V, k = sq_norms.shape
    n_rows = row_start.shape[0] - 1
    unit = np.float64(np.finfo(np.float32).eps) / 2
    x = np.empty((V, d), np.float32)
    values = np.empty(d, np.float32)
    scores = np.empty((V, k), np.float32)
    n_chosen = np.zeros(V, np.int64)
    w_max = np.zeros(V, np.float64)
    for v in range(V):
        for f in range(d):
            n_chosen[v] += np.int64(masks[v, f])
        for j in range(k):
            w_max[v] = max(w_max[v], np.float64(sq_norms[v, j]))
        w_max[v] = np.sqrt(w_max[v])
    for i in range(n_points):
        for v in range(V):
            for f in range(d):
                x[v, f] = X[i, f] * np.float32(masks[v, f])
        for r in range(n_rows):
            if row_start[r] == row_start[r + 1]:
                continue
            for f in range(d):
                values[f] = np.float32(center_data[r, f])
            for p in range(row_start[r], row_start[r + 1]):
                key = np.int64(pairs[p])
                v = key // k
                acc = np.float32(0.0)
                for f in range(d):
                    acc += x[v, f] * values[f]
                scores[v, key - v * k] = acc
        for v in range(V):
            gamma = (n_chosen[v] + 1) * unit / (1 - (n_chosen[v] + 1) * unit)
            if cosine:
                per_norm = gamma + 2 * unit
                const = 0.0
            else:
                per_norm = (gamma + unit) * w_max[v]
                const = (gamma + unit) * 0.5 * w_max[v] * w_max[v]
            for j in range(k):
                sq = np.float64(sq_norms[v, j])
                if cosine:
                    safe = np.sqrt(sq) if sq > 0 else 1.0
                    scores[v, j] = np.float32(scores[v, j] / safe)
                else:
                    scores[v, j] = scores[v, j] + np.float32(-0.5 * sq)
            tolerance = np.float32(tolerance_scale * (per_norm * row_norms[i] + const))
            top = scores[v, 0]
            first = 0
            for j in range(1, k):
                if scores[v, j] > top:
                    top = scores[v, j]
                    first = j
            floor = top - tolerance
            close = np.int64(0)
            for j in range(k):
                close += np.int64(scores[v, j] >= floor)
            codes[i, v] = first
            near_tie[i, v] = close > 1


# Rows and centers scored together in ``bottom_codes_batch``'s register tile: each pass over
# a dimension loads 4 row values and 2 center values for 8 products.
TILE_ROWS = 4


@njit(nogil=True, cache=True)
def _grown(array):
    """``array`` with twice its rows, the first rows copied (a growing output buffer)."""
    return np.concatenate((array, np.empty_like(array)))


# Reassociation lets the dot products vectorise. The rounding-error bound holds for any
# summation order, and near ties are re-ranked exactly, so the codes do not change.
@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def bottom_codes_batch(
    X, center_data, centers, masks, sq_norms, cosine, tolerance_scale, row_norms, codes, ties,
    candidates,
):  # fmt: skip
    """Nearest center of a small batch of rows in every bottom clustering, clustering by
    clustering, several rows per pass over each center.

    ``X`` is the dense input (n, d); ``masks[v]`` is 1 on clustering v's chosen dimensions
    and 0 elsewhere; ``sq_norms`` comes from ``bottom_center_norms``. For each clustering the
    rows are gathered once on its active dimensions (chosen, and nonzero in some row), then
    each center's stored row is gathered once on them and scored against ``TILE_ROWS`` rows
    at a time (two centers per tile), so a row costs a fraction of what ``bottom_codes_few``
    costs it alone, which reads a masked copy of the row per center.
    Scores are ``bottom_codes_few``'s (float32, any summation order: the error bound holds
    for all), and so are the tolerances.

    Near ties (a runner-up within the rounding-error bound times ``tolerance_scale``) are
    listed for the caller to re-rank exactly: tie t is row ``ties[t, 0]`` in clustering
    ``ties[t, 1]``, with candidate centers ``candidates[ties[t, 2]:ties[t, 3]]`` (every
    center scoring within the tolerance of the best). ``codes`` holds the float32 best
    meanwhile. Returns (number of ties, ties, candidates): the buffers grow when full, so
    the caller reads the returned ones.
    """
    n_points, d = X.shape
    V, k = centers.shape
    unit = np.float64(np.finfo(np.float32).eps) / 2
    padded = (n_points + TILE_ROWS - 1) // TILE_ROWS * TILE_ROWS
    x = np.zeros((padded, d), np.float32)  # rows on the active dimensions; padding stays 0
    first_values = np.empty(d, np.float32)
    second_values = np.empty(d, np.float32)
    scores = np.empty((padded, k), np.float32)
    active = np.empty(d, np.int64)
    n_ties = 0
    n_candidates = 0
    for v in range(V):
        n_chosen = np.int64(0)
        for f in range(d):
            n_chosen += np.int64(masks[v, f])
        # The dimensions that can add to a score: chosen, and nonzero in some row (images
        # are mostly zeros). A zero product adds nothing, so the scores are the same sums.
        n_active = 0
        for f in range(d):
            if masks[v, f]:
                nonzero = False
                for i in range(n_points):
                    nonzero |= X[i, f] != 0
                if nonzero:
                    active[n_active] = f
                    n_active += 1
        for i in range(n_points):
            for t in range(n_active):
                x[i, t] = X[i, active[t]]
        w_max = 0.0
        for j in range(k):
            w_max = max(w_max, np.float64(sq_norms[v, j]))
        w_max = np.sqrt(w_max)
        for j in range(0, k, 2):
            other = min(j + 1, k - 1)  # an odd k scores its last center twice
            if j + 3 < k:  # the next pair's rows, scattered over the stored rows
                prefetch_row(center_data, np.int64(centers[v, j + 2]))
                prefetch_row(center_data, np.int64(centers[v, j + 3]))
            first_row = np.int64(centers[v, j])
            second_row = np.int64(centers[v, other])
            for t in range(n_active):
                first_values[t] = np.float32(center_data[first_row, active[t]])
                second_values[t] = np.float32(center_data[second_row, active[t]])
            for i in range(0, padded, TILE_ROWS):
                a0 = b0 = a1 = b1 = a2 = b2 = a3 = b3 = np.float32(0.0)
                for f in range(n_active):
                    p = first_values[f]
                    q = second_values[f]
                    a0 += x[i, f] * p
                    b0 += x[i, f] * q
                    a1 += x[i + 1, f] * p
                    b1 += x[i + 1, f] * q
                    a2 += x[i + 2, f] * p
                    b2 += x[i + 2, f] * q
                    a3 += x[i + 3, f] * p
                    b3 += x[i + 3, f] * q
                scores[i, j] = a0
                scores[i + 1, j] = a1
                scores[i + 2, j] = a2
                scores[i + 3, j] = a3
                scores[i, other] = b0
                scores[i + 1, other] = b1
                scores[i + 2, other] = b2
                scores[i + 3, other] = b3
        gamma = (n_chosen + 1) * unit / (1 - (n_chosen + 1) * unit)
        if cosine:
            per_norm = gamma + 2 * unit
            const = 0.0
        else:
            per_norm = (gamma + unit) * w_max
            const = (gamma + unit) * 0.5 * w_max * w_max
        for j in range(k):
            sq = np.float64(sq_norms[v, j])
            if cosine:
                safe = np.sqrt(sq) if sq > 0 else 1.0
                for i in range(n_points):
                    scores[i, j] = np.float32(scores[i, j] / safe)
            else:
                bias = np.float32(-0.5 * sq)
                for i in range(n_points):
                    scores[i, j] = scores[i, j] + bias
        for i in range(n_points):
            tolerance = np.float32(tolerance_scale * (per_norm * row_norms[i] + const))
            row = scores[i]
            top = row[0]
            best = 0
            for j in range(1, k):
                if row[j] > top:
                    top = row[j]
                    best = j
            floor = top - tolerance
            close = np.int64(0)
            for j in range(k):
                close += np.int64(row[j] >= floor)
            codes[i, v] = best
            if close > 1:
                if n_ties == ties.shape[0]:
                    ties = _grown(ties)
                while n_candidates + close > candidates.shape[0]:
                    candidates = _grown(candidates)
                ties[n_ties, 0] = i
                ties[n_ties, 1] = v
                ties[n_ties, 2] = n_candidates
                for j in range(k):
                    if row[j] >= floor:
                        candidates[n_candidates] = j
                        n_candidates += 1
                ties[n_ties, 3] = n_candidates
                n_ties += 1
    return n_ties, ties, candidates
