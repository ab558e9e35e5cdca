"""GET /models/{model_id}/map and POST /models/{model_id}/map/locate: a model's stored 2-D map.

The map is a t-SNE projection of a sample of the training embedding that training stored in
the bundle (``mbn_core.bundle.embedding_map``). ``locate`` places embeddings that ``POST /embed``
returned on it, so a client (the web console among them) can show where new rows fall.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from mbn_core.bundle.embedding_map import LOCATE_NEIGHBOURS, METHOD
from service.deps import MapsHandlerDep, require_api_key
from service.domain import InvalidInput
from service.handlers import Located
from service.json_object import parse_rows
from service.routes._body import json_body, parse_object, read_json_body
from service.schemas import error_responses

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
def get_map(model_id: str, handler: MapsHandlerDep) -> ModelMap:
    view = handler.stored_map(model_id)
    stored = view.map
    xy = _rounded(stored.xy)
    return ModelMap(
        model=view.model_id,
        name=view.name,
        method=METHOD,
        n_points=stored.n_points,
        n_samples=view.n_samples,
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
async def locate(model_id: str, request: Request, handler: MapsHandlerDep) -> LocateResponse:
    # The service's own JSON reading (service.json_object), beside the event loop.
    body = await read_json_body(request)
    embeddings = await run_in_threadpool(_parse_locate, body, handler.max_rows)
    del body
    return await run_in_threadpool(lambda: _located(handler.locate(model_id, embeddings)))


class _NoOtherMembers(BaseModel):
    """What a locate body holds besides its embeddings: nothing (they are parsed apart)."""

    model_config = ConfigDict(extra="forbid")


def _parse_locate(body: bytes, max_rows: int) -> np.ndarray:
    # LocateRequest documents the body; its one member is large and parsed on its own, so
    # the rest is validated against a model that requires nothing.
    known = tuple(LocateRequest.model_fields)
    large = parse_object(_NoOtherMembers, body, large=("embeddings",), known=known)[1]
    if "embeddings" not in large:
        raise InvalidInput("the JSON body needs 'embeddings': rows from POST /embed")
    return parse_rows(large["embeddings"], what="embeddings", max_rows=max_rows)


def _located(located: Located) -> LocateResponse:
    xy = _rounded(located.xy)
    return LocateResponse(model=located.model_id, x=xy[:, 0].tolist(), y=xy[:, 1].tolist())


def _rounded(xy: np.ndarray) -> np.ndarray:
    return np.round(xy.astype(np.float64), _DECIMALS)
