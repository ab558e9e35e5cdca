"""Hot loops of the bottom layer's coarse pass (``coarse_pass``), compiled with numba.

Pure functions only, releasing the GIL: a fit runs clusterings on several threads.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from mbn_core.mbn._integer_scores import STRIPES

_INT32_MAX = 2**31 - 1


@njit(inline="always")
def squared_distance(x, w):
    """|x - w|^2 of two uint8 rows, exactly.

    int32 lanes (numba widens int32 sums to int64; the casts keep them narrow): the caller
    checked that d * 255**2 < 2**31."""
    total = np.int32(0)
    for d in range(x.shape[0]):
        diff = np.int32(np.int32(x[d]) - np.int32(w[d]))
        total = np.int32(total + np.int32(diff * diff))
    return total


@njit(nogil=True, cache=True)
def nearest_within_reach(dots, center_terms, row_terms, per_distance, slack, x_rows, w_rows, codes):
    """Each row's exact nearest center, scoring exactly only the centers within reach.

    ``center_terms[j] - 2 * dots[i, j] + row_terms[i]`` is the squared distance between
    row i and center j in the quantized projection (a whole number). The center nearest
    there is scored exactly first; its squared distance ``d`` puts every center that can
    be as near within ``(sqrt(d) * per_distance + slack)**2`` in the projection
    (``coarse_pass``), and those are scored exactly. The lowest index wins exact ties.

    ``x_rows`` (n, d) and ``w_rows`` (k, d) are the rows and centers on the chosen
    dimensions, shifted alike into uint8. Returns how many (row, center) pairs were scored.
    """
    n_rows, k = dots.shape
    n_groups = (k + STRIPES - 1) // STRIPES
    coarse = np.full(n_groups * STRIPES, np.int32(_INT32_MAX))
    group_lowest = np.empty(n_groups, np.int32)
    scored = 0
    for i in range(n_rows):
        row = dots[i]
        for j in range(k):
            coarse[j] = np.int32(center_terms[j] - row[j] - row[j])
        group_lowest[:] = coarse[:n_groups]
        for stripe in range(1, STRIPES):
            base = stripe * n_groups
            for g in range(n_groups):
                value = coarse[base + g]
                group_lowest[g] = value if value < group_lowest[g] else group_lowest[g]
        first = 0
        for g in range(1, n_groups):
            if group_lowest[g] < group_lowest[first]:
                first = g
        nearest = first
        while coarse[nearest] != group_lowest[first]:
            nearest += n_groups
        best = squared_distance(x_rows[i], w_rows[nearest])
        best_at = nearest
        radius = np.sqrt(np.float64(best)) * per_distance + slack
        # Whole numbers within radius**2; the factor covers float64's rounding of it.
        within = np.floor(radius * radius * (1.0 + 1e-12)) - np.float64(row_terms[i])
        limit = np.int32(min(within, np.float64(_INT32_MAX - 1)))
        scored += 1
        for g in range(n_groups):
            if group_lowest[g] > limit:
                continue
            for j in range(g, k, n_groups):
                if coarse[j] <= limit and j != nearest:
                    scored += 1
                    distance = squared_distance(x_rows[i], w_rows[j])
                    if distance < best or (distance == best and j < best_at):
                        best = distance
                        best_at = j
        codes[i] = best_at
    return scored
