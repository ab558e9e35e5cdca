"""GET /models, GET /models/{model_id}, DELETE /models/{model_id}, POST .../promote."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response

from service.deps import ModelsHandlerDep, require_api_key
from service.handlers import ModelEntry
from service.schemas import ModelInfo, ModelList, error_responses

router = APIRouter(tags=["models"], dependencies=[Depends(require_api_key)])


def _info(entry: ModelEntry) -> ModelInfo:
    return ModelInfo(**asdict(entry))


@router.get(
    "/models",
    response_model=ModelList,
    summary="Models, newest first, damaged ones with the reason",
    responses=error_responses(401),
)
def list_models(handler: ModelsHandlerDep) -> ModelList:
    listing = handler.list_models()
    return ModelList(
        models=[_info(entry) for entry in listing.models],
        default=listing.default,
        default_source=listing.default_source,  # type: ignore[arg-type]
        default_problem=listing.default_problem,
    )


@router.get(
    "/models/{model_id}",
    response_model=dict[str, Any],
    summary="A model's manifest (by id, or by name: the version it resolves to)",
    responses=error_responses(401, 404, 409, 503),
)
def get_model(model_id: str, handler: ModelsHandlerDep) -> dict[str, Any]:
    return handler.manifest(model_id)


@router.post(
    "/models/{model_id}/promote",
    response_model=ModelInfo,
    summary="Make this version what its name resolves to and (unless default=false) the "
    "default model",
    responses=error_responses(401, 404, 409),
)
def promote_model(
    model_id: str,
    handler: ModelsHandlerDep,
    default: Annotated[
        bool, Query(description="Also make it the default model (requests naming none).")
    ] = True,
) -> ModelInfo:
    return _info(handler.promote(model_id, default=default))


@router.delete(
    "/models/{model_id}",
    status_code=204,
    response_class=Response,
    summary="Delete a model (by id) from the shared model directory",
    description="The default model, the version a name resolves to while the name has "
    "other versions, and a model others are aligned to answer 409 unless force=true "
    "(requests would move to another model, or comparisons lose their reference).",
    responses=error_responses(401, 404, 409),
)
def delete_model(
    model_id: str,
    handler: ModelsHandlerDep,
    force: Annotated[
        bool,
        Query(
            description="Delete even the default model, a name's chosen version or a model "
            "others are aligned to."
        ),
    ] = False,
) -> Response:
    handler.delete(model_id, force=force)
    return Response(status_code=204)
