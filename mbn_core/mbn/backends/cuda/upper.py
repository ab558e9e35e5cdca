"""The upper layers on the device: the kept codes each point shares with each center,
counted through the points' posting lists, and the first arg-max per clustering."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mbn_core.mbn.backends.cuda import arrays as ga
from mbn_core.mbn.backends.cuda import kernels
from mbn_core.mbn.backends.cuda.device import SCORE_BYTES
from mbn_core.mbn.keep_hash import keep_threshold

# Bytes of a group of upper clusterings' center keys and kept posting lists where the array
# code builds them (``center_lists``, under numpy or without the kernel), at about this many
# bytes per key: the key, its hash, the mask, and the kept lists' indices. It bounds the
# groups on the kernel's path too, which writes no lists, so the two paths group alike.
_LIST_BYTES = 2 << 30
_LIST_BYTES_PER_KEY = 64
# Bytes of counts per group when numpy runs this code on the CPU: groups that stay in the
# caches, since there a clustering's own overhead is small and memory traffic is not.
_HOST_COUNT_BYTES = 8 << 20


def upper_layer_codes(
    xp: Any,
    batch_codes: np.ndarray,
    center_codes: np.ndarray,
    centers: np.ndarray,
    seeds: np.ndarray,
    n_values: int,
    feature_fraction: float,
    code_dtype: type[np.unsignedinteger],
    report: Callable[[int, int], None] | None = None,
    counting: SharedCodeCounting | None = None,
) -> np.ndarray:
    """(n, V) codes of an upper layer for the batch's previous-layer ``batch_codes``.

    ``center_codes`` are the previous-layer codes of the rows ``centers`` (V, k) index.
    Clusterings are counted in groups (``clusterings_per_group``): one count and one arg-max
    per group instead of per clustering, because a clustering's own work (a few million
    increments) is too small to hide a round of launches.
    """
    if counting is None:
        counting = kernel_counting(xp) if xp is not np else ArrayCounting(xp)
    block_codes = kernels.block_codes() if xp is not np else ga.upper_block_codes
    n_points = batch_codes.shape[0]
    V, k = centers.shape
    # Uploaded in their compact dtypes (half the bytes of int32 or less), widened there.
    postings = ga.build_postings(xp, xp.asarray(batch_codes).astype(xp.int32), n_values)
    # Row-major: the counting kernel reads a center row's codes as one run.
    stored = xp.ascontiguousarray(xp.asarray(np.asarray(center_codes)), dtype=xp.int32)
    all_centers = xp.asarray(centers.astype(np.int64))
    all_seeds = xp.asarray(np.asarray(seeds, dtype=np.uint64))
    block = max(1, min(n_points, SCORE_BYTES // (4 * k)))
    count_bytes = SCORE_BYTES if xp is not np else _HOST_COUNT_BYTES
    group = clusterings_per_group(V, k, block, stored.shape[1], count_bytes)
    # Every group's codes stay on the device until the last: one copy back, no waits.
    codes = xp.empty((n_points, V), dtype=xp.int32)
    for first in range(0, V, group):
        last = min(first + group, V)
        kept = counting.kept_dimensions(
            postings, stored, all_centers[first:last], all_seeds[first:last], feature_fraction
        )
        for start in range(0, n_points, block):
            stop = min(start + block, n_points)
            counts = counting.count(postings, kept, (last - first) * k, start, stop)
            codes[start:stop, first:last] = block_codes(xp, counts, k)
        if report is not None and last < V:  # queued; the last once copied back
            report(last, V)
    out = ga.to_host(xp, codes.astype(code_dtype))
    if report is not None:
        report(V, V)
    return out


class SharedCodeCounting:
    """How an upper layer's group of clusterings counts the kept codes each point shares
    with each center: ``kept_dimensions`` once per group, then ``count`` per row block."""

    def kept_dimensions(self, postings, stored, centers, seeds, feature_fraction) -> Any:
        """What ``count`` needs of the group: ``stored`` (n_rows, V_prev) int32 codes of the
        center rows, ``centers`` (G, k) int64 rows of it, ``seeds`` (G,) uint64."""
        raise NotImplementedError

    def count(self, postings, kept, columns: int, row_start: int, row_stop: int) -> Any:
        """(row_stop - row_start, columns) int32 counts: column g * k + j for center j of
        the group's clustering g."""
        raise NotImplementedError


class ArrayCounting(SharedCodeCounting):
    """The array-code reference: the kept posting lists (``arrays.center_lists``) once
    per group, counted by ``arrays.count_shared_codes``."""

    def __init__(self, xp: Any) -> None:
        self.xp = xp

    def kept_dimensions(self, postings, stored, centers, seeds, feature_fraction):
        return ga.center_lists(self.xp, postings, stored[centers], seeds, feature_fraction)

    def count(self, postings, kept, columns, row_start, row_stop):
        return ga.count_shared_codes(self.xp, postings, kept, columns, row_start, row_stop)


@dataclass(frozen=True)
class _GroupCenters:
    """A group's centers as the fused kernel reads them (nothing computed ahead)."""

    stored: Any
    centers: Any
    seeds: Any
    feature_fraction: float


class KernelCounting(SharedCodeCounting):
    """One CUDA kernel per row block (``count_kept_shared``): each thread hashes one
    (center, previous clustering) dimension of the group's centers, and the warp walks the
    kept ones' posting lists together, so the kept lists are never written out."""

    def __init__(self, xp: Any, kernel: Any) -> None:
        self.xp, self.kernel = xp, kernel

    def kept_dimensions(self, postings, stored, centers, seeds, feature_fraction):
        return _GroupCenters(stored, centers, seeds, feature_fraction)

    def count(self, postings, kept: _GroupCenters, columns, row_start, row_stop):
        xp = self.xp
        counts = xp.zeros((row_stop - row_start, columns), dtype=xp.int32)
        n_groups, k = kept.centers.shape
        n_previous = kept.stored.shape[1]
        n_dimensions = n_groups * k * n_previous
        if n_dimensions:
            blocks = (n_dimensions + kernels.BLOCK_THREADS - 1) // kernels.BLOCK_THREADS
            self.kernel(
                (blocks,),
                (kernels.BLOCK_THREADS,),
                (
                    kept.stored, kept.centers, kept.seeds,
                    keep_threshold(kept.feature_fraction),
                    np.int32(kept.feature_fraction >= 1.0),
                    postings.indptr, postings.rows, np.int32(n_previous),
                    np.int32(postings.n_values), np.int32(k), np.int64(n_dimensions),
                    np.int32(row_start), np.int32(row_stop), np.int32(columns), counts,
                ),
            )  # fmt: skip
        return counts


def kernel_counting(xp: Any) -> SharedCodeCounting:
    """``KernelCounting`` on the device, or ``ArrayCounting`` where its kernel cannot be
    built."""
    kernel = kernels.kernel("count_kept_shared")
    return ArrayCounting(xp) if kernel is None else KernelCounting(xp, kernel)


def clusterings_per_group(
    n_clusterings: int, k: int, block_rows: int, n_previous: int, count_bytes: int = SCORE_BYTES
) -> int:
    """Upper clusterings counted together: as many as keep a block's counts (rows x
    clusterings x centers, int32) within ``count_bytes``, and the centers' keys and lists
    (clusterings x centers x previous clusterings) within ``_LIST_BYTES``."""
    by_counts = count_bytes // (4 * k * block_rows)
    by_lists = _LIST_BYTES // (_LIST_BYTES_PER_KEY * k * n_previous)
    return max(1, min(n_clusterings, by_counts, by_lists))
