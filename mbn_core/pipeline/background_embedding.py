"""The held-out rows' exact embedding computed on a thread of its own, beside the student.

The report needs the fitted method's embedding of the rows held out of its fit. That needs
only the fitted method, which exists before its fast path is trained; a distilled student's
MLP then trains on one BLAS thread and leaves the other core idle for most of its time. So
the pipeline starts the embedding as soon as the method is fitted (``BackgroundEmbedding.
start``) and takes it when the report needs it (``BackgroundEmbedding.result``), from the
very estimator it was started with: the values ``transform`` gives on the caller's thread,
bit for bit (the BLAS limits the two hold are shared, ``mbn_core.utils.blas``). The thread
runs at a lower priority than the student, which the job waits for first
(``mbn_core.utils.priority``).

A stopped or failed job abandons the thread: it finishes its ``transform`` and the result is
dropped.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from mbn_core.pipeline.report import as_embedding
from mbn_core.utils.priority import HELD_OUT_NICENESS, lower_thread_priority


class BackgroundEmbedding:
    """``as_embedding(estimator.transform(rows))``, computed on a daemon thread from the
    estimator given to ``start``."""

    def __init__(self, rows) -> None:
        self.rows = rows
        self._estimator: Any = None
        self._thread: threading.Thread | None = None
        self._result: np.ndarray | None = None
        self._error: BaseException | None = None

    def start(self, estimator: Any) -> None:
        """Embed the rows with fitted ``estimator`` on a new thread; only the first call
        counts."""
        if self._thread is not None:
            return
        self._estimator = estimator
        self._thread = threading.Thread(target=self._run, name="mbn-held-out", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        lower_thread_priority(HELD_OUT_NICENESS)
        try:
            self._result = as_embedding(self._estimator.transform(self.rows))
        except BaseException as error:  # handed to the caller by ``result``
            self._error = error

    def result(self, estimator: Any) -> np.ndarray:
        """The embedding by ``estimator``: waited for when it was started with that very
        estimator, else computed here. A failure of the thread's ``transform`` is raised."""
        if self._thread is None or self._estimator is not estimator:
            return as_embedding(estimator.transform(self.rows))
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
