"""The random draws that make an MBN's layers, and the layers made from them.

Every random choice of a fit is made here, on the driver, in a fixed order, so the model
does not depend on the backend that computes the codes: the bottom layer's chosen inputs,
centers and shifts (``fit_bottom_layer``), then each upper layer's center rows and seeds
(``draw_upper``, made ahead on a thread of their own by ``DrawsAhead``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.sparse as sp

from mbn_core.exceptions import TrainingStopped
from mbn_core.mbn._draws import choose_rows
from mbn_core.mbn.backends.base import LayerBackend
from mbn_core.mbn.bottom import BottomLayer
from mbn_core.mbn.dtypes import compact_values, smallest_uint
from mbn_core.mbn.encoders import UpperClusterings
from mbn_core.mbn.network import Network
from mbn_core.mbn.phases import current_times, phase
from mbn_core.mbn.upper import UpperLayer

# Clusterings whose center draws are made in one compiled call (``draw_upper``).
DRAWN_TOGETHER = 16

UpperDraws = tuple[np.ndarray, np.ndarray]


def fit_bottom_layer(
    network: Network, X, k: int, n_chosen: int, rng, backend: LayerBackend
) -> tuple[BottomLayer, np.ndarray]:
    """The bottom layer of ``k`` centers per clustering drawn from the training data X, each
    clustering choosing ``n_chosen`` inputs, and the (n, V) codes of X in it (computed by
    ``backend``)."""
    n_samples, n_features = X.shape
    V = network.n_clusterings
    # Packed row by row: a (V, d) boolean matrix is V bytes per input feature, 40 GB for
    # a sparse vocabulary of 10^8 words at V = 400.
    packed_width = (n_features + 7) // 8
    feature_masks = np.zeros((V, packed_width), dtype=np.uint8)
    shift_fraction = network.shift_fraction
    shift_masks = np.zeros((V, packed_width), dtype=np.uint8) if shift_fraction > 0 else None
    centers = np.empty((V, k), dtype=np.int64)
    row = np.zeros(n_features, dtype=bool)
    with phase("draws"):
        for v in range(V):
            chosen = rng.choice(n_features, n_chosen, replace=False)
            row[:] = False
            row[chosen] = True
            feature_masks[v] = np.packbits(row)
            centers[v] = rng.choice(n_samples, k, replace=False)
            if shift_masks is not None:
                n_shift = round(shift_fraction * n_chosen)
                row[:] = False
                row[rng.choice(chosen, n_shift, replace=False)] = True
                shift_masks[v] = np.packbits(row)
    with phase("bottom"):
        rows, local = distinct_rows(centers, n_samples)
        if sp.issparse(X):
            center_data = sp.csr_matrix(X[rows], dtype=np.float32)
            center_data.sort_indices()
        else:
            center_data = compact_values(X[rows])
        layer = BottomLayer(
            feature_masks=feature_masks,
            shift_masks=shift_masks,
            centers=local.astype(smallest_uint(len(rows) - 1)),
            center_data=center_data,
            metric=network.metric,
        )
        return layer, backend.bottom_codes(layer, X)


def draw_upper(
    n_clusterings: int, n_samples: int, rng, k: int, cancelled: threading.Event
) -> UpperDraws:
    """An upper layer's random draws: each clustering's k center rows, then the seeds of
    their dimension choices. Drawn a few clusterings at a time, so that a stopped fit
    (``cancelled``) waits for a few permutations of the rows, not a layer's."""
    V = n_clusterings
    parts = []
    for first in range(0, V, DRAWN_TOGETHER):
        if cancelled.is_set():
            raise TrainingStopped("the fit stopped before this layer's draws")
        # rng.choice(n_samples, k, replace=False), once per clustering
        parts.append(choose_rows(rng, n_samples, k, min(DRAWN_TOGETHER, V - first)))
    seeds = rng.randint(0, 2**63, size=V, dtype=np.int64).astype(np.uint64)
    return np.concatenate(parts), seeds


def fit_upper_layer(
    codes: np.ndarray,
    n_values: int,
    drawn: UpperDraws,
    fraction: float,
    backend: LayerBackend,
    index: int,
) -> tuple[UpperLayer, np.ndarray]:
    """Upper layer ``index`` from its draws over the training rows' (n, V) ``codes`` in the
    layer below (``n_values`` centers there), and the rows' codes in it."""
    n_samples = codes.shape[0]
    centers, seeds = drawn
    clusterings = UpperClusterings(centers.astype(np.int32), seeds, n_values, fraction)
    new_codes = backend.fit_upper_codes(index, codes, clusterings)
    rows, local = distinct_rows(centers, n_samples)
    layer = UpperLayer.create(
        centers=local.astype(smallest_uint(len(rows) - 1)),
        center_codes=codes[rows].astype(smallest_uint(n_values - 1)),
        seeds=seeds,
        n_values=n_values,
        feature_fraction=fraction,
    )
    return layer, new_codes


class DrawsAhead:
    """The upper layers' draws (``draw(k, cancelled)`` for each layer's k), made in order on a
    thread of their own while the layers compute: the same draws from the generator as
    drawing each layer's in turn, since one thread makes them in the layers' order and
    nothing else draws until the last is taken. They are a permutation of the rows per
    clustering, as long as the layer's own work on a GPU, and ``choose_rows`` makes them
    without the GIL. Leaving early sets ``cancelled``, which the draws check between runs."""

    def __init__(self, draw: Callable[[int, threading.Event], UpperDraws], ks: list[int]):
        self._cancelled = threading.Event()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="mbn-draws")
        times = current_times()  # the fit's record, if any, for the draws' own thread

        def timed_draw(k: int) -> UpperDraws:
            with phase("draws", times):
                return draw(k, self._cancelled)

        self._pending = [self._pool.submit(timed_draw, k) for k in ks]

    def __iter__(self) -> Iterator[UpperDraws]:
        return (pending.result() for pending in self._pending)

    def __enter__(self) -> DrawsAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        # A stopped or failed fit draws no further layers, and stops the one under way.
        self._cancelled.set()
        self._pool.shutdown(wait=True, cancel_futures=True)


def distinct_rows(centers: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows among ``centers`` (values in [0, n_rows)), in increasing order, and
    each entry's position among them: ``np.unique(centers, return_inverse=True)`` without
    sorting the V * k entries."""
    present = np.zeros(n_rows, dtype=bool)
    present[centers] = True
    rows = np.flatnonzero(present)
    position = np.empty(n_rows, dtype=np.intp)
    position[rows] = np.arange(len(rows))
    return rows, position[centers]
