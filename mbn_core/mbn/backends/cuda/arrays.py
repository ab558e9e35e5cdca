"""MBN's layers as array code over a namespace ``xp``: CuPy on a GPU, numpy in the tests.

Everything the CUDA backend (``backends.cuda``) computes goes through these functions, so
their logic runs in CI with ``xp = numpy`` and on a GPU with ``xp = cupy``. Three steps have
fused kernels of their own on the GPU (``kernels.cu``), each with its reference here: the
centred scores' arg-max (``first_best_centred``), the kept posting lists and their count
(``center_lists`` and ``count_shared_codes``, which counts the same pairs with ``bincount``),
and the upper counts' arg-max (``upper_block_codes``).

The codes are the CPU's, bit for bit:

- bottom layer: small-integer data (images) within 256 consecutive integers, Euclidean, is
  shifted to [-128, 127], where the float32 (TF32) scores are exact and their first arg-max
  is the code (``centred_best``). Other data: float32 scores (TF32 allowed where the inputs
  are exact in it), the first arg-max, and every row whose runner-up lies within the scores'
  rounding-error bound re-ranked exactly: small-integer data on the device in float64, which
  is exact for them (every sum is a whole number below 2**53), the rest on the host by the
  CPU's own ``exact_best``. Either way the result is the float64 nearest center, lowest
  index on exact ties, as in ``bottom._pick_centers``.
- upper layers: the number of kept one-hot dimensions each point shares with each center,
  counted through the points' posting lists (never a dense one-hot product), then the first
  arg-max: the CPU kernels' rule (ties to the lowest center, 0 when nothing is shared).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mbn_core.mbn import keep_hash
from mbn_core.mbn._integer_scores import LEVELS
from mbn_core.mbn.bottom import TIE_MARGIN, exact_best
from mbn_core.mbn.keep_hash import keep_threshold

# splitmix64's constants (``keep_hash``).
_GOLDEN = np.uint64(keep_hash.GOLDEN)
_MIX1 = np.uint64(keep_hash.MIX1)
_MIX2 = np.uint64(keep_hash.MIX2)
_SHIFT1, _SHIFT2, _SHIFT3 = (np.uint64(shift) for shift in keep_hash.SHIFTS)
# Unit roundoff of the GPU's float32 scores, taken as a whole float32 epsilon: TF32 tensor
# cores may truncate rather than round their float32 sums, which doubles the per-step error.
_GPU_UNIT = float(np.finfo(np.float32).eps)
# Whole numbers up to this magnitude are exact in TF32 (11 significant bits).
TF32_EXACT_MAX = 2048
# float64 sums of products of whole numbers stay exact below this.
_FLOAT64_EXACT = 2.0**53
# Postings the counting reference (``count_shared_codes``) expands at once: its scratch is
# a few int64 arrays of this length.
REFERENCE_ENTRIES = 1 << 24


def splitmix64(xp: Any, seed: Any, keys: Any) -> Any:
    """``keep_hash``'s splitmix64 for an array of uint64 ``keys`` and a seed, or an array of
    seeds broadcast against them."""
    z = xp.asarray(seed, dtype=xp.uint64) + keys.astype(xp.uint64) * _GOLDEN
    z = (z ^ (z >> xp.uint64(_SHIFT1))) * _MIX1
    z = (z ^ (z >> xp.uint64(_SHIFT2))) * _MIX2
    return z ^ (z >> xp.uint64(_SHIFT3))


# ---------------------------------------------------------------------- bottom layer


@dataclass(frozen=True)
class BottomCenters:
    """One bottom clustering's centers, prepared for scoring on the device."""

    values_t: Any  # (d_chosen, k) float32: the GEMM's right-hand side
    center_term: Any  # (k,) float32: -|w|^2 / 2 (Euclidean) or 1 / |w| (cosine, 1 for 0)
    values64: Any | None  # (k, d_chosen) float64 for the exact re-rank, integer data only
    sq_norms64: Any | None  # (k,) float64 exact |w|^2, integer data only
    error_per_norm: float
    error_const: float


