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
a few neighbours, since one of the first is a center); where they are few, the walk serves
(``NeighbourLists.pays``). Lists too large for memory are built and scanned a block of points
at a time (``ScanPlan``): a point's list is the same in any block, and so are its codes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from mbn_core.mbn import _kernels, _one_hot_kernels, _scan_kernels
from mbn_core.mbn.keep_hash import keep_threshold

# Clusterings scanned together: one bit each in a 64-bit word.
GROUP = 64
# Most bytes a layer's scan holds beside the codes: its neighbour lists (6 bytes a neighbour)
# and its groups' centers (``GroupCenters``). Lists that would not fit are built and scanned
# a block of points at a time; each point's list, and so its codes, do not depend on the block.
MAX_LIST_BYTES = 64 << 20
# A point's scan reads about SCAN_DEPTH * n / k neighbours before one of them is a center and
# its best count closes the scan (measured on MNIST's layers: 6.8 n / k for a group of 64
# clusterings); lists hold LIST_MARGIN times that, so that few scans run past their end.
SCAN_DEPTH = 7.0
LIST_MARGIN = 3.0
# Seconds per unit of work, measured on one core of the development machine (MNIST-5k's
# layers): an increment of the walk, a neighbour met while listing, a neighbour read by a
# scan, a count of two points' kept shared codes, a kept-dimension hash.
WALK_INCREMENT = 4.5e-9
LIST_ENTRY = 2.0e-9
SCAN_STEP = 5.0e-9
PAIR_COUNT = 85e-9
HASH = 1.0e-9
# Counts per point and clustering (about 1.5 on MNIST's layers).
COUNTS_PER_POINT = 2.0
# Bytes a listed neighbour takes (int32 row, uint16 shared codes).
ENTRY_BYTES = 6


