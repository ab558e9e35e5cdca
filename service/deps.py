"""FastAPI dependencies: the objects the lifespan put on ``app.state``, as typed aliases.

Routes get handlers (``service.handlers``), never the job store, the registry or the
submitter beneath them.

Dependencies are ``async def``: FastAPI would run plain functions on a thread, a hop that
costs more than the single-vector /embed itself.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.auth import ApiKeys
from service.config import Settings
from service.errors import Unavailable
from service.handlers import (
    EmbedHandler,
    JobsHandler,
    MapsHandler,
    ModelsHandler,
    TrainingHandler,
)
from service.limits import RowBudget
from service.metrics import Metrics


def _started(request: Request, name: str) -> object:
    value = getattr(request.app.state, name, None)
    if value is None:
        raise Unavailable("the service is starting", retry_after=1)
    return value


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_embed_handler(request: Request) -> EmbedHandler:
    handler = _started(request, "embed_handler")
    assert isinstance(handler, EmbedHandler)
    return handler


async def get_training_handler(request: Request) -> TrainingHandler:
    handler = _started(request, "training_handler")
    assert isinstance(handler, TrainingHandler)
    return handler


async def get_jobs_handler(request: Request) -> JobsHandler:
    handler = _started(request, "jobs_handler")
    assert isinstance(handler, JobsHandler)
    return handler


async def get_models_handler(request: Request) -> ModelsHandler:
    handler = _started(request, "models_handler")
    assert isinstance(handler, ModelsHandler)
    return handler


async def get_maps_handler(request: Request) -> MapsHandler:
    handler = _started(request, "maps_handler")
    assert isinstance(handler, MapsHandler)
    return handler


async def get_row_budget(request: Request) -> RowBudget:
    budget: RowBudget = request.app.state.row_budget
    return budget


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


# Publishes the bearer scheme in OpenAPI (so /docs can send a key); the check itself is
# ApiKeys', which also words the errors (auto_error=False: HTTPBearer never answers).
_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key of MBN_API_KEYS: 'Authorization: Bearer <key>'. Only needed "
    "when the server has keys configured.",
)


async def require_api_key(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]
) -> None:
    keys: ApiKeys = request.app.state.api_keys
    keys.check(request.headers.get("authorization"))


async def require_api_key_for_metrics(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]
) -> None:
    settings: Settings = request.app.state.settings
    if settings.metrics_require_key:
        await require_api_key(request, credentials)


SettingsDep = Annotated[Settings, Depends(get_settings)]
BudgetDep = Annotated[RowBudget, Depends(get_row_budget)]
EmbedHandlerDep = Annotated[EmbedHandler, Depends(get_embed_handler)]
TrainingHandlerDep = Annotated[TrainingHandler, Depends(get_training_handler)]
JobsHandlerDep = Annotated[JobsHandler, Depends(get_jobs_handler)]
ModelsHandlerDep = Annotated[ModelsHandler, Depends(get_models_handler)]
MapsHandlerDep = Annotated[MapsHandler, Depends(get_maps_handler)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
