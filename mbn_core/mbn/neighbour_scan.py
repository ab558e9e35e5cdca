"""The upper layers of a fit by candidate scan: each point's neighbours ranked once per layer
by the codes they share, then every clustering's centers found among the first of them.

The posting-list walk (``mbn_core.mbn.upper``) counts, for every center, the codes it shares
with every point: each pair that shares a code costs an increment, in every clustering. But a
point's center in a clustering is the center sharing the most *kept* codes with it, and a
center sharing fewer codes in all than the best kept count found so far can neither beat nor
tie it. So, per layer:

1. each point's neighbours (the points it shares a code with) are listed once, most shared
   codes first (``NeighbourLists``): the work of one walk with every point a center;
2. per group of up to 64 clusterings, each point reads its list from the top, counts the
   kept codes it shares with the neighbours that are centers of a clustering still open, and
   closes a clustering when the next neighbour shares fewer codes than its best; work the
   group's clusterings share (reading the list, comparing two points' codes once for all the
   clusterings where the neighbour is a center) is done once.

The codes are the walk's, bit for bit (the tests compare them): the first center with the
most kept shared codes, 0 where a point shares none. A point whose list was cut short
(``max_neighbours``) with an unlisted neighbour that might still tie counts every center of
that clustering directly.

It pays where a clustering's centers are a large share of the points (the scan stops after
a few neighbours, since one of the first is a center); where they are few, or the lists would
not fit in memory, the walk serves (``NeighbourLists.pays``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from mbn_core.mbn import _kernels, _one_hot_kernels, _scan_kernels
from mbn_core.mbn.keep_hash import keep_threshold
from mbn_core.mbn.upper import lays_out_inline

# Clusterings scanned together: one bit each in a 64-bit word.
GROUP = 64
# Most bytes of neighbour lists a layer may hold (6 bytes a neighbour).
MAX_LIST_BYTES = 64 << 20
# A point's scan reads about SCAN_DEPTH * n / k neighbours before one of them is a center and
# its best count closes the scan (measured on MNIST's layers: 6.8 n / k for a group of 64
# clusterings); lists hold LIST_MARGIN times that, so that few scans run past their end.
SCAN_DEPTH = 7.0
LIST_MARGIN = 3.0
# Seconds per unit of work, measured on one core of the development machine (MNIST-5k's
# layers): an increment of the walk, a neighbour met while listing, a neighbour read by a
# scan, a count of two points' kept shared codes, a kept-dimension hash. The walk's increment
# costs less where its lists are long and read in place (``upper.lays_out_inline``): measured
# on MNIST-5k's layers 4-7 at 0.4-1.0 ns against 2.5-4 ns for the copied short lists of
# layers 1-3 (``benchmarks/experiments/profile_fit.py``, every layer walked).
WALK_INCREMENT = 4.5e-9
WALK_INCREMENT_IN_PLACE = 1.0e-9
LIST_ENTRY = 2.0e-9
SCAN_STEP = 5.0e-9
PAIR_COUNT = 85e-9
HASH = 1.0e-9
# Counts per point and clustering (about 1.5 on MNIST's layers).
COUNTS_PER_POINT = 2.0


def walk_entries(codes: np.ndarray, n_values: int) -> int:
    """The entries of the walk's posting lists for a fit on ``codes`` (n, V): every point a
    center row, each of its V lists whole (its own entry included), the sum over clusterings
    of each code's point count squared."""
    sizes = np.empty(codes.shape[1] * n_values, dtype=np.int64)
    _one_hot_kernels.one_hot_counts(np.ascontiguousarray(codes.T), n_values, sizes)
    return int(np.sum(sizes**2))


