"""GET /health/live, GET /health/ready, GET /metrics. Health stays open without API keys."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.deps import MetricsDep, require_api_key_for_metrics
from service.errors import Unavailable
from service.schemas import Health, error_responses

router = APIRouter(tags=["health"])


@router.get(
    "/health/live",
    response_model=Health,
    response_model_exclude_none=True,
    summary="The process answers",
)
async def live() -> Health:
    return Health(status="ok")


@router.get(
    "/health/ready",
    response_model=Health,
    response_model_exclude_none=True,
    summary="Ready for traffic: the job store answers and models are usable (else 503)",
    responses=error_responses(503),
)
async def ready(request: Request) -> Health:
    # Answered from memory (service.readiness): never queued behind requests.
    readiness = getattr(request.app.state, "readiness", None)
    if readiness is None:
        raise Unavailable("not ready: starting", retry_after=1)
    checks, problems = readiness()
    if problems:
        raise Unavailable("not ready: " + "; ".join(problems), retry_after=1)
    exact = getattr(request.app.state, "exact", None)
    return Health(
        status="ready", checks=checks, exact_runtime=None if exact is None else exact.describe()
    )


# HEAD too, for load balancers and uptime checkers that probe with it: the same status, no
# body (kept out of the schema, where it would repeat the GET operations).
@router.head("/health/live", include_in_schema=False)
async def live_head() -> Response:
    return Response(status_code=200)


@router.head("/health/ready", include_in_schema=False)
async def ready_head(request: Request) -> Response:
    await ready(request)  # Unavailable (503) when not ready
    return Response(status_code=200)


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, **error_responses(401)},
    dependencies=[Depends(require_api_key_for_metrics)],
)
def metrics(metrics: MetricsDep) -> Response:
    return Response(content=metrics.render(), media_type=CONTENT_TYPE_LATEST)