def prepare_centers(xp: Any, values: Any, metric: str, integer: bool) -> BottomCenters:
    """``values`` (k, d_chosen) float32 on the device, as ``score_block`` uses them."""
    values64 = values.astype(xp.float64)
    sq_norms = (values64 * values64).sum(axis=1)
    norms = xp.sqrt(sq_norms)
    if metric == "euclidean":
        term = (-0.5 * sq_norms).astype(xp.float32)
        w_max = float(norms.max()) if norms.size else 0.0
        n_terms = values.shape[1] + 2  # the products, the bias and the final rounding
        gamma = n_terms * _GPU_UNIT / (1 - n_terms * _GPU_UNIT)
        per_norm, const = gamma * w_max, gamma * 0.5 * w_max**2
    else:
        term = (1.0 / xp.where(norms > 0, norms, 1.0)).astype(xp.float32)
        n_terms = values.shape[1] + 3  # the products, 1 / |w|, its product and rounding
        per_norm, const = n_terms * _GPU_UNIT / (1 - n_terms * _GPU_UNIT), 0.0
    return BottomCenters(
        values_t=xp.ascontiguousarray(values.T),
        center_term=term,
        values64=values64 if integer else None,
        sq_norms64=sq_norms if integer else None,
        error_per_norm=per_norm,
        error_const=const,
    )


def score_block(xp: Any, rows: Any, centers: BottomCenters, metric: str) -> Any:
    """(m, k) float32 scores of ``rows`` (m, d_chosen) float32: larger is nearer."""
    scores = rows @ centers.values_t
    if metric == "euclidean":
        scores += centers.center_term
    else:
        scores *= centers.center_term
    return scores


def row_tolerance(xp: Any, row_norms: Any, centers: BottomCenters) -> Any:
    """Per-row score differences that rounding could have reversed (times the margin)."""
    bound = centers.error_per_norm * row_norms + centers.error_const
    return (TIE_MARGIN * bound).astype(xp.float32)


def best_and_near_ties(xp: Any, scores: Any, tolerance: Any) -> tuple[Any, Any]:
    """First arg-max of each row, and whether another score lies within its tolerance."""
    best = scores.argmax(axis=1).astype(xp.int32)
    top = scores.max(axis=1)
    close = (scores >= (top - tolerance)[:, None]).sum(axis=1)
    return best, close > 1


def exact_best_on_device(xp: Any, rows64: Any, centers: BottomCenters, metric: str) -> Any:
    """The exact nearest center of integer ``rows64`` (f, d_chosen) float64, computed in
    float64 (exact: every sum is a whole number below 2**53), lowest index on ties.

    Cosine: ``x.w / sqrt(|w|^2)`` as ``bottom.exact_best`` computes it (0 for a zero center).
    """
    assert centers.values64 is not None and centers.sq_norms64 is not None
    dots = rows64 @ centers.values64.T
    if metric == "euclidean":
        exact = 2.0 * dots - centers.sq_norms64
    else:
        norms = xp.sqrt(centers.sq_norms64)
        exact = xp.where(norms > 0, dots / xp.where(norms > 0, norms, 1.0), 0.0)
    return exact.argmax(axis=1).astype(xp.int32)


def exact_best_on_host(
    scores: np.ndarray,
    tolerance: np.ndarray,
    rows: np.ndarray,
    values: np.ndarray,
    metric: str,
) -> np.ndarray:
    """``bottom._pick_centers``' re-rank of near-tie rows, on the host.

    ``scores`` (f, k) and ``tolerance`` (f,) are the rows' float32 scores, ``rows``
    (f, d_chosen) their float32 inputs, ``values`` (k, d_chosen) the float32 centers.
    Candidates within tolerance of the best are ranked by ``exact_best``, as on the CPU.
    """
    out = np.empty(len(rows), dtype=np.int32)
    for i in range(len(rows)):
        row = scores[i]
        candidates = np.flatnonzero(row >= row.max() - tolerance[i])
        chosen = values[candidates].astype(np.float64)
        out[i] = candidates[exact_best(rows[i].astype(np.float64), chosen, metric)]
    return out


