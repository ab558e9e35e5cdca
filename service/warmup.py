"""The default model made warm before the replica says it is ready.

``/health/ready`` answered 200 while the first fast request still paid for its model's first
run and the first exact one for the exact model's read and its kernels' first use (seconds
each). The warmer runs the default model once on each path as soon as the default is known (and
again when another model becomes the default):

- fast: one row and one small batch through the ONNX graph, in this process, within the
  readiness check that first sees the default (milliseconds to a few seconds, which the first
  request paid before); ready is never said of a cold default;
- exact: one row through the replica's exact runtime, at the monitor's background priority,
  so that the runtime maps the model. Readiness reports it (``default_exact_loaded``) but
  never waits for it: an exact model can take long to read, and fast traffic must not wait.
  The runtime may later drop the model from its cache (``MBN_EXACT_CACHE_SIZE``).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable

import numpy as np

from mbn_core.bundle import Bundle
from service.exact.frontend import ExactFrontend

log = logging.getLogger(__name__)

# Rows of the fast path's second warm-up batch: a batch size of the kind clients send.
_WARM_BATCH_ROWS = 64


class DefaultModelWarmer:
    """Warms the default model's fast and exact paths (see the module's docstring)."""

    def __init__(self, exact: ExactFrontend | None) -> None:
        self.exact = exact
        self._lock = threading.Lock()
        self._started: weakref.WeakSet[Bundle] = weakref.WeakSet()
        self._exact_started: weakref.WeakSet[Bundle] = weakref.WeakSet()
        self._fast: weakref.WeakSet[Bundle] = weakref.WeakSet()
        self._exact: weakref.WeakSet[Bundle] = weakref.WeakSet()

    def status(self, bundle: Bundle | None) -> tuple[bool, bool]:
        """(fast path warm, exact model loaded) of ``bundle`` (the default; None: none yet).
        Blocking (readiness calls it from its own thread): the first time ``bundle`` is
        asked about, its fast path is warmed before the answer. Its exact warm-up starts on
        a thread of its own once the replica's exact runtime is running."""
        if bundle is None:
            return False, False
        # Only a runtime that ``mbn serve`` runs beside the API processes: an app that
        # starts its own on first use (as tests do) is not made to start one here.
        exact = self.exact
        state = None if exact is None or exact.socket_path is None else exact.state
        runtime_up = state is not None and state.connected
        with self._lock:
            warm_fast = bundle not in self._started
            self._started.add(bundle)
            warm_exact = runtime_up and bundle not in self._exact_started
            if warm_exact:
                self._exact_started.add(bundle)
            fast, loaded = bundle in self._fast, bundle in self._exact
        if warm_exact:
            self._thread(self._warm_exact, bundle)
        if warm_fast:  # here: this is the readiness checks' thread, never the event loop's
            self._warm_fast(bundle)
            fast = True
        return fast, loaded

    @staticmethod
    def _thread(target: Callable[[Bundle], None], bundle: Bundle) -> None:
        threading.Thread(target=target, args=(bundle,), name="mbn-warm", daemon=True).start()

    def _warm_fast(self, bundle: Bundle) -> None:
        rows = warm_rows(bundle, _WARM_BATCH_ROWS)
        try:
            bundle.embed_with_clusters(rows[:1], "fast")
            bundle.embed_with_clusters(rows, "fast")
        except Exception as error:  # a request will say what is wrong; readiness goes on
            log.warning("model %s: its fast path failed to warm up: %s", bundle.id, error)
        with self._lock:
            self._fast.add(bundle)
        log.info("model %s: fast path warm", bundle.id)

    def _warm_exact(self, bundle: Bundle) -> None:
        assert self.exact is not None
        if self.exact.shadow(bundle, warm_rows(bundle, 1)) is not None:
            with self._lock:
                self._exact.add(bundle)
            log.info("model %s: exact model loaded by the exact runtime", bundle.id)
        else:  # busy or down: the next readiness check tries again
            with self._lock:
                self._exact_started.discard(bundle)


def warm_rows(bundle: Bundle, n_rows: int) -> np.ndarray:
    """``n_rows`` rows any model takes: its input scaling's centre (the training data's,
    inside the training range), else zeros."""
    scaling = bundle.input_scaling
    centre = np.zeros(bundle.input_dim, dtype=np.float32)
    if not scaling.is_identity and scaling.offset is not None:
        centre = np.asarray(scaling.offset, dtype=np.float32).reshape(-1)[: bundle.input_dim]
    return np.tile(centre, (n_rows, 1)).astype(np.float32)
