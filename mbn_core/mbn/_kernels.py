"""Hot loops of MBN's upper layers and outputs, compiled with numba (the bottom layer's are
in ``_bottom_kernels``).

Pure functions only: no estimator state, no validation ("prior validation of data is
assumed"). Every kernel releases the GIL so the estimator can run clusterings on several
threads, and none starts threads of its own.

Integer codes enter as int32 and centers as int32 row indices; callers convert.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from mbn_core.mbn import keep_hash
from mbn_core.mbn._prefetch import prefetch

# splitmix64's constants (``keep_hash``), as the uint64 scalars numba compiles in.
_GOLDEN = np.uint64(keep_hash.GOLDEN)
_MIX1 = np.uint64(keep_hash.MIX1)
_MIX2 = np.uint64(keep_hash.MIX2)
_SHIFT1, _SHIFT2, _SHIFT3 = (np.uint64(shift) for shift in keep_hash.SHIFTS)


@njit(inline="always")
def _splitmix64(seed, key):
    z = seed + np.uint64(key) * _GOLDEN
    z = (z ^ (z >> _SHIFT1)) * _MIX1
    z = (z ^ (z >> _SHIFT2)) * _MIX2
    return z ^ (z >> _SHIFT3)


@njit(nogil=True, cache=True)
def dimension_kept(seed, keys, threshold):
    """Whether each one-hot dimension in ``keys`` is chosen by the clustering ``seed``.

    A dimension is kept when its hash falls below ``threshold`` (= fraction * 2**64), so
    the choice can be evaluated for just the dimensions a computation touches.
    """
    out = np.empty(keys.shape[0], np.bool_)
    for t in range(keys.shape[0]):
        out[t] = _splitmix64(seed, keys[t]) < threshold
    return out


@njit(nogil=True, cache=True)
def build_postings(codes, n_values):
    """Invert a code matrix: for each (clustering v, value c) the rows whose code is c.

    Returns ``indptr`` (length V * n_values + 1) and ``rows`` such that the rows with
    ``codes[:, v] == c`` are ``rows[indptr[key]:indptr[key + 1]]`` for ``key = v * n_values + c``,
    in increasing order.

    One clustering at a time: its counts and fill positions (n_values of them) stay in cache,
    and its rows fill one contiguous stretch; the column reads, strided, reuse each cache line
    of ``codes`` over the next clusterings (row by row over every clustering, the fills would
    scatter over all V * n_values keys).
    """
    n_rows, n_clusterings = codes.shape
    n_keys = n_clusterings * n_values
    indptr = np.empty(n_keys + 1, np.int64)
    rows = np.empty(n_rows * n_clusterings, np.int32)
    fill = np.empty(n_values, np.int64)
    for v in range(n_clusterings):
        fill[:] = 0
        for i in range(n_rows):
            fill[codes[i, v]] += 1
        # Clustering v's lists follow those of the clusterings before it: n_rows entries each.
        start = v * n_rows
        base = v * n_values
        for c in range(n_values):
            count = fill[c]
            indptr[base + c] = start
            fill[c] = start
            start += count
        for i in range(n_rows):
            c = codes[i, v]
            rows[fill[c]] = i
            fill[c] += 1
    indptr[n_keys] = n_rows * n_clusterings
    return indptr, rows


@njit(nogil=True, cache=True)
def locate_postings(indptr, center_codes, n_values, start, length):
    """For every center row and clustering, where its code's posting list lies.

    Done once per layer, so each clustering reads a center's V posting ranges as two
    contiguous rows instead of V scattered look-ups into ``indptr``.
    """
    n_centers, n_clusterings = center_codes.shape
    for r in range(n_centers):
        for v in range(n_clusterings):
            key = v * n_values + center_codes[r, v]
            start[r, v] = indptr[key]
            length[r, v] = indptr[key + 1] - indptr[key]


@njit(inline="always")
def keep_flags(seed, code_row, key_base, threshold, keep_all, keep):
    """keep[v] = 1 where the one-hot dimension (v, code_row[v]) is chosen, else 0.

    A loop of its own and nothing else in it, so that the hashes vectorise (a running count
    here measurably slows it)."""
    for v in range(code_row.shape[0]):
        chosen = _splitmix64(seed, key_base[v] + np.uint64(code_row[v])) < threshold
        keep[v] = np.int64(chosen) | keep_all


# Posting lists are copied ROW_PAD entries at a time (the ``rows`` array carries ROW_PAD
# spare entries at its end): short lists then cost no unpredictable loop exits.
ROW_PAD = 4


@njit(inline="always")
def _count_and_select(points, n, count, best_count, out, j):
    """Count how often each point occurs in ``points[:n]`` (its codes shared with center j),
    and make j the point's center where that beats its best so far (ties keep the lower j)."""
    for e in range(n):
        count[points[e]] += 1
    for e in range(n):
        i = points[e]
        c = count[i]
        if c > best_count[i]:
            best_count[i] = c
            out[i] = j
        count[i] = 0


