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

A transform's new rows are scanned the same way among a fitted layer's center rows
(``new_point_codes``): the walk visits every center's lists in every clustering however few
the rows, so the scan serves batches of up to a few rows per center (``scans_new_points``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from mbn_core.mbn import _kernels, _one_hot_kernels, _scan_kernels
from mbn_core.mbn.dtypes import smallest_uint
from mbn_core.mbn.keep_hash import keep_threshold
from mbn_core.mbn.parts import in_parts
from mbn_core.mbn.upper import UpperLayer, lays_out_inline

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
# New points (a transform) are scanned in batches of up to this many points per center of a
# layer: the crossover with the walk lies at 6-25 on MNIST models of 10,000 and 54,000 rows
# (every layer, 300-6,000 new rows, ``benchmarks/experiments/profile_transform.py``).
NEW_POINTS_PER_CENTER = 12


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
        """The lists of ``codes`` (n, V), values in [0, n_values), among themselves, at most
        ``max_neighbours`` a point; rows split between ``n_threads`` of ``pool``."""
        indptr, rows = _kernels.build_postings(codes, n_values)
        return cls._listed(codes, indptr, rows, n_values, codes.shape[0], True, max_neighbours,
                           pool, n_threads)  # fmt: skip

    @classmethod
    def of_new_points(
        cls,
        codes: np.ndarray,
        postings: tuple[np.ndarray, np.ndarray],
        n_values: int,
        n_rows: int,
        max_neighbours: int,
        pool: Executor | None = None,
        n_threads: int = 1,
    ) -> NeighbourLists:
        """The lists of new points' ``codes`` among ``n_rows`` fitted rows whose posting lists
        (``indptr``, ``rows``: ``_kernels.build_postings`` of their codes) are ``postings``."""
        return cls._listed(codes, *postings, n_values, n_rows, False, max_neighbours, pool,
                           n_threads)  # fmt: skip

    @classmethod
    def _listed(
        cls, codes, indptr, rows, n_values, n_rows, own, max_neighbours, pool, n_threads
    ) -> NeighbourLists:
        n_points, n_clusterings = codes.shape
        width = max(1, min(max_neighbours, n_rows - 1 if own else n_rows))
        neighbours = np.empty((n_points, width), dtype=np.int32)
        shared = np.empty((n_points, width), np.uint16 if n_clusterings < 2**16 else np.int32)
        left_out = np.empty(n_points, dtype=np.int32)

        def fill(part: tuple[int, int]) -> None:
            _scan_kernels.neighbour_lists(
                codes, indptr, rows, n_values, n_rows, own, *part, neighbours, shared, left_out
            )

        in_parts(fill, n_points, pool, n_threads)
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
        group = ScanGroup.build(codes, center_rows, seeds, n_values, fraction, pool, n_threads)
        return self.scan_group(codes, group, pool=pool, n_threads=n_threads)

    def scan_group(
        self,
        codes: np.ndarray,
        group: ScanGroup,
        point_codes: np.ndarray | None = None,
        pool: Executor | None = None,
        n_threads: int = 1,
    ) -> np.ndarray:
        """(n, G) codes of the listed points in ``group``'s clusterings, whose centers are
        rows of ``codes``: the points are those rows, or new points of ``point_codes``."""
        own = point_codes is None
        points = codes if point_codes is None else point_codes
        out = np.empty((points.shape[0], group.center_rows.shape[0]), dtype=np.int32)

        def fill(part: tuple[int, int]) -> None:
            _scan_kernels.scan_points(
                codes, points, own, self.neighbours, self.shared, self.left_out,
                group.center_rows, group.masks, group.member, group.row_start, group.pairs,
                *part, out,
            )  # fmt: skip

        in_parts(fill, points.shape[0], pool, n_threads)
        return out

    @property
    def nbytes(self) -> int:
        return self.neighbours.nbytes + self.shared.nbytes + self.left_out.nbytes


@dataclass(frozen=True)
class ScanGroup:
    """What a scan needs of G <= ``GROUP`` clusterings: their center rows (G, k), the bits
    of the one-hot dimensions each keeps among its centers' (``masks``, G x k x words), and
    which clusterings each row is a center of (``member``, ``row_start``, ``pairs``:
    ``_scan_kernels.group_members``)."""

    center_rows: np.ndarray
    masks: np.ndarray
    member: np.ndarray
    row_start: np.ndarray
    pairs: np.ndarray

    @classmethod
    def build(
        cls,
        codes: np.ndarray,
        center_rows: np.ndarray,
        seeds: np.ndarray,
        n_values: int,
        fraction: float,
        pool: Executor | None = None,
        n_threads: int = 1,
    ) -> ScanGroup:
        """The group of clusterings with centers ``center_rows`` (G, k) of ``codes`` and
        dimension seeds ``seeds`` (G,), keeping each dimension with probability ``fraction``."""
        n_rows, n_clusterings = codes.shape
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

        in_parts(mask, n_groups, pool, n_threads)
        member = np.empty(n_rows, dtype=np.uint64)
        row_start = np.empty(n_rows + 1, dtype=np.int64)
        pairs = np.empty(n_groups * k, dtype=np.int64)
        _scan_kernels.group_members(center_rows, n_rows, member, row_start, pairs)
        return cls(center_rows, masks, member, row_start, pairs)


def scans_new_points(layer: UpperLayer, n_points: int) -> bool:
    """Whether ``new_point_codes`` beats the walk for a batch of ``n_points`` new points.

    The walk visits every center's lists in every clustering however small the batch (work
    in proportion to k), the scan about as much per point in every layer: so the scan serves
    batches of up to ``NEW_POINTS_PER_CENTER`` points per center.
    """
    return n_points <= NEW_POINTS_PER_CENTER * layer.n_centers


def new_point_codes(
    layer: UpperLayer,
    codes: np.ndarray,
    pool: Executor | None = None,
    n_threads: int = 1,
    told: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """A fitted upper ``layer``'s codes of new points, from their previous-layer ``codes``,
    by candidate scan among the layer's center rows: the codes ``upper_clustering_codes``
    gives, bit for bit.

    The points are listed a block at a time, each block's lists within ``MAX_LIST_BYTES``;
    every block is scanned in every group of ``GROUP`` clusterings. ``told(done, total)``
    after each block's group, counting the clusterings scanned for every block (a backend's
    progress and cancellation).
    """
    center_codes = layer.center_codes
    n_rows = center_codes.shape[0]
    codes = np.ascontiguousarray(codes, dtype=center_codes.dtype)
    n_points = codes.shape[0]
    n_new, k = layer.centers.shape
    width = max(1, min(NeighbourLists.size_for(n_rows, k), n_rows))
    block = max(1, MAX_LIST_BYTES // (width * 6))
    postings = _center_postings(layer, center_codes)
    starts = range(0, n_new, GROUP)

    def group(first: int) -> ScanGroup:
        last = min(first + GROUP, n_new)
        return ScanGroup.build(
            center_codes, layer.centers[first:last], layer.seeds[first:last], layer.n_values,
            layer.feature_fraction, pool, n_threads,
        )  # fmt: skip

    # Kept across blocks when there are several (each group's masks are V_prev bits per
    # center), else built one at a time.
    groups = [group(first) for first in starts] if n_points > block else None
    out = np.empty((n_points, n_new), dtype=smallest_uint(k - 1))
    total = n_new * -(-n_points // block)
    for top in range(0, n_points, block):
        rows = slice(top, min(top + block, n_points))
        lists = NeighbourLists.of_new_points(
            codes[rows], postings, layer.n_values, n_rows, width, pool, n_threads
        )
        for index, first in enumerate(starts):
            scanned = group(first) if groups is None else groups[index]
            columns = slice(first, first + scanned.center_rows.shape[0])
            out[rows, columns] = lists.scan_group(
                center_codes, scanned, point_codes=codes[rows], pool=pool, n_threads=n_threads
            )
            if told is not None:
                told(top // block * n_new + columns.stop, total)
    return out


def _center_postings(layer: UpperLayer, center_codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, rows): the posting lists of a layer's center codes, as
    ``_kernels.build_postings`` lays them out; read off the layer's ``CodeIndex`` when it
    keeps one (every row has one code per clustering, so clustering v's lists start at
    v * n_rows), else built."""
    index = layer.index
    if index is None:
        return _kernels.build_postings(center_codes, layer.n_values)
    n_clusterings = index.offsets.shape[0]
    starts = np.arange(n_clusterings, dtype=np.int64)[:, None] * index.n_rows
    indptr = np.empty(n_clusterings * layer.n_values + 1, dtype=np.int64)
    indptr[:-1] = (index.offsets[:, :-1].astype(np.int64) + starts).ravel()
    indptr[-1] = n_clusterings * index.n_rows
    return indptr, index.rows
