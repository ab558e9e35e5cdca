"""Live monitoring of each model: fidelity of the fast path on shadow rows, input novelty.

A share (``MBN_SHADOW_FRACTION``) of the rows answered in fast mode is sampled. Sampled rows
are copied (a few rows, on the event loop) and queued for one background thread; nothing on
the request's path waits for it. The thread takes the queue in batches: once ``batch_rows``
rows wait, or the oldest has waited ``MBN_SHADOW_MAX_DELAY`` seconds. There

- every sampled row gets its novelty score and range check (``mbn_core.pipeline.novelty``),
- rows outside the training range are counted (the out-of-range share) and go no further:
  a fast path's error on them says nothing about its fidelity on the input it serves, and a
  single row of 1e30 would swamp every figure of the window;
- and the other rows are embedded exactly by the replica's exact runtime (``service.exact``) at
  background priority: the runtime computes them only when no client's exact row waits, in
  short steps of their own. These *shadow rows*, with their fast and exact embeddings, are
  kept for the fidelity report.

Why batches: embedding one row exactly reads every bottom-layer center, a batch reads them
once for all its rows, so a row's exact work costs several times less in a batch. On a replica
whose runtime is busy with clients' requests, the shadow rows wait behind them (up to a
couple of minutes, then they are counted as skipped) and the figures update more slowly,
while the requests do not.

Memory is bounded: at most ``2 * batch_rows`` rows wait (beyond it the oldest are dropped
and counted), one batch is processed at a time, and each model keeps its last
``MBN_MONITOR_WINDOW`` sampled rows and shadow rows. The report over the window uses the
very function that measures the bundle's fidelity at training time
(``mbn_core.pipeline.fidelity.measure_fidelity``), computed when asked and cached until the
window changes.

A figure with no rows behind it is null in the report and has no sample in ``/metrics``:
a zero would read as a failing model and raise every alert on an idle one. The state of a
model that is deleted (here, or by another replica: the registry tells the monitor) goes
with it, its series in ``/metrics`` included.

Shadow rows never take a client's place in the runtime's queue: they have a bound of their
own, so exact requests are never refused because of them.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
import weakref
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import r2_score

from mbn_core.bundle import NOVELTY_FILE, Bundle
from mbn_core.bundle.manifest import HEAD_CENTERS, exact_file
from mbn_core.bundle.mapped_npz import map_npz
from mbn_core.pipeline.fidelity import measure_fidelity
from mbn_core.pipeline.novelty import Novelty, load_novelty
from service.exact.frontend import ExactFrontend

log = logging.getLogger(__name__)

# The live fidelity's state for a method with no exact map to compare the fast path with.
NO_EXACT_MAP = "no exact map"
# Clusters of the window's k-means comparison when the model has no clustering head.
_DEFAULT_REPORT_CLUSTERS = 10
# Rows the shadow thread embeds together. A few hundred rows make the bottom layer a matrix
# product rather than one pass over the centers per row; at the default fraction a busy
# replica gathers them in well under a minute, and a quiet one is served by the delay.
SHADOW_BATCH_ROWS = 256


@dataclass
class _Sample:
    bundle: Bundle
    rows: np.ndarray
    fast: np.ndarray
    queued_at: float  # time.monotonic()


@dataclass
class ModelWindow:
    """What one model's monitor holds: counters and the last ``window`` rows."""

    window: int
    rows_seen: int = 0
    rows_sampled: int = 0
    shadow_rows: int = 0
    skipped_busy: int = 0  # not shadowed: the exact runtime was busy, down or refused them
    skipped_out_of_range: int = 0  # not shadowed: outside the training range
    dropped: int = 0  # sampled while the shadow thread was behind: not processed
    pending: int = 0  # sampled and queued, not processed yet
    last_update: float | None = None  # time.time() of the last processed sample
    novel: deque[bool] = field(init=False)
    out_of_range: deque[bool] = field(init=False)
    fast: deque[np.ndarray] = field(init=False)
    exact: deque[np.ndarray] = field(init=False)
    centers: np.ndarray | None = None  # the clustering head's, from the exact model
    version: int = 0
    cached: tuple[int, dict[str, Any]] | None = None  # (version, live fidelity)

    def __post_init__(self) -> None:
        self.novel = deque(maxlen=self.window)
        self.out_of_range = deque(maxlen=self.window)
        self.fast = deque(maxlen=self.window)
        self.exact = deque(maxlen=self.window)


