"""The bundle's 2-D map laid out on a thread of its own, beside the rest of the training job.

The map's t-SNE needs only the model's training embedding, which exists as soon as the
teacher has fitted; the cross-fitted report, the MLP and the export come after it and leave a
core idle for much of their time (the MLP and most of the report run on one thread). So
training starts the layout then (``BackgroundMap.start``), on one thread, and takes it when
the bundle is assembled (``BackgroundMap.layout``), checking that it was made from the very
embedding the model kept. The result is the layout ``lay_out`` makes on the caller's thread
with the same options, bit for bit. The thread runs at the lowest priority of the job's
threads: its layout is wanted last (``mbn_core.utils.priority``).

A stopped or failed job abandons the thread (t-SNE cannot be interrupted): it finishes its
layout (seconds) and the result is dropped.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from mbn_core.bundle.embedding_map import MapLayout, lay_out
from mbn_core.utils.priority import MAP_NICENESS, lower_thread_priority

log = logging.getLogger(__name__)


class BackgroundMap:
    """One map layout, computed on a daemon thread from the embedding given to ``start``.

    Parameters
    ----------
    max_points, random_state, n_jobs
        ``lay_out``'s options.
    """

    def __init__(self, *, max_points: int, random_state, n_jobs: int | None) -> None:
        self.options = {"max_points": max_points, "random_state": random_state, "n_jobs": n_jobs}
        self._embedding: np.ndarray | None = None
        self._thread: threading.Thread | None = None
        self._result: MapLayout | None = None
        self._error: BaseException | None = None

    def start(self, embedding) -> None:
        """Lay out ``embedding`` (float32 copy) on a new thread; only the first call counts
        (a cross-fitted report's folds fit teachers too, on other rows)."""
        if self._thread is not None:
            return
        self._embedding = np.array(embedding, dtype=np.float32)
        self._thread = threading.Thread(target=self._run, name="mbn-map-layout", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        lower_thread_priority(MAP_NICENESS)
        try:
            self._result = lay_out(self._embedding, **self.options)
        except BaseException as error:  # handed to the caller by ``layout``
            self._error = error

    def layout(self, embedding) -> MapLayout | None:
        """The layout, waiting for it, when it was started from exactly ``embedding``
        (float32); None otherwise (never started, or from other values: the caller then
        lays the map out itself). A failure of the layout is raised here."""
        if self._thread is None or self._embedding is None:
            return None
        if not np.array_equal(self._embedding, np.asarray(embedding, dtype=np.float32)):
            log.warning("the map was started from another embedding; laying it out again")
            return None
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result
