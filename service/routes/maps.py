"""GET /models/{model_id}/map and POST /models/{model_id}/map/locate: a model's stored 2-D map.

The map is a t-SNE projection of a sample of the training embedding that training stored in
the bundle (``mbn_core.embedding_map``). ``locate`` places embeddings that ``POST /embed``
returned on it, so a client (the web console among them) can show where new rows fall.
"""

from __future__ import annotations

import logging
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from mbn_core.bundle import Bundle, BundleError
from mbn_core.embedding_map import LOCATE_NEIGHBOURS, METHOD, EmbeddingMap
from service.deps import RegistryDep, SettingsDep, require_api_key
from service.errors import InvalidInput, NotFound, PayloadTooLarge
from service.registry import ModelRegistry
from service.routes._body import json_body, parse_json
from service.schemas import error_responses

log = logging.getLogger(__name__)

router = APIRouter(tags=["models"], dependencies=[Depends(require_api_key)])
# Map coordinates are sent with this many decimals: t-SNE's scale is tens of units, so a
# thousandth is far below a pixel, and the answer is half the size of full floats.
_DECIMALS = 3


class ModelMap(BaseModel):
    """A 2-D map of a sample of the model's training embedding (one entry per point)."""

    model: str = Field(description="Id of the model.")
    name: str = Field(description="Name of the model.")
    method: str = Field(description=f"The projection ({METHOD!r}: t-SNE of the embedding).")
    n_points: int = Field(description="Points on the map (a random sample of training rows).")
    n_samples: int | None = Field(description="Training rows the sample was drawn from.")
    color_by: str | None = Field(
        description="What colours the map: 'label' (training labels), 'cluster' (the "
        "clustering head's), or null."
    )
    x: list[float] = Field(description="Horizontal map coordinate of each point.")
    y: list[float] = Field(description="Vertical map coordinate of each point.")
    row: list[int] = Field(description="Each point's row number in the training data.")
    cluster: list[int] | None = Field(
        description="Cluster of each point (models with a clustering head)."
    )
    label: list[str] | None = Field(description="Training label of each point, when given.")


class LocateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    embeddings: list[Annotated[list[float], Field(min_length=1)]] = Field(
        min_length=1,
        description="Embeddings from POST /embed with this model (fast or exact), one per row.",
    )


class LocateResponse(BaseModel):
    model: str
    x: list[float] = Field(description="Horizontal map coordinate of each embedding.")
    y: list[float] = Field(description="Vertical map coordinate of each embedding.")


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


@router.get(
    "/models/{model_id}/map",
    response_model=ModelMap,
    summary="A model's 2-D map of its training embedding (by id or by name)",
    description=(
        "A t-SNE projection of up to 20,000 training rows, stored by training. Coloured by "
        "training labels when the data had them, else by the clustering head's clusters. "
        "404 for models trained without a map."
    ),
    responses=error_responses(401, 404, 503),
)
def get_map(model_id: str, registry: RegistryDep) -> ModelMap:
    bundle = registry.get(model_id)
    stored = _stored_map(bundle)
    xy = np.round(stored.xy.astype(np.float64), _DECIMALS)
    n_samples = bundle.manifest.get("training", {}).get("n_samples")
    return ModelMap(
        model=bundle.id,
        name=bundle.name,
        method=METHOD,
        n_points=stored.n_points,
        n_samples=n_samples if isinstance(n_samples, int) else None,
        color_by=stored.color_by,
        x=xy[:, 0].tolist(),
        y=xy[:, 1].tolist(),
        row=stored.row.tolist(),
        cluster=None if stored.cluster is None else stored.cluster.tolist(),
        label=None if stored.label is None else stored.label.tolist(),
    )


@router.post(
    "/models/{model_id}/map/locate",
    response_model=LocateResponse,
    summary="Place embeddings on a model's 2-D map",
    description=(
        "Each embedding lands at the distance-weighted mean map position of its "
        f"{LOCATE_NEIGHBOURS} nearest training points (t-SNE has no transform of its own). "
        "Embed rows with POST /embed first, then locate the embeddings."
    ),
    responses=error_responses(401, 404, 413, 415, 422, 503),
    openapi_extra=json_body(LocateRequest),
)
async def locate(
    model_id: str, request: Request, registry: RegistryDep, settings: SettingsDep
) -> LocateResponse:
    # The service's own JSON reading: duplicate keys, deep nesting and bad UTF-8 are a 422.
    body = await parse_json(request, LocateRequest)
    return await run_in_threadpool(_locate, model_id, body, registry, settings.max_rows_per_request)


def _locate(
    model_id: str, body: LocateRequest, registry: ModelRegistry, limit: int
) -> LocateResponse:
    bundle = registry.get(model_id)
    stored = _stored_map(bundle)
    if len(body.embeddings) > limit:
        raise PayloadTooLarge(f"{len(body.embeddings)} embeddings; at most {limit} per request")
    if any(len(row) != bundle.output_dim for row in body.embeddings):
        raise InvalidInput(
            f"every embedding must have {bundle.output_dim} numbers (model {bundle.id!r})"
        )
    embeddings = np.asarray(body.embeddings, dtype=np.float64)
    if not np.isfinite(embeddings).all():
        raise InvalidInput("embeddings contain NaN or infinity")
    xy = np.round(stored.locate(embeddings).astype(np.float64), _DECIMALS)
    return LocateResponse(model=bundle.id, x=xy[:, 0].tolist(), y=xy[:, 1].tolist())