class LiveMonitor:
    """Samples fast-mode rows, scores them, shadows them exactly and reports per model.

    Parameters
    ----------
    exact : ExactFrontend
        The replica's exact runtime, which embeds the shadow rows at background priority.
    fraction : float
        Share of fast-mode rows sampled (0 turns monitoring off).
    window : int
        Sampled rows and shadow rows each model keeps.
    replica : str
        This replica's name, for the metrics' label.
    max_delay : float
        Seconds a sampled row may wait for others to fill a batch (0: processed as soon as
        the thread is free, with whatever has queued meanwhile).
    batch_rows : int
        Rows that start a batch without waiting; twice this many may wait in all.
    seed : int or None
        Seed of the sampling.
    """

    def __init__(
        self,
        exact: ExactFrontend,
        *,
        fraction: float,
        window: int,
        replica: str,
        max_delay: float,
        batch_rows: int = SHADOW_BATCH_ROWS,
        seed: int | None = None,
    ) -> None:
        self.exact = exact
        self.fraction = fraction
        self.window = window
        self.replica = replica
        self.max_delay = max_delay
        self.batch_rows = batch_rows
        self._rng = np.random.default_rng(seed)
        # Rows to let pass before the next sampled one: a geometric gap, drawn once per
        # sampled row rather than a random number per row, so that a request with no
        # sampled row (nearly all of them) costs a subtraction.
        self._countdown = self._rows_to_skip()
        # One lock guards the windows, the queue and the thread's state; the thread sleeps on it.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._windows: dict[str, ModelWindow] = {}
        self._novelty: dict[str, tuple[Bundle, Novelty | None]] = {}
        self._queue: deque[_Sample] = deque()
        self._queued_rows = 0
        self._busy = False  # a batch is being processed
        self._flush = False  # process what waits now (wait_idle)
        self._stopped = False
        self._thread: threading.Thread | None = None
        # Each model's clustering head, read from its exact file once (cluster agreement).
        self._centers: dict[str, tuple[Bundle, np.ndarray | None]] = {}
        # Bundles deleted or replaced (``forget``): rows of theirs still in flight or queued
        # must not bring their windows back.
        self._retired: weakref.WeakSet[Bundle] = weakref.WeakSet()

    # --- the request's side (event loop) ------------------------------------------------------
    def observe(self, bundle: Bundle, rows: np.ndarray, fast: np.ndarray) -> None:
        """Count ``rows`` (answered in fast mode with ``fast``) and queue a sample of them for
        the background thread: each row with probability ``fraction``. Cheap and never
        blocking: a counter, and for a request with sampled rows a copy of them and at most a
        wake-up of the thread."""
        if self.fraction <= 0:
            return
        n_rows = rows.shape[0]
        limit = 2 * self.batch_rows
        with self._lock:
            if bundle in self._retired:
                return  # a request that began before its model was deleted
            model = self._window(bundle.id)
            model.rows_seen += n_rows
            if self._countdown >= n_rows:  # the common case: no row of this request
                self._countdown -= n_rows
                return
            # Row ``countdown`` is sampled, the later ones each with the fraction; the gap
            # to the next sampled row starts afresh (rows are sampled independently).
            first = self._countdown
            later = np.flatnonzero(self._rng.random(n_rows - first - 1) < self.fraction)
            chosen = np.concatenate([[first], first + 1 + later])
            self._countdown = self._rows_to_skip()
            if self._stopped:
                return
            model.rows_sampled += chosen.size
            if chosen.size > limit:  # a huge request at a high fraction: its last rows
                model.dropped += chosen.size - limit
                chosen = chosen[-limit:]
            sample = _Sample(bundle, rows[chosen].copy(), fast[chosen].copy(), time.monotonic())
            self._queue.append(sample)
            self._queued_rows += len(sample.rows)
            model.pending += len(sample.rows)
            while self._queued_rows > limit:  # behind: the oldest rows go
                old = self._queue.popleft()
                self._queued_rows -= len(old.rows)
                old_model = self._windows.get(old.bundle.id)
                if old_model is not None:
                    old_model.pending -= len(old.rows)
                    old_model.dropped += len(old.rows)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mbn-shadow", daemon=True)
                self._thread.start()
            elif len(self._queue) == 1 or self._queued_rows >= self.batch_rows:
                self._wake.notify()  # a new deadline, or a full batch

    def _rows_to_skip(self) -> int:
        if self.fraction <= 0:
            return 0
        return int(self._rng.geometric(min(1.0, self.fraction))) - 1

    # --- the background thread -------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            for samples in _by_model(batch):
                try:
                    self._process_model(samples)
                except Exception:  # a monitor must never take the service down
                    log.exception("monitoring model %s failed", samples[-1].bundle.id)
            with self._lock:
                self._busy = False
                self._wake.notify_all()  # wait_idle

    def _next_batch(self) -> list[_Sample] | None:
        """Wait until a batch is due and take it off the queue (None once shut down)."""
        with self._lock:
            while not self._stopped:
                if self._queue:
                    due = self._queue[0].queued_at + self.max_delay
                    wait = due - time.monotonic()
                    if self._flush or self._queued_rows >= self.batch_rows or wait <= 0:
                        break
                    self._wake.wait(wait)
                else:
                    self._flush = False
                    self._wake.wait()
            if self._stopped:
                return None
            batch, rows = [], 0
            while self._queue and rows < self.batch_rows:
                sample = self._queue.popleft()
                batch.append(sample)
                rows += len(sample.rows)
                window = self._windows.get(sample.bundle.id)
                if window is not None:
                    window.pending -= len(sample.rows)
            self._queued_rows -= rows
            self._busy = True
            return batch

    def _process_model(self, samples: list[_Sample]) -> None:
        """Score one model's rows of a batch and have the exact runtime embed them."""
        bundle = samples[-1].bundle  # the newest of the id (a replaced bundle's rows too)
        rows = np.concatenate([sample.rows for sample in samples])
        fast = np.concatenate([sample.fast for sample in samples])
        novelty = self.novelty(bundle)
        novel = out_of_range = None
        if novelty is not None:
            out_of_range = novelty.out_of_range(rows)
            if novelty.degenerate is None:
                novel = novelty.is_novel(rows)
        # Rows beyond the training range stay out of the fidelity window; so do rows whose
        # fast embedding is not finite (a model without a range check: no novelty model).
        keep = np.isfinite(fast).all(axis=1)
        if out_of_range is not None:
            keep &= ~out_of_range
        # A method without an exact map has no shadow rows: novelty alone is measured.
        shadow = keep.any() and bundle.no_exact_map is None
        exact = self.exact.shadow(bundle, rows[keep]) if shadow else None
        if exact is not None:
            finite = np.isfinite(exact).all(axis=1)
            shadowed_fast, exact = fast[keep][finite], exact[finite]
        centers = self._head_centers(bundle) if exact is not None else None
        with self._lock:
            window = self._windows.get(bundle.id)
            if window is None or bundle in self._retired:
                return  # deleted meanwhile: its state is gone and stays gone
            if out_of_range is not None:
                window.out_of_range.extend(out_of_range.tolist())
            if novel is not None:
                window.novel.extend(novel.tolist())
            window.skipped_out_of_range += int(np.count_nonzero(~keep))
            if exact is None:
                if bundle.no_exact_map is None:  # none to skip without an exact map
                    window.skipped_busy += int(np.count_nonzero(keep))
            else:
                window.skipped_out_of_range += int(np.count_nonzero(keep)) - len(exact)
                window.fast.extend(shadowed_fast)
                window.exact.extend(exact)
                window.shadow_rows += len(exact)
                window.centers = centers
            window.version += 1
            window.last_update = time.time()

    def _head_centers(self, bundle: Bundle) -> np.ndarray | None:
        """The clustering head's centroids (None without a head), read from the exact file:
        the array alone, mapped, not the whole model."""
        cached = self._centers.get(bundle.id)
        if cached is not None and cached[0] is bundle:
            return cached[1]
        centers = None
        if bundle.n_clusters is not None:
            path = bundle.path / exact_file(bundle.manifest)
            try:
                with open(path, "rb") as handle:
                    head = map_npz(handle, str(path)).get(HEAD_CENTERS)
                centers = None if head is None else np.array(head, dtype=np.float32)
            except (OSError, ValueError) as error:
                log.warning("model %s: no clustering head for the monitor: %s", bundle.id, error)
        self._centers[bundle.id] = (bundle, centers)
        return centers

    # --- reading ---------------------------------------------------------------------------
    def novelty(self, bundle: Bundle) -> Novelty | None:
        """``bundle``'s novelty model (read on first use; None when it has none).

        Blocking the first time: call it off the event loop. BundleError when damaged."""
        with self._lock:
            cached = self._novelty.get(bundle.id)
        if cached is not None and cached[0] is bundle:
            return cached[1]
        model = load_novelty(bundle)
        with self._lock:
            if bundle not in self._retired:
                self._novelty[bundle.id] = (bundle, model)
        return model

    def forget(self, bundle: Bundle) -> None:
        """Drop everything held for ``bundle`` (deleted, or replaced by another version of
        its id): its window, its novelty model, its clustering head and its queued rows.
        Its series leave ``/metrics`` with it."""
        with self._lock:
            self._retired.add(bundle)
            self._windows.pop(bundle.id, None)
            self._novelty.pop(bundle.id, None)
            self._centers.pop(bundle.id, None)
            kept = deque(sample for sample in self._queue if sample.bundle.id != bundle.id)
            self._queued_rows = sum(len(sample.rows) for sample in kept)
            self._queue = kept

    def idle(self) -> bool:
        """Whether no batch is being processed and no sampled row waits."""
        with self._lock:
            return not self._busy and not self._queue

    def report(self, bundle: Bundle) -> dict[str, Any]:
        """The monitor of ``bundle``: counters, live fidelity on the shadow window beside
        the training-time report, novelty and out-of-range shares of the sampled window.
        Computing the fidelity takes a k-means run (cached until the window changes): call
        it off the event loop."""
        with self._lock:
            window = self._windows.get(bundle.id) or ModelWindow(self.window)
            counters = {
                "rows_seen": window.rows_seen,
                "rows_sampled": window.rows_sampled,
                "shadow_rows": window.shadow_rows,
                "skipped_out_of_range": window.skipped_out_of_range,
                "skipped_exact_busy": window.skipped_busy,
                "dropped_behind": window.dropped,
                "pending_rows": window.pending,
            }
            version, cached = window.version, window.cached
            if cached is not None and cached[0] != version:
                cached = None
            n_shadow = len(window.fast)
            # The window's rows are copied only when the fidelity must be computed again.
            fast = np.array(window.fast) if n_shadow and cached is None else None
            exact = np.array(window.exact) if n_shadow and cached is None else None
            novel = np.array(window.novel, dtype=bool)
            out_of_range = np.array(window.out_of_range, dtype=bool)
            last_update = window.last_update
            centers = window.centers
        no_exact_map = bundle.no_exact_map
        if no_exact_map is not None:
            live = {"state": NO_EXACT_MAP, "reason": no_exact_map}
        elif cached is not None:
            live = cached[1]
        else:
            live = live_fidelity(fast, exact, centers, bundle.n_clusters)
            with self._lock:
                current = self._windows.get(bundle.id)
                if current is not None and current.version == version:
                    current.cached = (version, live)
        unavailable = self._novelty_unavailable(bundle)
        if self.fraction <= 0:
            state = "off"
        elif counters["rows_seen"] == 0:
            state = "no_traffic"
        elif n_shadow == 0:
            state = "no_shadow_rows"
        else:
            state = "live"
        return {
            "model": bundle.id,
            "name": bundle.name,
            "replica": self.replica,
            "shadow_fraction": self.fraction,
            "shadow_max_delay": self.max_delay,
            "window": self.window,
            **counters,
            "window_shadow_rows": n_shadow,
            "window_sampled_rows": len(novel),
            "state": state,
            "live": live,
            "training": bundle.manifest.get("fidelity"),
            "novelty_available": unavailable is None,
            "novelty_unavailable": unavailable,
            "novelty_threshold": (bundle.manifest.get("novelty") or {}).get("threshold"),
            "novelty_share": _share(novel),
            "out_of_range_share": _share(out_of_range),
            "last_update": _iso(last_update),
            "has_traffic": counters["rows_seen"] > 0,
            "note": _note(state, counters, n_shadow, unavailable, self.max_delay)
            if no_exact_map is None
            else f"{NO_EXACT_MAP}: live fidelity cannot be measured ({no_exact_map}); "
            "novelty and out-of-range shares are measured",
        }

    def _novelty_unavailable(self, bundle: Bundle) -> str | None:
        """Why ``bundle`` has no usable novelty score (None when it has one): no novelty
        model, or one whose calibration is degenerate (known once its model was read)."""
        if NOVELTY_FILE not in bundle.manifest.get("files", {}):
            return (
                f"model {bundle.id!r} has no novelty model (trained before novelty scores, "
                "or on sparse input)"
            )
        section = bundle.manifest.get("novelty") or {}
        if section.get("degenerate"):
            return str(section.get("degenerate_reason") or "the novelty calibration is degenerate")
        with self._lock:
            cached = self._novelty.get(bundle.id)
        if cached is not None and cached[0] is bundle and cached[1] is not None:
            return cached[1].degenerate
        return None

    def gauges(self) -> list[tuple[str, str, dict[str, float]]]:
        """(model id, model name, the gauges' values) of every model with a window, as of
        now: R^2 and median cosine as ``measure_fidelity`` computes them (without its k-means,
        so a scrape stays cheap), and the shares. A model whose method has no exact map has
        no live fidelity gauges at all (a zero would read as a broken fast path)."""
        out = []
        with self._lock:
            windows = [
                (model_id, w, list(w.fast), list(w.exact), list(w.novel), list(w.out_of_range))
                for model_id, w in self._windows.items()
            ]
        for model_id, _, fast, exact, novel, out_of_range in windows:
            # A figure without rows has no sample: no alert fires on an idle model.
            values: dict[str, float] = {}
            if fast:
                r2, cosine = r2_and_median_cosine(np.array(exact), np.array(fast))
                if r2 is not None:
                    values["mbn_live_fidelity_r2"] = r2
                if cosine is not None:
                    values["mbn_live_fidelity_cosine"] = cosine
            if novel:
                values["mbn_input_novelty_share"] = float(np.mean(novel))
            if out_of_range:
                values["mbn_input_out_of_range_share"] = float(np.mean(out_of_range))
            if values:
                out.append((model_id, "", values))
        return out

    def wait_idle(self, timeout: float) -> bool:
        """Process every waiting row now, without waiting for a batch to fill, and wait
        until that is done (for tests and benchmarks). False when ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._flush = True
            self._wake.notify_all()
            while self._busy or self._queue:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped:
                    return False
                self._wake.wait(left)
            return True

    def shutdown(self) -> None:
        """Stop the thread after its current batch; waiting rows are not processed."""
        with self._lock:
            self._stopped = True
            self._wake.notify_all()

    def _window(self, model_id: str) -> ModelWindow:
        window = self._windows.get(model_id)
        if window is None:
            window = self._windows[model_id] = ModelWindow(self.window)
        return window


def _by_model(batch: list[_Sample]) -> list[list[_Sample]]:
    """The batch's samples grouped by model id, in order of first appearance."""
    groups: dict[str, list[_Sample]] = {}
    for sample in batch:
        groups.setdefault(sample.bundle.id, []).append(sample)
    return list(groups.values())


