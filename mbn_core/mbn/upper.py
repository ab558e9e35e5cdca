"""The upper layers of an MBN: k-centers clusterings of the previous layer's one-hot codes.

A point's similarity to a center is the number of one-hot dimensions both have set among
those the clustering chose: the codes they share. It is computed from posting lists (which
points have code c in clustering v), so the cost is the pairs that share a code, never a
dense n x k matrix.
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from mbn_core.mbn import _kernels, _layout_kernels
from mbn_core.mbn.dtypes import smallest_uint
from mbn_core.mbn.keep_hash import keep_threshold
from mbn_core.mbn.parts import in_parts

# Batches of up to this many rows are encoded row by row over a layer's ``CodeIndex``
# (``UpperLayer.encodes_by_row``) rather than through the rebuilt code matrix...
INDEXED_ROWS = 256
# ...while they have fewer rows than this per center of the layer: a larger batch repays the
# candidate scan's cost per layer (``neighbour_scan.new_point_codes``: V x k masks of kept
# dimensions), after which a row costs a third to a half of its walk of the index (MNIST
# models of 9,000 and 54,000 rows, layers of k 250-1,000, batches of 64-256 rows).
INDEXED_ROWS_PER_CENTER = 0.25


@dataclass(frozen=True)
class CodeIndex:
    """The center rows of an upper layer by (clustering, code): the center codes inverted.

    Each row has one code per clustering, so clustering v's lists fill ``rows[v * n_rows:
    (v + 1) * n_rows]``; the rows whose code in clustering v is c are
    ``rows[v * n_rows + offsets[v, c]:v * n_rows + offsets[v, c + 1]]``, in increasing order
    (``rows_with``). ``rows`` has as many entries as the code matrix and ``offsets`` V x
    (n_values + 1), both in the smallest dtype that numbers the rows, so the index replaces
    the matrix in memory; the matrix is rebuilt from it when a large batch needs it
    (``codes``).
    """

    offsets: np.ndarray
    rows: np.ndarray
    n_rows: int
    n_values: int
    code_dtype: np.dtype

    @classmethod
    def build(cls, center_codes: np.ndarray, n_values: int) -> CodeIndex:
        """Invert a (n_rows, V) code matrix with values in [0, n_values)."""
        n_rows, n_clusterings = center_codes.shape
        offsets = np.empty((n_clusterings, n_values + 1), dtype=smallest_uint(n_rows))
        rows = np.empty(n_rows * n_clusterings, dtype=smallest_uint(max(n_rows - 1, 0)))
        _kernels.build_code_index(center_codes, offsets, rows)
        return cls(
            offsets=offsets,
            rows=rows,
            n_rows=n_rows,
            n_values=n_values,
            code_dtype=center_codes.dtype,
        )

    def rows_with(self, clustering: int, code: int) -> np.ndarray:
        """The rows whose code in ``clustering`` is ``code``, in increasing order."""
        base = clustering * self.n_rows
        start, stop = self.offsets[clustering, code : code + 2].astype(np.int64)
        return self.rows[base + start : base + stop]

    def codes(self) -> np.ndarray:
        """The (n_rows, V) code matrix the index was built from."""
        out = np.empty((self.n_rows, self.offsets.shape[0]), dtype=self.code_dtype)
        _kernels.fill_codes_from_index(self.offsets, self.rows, out)
        return out

    @property
    def nbytes(self) -> int:
        return self.offsets.nbytes + self.rows.nbytes


@dataclass(frozen=True)
class UpperLayer:
    """A fitted upper layer: V k-centers clusterings of the previous layer's one-hot codes.

    The input is the concatenation of the previous layer's V one-hot codes, V * k_prev
    dimensions. Each clustering keeps every one of them with probability
    ``feature_fraction``, decided by hashing (seed, dimension): the choice is never
    materialised, and is evaluated only where a center has a one.

    Build with ``UpperLayer.create``: it stores the center codes either as the matrix or as
    its ``CodeIndex`` (the faster for small requests, kept where it is no larger).

    Attributes
    ----------
    centers : ndarray of shape (V, k), unsigned int
        Rows of ``center_codes`` that serve as each clustering's centers.
    seeds : ndarray of shape (V,), uint64
        Seeds of each clustering's dimension choice.
    n_values : int
        k of the previous layer (codes lie in [0, n_values)).
    feature_fraction : float
        Probability that a one-hot dimension is chosen.
    stored_codes : ndarray of shape (n_center_rows, V_prev), unsigned int, or None
        Previous-layer codes of the training points used as centers, when kept as a matrix.
    index : CodeIndex or None
        The same codes inverted, when kept as an index.
    """

    centers: np.ndarray
    seeds: np.ndarray
    n_values: int
    feature_fraction: float
    stored_codes: np.ndarray | None = None
    index: CodeIndex | None = None

    @classmethod
    def create(
        cls,
        centers: np.ndarray,
        center_codes: np.ndarray,
        seeds: np.ndarray,
        n_values: int,
        feature_fraction: float,
    ) -> UpperLayer:
        """A layer storing ``center_codes`` as the matrix or as its index (see the class).

        The index answers a small request in fewer steps than the matrix in every layer
        measured, so it is kept wherever it takes no more memory than the matrix:
        where the row numbers are no wider than the codes. Deep layers (codes < 256 of
        thousands of rows) keep the matrix, half the size.
        """
        n_rows = center_codes.shape[0]
        row_dtype = np.dtype(smallest_uint(max(n_rows - 1, 0)))
        if row_dtype.itemsize <= center_codes.dtype.itemsize:
            return cls(
                centers, seeds, n_values, feature_fraction,
                index=CodeIndex.build(center_codes, n_values),
            )  # fmt: skip
        return cls(centers, seeds, n_values, feature_fraction, stored_codes=center_codes)

    @property
    def center_codes(self) -> np.ndarray:
        """(n_center_rows, V_prev) previous-layer codes of the center rows (rebuilt from the
        index when the layer keeps one: a copy, not a view)."""
        if self.stored_codes is not None:
            return self.stored_codes
        assert self.index is not None
        return self.index.codes()

    @property
    def n_centers(self) -> int:
        return int(self.centers.shape[1])

    def encodes_by_row(self, n_rows: int) -> bool:
        """Whether ``codes_few`` is the cheaper way to encode a batch of ``n_rows`` on the
        host: with an index, the batch path first rebuilds the code matrix, which costs as
        much as a few hundred rows encoded over the index one by one, and the scan computes
        masks for every center, which as many rows as a quarter of the centers repay."""
        limit = min(INDEXED_ROWS, INDEXED_ROWS_PER_CENTER * self.n_centers)
        return self.index is not None and n_rows <= limit

    def codes_few(self, codes: np.ndarray) -> np.ndarray:
        """This layer's codes of a few points from their previous-layer ``codes``.

        Every clustering, over the index or the code matrix, with nothing rebuilt per call:
        the same codes as ``upper_clustering_codes`` over any layout.
        """
        out = np.empty((codes.shape[0], self.centers.shape[0]), dtype=np.int32)
        threshold = keep_threshold(self.feature_fraction)
        keep_all = self.feature_fraction >= 1.0
        row_start, pairs = self._row_pairs
        if self.index is not None:
            _kernels.upper_codes_indexed_by_row(
                codes, self.index.offsets, self.index.rows, row_start, pairs, self.n_centers,
                self.seeds, self.n_values, threshold, keep_all, out,
            )  # fmt: skip
        else:
            assert self.stored_codes is not None
            _kernels.upper_codes_dense_by_row(
                codes.astype(self.stored_codes.dtype), self.stored_codes, row_start, pairs,
                self.n_centers, self.seeds, self.n_values, threshold, keep_all, out,
            )  # fmt: skip
        return out.astype(smallest_uint(self.n_centers - 1))

    @cached_property
    def _row_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        # The centers by stored code row, for ``codes_few``: V * k keys plus a pointer per
        # stored row, so that each stored row is visited once for every center it is.
        n_rows = self.index.n_rows if self.index is not None else len(self.center_codes)
        row_start = np.empty(n_rows + 1, dtype=np.int32 if self.centers.size < 2**31 else np.int64)
        pairs = np.empty(self.centers.size, dtype=smallest_uint(max(self.centers.size - 1, 0)))
        _kernels.build_row_pairs(self.centers, row_start, pairs)
        return row_start, pairs

    @property
    def nbytes(self) -> int:
        stored = self.stored_codes.nbytes if self.stored_codes is not None else 0
        indexed = self.index.nbytes if self.index is not None else 0
        return self.centers.nbytes + stored + indexed + self.seeds.nbytes


# Posting lists are laid out per center row (see ``_kernels.inline_postings``) while they
# average at most this many points and the copy stays under INLINE_MAX_BYTES; longer lists
# are read in place, where they are long sequential runs anyway: short lists read faster
# inline, long ones no faster, for a dearer copy.
INLINE_MAX_MEAN = 12.0
INLINE_MAX_BYTES = 256 << 20


def lays_out_inline(total: int, n_lists: int, n_points: int) -> bool:
    """Whether ``Postings`` copies ``n_lists`` lists of ``total`` entries (points of a batch
    of ``n_points``) per center row rather than reading them in place."""
    point_bytes = np.dtype(smallest_uint(max(n_points - 1, 0))).itemsize
    return total <= INLINE_MAX_MEAN * n_lists and total * point_bytes <= INLINE_MAX_BYTES


@dataclass(frozen=True)
class Postings:
    """Posting lists of a batch's previous-layer codes, located for a layer's center rows.

    Shared by all V clusterings of a layer: built once per layer and batch. Stored in the
    narrowest dtypes that fit, because the kernels' random reads are only cheap while these
    arrays stay within a few megabytes of cache. Either ``rows`` / ``start`` / ``length``
    (lists read in place) or ``segments`` / ``neighbors`` (lists copied per center row) are set.
    """

    n_points: int
    centers_are_points: bool = False
    rows: np.ndarray | None = None
    start: np.ndarray | None = None
    length: np.ndarray | None = None
    segments: np.ndarray | None = None
    neighbors: np.ndarray | None = None

    @classmethod
    def build(
        cls,
        codes: np.ndarray,
        center_codes: np.ndarray,
        n_values: int,
        inline: bool | None = None,
        centers_are_points: bool = False,
        pool: Executor | None = None,
    ) -> Postings:
        """Invert ``codes`` and locate the lists of every center row.

        ``inline`` forces a layout; None chooses by the lists' mean length and size.
        ``centers_are_points`` says that center row r is the batch's point r (training: the
        centers are training points), which the inline layout uses to skip self matches.
        ``pool`` shares the copy of the inline layout between two of its threads.
        """
        n_points = codes.shape[0]
        indptr, rows = _kernels.build_postings(codes, n_values)
        point_dtype = smallest_uint(max(n_points - 1, 0))
        n_centers, n_clusterings = center_codes.shape
        start = np.empty(center_codes.shape, dtype=np.int32 if rows.size < 2**31 else np.int64)
        longest = int(np.diff(indptr).max()) if indptr.size > 1 else 0
        length = np.empty(center_codes.shape, dtype=smallest_uint(longest))

        def locate(part: tuple[int, int]) -> None:
            rows_of = slice(*part)
            _kernels.locate_postings(
                indptr, center_codes[rows_of], n_values, start[rows_of], length[rows_of]
            )

        in_parts(locate, n_centers, pool, 2)
        total = int(length.sum(dtype=np.int64))
        if inline is None:
            inline = lays_out_inline(total, n_centers * n_clusterings, n_points)
        if inline:
            # Self matches are left out when the centers are the points.
            skip = 1 if centers_are_points else 0
            segments = np.empty(
                (n_centers, n_clusterings + 1), dtype=np.int32 if total < 2**31 else np.int64
            )
            _layout_kernels.segment_starts(length, skip, segments)
            kept = total - skip * n_centers * n_clusterings
            neighbors = np.zeros(kept + _kernels.ROW_PAD, dtype=point_dtype)

            def fill(part: tuple[int, int]) -> None:
                if centers_are_points:
                    _kernels.inline_own_postings(indptr, rows, n_values, segments, neighbors, *part)
                else:
                    _kernels.inline_postings(
                        indptr, rows, center_codes, n_values, segments, neighbors, *part
                    )

            # Memory-latency bound: worth both cores even though it runs once per layer.
            in_parts(fill, n_clusterings if centers_are_points else n_centers, pool, 2)
            return cls(
                n_points=n_points,
                centers_are_points=centers_are_points,
                segments=segments,
                neighbors=neighbors,
            )
        padded = np.zeros(rows.size + _kernels.ROW_PAD, dtype=point_dtype)
        padded[: rows.size] = rows
        return cls(n_points=n_points, rows=padded, start=start, length=length)


@dataclass(frozen=True)
class PointPostings:
    """The center rows sharing each code of a small batch (``_kernels.batch_key_postings``).

    The layout for a few rows (a request): one pass over the center codes per layer, then
    each clustering costs about k + (shared codes) per point instead of k * V.
    """

    n_points: int
    n_center_rows: int
    codes: np.ndarray
    point_keys: np.ndarray
    indptr: np.ndarray
    rows: np.ndarray

    @classmethod
    def build(cls, codes: np.ndarray, center_codes: np.ndarray, n_values: int) -> PointPostings:
        point_keys, indptr, rows = _kernels.batch_key_postings(codes, center_codes, n_values)
        return cls(
            n_points=codes.shape[0],
            n_center_rows=center_codes.shape[0],
            codes=codes,
            point_keys=point_keys,
            indptr=indptr,
            rows=rows,
        )

    @staticmethod
    def cheaper(
        n_points: int, n_center_rows: int, n_values: int, k: int, V: int, fraction: float
    ) -> bool:
        """Whether this layout beats ``Postings`` for a batch (estimated work per clustering)."""
        per_point = V + fraction * V * n_center_rows / n_values + k
        per_center = V * (1 + fraction * n_points / n_values)
        return n_points * per_point < k * per_center


def upper_clustering_codes(
    postings: Postings | PointPostings,
    center_codes: np.ndarray,
    centers: np.ndarray,
    n_values: int,
    seed: np.uint64,
    feature_fraction: float,
) -> np.ndarray:
    """Nearest center of every point of a batch for one upper-layer clustering.

    Parameters
    ----------
    postings : Postings or PointPostings
        The batch's previous-layer codes, inverted (``Postings.build``), or the center rows
        sharing each of them (``PointPostings.build``, for small batches).
    center_codes : ndarray of shape (n_center_rows, V_prev), unsigned int
        Previous-layer codes of the candidate center rows.
    centers : ndarray of shape (k,), int32
        This clustering's centers, as rows of ``center_codes``.
    n_values : int
        k of the previous layer.
    seed : uint64
        Seed of this clustering's choice of one-hot dimensions.
    feature_fraction : float
        Probability that a one-hot dimension is chosen.

    Returns
    -------
    codes : ndarray of shape (n_points,), int32
    """
    out = np.empty(postings.n_points, dtype=np.int32)
    choice = (np.uint64(seed), keep_threshold(feature_fraction), feature_fraction >= 1.0)
    if isinstance(postings, PointPostings):
        _kernels.upper_codes_by_point(
            postings.codes,
            postings.point_keys,
            postings.indptr,
            postings.rows,
            centers,
            postings.n_center_rows,
            n_values,
            *choice,
            out,
        )
    elif postings.segments is not None:
        _kernels.upper_codes_inline(
            postings.segments,
            postings.neighbors,
            center_codes,
            centers,
            n_values,
            *choice,
            postings.centers_are_points,
            *_kernels.count_scratch(postings.n_points, center_codes.shape[1]),
            out,
        )
    else:
        _kernels.upper_codes(
            postings.rows,
            postings.start,
            postings.length,
            center_codes,
            centers,
            n_values,
            *choice,
            *_kernels.count_scratch(postings.n_points, center_codes.shape[1]),
            out,
        )
    return out