def count_scratch(n_points: int, n_clusterings: int) -> tuple[np.ndarray, np.ndarray]:
    """Zeroed ``count`` and ``best_count`` arrays for ``upper_codes`` over ``n_points``
    points with codes in ``n_clusterings`` clusterings. A count is at most the clusterings,
    so below 2**16 of them it takes 16 bits: half the bytes under every increment."""
    dtype = np.uint16 if n_clusterings < 2**16 else np.int32
    return np.zeros(n_points, dtype), np.zeros(n_points, dtype)


# Posting lists named to the prefetcher this many lists ahead of the one being read: enough
# loads in flight to cover a memory round trip, few enough that they stay in cache until read.
LISTS_AHEAD = 8
# Entries per prefetch: a cache line of the narrowest lists (64 bytes of uint32).
LINE_ENTRIES = 16


@njit(inline="always")
def _prefetch_list(rows, first, count):
    for p in range(first, first + count, LINE_ENTRIES):
        prefetch(rows, p)


@njit(inline="always")
def _prefetch_row(matrix, row):
    width = matrix.shape[1]
    for p in range(row * width, (row + 1) * width, LINE_ENTRIES):
        prefetch(matrix, p)


@njit(nogil=True, cache=True)
def upper_codes(
    rows, start, length, center_codes, centers, n_values, seed, threshold, keep_all, count,
    best_count, out,
):  # fmt: skip
    """One upper-layer clustering: each point's center with the most shared chosen codes.

    The similarity of point x and center w is w^T x over the chosen one-hot dimensions,
    i.e. the number of clusterings v where both have the same code c and the dimension
    (v, c) is chosen. Iterating over centers and their posting lists touches only the
    pairs that share a code, so the cost is k * V + (number of shared codes), never the
    dense n x k similarity matrix. Ties go to the lowest center index; a point sharing
    nothing with any center gets center 0 (all similarities are 0).

    The lists lie scattered over ``rows`` (on large data, far beyond the caches), so each
    is named to the prefetcher ``LISTS_AHEAD`` lists before it is read, and the next
    center's rows of ``start``, ``length`` and ``center_codes`` while this one is counted.

    ``count`` and ``best_count`` are zeroed scratch arrays of one entry per point
    (``count_scratch``), ``count`` left zeroed.
    """
    n_clusterings = center_codes.shape[1]
    n_points = count.shape[0]
    best_count[:] = 0
    out[:] = 0
    range_start = np.empty(n_clusterings, np.int64)
    range_length = np.empty(n_clusterings, np.int64)
    points = np.empty(max(64, 8 * n_clusterings), np.int32)
    k = centers.shape[0]
    for j in range(k):
        r = centers[j]
        n_ranges = 0
        total = 0
        for v in range(n_clusterings):
            key = v * n_values + center_codes[r, v]
            range_start[n_ranges] = start[r, v]
            range_length[n_ranges] = length[r, v]
            keep = keep_all or _splitmix64(seed, key) < threshold
            total += range_length[n_ranges] * keep
            n_ranges += keep
        for q in range(min(LISTS_AHEAD, n_ranges)):
            _prefetch_list(rows, range_start[q], range_length[q])
        if j + 1 < k:
            _prefetch_row(start, centers[j + 1])
            _prefetch_row(length, centers[j + 1])
            _prefetch_row(center_codes, centers[j + 1])
        if 2 * total > n_points:
            # Long posting lists (deep layers): count, then sweep all points once.
            for q in range(n_ranges):
                if q + LISTS_AHEAD < n_ranges:
                    ahead = q + LISTS_AHEAD
                    _prefetch_list(rows, range_start[ahead], range_length[ahead])
                s = range_start[q]
                for p in range(s, s + range_length[q]):
                    count[rows[p]] += 1
            for i in range(n_points):
                c = count[i]
                if c > best_count[i]:
                    best_count[i] = c
                    out[i] = j
                count[i] = 0
        else:
            if total + ROW_PAD > points.shape[0]:
                points = np.empty(2 * (total + ROW_PAD), np.int32)
            t = 0
            for q in range(n_ranges):
                if q + LISTS_AHEAD < n_ranges:
                    ahead = q + LISTS_AHEAD
                    _prefetch_list(rows, range_start[ahead], range_length[ahead])
                s = range_start[q]
                for p in range(ROW_PAD):
                    points[t + p] = rows[s + p]
                for p in range(ROW_PAD, range_length[q]):
                    points[t + p] = rows[s + p]
                t += range_length[q]
            _count_and_select(points, total, count, best_count, out, j)