# Small-integer data within LEVELS consecutive integers (the CPU integer path's range) is
# shifted by ``low + CENTRE`` into [-128, 127], where every product is at most 2**14 in
# magnitude and exact in TF32.
CENTRE = LEVELS // 2
# Sums of up to this many such products stay within 2**24: whole numbers, exact in float32
# whatever the order (and the tensor cores' truncation) of the additions.
CENTRED_EXACT_DIMENSIONS = 2**24 // (CENTRE * CENTRE)


def centred_scores_are_exact(low: int, high: int, n_chosen: int, metric: str) -> bool:
    """Whether ``centred_best`` gives the exact codes for whole numbers in [low, high]."""
    return metric == "euclidean" and high - low < LEVELS and n_chosen <= CENTRED_EXACT_DIMENSIONS


def centred_best(xp: Any, rows: Any, values: Any, pick: CentredPick | None = None) -> Any:
    """The nearest of ``values`` (k, d_chosen) to each of ``rows`` (m, d_chosen), lowest
    index on exact ties: the CPU's codes, with no re-rank.

    Both are float32 whole numbers in [-128, 127] with d_chosen at most
    ``CENTRED_EXACT_DIMENSIONS`` (``centred_scores_are_exact``), so the float32 products
    ``x.w`` are exact, and ``2 x.w - |w|^2`` (the distance less the row's own term) is exact
    in int32, whose first arg-max is the nearest center: ``pick`` (the CUDA backend's fused
    kernel) or its reference ``first_best_centred``.
    """
    dots = rows @ values.T
    sq_norms = (values.astype(xp.int32) ** 2).sum(axis=1, dtype=xp.int32)
    return (pick or first_best_centred)(xp, dots, sq_norms)


def first_best_centred(xp: Any, dots: Any, sq_norms: Any) -> Any:
    """(m,) int32 first arg-max of ``2 * dots - sq_norms`` in int32, for float32 ``dots``
    (m, k) of whole numbers and int32 ``sq_norms`` (k,) (``centred_best``'s bounds)."""
    scores = dots.astype(xp.int32)
    scores *= 2
    scores -= sq_norms
    return scores.argmax(axis=1).astype(xp.int32)


def integer_exact(low: float, high: float, n_chosen: int) -> bool:
    """Whether data of whole numbers in [low, high] re-rank exactly in float64 sums."""
    largest = max(abs(low), abs(high))
    return 2.0 * n_chosen * largest * largest < _FLOAT64_EXACT


# ---------------------------------------------------------------------- upper layers


@dataclass(frozen=True)
class DevicePostings:
    """Posting lists of a batch's codes: the rows with code c in clustering v are
    ``rows[indptr[v * n_values + c]:indptr[v * n_values + c + 1]]``."""

    indptr: Any  # (V * n_values + 1,) int64
    rows: Any  # (n * V,) int32
    n_points: int
    n_values: int


def build_postings(xp: Any, codes: Any, n_values: int) -> DevicePostings:
    """Invert ``codes`` (n, V) on the device (a sort by key; order within a list is free:
    counting does not depend on it)."""
    n_points, n_clusterings = codes.shape
    keys = xp.arange(n_clusterings, dtype=xp.int64)[None, :] * n_values + codes.astype(xp.int64)
    flat = keys.ravel()
    order = xp.argsort(flat)
    rows = (order // n_clusterings).astype(xp.int32)
    counts = xp.bincount(flat, minlength=n_clusterings * n_values)
    indptr = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(counts).astype(xp.int64)])
    return DevicePostings(indptr=indptr, rows=rows, n_points=n_points, n_values=n_values)


@dataclass(frozen=True)
class CenterLists:
    """The kept posting lists of a group of upper clusterings' centers: list q belongs to
    column ``owner[q]`` of the counts (center j of the group's clustering g is column
    ``g * k + j``) and spans ``rows[start[q]:start[q] + length[q]]`` of the postings."""

    start: Any  # int64
    length: Any  # int32
    owner: Any  # int32


