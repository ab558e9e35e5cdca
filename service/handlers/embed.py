"""The /embed handler: resolves the model, admits the computation and runs it.

Fast mode runs here, in the API process (on the event loop or on the row budget's threads,
under its in-flight row bound). Exact mode is sent to the replica's exact runtime
(``service.exact``), which queues, batches and computes it in its own process; the handler
waits for the answer, or for the client to leave, which drops the request's rows.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio.to_thread
import numpy as np

from mbn_core.bundle import Bundle, BundleError, OutOfRangeInput
from mbn_core.bundle.load import check_scaled_range
from service.admission import RowBudget
from service.domain import InvalidInput
from service.exact.frontend import ExactFrontend
from service.monitor import LiveMonitor
from service.registry import ModelRegistry


@dataclass(frozen=True)
class Embedding:
    """What an embed request computed.

    Attributes
    ----------
    bundle : Bundle
        The model that answered (its id and name go back to the client).
    mode : {"fast", "exact"}
    embeddings : ndarray of shape (n, dim), float32
    clusters : ndarray of shape (n,), int64, or None
        Cluster ids, when asked for and the model has a clustering head.
    compute_ms : float
        Time in the model (the X-Compute-Time-Ms header): for exact mode, the runtime's
        steps that held the request's rows (shared with the requests merged with it).
    """

    bundle: Bundle
    mode: str
    embeddings: np.ndarray
    clusters: np.ndarray | None
    compute_ms: float


@dataclass(frozen=True)
class RowNovelty:
    """What ``return_novelty`` answers for each row: its novelty score and whether it is
    above the calibrated threshold, and whether it has a feature outside the training range.
    ``unavailable`` says why the scores (and, without a novelty model, the range check) are
    missing."""

    scores: np.ndarray | None = None
    novel: np.ndarray | None = None
    out_of_range: np.ndarray | None = None
    unavailable: str | None = None


class EmbedHandler:
    """Resolves models and computes embeddings for ``POST /embed``.

    Parameters
    ----------
    registry : ModelRegistry
        Resolves references to bundles.
    exact : ExactFrontend
        The replica's exact runtime (its queue bounds exact work: 429 beyond it).
    budget : RowBudget
        Bounds the rows of fast computations in flight.
    inline_fast_rows : int
        Fast batches up to this many rows run on the event loop (cheaper than a thread hop);
        larger ones on a thread (onnxruntime releases the GIL).
    max_rows_per_request : int
        Most rows one request may send (MBN_MAX_ROWS_PER_REQUEST).
    monitor : LiveMonitor or None
        Samples fast-mode rows for the live monitor and scores novelty.
    """

    def __init__(
        self,
        registry: ModelRegistry,
        exact: ExactFrontend,
        budget: RowBudget,
        inline_fast_rows: int,
        max_rows_per_request: int,
        monitor: LiveMonitor | None = None,
    ) -> None:
        self.registry = registry
        self.exact = exact
        self.budget = budget
        self.inline_fast_rows = inline_fast_rows
        self.max_rows_per_request = max_rows_per_request
        self.monitor = monitor

    async def resolve(self, ref: str | None) -> Bundle:
        """The bundle ``ref`` (id, name, or None for the default) names, or a domain error."""
        bundle = self.registry.lookup(ref)
        if bundle is None:  # maybe written by another replica: rescan, off the event loop
            bundle = await anyio.to_thread.run_sync(self.registry.get, ref)
        return bundle

    async def embed(
        self,
        bundle: Bundle,
        x: np.ndarray,
        mode: str,
        clusters: bool,
        gone: Callable[[], Awaitable[object]] | None = None,
    ) -> Embedding:
        """Embed the checked matrix ``x`` with ``bundle``; ``clusters`` asks for cluster ids
        (ignored when the model has no clustering head). ``gone()`` completes when the client
        has left: an exact request still waiting is then dropped (``ClientGone``)."""
        want_clusters = clusters and bundle.n_clusters is not None
        if mode == "exact" and bundle.no_exact_map is not None:
            # Refused before it takes an exact slot: the method has no map for new rows.
            raise InvalidInput(
                f"model {bundle.id!r} ({bundle.method}) has no exact mode: {bundle.no_exact_map}"
            )
        started = time.perf_counter()
        if mode == "exact":
            try:  # refused here alike on both paths, before anything is queued
                check_scaled_range(bundle.input_scaling, x)
            except OutOfRangeInput as exc:
                raise InvalidInput(str(exc)) from None
            # Queued and computed in the exact runtime: this process's request slot is free
            # for others meanwhile (the runtime's queue bounds exact work).
            with self.budget.waiting_elsewhere():
                answer = await self.exact.embed(bundle, x, gone=gone, offload=self.budget.run)
            embeddings, labels = answer.embedding, answer.clusters
            compute_ms = answer.compute_ms
        else:
            try:
                with self.budget.rows(x.shape[0]):
                    if x.shape[0] <= self.inline_fast_rows:
                        embeddings, labels = bundle.embed_with_clusters(x, mode="fast")
                    else:  # onnxruntime releases the GIL: beside the event loop
                        embeddings, labels = await self.budget.run(
                            bundle.embed_with_clusters, x, "fast"
                        )
            except OutOfRangeInput as exc:
                raise InvalidInput(str(exc)) from None
            compute_ms = (time.perf_counter() - started) * 1000.0
            if self.monitor is not None:
                self.monitor.observe(bundle, x, embeddings)  # a sample goes to its thread
        return Embedding(bundle, mode, embeddings, labels if want_clusters else None, compute_ms)

    async def novelty(self, bundle: Bundle, x: np.ndarray) -> RowNovelty:
        """Novelty scores, flags and range checks of the rows of ``x``, as far as
        ``bundle``'s novelty model allows; computed beside the event loop."""
        if self.monitor is None:
            return RowNovelty(unavailable="monitoring is not set up on this replica")
        monitor = self.monitor

        def score() -> RowNovelty:
            model = monitor.novelty(bundle)
            if model is None:
                return RowNovelty(
                    unavailable=f"model {bundle.id!r} has no novelty model (trained before "
                    "novelty scores, or on sparse input)"
                )
            out_of_range = model.out_of_range(x)
            if model.degenerate is not None:  # the range check stands on its own
                return RowNovelty(out_of_range=out_of_range, unavailable=model.degenerate)
            scores = model.score(x)
            return RowNovelty(scores, scores > model.threshold, out_of_range)

        try:
            return await self.budget.run(score)
        except BundleError as exc:
            raise self.registry.mark_damaged(bundle, exc) from None