@dataclass(frozen=True)
class GroupCenters:
    """What a scan needs of a group of up to ``GROUP`` clusterings, whatever points it scans.

    Attributes
    ----------
    center_rows : ndarray of shape (G, k), int64
        The rows of the codes that are each clustering's centers.
    masks : ndarray of shape (G, k, words), uint64
        The one-hot dimensions each clustering keeps among each center's, 64 clusterings of
        the layer below a word.
    member, row_start, pairs : ndarray
        Which clusterings have each point as a center (``_scan_kernels.group_members``).
    """

    center_rows: np.ndarray
    masks: np.ndarray
    member: np.ndarray
    row_start: np.ndarray
    pairs: np.ndarray

    @classmethod
    def prepare(
        cls, codes: np.ndarray, center_rows: np.ndarray, seeds: np.ndarray, n_values: int,
        fraction: float,
    ) -> GroupCenters:  # fmt: skip
        """The group of clusterings whose centers are the rows ``center_rows`` (G, k) of
        ``codes``, with ``seeds`` (G,) of their dimension choices, keeping each one-hot
        dimension with probability ``fraction``."""
        n_points, n_clusterings = codes.shape
        n_groups, k = center_rows.shape
        center_rows = np.ascontiguousarray(center_rows, dtype=np.int64)
        masks = np.empty((n_groups, k, (n_clusterings + 63) // 64), dtype=np.uint64)
        _scan_kernels.keep_masks(
            codes, center_rows, np.asarray(seeds, dtype=np.uint64), n_values,
            keep_threshold(fraction), fraction >= 1.0, masks,
        )  # fmt: skip
        member = np.empty(n_points, dtype=np.uint64)
        row_start = np.empty(n_points + 1, dtype=np.int64)
        pairs = np.empty(n_groups * k, dtype=np.int64)
        _scan_kernels.group_members(center_rows, n_points, member, row_start, pairs)
        return cls(center_rows, masks, member, row_start, pairs)

    @staticmethod
    def nbytes_for(n_points: int, n_clusterings: int, n_groups: int, k: int) -> int:
        """Bytes of a group of ``n_groups`` clusterings of ``k`` centers over ``n_points``
        rows of ``n_clusterings`` codes."""
        words = (n_clusterings + 63) // 64
        return n_groups * k * (words + 2) * 8 + (2 * n_points + 1) * 8


@dataclass(frozen=True)
class ScanPlan:
    """How a layer's scan is laid out in memory: the points in ``blocks`` (one list build
    each), and whether the groups' centers are kept across blocks or made again for each."""

    width: int
    blocks: list[tuple[int, int]]
    keep_groups: bool

    @classmethod
    def for_layer(cls, n_points: int, n_clusterings: int, k: int, n_new: int) -> ScanPlan | None:
        """The plan for ``n_new`` clusterings of ``k`` centers over ``n_points`` rows of
        ``n_clusterings`` codes within ``MAX_LIST_BYTES``; None where not even one point's
        list fits beside one group's centers."""
        width = max(1, min(NeighbourLists.size_for(n_points, k), n_points - 1))
        one_group = GroupCenters.nbytes_for(n_points, n_clusterings, min(GROUP, n_new), k)
        every_group = sum(
            GroupCenters.nbytes_for(n_points, n_clusterings, min(GROUP, n_new - first), k)
            for first in range(0, n_new, GROUP)
        )
        all_lists = n_points * width * ENTRY_BYTES
        if all_lists + one_group <= MAX_LIST_BYTES:  # one block: a group at a time
            return cls(width, [(0, n_points)], keep_groups=False)
        keep_groups = every_group <= MAX_LIST_BYTES // 2
        room = MAX_LIST_BYTES - (every_group if keep_groups else one_group)
        per_block = room // (width * ENTRY_BYTES)
        if per_block < 1:
            return None
        n_blocks = -(-n_points // per_block)
        cuts = np.linspace(0, n_points, n_blocks + 1).astype(int).tolist()
        return cls(width, list(itertools.pairwise(cuts)), keep_groups)

    @property
    def group_builds(self) -> int:
        """How many times each group's centers are made."""
        return 1 if self.keep_groups else len(self.blocks)


@dataclass(frozen=True)
class NeighbourLists:
    """Some points' neighbours in one layer's codes, most shared codes first.

    Attributes
    ----------
    neighbours : ndarray of shape (m, P), int32
        The first P (or all) neighbours of each of the points ``first:first + m``; -1 past
        its last.
    shared : ndarray of shape (m, P), uint16 or int32
        The codes each listed neighbour shares with the point.
    left_out : ndarray of shape (m,), int32
        The most codes an unlisted neighbour shares with the point, -1 when none is unlisted.
    first : int
        The point of row 0 (the lists may be of a block of the points).
    """

    neighbours: np.ndarray
    shared: np.ndarray
    left_out: np.ndarray
    first: int = 0

    @classmethod
    def build(
        cls,
        codes: np.ndarray,
        n_values: int,
        max_neighbours: int,
        pool: Executor | None = None,
        n_threads: int = 1,
        *,
        rows: tuple[int, int] | None = None,
        postings: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> NeighbourLists:
        """The lists of ``codes`` (n, V), values in [0, n_values), at most ``max_neighbours``
        a point, for the points ``rows`` (first, last; default all of them), split between
        ``n_threads`` of ``pool``. ``postings``: ``_kernels.build_postings(codes,
        n_values)``, made here when not given (the blocks of a layer share them)."""
        n_points, n_clusterings = codes.shape
        first, last = (0, n_points) if rows is None else rows
        indptr, posted = _kernels.build_postings(codes, n_values) if postings is None else postings
        width = max(1, min(max_neighbours, n_points - 1))
        neighbours = np.empty((last - first, width), dtype=np.int32)
        shared = np.empty((last - first, width), np.uint16 if n_clusterings < 2**16 else np.int32)
        left_out = np.empty(last - first, dtype=np.int32)

        def fill(part: tuple[int, int]) -> None:
            _scan_kernels.neighbour_lists(
                codes, indptr, posted, n_values, *part, first, neighbours, shared, left_out
            )

        _in_parts(fill, first, last, pool, n_threads)
        return cls(neighbours=neighbours, shared=shared, left_out=left_out, first=first)

    @staticmethod
    def size_for(n_points: int, n_centers: int) -> int:
        """Neighbours to list a point for scans of clusterings of ``n_centers`` centers."""
        return int(np.ceil(LIST_MARGIN * SCAN_DEPTH * n_points / max(n_centers, 1)))

    @staticmethod
    def pays(codes: np.ndarray, n_values: int, n_centers: int, n_new: int, fraction: float) -> bool:
        """Whether scanning beats the walk for a layer of ``n_new`` clusterings of
        ``n_centers`` centers over ``codes`` (values below ``n_values``): the scan must fit
        in ``MAX_LIST_BYTES`` (in blocks of points: ``ScanPlan``), and the estimated seconds
        (the constants above) be fewer."""
        n_points, n_clusterings = codes.shape
        if n_points < 2:
            return False
        plan = ScanPlan.for_layer(n_points, n_clusterings, n_centers, n_new)
        if plan is None:
            return False
        # Codes a point shares with all points, itself included: sum of its lists' lengths.
        sizes = np.empty(n_clusterings * n_values, dtype=np.int64)
        _one_hot_kernels.one_hot_counts(np.ascontiguousarray(codes.T), n_values, sizes)
        per_point = float(np.sum(sizes.astype(np.float64) ** 2)) / n_points
        walk = n_new * n_centers * fraction * per_point * WALK_INCREMENT
        depth = SCAN_DEPTH * n_points / n_centers
        scan = (
            n_points * per_point * LIST_ENTRY
            + plan.group_builds * n_new * n_centers * n_clusterings * HASH
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
        """(m, G) codes of the listed points in G <= ``GROUP`` clusterings whose centers are
        the rows ``center_rows`` (G, k) of ``codes``, with ``seeds`` (G,) of their dimension
        choices, keeping each one-hot dimension with probability ``fraction``."""
        group = GroupCenters.prepare(codes, center_rows, seeds, n_values, fraction)
        return self.scan_group(codes, group, pool, n_threads)

    def scan_group(
        self,
        codes: np.ndarray,
        group: GroupCenters,
        pool: Executor | None = None,
        n_threads: int = 1,
    ) -> np.ndarray:
        """(m, G) codes of the listed points in the clusterings of ``group``."""
        n_listed = len(self.left_out)
        out = np.empty((n_listed, group.center_rows.shape[0]), dtype=np.int32)

        def fill(part: tuple[int, int]) -> None:
            _scan_kernels.scan_points(
                codes, self.neighbours, self.shared, self.left_out, group.center_rows,
                group.masks, group.member, group.row_start, group.pairs, *part, self.first,
                out,
            )  # fmt: skip

        _in_parts(fill, self.first, self.first + n_listed, pool, n_threads)
        return out

    @property
    def nbytes(self) -> int:
        return self.neighbours.nbytes + self.shared.nbytes + self.left_out.nbytes


def _in_parts(
    fill: Callable[[tuple[int, int]], None],
    first: int,
    last: int,
    pool: Executor | None,
    n_threads: int,
) -> None:
    """``fill`` over ``n_threads`` contiguous ranges of the rows ``first:last``, on ``pool``
    when there is one."""
    n_rows = last - first
    parts = max(1, min(n_threads if pool is not None else 1, n_rows))
    cuts = (first + np.linspace(0, n_rows, parts + 1).astype(int)).tolist()
    ranges = list(itertools.pairwise(cuts))
    if pool is None or parts == 1:
        for part in ranges:
            fill(part)
    else:
        list(pool.map(fill, ranges))
