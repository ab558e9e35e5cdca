"""Hot loops of the upper layers' candidate scan (``mbn_core.mbn.neighbour_scan``), compiled
with numba. Pure functions, no validation; every kernel releases the GIL and writes only the
rows it is given, so threads may take disjoint row ranges.

A point's similarity to a center in an upper clustering is the number of clusterings v of the
layer below where both have the same code and the clustering keeps that one-hot dimension.
It is at most their *shared* codes, kept or not: the bound that lets a point's scan stop.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from mbn_core.mbn._kernels import keep_flags
from mbn_core.mbn._prefetch import prefetch, prefetch_row

# A point's lists are met one per clustering, each somewhere else in memory: their bounds are
# named to the prefetcher this many clusterings ahead, the lists half as many.
BOUNDS_AHEAD = 16
# A scan names the codes of the neighbours it will count this many neighbours ahead.
CODES_AHEAD = 4


@njit(nogil=True, cache=True)
def neighbour_lists(
    codes, indptr, rows, n_values, n_rows, own, first, last, neighbours, shared, left_out
):  # fmt: skip
    """Each point's neighbours (rows sharing at least one code), most shared codes first.

    For points ``first:last`` of ``codes``: ``neighbours[i, :m]`` are the first m = min(P,
    all) of them by decreasing shared codes (ties in the order the posting lists meet them),
    ``shared[i, :m]`` their shared codes, the rest -1 and 0; ``left_out[i]`` is the most codes
    shared by a neighbour not listed, -1 when every neighbour is. ``indptr``/``rows`` are the
    posting lists of the ``n_rows`` rows' codes (``_kernels.build_postings``); ``own``: those
    rows are the points themselves (a point is not its own neighbour).
    """
    n_clusterings = codes.shape[1]
    capacity = neighbours.shape[1]
    count = np.zeros(n_rows, np.int32)
    met = np.empty(n_rows, np.int64)
    # Neighbours by shared codes (at most n_clusterings): a counting sort, stable, so ties
    # keep the order the lists met them in.
    at_count = np.zeros(n_clusterings + 2, np.int64)
    for i in range(first, last):
        n_met = 0
        for v in range(min(BOUNDS_AHEAD, n_clusterings)):
            prefetch(indptr, v * n_values + np.int64(codes[i, v]))
        for v in range(n_clusterings):
            if v + BOUNDS_AHEAD < n_clusterings:
                ahead = v + BOUNDS_AHEAD
                prefetch(indptr, ahead * n_values + np.int64(codes[i, ahead]))
            if v + BOUNDS_AHEAD // 2 < n_clusterings:
                ahead = v + BOUNDS_AHEAD // 2
                prefetch(rows, indptr[ahead * n_values + np.int64(codes[i, ahead])])
            key = v * n_values + np.int64(codes[i, v])
            for p in range(indptr[key], indptr[key + 1]):
                r = rows[p]
                if count[r] == 0 and not (own and r == i):
                    met[n_met] = r
                    n_met += 1
                count[r] += 1
        if own:
            count[i] = 0
        at_count[:] = 0
        for q in range(n_met):
            at_count[n_clusterings - count[met[q]] + 1] += 1  # most shared first
        for c in range(n_clusterings + 1):
            at_count[c + 1] += at_count[c]
        listed = min(capacity, n_met)
        left = -1
        for q in range(n_met):
            r = met[q]
            codes_shared = count[r]
            count[r] = 0
            place = at_count[n_clusterings - codes_shared]
            at_count[n_clusterings - codes_shared] += 1
            if place < listed:
                neighbours[i, place] = r
                shared[i, place] = codes_shared
            elif place == listed:
                left = codes_shared
        for q in range(listed, capacity):
            neighbours[i, q] = -1
            shared[i, q] = 0
        left_out[i] = left


@njit(nogil=True, cache=True)
def keep_masks(codes, center_rows, seeds, n_values, threshold, keep_all, masks):
    """masks[g, j] = the bits (64 clusterings a word) of the one-hot dimensions that
    clustering g keeps among center j's: (v, codes[center_rows[g, j], v]) for every v."""
    n_groups, k = center_rows.shape
    n_clusterings = codes.shape[1]
    keep = np.empty(n_clusterings, np.int64)
    key_base = np.arange(n_clusterings).astype(np.uint64) * np.uint64(n_values)
    masks[:] = 0
    for g in range(n_groups):
        for j in range(k):
            keep_flags(seeds[g], codes[center_rows[g, j]], key_base, threshold, keep_all, keep)
            for v in range(n_clusterings):
                masks[g, j, v >> 6] |= np.uint64(keep[v]) << np.uint64(v & 63)