@njit(nogil=True, cache=True)
def inline_postings(indptr, rows, center_codes, n_values, segments, neighbors, begin, end):
    """Copy the V posting lists of center rows ``begin:end`` next to each other.

    ``neighbors[segments[r, v]:segments[r, v + 1]]`` are the points sharing code
    ``center_codes[r, v]`` in clustering v. Short lists scattered over ``rows`` cost a cache
    miss each; laid out per row they are read as one stream. Row ranges are independent, so
    threads may fill disjoint ones.
    """
    n_clusterings = center_codes.shape[1]
    for r in range(begin, end):
        for v in range(n_clusterings):
            key = v * n_values + center_codes[r, v]
            out = segments[r, v]
            for p in range(indptr[key], indptr[key + 1]):
                neighbors[out] = rows[p]
                out += 1


@njit(nogil=True, cache=True)
def inline_own_postings(indptr, rows, n_values, segments, neighbors, v_begin, v_end):
    """``inline_postings`` when the center rows are the points themselves (training), for
    clusterings ``v_begin:v_end``: each row's lists leave the row out (it is in every one
    of them; the kernel counts it directly).

    Walks the lists in order and scatters each to its members' segments: sequential reads
    and scattered writes, about twice as fast as gathering a row's scattered lists.
    """
    for v in range(v_begin, v_end):
        for key in range(v * n_values, (v + 1) * n_values):
            first, last = indptr[key], indptr[key + 1]
            for p in range(first, last):
                member = rows[p]
                out = segments[member, v]
                for q in range(first, last):
                    if q != p:
                        neighbors[out] = rows[q]
                        out += 1


