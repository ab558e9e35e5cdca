"""FastAPI dependencies: the objects the lifespan put on ``app.state``, as typed aliases.

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
from service.handlers import EmbedHandler
from service.jobs import JobFiles, JobStore
from service.limits import ExactGate, RowBudget
from service.metrics import Metrics
from service.registry import ModelRegistry
from service.submission import Submitter
from service.worker import Worker


def _started(request: Request, name: str) -> object:
    value = getattr(request.app.state, name, None)
    if value is None:
        raise Unavailable("the service is starting", retry_after=1)
    return value


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_store(request: Request) -> JobStore:
    store = _started(request, "store")
    assert isinstance(store, JobStore)
    return store


async def get_files(request: Request) -> JobFiles:
    files = _started(request, "files")
    assert isinstance(files, JobFiles)
    return files


async def get_registry(request: Request) -> ModelRegistry:
    registry = _started(request, "registry")
    assert isinstance(registry, ModelRegistry)
    return registry


async def get_gate(request: Request) -> ExactGate:
    gate = _started(request, "exact_gate")
    assert isinstance(gate, ExactGate)
    return gate


async def get_embed_handler(request: Request) -> EmbedHandler:
    handler = _started(request, "embed_handler")
    assert isinstance(handler, EmbedHandler)
    return handler


async def get_row_budget(request: Request) -> RowBudget:
    budget: RowBudget = request.app.state.row_budget
    return budget


async def get_submitter(request: Request) -> Submitter:
    submitter = _started(request, "submitter")
    assert isinstance(submitter, Submitter)
    return submitter


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


async def get_worker(request: Request) -> Worker | None:
    worker: Worker | None = getattr(request.app.state, "worker", None)
    return worker


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
StoreDep = Annotated[JobStore, Depends(get_store)]
FilesDep = Annotated[JobFiles, Depends(get_files)]
RegistryDep = Annotated[ModelRegistry, Depends(get_registry)]
GateDep = Annotated[ExactGate, Depends(get_gate)]
BudgetDep = Annotated[RowBudget, Depends(get_row_budget)]
EmbedHandlerDep = Annotated[EmbedHandler, Depends(get_embed_handler)]
SubmitterDep = Annotated[Submitter, Depends(get_submitter)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
WorkerDep = Annotated[Worker | None, Depends(get_worker)]
