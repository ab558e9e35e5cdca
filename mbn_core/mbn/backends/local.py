"""The local backend: a layer's clusterings as tasks of a thread pool on this machine.

The kernels release the GIL, so threads scale over the cores. BLAS stays at one thread
while a network runs (``MBN`` limits it), so the pool's threads do not oversubscribe them.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from mbn_core.mbn.backends.base import LayerBackend, ProgressCallback, register_backend
from mbn_core.mbn.bottom import BottomLayer
from mbn_core.mbn.dtypes import smallest_uint
from mbn_core.mbn.encoders import Encoder, UpperClusterings, bottom_encoder, upper_encoder
from mbn_core.mbn.neighbour_scan import (
    GROUP,
    NeighbourLists,
    new_point_codes,
    scans_new_points,
)
from mbn_core.mbn.upper import UpperLayer


class LocalBackend(LayerBackend):
    """Runs each layer's clusterings on ``n_jobs`` threads, as tasks of one clustering or (small
    batches) a run of them."""

    name = "local"
    device = "cpu"

    def __init__(self, *, n_jobs: int | None = None, callback: ProgressCallback | None = None):
        super().__init__(n_jobs=n_jobs, callback=callback)
        self.n_threads = effective_threads(n_jobs)
        # One thread works on the caller's thread: a pool of one would only add a hand-over
        # per task, each taking the interpreter lock that a server's request threads share.
        self.pool = ThreadPoolExecutor(self.n_threads) if self.n_threads > 1 else None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)

    def bottom_codes(self, layer: BottomLayer, X) -> np.ndarray:
        encode = bottom_encoder(layer, X)
        return self.map_clusterings(0, len(layer.centers), encode, X.shape[0], layer.n_centers)

    def fit_upper_codes(
        self, index: int, codes: np.ndarray, clusterings: UpperClusterings
    ) -> np.ndarray:
        n_new = len(clusterings.centers)
        if NeighbourLists.pays(
            codes, clusterings.n_values, clusterings.n_centers, n_new,
            clusterings.feature_fraction,
        ):  # fmt: skip
            return self.scan_upper_codes(index, codes, clusterings)
        encode = clusterings.encoder(codes, self.pool)
        n_clusterings = len(clusterings.centers)
        return self.map_clusterings(
            index, n_clusterings, encode, codes.shape[0], clusterings.n_centers
        )

    def scan_upper_codes(
        self, index: int, codes: np.ndarray, clusterings: UpperClusterings
    ) -> np.ndarray:
        """``fit_upper_codes`` by candidate scan (``mbn_core.mbn.neighbour_scan``): the
        layer's neighbour lists once, then ``GROUP`` clusterings at a time, each group's
        points split between the threads; progress is told after each group."""
        n_points = codes.shape[0]
        n_new, k = clusterings.centers.shape
        lists = NeighbourLists.build(
            codes, clusterings.n_values, NeighbourLists.size_for(n_points, k), self.pool,
            self.n_threads,
        )  # fmt: skip
        out = np.empty((n_points, n_new), dtype=smallest_uint(k - 1))
        for first in range(0, n_new, GROUP):
            last = min(first + GROUP, n_new)
            out[:, first:last] = lists.scan(
                codes, clusterings.centers[first:last], clusterings.seeds[first:last],
                clusterings.n_values, clusterings.feature_fraction, self.pool, self.n_threads,
            )  # fmt: skip
            self.report(index, last, n_new)
        return out

    def upper_codes(self, index: int, codes: np.ndarray, layer: UpperLayer) -> np.ndarray:
        n_clusterings = len(layer.centers)
        if layer.encodes_by_row(codes.shape[0]):  # a mid-size batch over the layer's index
            codes = layer.codes_few(codes)
            self.report(index, n_clusterings, n_clusterings)
            return codes
        if scans_new_points(layer, codes.shape[0]):

            def told(done: int, total: int) -> None:
                self.report(index, done * n_clusterings // total, n_clusterings)

            return new_point_codes(layer, codes, self.pool, self.n_threads, told)
        encode = upper_encoder(layer, codes, self.pool)
        return self.map_clusterings(index, n_clusterings, encode, codes.shape[0], layer.n_centers)

    def map_clusterings(
        self, layer: int, n_clusterings: int, encode: Encoder, n_rows: int, n_centers: int
    ) -> np.ndarray:
        """(n_rows, n_clusterings) codes, column v from ``encode(v)``, reporting every finished
        clustering (in order) to the callback.

        One task per clustering, except for small batches: there a clustering is a fraction
        of a millisecond of work, less than a task's hand-over between threads, so each task
        takes a run of clusterings (``clusterings_per_task``).
        """
        codes = np.empty((n_rows, n_clusterings), dtype=smallest_uint(n_centers - 1))
        stopped = False
        per_task = clusterings_per_task(n_rows, n_clusterings, self.n_threads)

        def task(first: int) -> None:
            for v in range(first, min(first + per_task, n_clusterings)):
                if stopped:
                    return
                codes[:, v] = encode(v)

        starts = range(0, n_clusterings, per_task)
        pool = self.pool
        futures: list[Future[None]] = [] if pool is None else [pool.submit(task, f) for f in starts]
        try:
            for index, first in enumerate(starts):
                if futures:
                    futures[index].result()
                else:
                    task(first)
                for done in range(first + 1, min(first + per_task, n_clusterings) + 1):
                    try:
                        self.report(layer, done, n_clusterings)
                    except BaseException:
                        stopped = True
                        raise
        finally:
            for future in futures:
                future.cancel()
        return codes


# A task covers clusterings until it has about this many rows' worth of work: in ``fit``
# (thousands of rows) that is one clustering, so progress and stopping stay per clustering.
TASK_ROWS = 4096


def clusterings_per_task(n_rows: int, n_clusterings: int, n_threads: int) -> int:
    """Clusterings one task encodes: enough for ``TASK_ROWS`` rows, and no fewer tasks than
    threads."""
    wanted = max(1, TASK_ROWS // max(n_rows, 1))
    return max(1, min(wanted, -(-n_clusterings // max(n_threads, 1))))


def effective_threads(n_jobs: int | None) -> int:
    """Threads for ``n_jobs``: None uses every available core, -1 too, -2 all but one..."""
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    available = available or 1
    if n_jobs is None:
        return available
    if n_jobs < 0:
        return max(1, available + 1 + n_jobs)
    return int(n_jobs)


register_backend(
    LocalBackend.name,
    LocalBackend,
    device="cpu",
    description="this machine's threads, a clustering (or a run of them) per task",
)