@njit(nogil=True, cache=True)
def upper_codes_inline(
    segments,
    neighbors,
    center_codes,
    centers,
    n_values,
    seed,
    threshold,
    keep_all,
    skip_self,
    count,
    best_count,
    out,
):
    """``upper_codes`` over inline posting lists (``inline_postings``); same result, and
    the same scratch arrays."""
    n_clusterings = center_codes.shape[1]
    best_count[:] = 0
    out[:] = 0
    points = np.empty(max(64, 8 * n_clusterings), np.int32)
    keep = np.empty(n_clusterings, np.int64)
    kept = np.empty(n_clusterings, np.int64)
    key_base = np.arange(n_clusterings).astype(np.uint64) * np.uint64(n_values)
    for j in range(centers.shape[0]):
        r = centers[j]
        row = segments[r]
        span = row[n_clusterings] - row[0]
        if span + ROW_PAD > points.shape[0]:
            points = np.empty(2 * (span + ROW_PAD), np.int32)
        keep_flags(seed, center_codes[r], key_base, threshold, keep_all, keep)
        # The kept clusterings, compacted without branches: about half the lists are dropped,
        # at random, which a branch per list would mispredict.
        n_lists = 0
        for v in range(n_clusterings):
            kept[n_lists] = v
            n_lists += keep[v]
        t = 0
        for q in range(n_lists):
            v = kept[q]
            s = row[v]
            for p in range(ROW_PAD):
                points[t + p] = neighbors[s + p]
            for p in range(ROW_PAD, row[v + 1] - s):
                points[t + p] = neighbors[s + p]
            t += row[v + 1] - s
        if skip_self and n_lists > best_count[r]:
            # The center's own point shares every kept code with it.
            best_count[r] = n_lists
            out[r] = j
        _count_and_select(points, t, count, best_count, out, j)


@njit(nogil=True, cache=True)
def batch_key_postings(codes, center_codes, n_values):
    """Invert ``center_codes`` for just the keys that occur in the small batch ``codes``.

    Returns ``point_keys`` (slot of each point's key ``v * n_values + codes[i, v]``),
    ``indptr`` and ``rows``: the center rows whose code equals the point's in clustering v
    are ``rows[indptr[s]:indptr[s + 1]]`` for ``s = point_keys[i, v]``, in increasing order.
    One pass over ``center_codes``, whatever the number of centers per clustering.
    """
    n_points, n_clusterings = codes.shape
    slot = np.full(n_clusterings * n_values, -1, np.int32)
    point_keys = np.empty((n_points, n_clusterings), np.int32)
    n_slots = 0
    for i in range(n_points):
        for v in range(n_clusterings):
            key = v * n_values + np.int64(codes[i, v])
            if slot[key] < 0:
                slot[key] = n_slots
                n_slots += 1
            point_keys[i, v] = slot[key]
    indptr = np.zeros(n_slots + 1, np.int64)
    n_rows = center_codes.shape[0]
    for r in range(n_rows):
        for v in range(n_clusterings):
            s = slot[v * n_values + np.int64(center_codes[r, v])]
            if s >= 0:
                indptr[s + 1] += 1
    for s in range(n_slots):
        indptr[s + 1] += indptr[s]
    fill = indptr[:-1].copy()
    rows = np.empty(indptr[n_slots], np.int32)
    for r in range(n_rows):
        for v in range(n_clusterings):
            s = slot[v * n_values + np.int64(center_codes[r, v])]
            if s >= 0:
                rows[fill[s]] = r
                fill[s] += 1
    return point_keys, indptr, rows


@njit(nogil=True, cache=True)
def upper_codes_by_point(
    codes, point_keys, indptr, rows, centers, n_center_rows, n_values, seed, threshold,
    keep_all, out,
):  # fmt: skip
    """``upper_codes`` organised per point over ``batch_key_postings``; same result.

    The cost is about k + (shared codes) per point instead of k * V per clustering, which
    is what a request of a few rows wants.
    """
    n_points, n_clusterings = codes.shape
    k = centers.shape[0]
    local = np.full(n_center_rows, -1, np.int32)
    for j in range(k):
        local[centers[j]] = j
    count = np.zeros(k, np.int32)
    for i in range(n_points):
        for v in range(n_clusterings):
            key = v * n_values + np.int64(codes[i, v])
            if keep_all or _splitmix64(seed, key) < threshold:
                s = point_keys[i, v]
                for p in range(indptr[s], indptr[s + 1]):
                    j = local[rows[p]]
                    if j >= 0:
                        count[j] += 1
        best_count = 0
        best = 0
        for j in range(k):
            c = count[j]
            if c > best_count:
                best_count = c
                best = j
            count[j] = 0
        out[i] = best