def live_fidelity(
    fast: np.ndarray | None,
    exact: np.ndarray | None,
    centers: np.ndarray | None,
    n_clusters: int | None,
) -> dict[str, Any]:
    """The training report's measures of fast against exact on the shadow rows
    (``measure_fidelity``): R^2, mean and median cosine, 10-NN overlap, NMI of k-means on
    both, and cluster agreement (same nearest head centroid). None for every measure without
    shadow rows, and for one the rows are too few for (R^2 of one row, 10-NN of ten)."""
    if fast is None or exact is None or len(fast) == 0:
        return {"n_holdout": 0, "r2": None, "cosine": None, "cosine_median": None,
                "knn_overlap": None, "nmi_fast_exact": None,
                "cluster_agreement": None}  # fmt: skip
    with warnings.catch_warnings():
        # Recent traffic may repeat rows: fewer distinct points than clusters is expected.
        warnings.simplefilter("ignore", ConvergenceWarning)
        report = measure_fidelity(
            exact, fast, n_clusters=n_clusters or _DEFAULT_REPORT_CLUSTERS, centers=centers, seed=0
        )
    return {
        key: _finite_or_none(value)
        for key, value in report.items()
        if not key.startswith("nmi_labels")
    }


def r2_and_median_cosine(exact: np.ndarray, fast: np.ndarray) -> tuple[float | None, float | None]:
    """R^2 (variance weighted) and median row cosine of ``fast`` against ``exact``, as
    ``measure_fidelity`` reports them; None for a figure the rows do not define (R^2 of a
    single row, or of rows without variance)."""
    exact = np.asarray(exact, dtype=np.float64)
    fast = np.asarray(fast, dtype=np.float64)
    r2 = None
    if len(exact) > 1:
        r2 = _finite_or_none(float(r2_score(exact, fast, multioutput="variance_weighted")))
    norms = np.linalg.norm(exact, axis=1) * np.linalg.norm(fast, axis=1)
    cosine = np.sum(exact * fast, axis=1) / np.maximum(norms, np.finfo(np.float64).tiny)
    return r2, _finite_or_none(float(np.median(cosine)))


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def _share(flags: np.ndarray) -> float | None:
    return float(np.mean(flags)) if flags.size else None