def center_lists(
    xp: Any,
    postings: DevicePostings,
    center_codes: Any,
    seeds: Any,
    feature_fraction: float,
) -> CenterLists:
    """The lists of the one-hot dimensions (v, center_codes[g, j, v]) each center keeps.

    ``center_codes`` (G, k, V_prev) are the previous-layer codes of the centers of G
    clusterings, ``seeds`` (G,) their seeds; a dimension is kept when its splitmix64 hash
    under the clustering's seed falls below the layer's threshold, as on the CPU.
    """
    n_groups, k, n_clusterings = center_codes.shape
    keys = xp.arange(n_clusterings, dtype=xp.int64)[None, None, :] * postings.n_values
    keys = keys + center_codes.astype(xp.int64)
    if feature_fraction >= 1.0:
        kept = xp.ones(keys.shape, dtype=bool)
    else:
        seeds = xp.asarray(np.asarray(seeds, dtype=np.uint64)).reshape(n_groups, 1, 1)
        kept = splitmix64(xp, seeds, keys) < xp.uint64(keep_threshold(feature_fraction))
    group, center, column = xp.nonzero(kept)  # row-major: each center's lists in order
    chosen = keys[group, center, column]
    owner = (group * k + center).astype(xp.int32)
    start = postings.indptr[chosen]
    length = (postings.indptr[chosen + 1] - start).astype(xp.int32)
    return CenterLists(start=start, length=length, owner=owner)


def count_shared_codes(
    xp: Any,
    postings: DevicePostings,
    lists: CenterLists,
    columns: int,
    row_start: int,
    row_stop: int,
    max_entries: int = REFERENCE_ENTRIES,
) -> Any:
    """(row_stop - row_start, columns) int32: for points in the row range, how many kept
    dimensions they share with each center (the reference of the CUDA kernel). The lists are
    walked in runs of about ``max_entries`` postings, which bounds the scratch memory."""
    n_rows = row_stop - row_start
    ends = xp.cumsum(lists.length.astype(xp.int64))
    total = int(ends[-1]) if ends.size else 0
    # List boundaries closest to multiples of max_entries: a run of whole lists each time
    # (a single list longer than that is a run of its own).
    cuts = xp.searchsorted(ends, xp.arange(max_entries, total, max_entries), side="left")
    bounds = [0, *sorted({int(c) + 1 for c in to_host(xp, cuts)} - {0}), int(ends.size)]
    counts = None
    for first_list, stop_list in itertools.pairwise(bounds):
        if first_list >= stop_list:
            continue
        length = lists.length[first_list:stop_list].astype(xp.int64)
        run_ends = xp.cumsum(length)
        run_first = run_ends - length
        # Entry e of the run's concatenated lists belongs to the first list ending after it.
        entries = xp.arange(int(run_ends[-1]), dtype=xp.int64)
        which = xp.searchsorted(run_ends, entries, side="right")
        position = lists.start[first_list:stop_list][which] + (entries - run_first[which])
        points = postings.rows[position].astype(xp.int64)
        inside = (points >= row_start) & (points < row_stop)
        owner = lists.owner[first_list:stop_list][which][inside]
        flat = (points[inside] - row_start) * columns + owner
        run = xp.bincount(flat, minlength=n_rows * columns)
        counts = run if counts is None else counts + run
    if counts is None:
        return xp.zeros((n_rows, columns), dtype=xp.int32)
    return counts.reshape(n_rows, columns).astype(xp.int32)


def upper_block_codes(xp: Any, counts: Any, k: int) -> Any:
    """(rows, G) int32 codes from a group's (rows, G * k) int32 counts: in each clustering,
    the center with the most shared codes, the first arg-max (ties to the lowest center, 0
    when nothing is shared), as the CPU kernels choose. The reference of the CUDA backend's
    kernel."""
    n_rows = counts.shape[0]
    return counts.reshape(n_rows, -1, k).argmax(axis=2).astype(xp.int32)


def to_host(xp: Any, array: Any) -> np.ndarray:
    """``array`` as a numpy array (a copy from the device under CuPy, itself under numpy)."""
    return array if xp is np else xp.asnumpy(array)


# (xp, dots, sq_norms) -> best: ``first_best_centred``'s job.
CentredPick = Callable[[Any, Any, Any], Any]
# (xp, counts, k) -> codes: ``upper_block_codes``' job.
BlockCodes = Callable[[Any, Any, int], Any]
