"""FastAPI dependencies: the objects the lifespan put on ``app.state``, as typed aliases.

Routes get handlers (``service.handlers``), never the job store, the registry or the
submitter beneath them.

Dependencies are ``async def``: FastAPI would run plain functions on a thread, a hop that
costs more than the single-vector /embed itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.admission import ReadBudget
from service.auth import ApiKeys
from service.config import Settings
from service.errors import Unavailable
from service.handlers import (
    EmbedHandler,
    JobsHandler,
    MapsHandler,
    ModelsHandler,
    RuntimeHandler,
    TrainingHandler,
)
from service.metrics import Metrics
from service.monitor import LiveMonitor

T = TypeVar("T")


def _state(name: str, kind: type[T]) -> Callable[[Request], Awaitable[T]]:
    """A dependency returning ``app.state.<name>``; 503 while the lifespan has not set it."""

    async def get(request: Request) -> T:
        value = getattr(request.app.state, name, None)
        if value is None:
            raise Unavailable("the service is starting", retry_after=1)
        assert isinstance(value, kind)
        return value

    get.__name__ = f"get_{name}"
    return get


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


SettingsDep = Annotated[Settings, Depends(_state("settings", Settings))]
EmbedHandlerDep = Annotated[EmbedHandler, Depends(_state("embed_handler", EmbedHandler))]
TrainingHandlerDep = Annotated[
    TrainingHandler, Depends(_state("training_handler", TrainingHandler))
]
JobsHandlerDep = Annotated[JobsHandler, Depends(_state("jobs_handler", JobsHandler))]
ModelsHandlerDep = Annotated[ModelsHandler, Depends(_state("models_handler", ModelsHandler))]
MapsHandlerDep = Annotated[MapsHandler, Depends(_state("maps_handler", MapsHandler))]
RuntimeHandlerDep = Annotated[RuntimeHandler, Depends(_state("runtime_handler", RuntimeHandler))]
MetricsDep = Annotated[Metrics, Depends(_state("metrics", Metrics))]
MonitorDep = Annotated[LiveMonitor, Depends(_state("monitor", LiveMonitor))]
ReadBudgetDep = Annotated[ReadBudget, Depends(_state("read_budget", ReadBudget))]