def _iso(stamp: float | None) -> str | None:
    """A ``time.time()`` as the service writes every timestamp (ISO 8601, UTC, ``Z``)."""
    if stamp is None:
        return None
    moment = datetime.fromtimestamp(stamp, UTC).isoformat(timespec="milliseconds")
    return moment.replace("+00:00", "Z")


def _note(
    state: str,
    counters: dict[str, int],
    n_shadow: int,
    novelty_unavailable: str | None,
    max_delay: float,
) -> str:
    if state == "off":
        return "monitoring is off (MBN_SHADOW_FRACTION=0): no figures are measured"
    if state == "no_traffic":
        return "no fast-mode traffic on this replica yet: no figures until there are rows"
    parts = []
    if n_shadow == 0:
        parts.append("no shadow rows yet (none sampled, or the exact runtime was busy or "
                     "down): no live fidelity yet")  # fmt: skip
    if counters["skipped_out_of_range"]:
        parts.append(f"{counters['skipped_out_of_range']} sampled rows were outside the training "
                     "range (or gave no finite embedding) and are left out of the live "
                     "fidelity; the out-of-range share counts them")  # fmt: skip
    if counters["pending_rows"]:
        parts.append(f"{counters['pending_rows']} sampled rows wait to be processed in a "
                     f"batch (within {max_delay:g} s, MBN_SHADOW_MAX_DELAY)")  # fmt: skip
    if novelty_unavailable is not None:
        parts.append(f"no novelty share: {novelty_unavailable}")
    return "; ".join(parts) or "ok"