@njit(nogil=True, cache=True)
def project_codes(codes, table, offset, out):
    """PCA of one-hot codes without building them: out[i] = sum_v table[v, codes[i, v]] - offset.

    The sum runs over v in a fixed order, so a row's result does not depend on the batch.
    """
    n_rows, n_clusterings = codes.shape
    n_components = table.shape[2]
    for i in range(n_rows):
        for c in range(n_components):
            out[i, c] = -offset[c]
        for v in range(n_clusterings):
            entry = table[v, codes[i, v]]
            for c in range(n_components):
                out[i, c] += entry[c]


@njit(nogil=True, cache=True)
def build_code_index(codes, offsets, rows):
    """Invert a code matrix into preallocated arrays of the caller's (narrow) dtypes.

    Every row has exactly one code per clustering, so clustering v's lists fill
    ``rows[v * n_rows:(v + 1) * n_rows]``; ``offsets[v, c]`` (shape (V, n_values + 1)) is
    where value c's list starts inside that slice. Rows are listed in increasing order. No
    temporary the size of the index is made, so loading a model leaves no freed pages behind.
    """
    n_rows, n_clusterings = codes.shape
    n_values = offsets.shape[1] - 1
    cursor = np.empty(n_values, np.int64)
    for v in range(n_clusterings):
        for c in range(n_values + 1):
            offsets[v, c] = 0
        for i in range(n_rows):
            offsets[v, np.int64(codes[i, v]) + 1] += 1
        for c in range(n_values):
            offsets[v, c + 1] += offsets[v, c]
        for c in range(n_values):
            cursor[c] = v * n_rows + np.int64(offsets[v, c])
        for i in range(n_rows):
            code = np.int64(codes[i, v])
            rows[cursor[code]] = i
            cursor[code] += 1


@njit(nogil=True, cache=True)
def fill_codes_from_index(offsets, rows, out):
    """Invert a ``build_code_index`` index back to its code matrix: out[r, v] = c for every
    row r in the list of (v, c)."""
    n_rows, n_clusterings = out.shape
    n_values = offsets.shape[1] - 1
    for v in range(n_clusterings):
        base = v * n_rows
        for c in range(n_values):
            for p in range(base + np.int64(offsets[v, c]), base + np.int64(offsets[v, c + 1])):
                out[rows[p], v] = c


@njit(inline="always")
def _point_keep(seed, point_codes, key_base, threshold, keep_all, keep):
    """keep[v] = 1 where the point's one-hot dimension (v, point_codes[v]) is chosen."""
    for v in range(point_codes.shape[0]):
        chosen = _splitmix64(seed, key_base[v] + np.uint64(point_codes[v])) < threshold
        keep[v] = np.int32(chosen) | np.int32(keep_all)


@njit(nogil=True, cache=True)
def build_row_pairs(centers, row_start, pairs):
    """Invert a bottom layer's centers by stored row: ``pairs[row_start[r]:row_start[r + 1]]``
    are the keys ``v * k + j`` of the (clustering v, center j) that use stored row r, in
    increasing order. Written into the caller's arrays (no temporary as large as them)."""
    V, k = centers.shape
    n_rows = row_start.shape[0] - 1
    for r in range(n_rows + 1):
        row_start[r] = 0
    for v in range(V):
        for j in range(k):
            row_start[np.int64(centers[v, j]) + 1] += 1
    for r in range(n_rows):
        row_start[r + 1] += row_start[r]
    cursor = row_start[:-1].copy()
    for v in range(V):
        for j in range(k):
            row = np.int64(centers[v, j])
            pairs[cursor[row]] = v * k + j
            cursor[row] += 1


