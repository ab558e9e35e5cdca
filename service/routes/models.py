"""GET /models, GET /models/{model_id}, DELETE /models/{model_id}."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Response

from mbn_core.bundle import Bundle
from service.deps import RegistryDep, require_api_key
from service.schemas import ModelInfo, ModelList, error_responses

router = APIRouter(tags=["models"], dependencies=[Depends(require_api_key)])


def _info(bundle: Bundle, default: Bundle | None) -> ModelInfo:
    return ModelInfo(
        id=bundle.id,
        name=bundle.name,
        created=bundle.created,
        input_dim=bundle.input_dim,
        output_dim=bundle.output_dim,
        n_clusters=bundle.n_clusters,
        default=default is not None and bundle.id == default.id,
    )


@router.get(
    "/models",
    response_model=ModelList,
    summary="Loaded models, newest first",
    responses=error_responses(401),
)
def list_models(registry: RegistryDep) -> ModelList:
    registry.rescan(force=False)  # show what other replicas wrote (rate-limited)
    default = registry.snapshot.default
    return ModelList(
        models=[_info(b, default) for b in registry.models()],
        default=None if default is None else default.id,
    )


@router.get(
    "/models/{model_id}",
    response_model=dict[str, Any],
    summary="A model's manifest (by id, or by name: its newest version)",
    responses=error_responses(401, 404, 503),
)
def get_model(model_id: str, registry: RegistryDep) -> dict[str, Any]:
    return registry.get(model_id).manifest


@router.delete(
    "/models/{model_id}",
    status_code=204,
    response_class=Response,
    summary="Delete a model (by id) from the shared model directory",
    responses=error_responses(401, 404),
)
def delete_model(model_id: str, registry: RegistryDep) -> Response:
    registry.delete(model_id)
    return Response(status_code=204)