@dataclass(frozen=True)
class NeighbourLists:
    """Each point's neighbours in one layer's codes, most shared codes first.

    Attributes
    ----------
    neighbours : ndarray of shape (n, P), int32
        The first P (or all) neighbours of each point; -1 past its last.
    shared : ndarray of shape (n, P), uint16 or int32
        The codes each listed neighbour shares with the point.
    left_out : ndarray of shape (n,), int32
        The most codes an unlisted neighbour shares with the point, -1 when none is unlisted.
    """

    neighbours: np.ndarray
    shared: np.ndarray
    left_out: np.ndarray

    @classmethod
    def build(
        cls,
        codes: np.ndarray,
        n_values: int,
        max_neighbours: int,
        pool: Executor | None = None,
        n_threads: int = 1,
    ) -> NeighbourLists:
        """The lists of ``codes`` (n, V), values in [0, n_values), at most ``max_neighbours``
        a point; rows split between ``n_threads`` of ``pool``."""
        n_points, n_clusterings = codes.shape
        indptr, rows = _kernels.build_postings(codes, n_values)
        width = max(1, min(max_neighbours, n_points - 1))
        neighbours = np.empty((n_points, width), dtype=np.int32)
        shared = np.empty((n_points, width), np.uint16 if n_clusterings < 2**16 else np.int32)
        left_out = np.empty(n_points, dtype=np.int32)

        def fill(part: tuple[int, int]) -> None:
            _scan_kernels.neighbour_lists(
                codes, indptr, rows, n_values, *part, neighbours, shared, left_out
            )

        _in_parts(fill, n_points, pool, n_threads)
        return cls(neighbours=neighbours, shared=shared, left_out=left_out)

    @staticmethod
    def size_for(n_points: int, n_centers: int) -> int:
        """Neighbours to list a point for scans of clusterings of ``n_centers`` centers."""
        return int(np.ceil(LIST_MARGIN * SCAN_DEPTH * n_points / max(n_centers, 1)))

    @staticmethod
    def pays(codes: np.ndarray, n_values: int, n_centers: int, n_new: int, fraction: float) -> bool:
        """Whether scanning beats the walk for a layer of ``n_new`` clusterings of
        ``n_centers`` centers over ``codes`` (values below ``n_values``): the lists must fit
        in ``MAX_LIST_BYTES``, and the estimated seconds (the constants above) be fewer."""
        n_points, n_clusterings = codes.shape
        width = min(NeighbourLists.size_for(n_points, n_centers), n_points - 1)
        if n_points < 2 or n_points * width * 6 > MAX_LIST_BYTES:
            return False
        entries = walk_entries(codes, n_values)
        # Codes a point shares with all points, itself included: sum of its lists' lengths.
        per_point = entries / n_points
        inline = lays_out_inline(entries, n_points * n_clusterings, n_points)
        increment = WALK_INCREMENT if inline else WALK_INCREMENT_IN_PLACE
        walk = n_new * n_centers * fraction * per_point * increment
        depth = SCAN_DEPTH * n_points / n_centers
        scan = (
            n_points * per_point * LIST_ENTRY
            + n_new * n_centers * n_clusterings * HASH
            + n_new * n_points * (COUNTS_PER_POINT * PAIR_COUNT + depth / GROUP * SCAN_STEP)
        )
        return scan < walk

    def scan(
        self,
        codes: np.ndarray,
        center_rows: np.ndarray,
        seeds: np.ndarray,
        n_values: int,
        fraction: float,
        pool: Executor | None = None,
        n_threads: int = 1,
    ) -> np.ndarray:
        """(n, G) codes of the points in G <= ``GROUP`` clusterings whose centers are the
        rows ``center_rows`` (G, k) of ``codes``, with ``seeds`` (G,) of their dimension
        choices, keeping each one-hot dimension with probability ``fraction``."""
        n_points, n_clusterings = codes.shape
        n_groups, k = center_rows.shape
        center_rows = np.ascontiguousarray(center_rows, dtype=np.int64)
        seeds = np.asarray(seeds, dtype=np.uint64)
        threshold = keep_threshold(fraction)
        masks = np.empty((n_groups, k, (n_clusterings + 63) // 64), dtype=np.uint64)

        def mask(part: tuple[int, int]) -> None:
            # A hash per center row and dimension: at large k a fifth of the scan's time, so
            # its clusterings are shared between the threads too.
            first, last = part
            _scan_kernels.keep_masks(
                codes, center_rows[first:last], seeds[first:last], n_values, threshold,
                fraction >= 1.0, masks[first:last],
            )  # fmt: skip

        _in_parts(mask, n_groups, pool, n_threads)
        member = np.empty(n_points, dtype=np.uint64)
        row_start = np.empty(n_points + 1, dtype=np.int64)
        pairs = np.empty(n_groups * k, dtype=np.int64)
        _scan_kernels.group_members(center_rows, n_points, member, row_start, pairs)
        out = np.empty((n_points, n_groups), dtype=np.int32)

        def fill(part: tuple[int, int]) -> None:
            _scan_kernels.scan_points(
                codes, self.neighbours, self.shared, self.left_out, center_rows, masks,
                member, row_start, pairs, *part, out,
            )  # fmt: skip

        _in_parts(fill, n_points, pool, n_threads)
        return out

    @property
    def nbytes(self) -> int:
        return self.neighbours.nbytes + self.shared.nbytes + self.left_out.nbytes


def _in_parts(
    fill: Callable[[tuple[int, int]], None], n_rows: int, pool: Executor | None, n_threads: int
) -> None:
    """``fill`` over ``n_threads`` contiguous row ranges, on ``pool`` when there is one."""
    parts = max(1, min(n_threads if pool is not None else 1, n_rows))
    cuts = np.linspace(0, n_rows, parts + 1).astype(int)
    ranges = list(zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True))
    if pool is None or parts == 1:
        for part in ranges:
            fill(part)
    else:
        list(pool.map(fill, ranges))