@njit(nogil=True, cache=True)
def upper_codes_dense_by_row(
    codes, center_codes, row_start, pairs, k, seeds, n_values, threshold, keep_all, out
):  # fmt: skip
    """A whole upper layer for a few points, comparing each center's codes directly, with
    each stored center row read once for all clusterings.

    Costs about (stored rows + V x k) x V_prev per point, sequential and branch-free:
    cheaper than posting lists in the deep layers, whose few centers share long lists.

    ``row_start`` / ``pairs`` list, for each row of ``center_codes``, the keys ``w * k + j``
    of the (clustering w, center j) that use it (``build_row_pairs`` of the layer's
    centers). Per point: which of its one-hot dimensions each clustering keeps (V x V_prev
    flags), then one pass over the stored rows in order, comparing each row's codes with the
    point's once and counting them under every using clustering's flags. Same counts, same
    result (ties to the lowest center, 0 when nothing is shared).
    """
    n_points, n_clusterings = codes.shape
    V = seeds.shape[0]
    n_rows = row_start.shape[0] - 1
    keep = np.empty((V, n_clusterings), np.uint8)
    flags = np.empty(n_clusterings, np.int32)
    same = np.empty(n_clusterings, np.uint8)
    counts = np.zeros((V, k), np.int32)
    key_base = np.arange(n_clusterings).astype(np.uint64) * np.uint64(n_values)
    for i in range(n_points):
        for w in range(V):
            _point_keep(seeds[w], codes[i], key_base, threshold, keep_all, flags)
            for v in range(n_clusterings):
                keep[w, v] = np.uint8(flags[v])
        for r in range(n_rows):
            if row_start[r] == row_start[r + 1]:
                continue
            for v in range(n_clusterings):
                same[v] = np.uint8(center_codes[r, v] == codes[i, v])
            for p in range(row_start[r], row_start[r + 1]):
                key = np.int64(pairs[p])
                w = key // k
                c = np.int32(0)
                for v in range(n_clusterings):
                    c += np.int32(keep[w, v] & same[v])
                counts[w, key - w * k] = c
        _best_centers(counts, out[i])


@njit(nogil=True, cache=True)
def upper_codes_indexed_by_row(
    codes, offsets, index_rows, row_start, pairs, k, seeds, n_values, threshold, keep_all, out
):  # fmt: skip
    """A whole upper layer for a few points, over an index of the center rows by code.

    ``index_rows[base + offsets[v, c]:base + offsets[v, c + 1]]``, ``base = v * n_rows``,
    are the stored rows whose code in clustering v is c (``build_code_index``);
    ``row_start`` / ``pairs`` list the (clustering w, center j) that use each stored row
    (``build_row_pairs`` of the layer's centers, distinct within a clustering as fitted). For
    each of the point's codes, each row sharing it adds one to every center it is, in every
    clustering that keeps that one-hot dimension: about (rows sharing a code) x (centers per
    row) steps per point, whatever V. Same counts as ``upper_codes`` (ties to the lowest
    center, 0 when nothing is shared).
    """
    n_points, n_clusterings = codes.shape
    V = seeds.shape[0]
    n_rows = row_start.shape[0] - 1
    counts = np.zeros((V, k), np.int32)
    for i in range(n_points):
        for v in range(n_clusterings):
            c = np.int64(codes[i, v])
            dimension = np.uint64(v) * np.uint64(n_values) + np.uint64(c)
            base = v * np.int64(n_rows)
            start = base + np.int64(offsets[v, c])
            for p in range(start, base + np.int64(offsets[v, c + 1])):
                r = np.int64(index_rows[p])
                for q in range(row_start[r], row_start[r + 1]):
                    key = np.int64(pairs[q])
                    w = key // k
                    if keep_all or _splitmix64(seeds[w], dimension) < threshold:
                        counts[w, key - w * k] += 1
        _best_centers(counts, out[i])


@njit(nogil=True, cache=True)
def _best_centers(counts, out_row):
    """Each clustering's center with the most shared codes (ties to the lowest, 0 when
    nothing is shared) into ``out_row``; ``counts`` (V, k) is zeroed for the next point."""
    V, k = counts.shape
    for w in range(V):
        best_count = np.int32(0)
        best = 0
        for j in range(k):
            if counts[w, j] > best_count:
                best_count = counts[w, j]
                best = j
            counts[w, j] = 0
        out_row[w] = best
