"""GET /models, GET /models/{model_id}, DELETE /models/{model_id}, POST .../promote."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Response
from starlette.concurrency import run_in_threadpool

from mbn_core.bundle import Bundle
from service.deps import RegistryDep, require_api_key
from service.registry import Damaged, Snapshot
from service.schemas import ModelInfo, ModelList, error_responses

router = APIRouter(tags=["models"], dependencies=[Depends(require_api_key)])


def _info(bundle: Bundle, snapshot: Snapshot) -> ModelInfo:
    return ModelInfo(
        id=bundle.id,
        name=bundle.name,
        created=bundle.created,
        input_dim=bundle.input_dim,
        output_dim=bundle.output_dim,
        n_clusters=bundle.n_clusters,
        default=snapshot.default is bundle,
        current=snapshot.by_name.get(bundle.name) is bundle,
    )


def _damaged_info(damaged: Damaged) -> ModelInfo:
    return ModelInfo(
        id=damaged.id,
        name=damaged.name,
        created=damaged.created,
        input_dim=None,
        output_dim=None,
        n_clusters=None,
        default=False,
        state="damaged",
        problem=damaged.problem,
    )


@router.get(
    "/models",
    response_model=ModelList,
    summary="Models, newest first, damaged ones with the reason",
    responses=error_responses(401),
)
def list_models(registry: RegistryDep) -> ModelList:
    registry.rescan(force=False)  # show what other replicas wrote (rate-limited)
    snapshot = registry.snapshot
    models = [_info(b, snapshot) for b in registry.models()]
    models += [_damaged_info(d) for d in registry.damaged()]
    models.sort(key=lambda m: (m.created or "", m.id), reverse=True)
    return ModelList(
        models=models,
        default=None if snapshot.default is None else snapshot.default.id,
        default_source=snapshot.default_source,  # type: ignore[arg-type]
        default_problem=snapshot.default_problem,
    )


@router.get(
    "/models/{model_id}",
    response_model=dict[str, Any],
    summary="A model's manifest (by id, or by name: the version it resolves to)",
    responses=error_responses(401, 404, 409, 503),
)
def get_model(model_id: str, registry: RegistryDep) -> dict[str, Any]:
    return registry.get(model_id).manifest


@router.post(
    "/models/{model_id}/promote",
    response_model=ModelInfo,
    summary="Make this version what its name resolves to and (unless default=false) the "
    "default model",
    responses=error_responses(401, 404, 409),
)
async def promote_model(
    model_id: str,
    registry: RegistryDep,
    default: Annotated[
        bool, Query(description="Also make it the default model (requests naming none).")
    ] = True,
) -> ModelInfo:
    bundle = await run_in_threadpool(lambda: registry.promote(model_id, default=default))
    return _info(bundle, registry.snapshot)


@router.delete(
    "/models/{model_id}",
    status_code=204,
    response_class=Response,
    summary="Delete a model (by id) from the shared model directory",
    description="The default model, and the version a name resolves to while the name has "
    "other versions, answer 409 unless force=true (requests would move to another model).",
    responses=error_responses(401, 404, 409),
)
def delete_model(
    model_id: str,
    registry: RegistryDep,
    force: Annotated[
        bool, Query(description="Delete even the default model or a name's chosen version.")
    ] = False,
) -> Response:
    registry.delete(model_id, force=force)
    return Response(status_code=204)