@njit(nogil=True, cache=True)
def group_members(center_rows, n_points, member, row_start, pairs):
    """Which of a group's clusterings have each point as a center: ``member[r]`` has bit g
    set when row r is a center of clustering g, and ``pairs[row_start[r]:row_start[r + 1]]``
    are those (g * k + j), g increasing."""
    n_groups, k = center_rows.shape
    member[:] = 0
    row_start[:] = 0
    for g in range(n_groups):
        for j in range(k):
            r = center_rows[g, j]
            member[r] |= np.uint64(1) << np.uint64(g)
            row_start[r + 1] += 1
    for r in range(n_points):
        row_start[r + 1] += row_start[r]
    cursor = row_start[:-1].copy()
    for g in range(n_groups):
        for j in range(k):
            r = center_rows[g, j]
            pairs[cursor[r]] = g * k + j
            cursor[r] += 1


@njit(inline="always")
def _popcount(x):
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(inline="always")
def _match_bits(a, b, out):
    """out = the bits of the clusterings where code rows a and b agree."""
    n = a.shape[0]
    for w in range(out.shape[0]):
        bits = np.uint64(0)
        for t in range(min(64, n - 64 * w)):
            bits |= np.uint64(a[64 * w + t] == b[64 * w + t]) << np.uint64(t)
        out[w] = bits


@njit(inline="always")
def _kept_shared(match, mask):
    total = 0
    for w in range(match.shape[0]):
        total += _popcount(match[w] & mask[w])
    return total


@njit(nogil=True, cache=True)
def scan_points(
    codes, point_codes, own, neighbours, shared, left_out, center_rows, masks, member,
    row_start, pairs, first, last, out,
):  # fmt: skip
    """Each point's center in every clustering of a group, for points ``first:last`` of
    ``point_codes``, among the rows of ``codes`` (``own``: the points are those rows).

    A point's center is the one with the most kept shared codes, the lowest index on ties,
    0 when it shares none. An own point is a candidate of its own when it is a center; then its
    neighbours are read most shared first, each counted where it is a center of a clustering
    still undecided, and a clustering is decided once the next neighbour shares fewer codes
    than its best: no later center can reach or tie it. A clustering still undecided where
    the list ends, with an unlisted neighbour that might, counts every center directly.
    ``out[i, g]`` for the group's clustering g.
    """
    n_groups, k = center_rows.shape
    n_words = masks.shape[2]
    capacity = neighbours.shape[1]
    every = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - n_groups)
    best = np.zeros(n_groups, np.int64)
    best_at = np.zeros(n_groups, np.int64)
    match = np.empty(n_words, np.uint64)
    for i in range(first, last):
        best[:] = 0
        best_at[:] = 0
        own_first = row_start[i] if own else 0
        own_last = row_start[i + 1] if own else 0
        for e in range(own_first, own_last):  # the point itself, as a center
            g = pairs[e] // k
            j = pairs[e] - g * k
            kept = 0
            for w in range(n_words):
                kept += _popcount(masks[g, j, w])
            if kept > best[g]:
                best[g] = kept
                best_at[g] = j
        undecided = every
        bound = np.int64(1) << 40
        for q in range(capacity):
            r = neighbours[i, q]
            if r < 0:
                break
            codes_shared = np.int64(shared[i, q])
            if codes_shared < bound:  # decide the clusterings this bound settles
                bound = codes_shared
                for g in range(n_groups):
                    if best[g] > bound:
                        undecided &= ~(np.uint64(1) << np.uint64(g))
                if undecided == np.uint64(0):
                    break
            if q + CODES_AHEAD < capacity:
                upcoming = neighbours[i, q + CODES_AHEAD]
                if upcoming >= 0 and member[upcoming] & undecided:
                    prefetch_row(codes, upcoming)
            if member[r] & undecided:
                _match_bits(point_codes[i], codes[r], match)
                for e in range(row_start[r], row_start[r + 1]):
                    g = pairs[e] // k
                    if (undecided >> np.uint64(g)) & np.uint64(1):
                        j = pairs[e] - g * k
                        c = _kept_shared(match, masks[g, j])
                        if c > best[g] or (c == best[g] and j < best_at[g]):
                            best[g] = c
                            best_at[g] = j
        for g in range(n_groups):
            undecided_g = (undecided >> np.uint64(g)) & np.uint64(1)
            if undecided_g and left_out[i] >= best[g]:
                top = 0
                top_at = 0
                for j in range(k):
                    _match_bits(point_codes[i], codes[center_rows[g, j]], match)
                    c = _kept_shared(match, masks[g, j])
                    if c > top:
                        top = c
                        top_at = j
                best_at[g] = top_at
            out[i, g] = best_at[g]
