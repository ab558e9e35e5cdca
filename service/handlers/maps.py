"""The maps handler: a model's stored 2-D map, and embeddings placed on it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mbn_core.bundle import Bundle, BundleError
from mbn_core.bundle.embedding_map import EmbeddingMap
from service.domain import InvalidInput, NotFound, PayloadTooLarge
from service.registry import ModelRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelMapView:
    """A model's stored map.

    Attributes
    ----------
    model_id, name : str
        The model the map belongs to.
    n_samples : int or None
        Training rows the map's sample was drawn from (None when the manifest does not say).
    map : EmbeddingMap
    """

    model_id: str
    name: str
    n_samples: int | None
    map: EmbeddingMap


@dataclass(frozen=True)
class Located:
    """Embeddings placed on a model's map.

    Attributes
    ----------
    model_id : str
    xy : ndarray of shape (n, 2)
        Map position of each embedding.
    """

    model_id: str
    xy: np.ndarray


class MapsHandler:
    """Reads models' stored maps and places embeddings on them.

    Parameters
    ----------
    registry : ModelRegistry
        Resolves the model a request names.
    max_rows : int
        Embeddings one locate request may hold (``MBN_MAX_ROWS_PER_REQUEST``).
    """

    def __init__(self, registry: ModelRegistry, *, max_rows: int) -> None:
        self.registry = registry
        self.max_rows = max_rows

    def stored_map(self, ref: str) -> ModelMapView:
        """The map of the model ``ref`` (id or name); ``NotFound`` when it has none."""
        bundle = self.registry.get(ref)
        stored = _stored_map(bundle)
        n_samples = bundle.manifest.get("training", {}).get("n_samples")
        return ModelMapView(
            model_id=bundle.id,
            name=bundle.name,
            n_samples=n_samples if isinstance(n_samples, int) else None,
            map=stored,
        )

    def locate(self, ref: str, embeddings: np.ndarray | Sequence[Sequence[float]]) -> Located:
        """Place ``embeddings`` (from ``POST /embed`` with the model ``ref``) on its map:
        ``PayloadTooLarge`` beyond ``max_rows``, ``InvalidInput`` for embeddings of another
        dimension or with NaN or infinity."""
        bundle = self.registry.get(ref)
        stored = _stored_map(bundle)
        if len(embeddings) > self.max_rows:
            raise PayloadTooLarge(
                f"{len(embeddings)} embeddings; at most {self.max_rows} per request"
            )
        if any(len(row) != bundle.output_dim for row in embeddings):
            raise InvalidInput(
                f"every embedding must have {bundle.output_dim} numbers (model {bundle.id!r})"
            )
        # Embeddings are float32: a finite float64 beyond its range would become infinity.
        with np.errstate(over="ignore"):
            matrix = np.asarray(embeddings, dtype=np.float64).astype(np.float32)
        if not np.isfinite(matrix).all():
            raise InvalidInput(
                "embeddings contain NaN, infinity or a value beyond the float32 range"
            )
        return Located(model_id=bundle.id, xy=stored.locate(matrix))


def _stored_map(bundle: Bundle) -> EmbeddingMap:
    if not bundle.has_map:
        raise NotFound(
            f"model {bundle.id!r} has no stored map (trained before maps were stored, or "
            "with map_points 0)"
        )
    try:
        return bundle.embedding_map()
    except (BundleError, FileNotFoundError) as error:
        # The message names server paths: the log gets it, the client does not.
        log.error("map of model %s unreadable: %s", bundle.id, error)
        raise NotFound(f"the map of model {bundle.id!r} is no longer readable") from None
