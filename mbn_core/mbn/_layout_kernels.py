"""Hot loop of laying out a batch's posting lists per center row (``upper.Postings``),
compiled with numba."""

from __future__ import annotations

from numba import njit


@njit(nogil=True, cache=True)
def segment_starts(length, skip, segments):
    """Where each center row's lists start when they lie one after another, row by row.

    ``length[r, v]`` is the length of center row r's list in clustering v; each is taken
    ``skip`` entries shorter (1 where a row is left out of its own lists). ``segments[r, v]``
    gets the list's start and ``segments[r, V]`` the row's end: one pass, with no temporary
    the size of ``length`` (a cumulative sum in NumPy makes three).
    """
    n_rows, n_clusterings = length.shape
    at = 0
    for r in range(n_rows):
        for v in range(n_clusterings):
            segments[r, v] = at
            at += length[r, v] - skip
        segments[r, n_clusterings] = at
