"""GET /exact/runtime: the replica's exact runtime, as this API process last heard from it."""

from __future__ import annotations

import dataclasses
import math

from fastapi import APIRouter, Depends

from service.deps import RuntimeHandlerDep, require_api_key
from service.schemas import RuntimeOut, error_responses

router = APIRouter(tags=["health"], dependencies=[Depends(require_api_key)])


@router.get(
    "/exact/runtime",
    response_model=RuntimeOut,
    summary="The exact runtime: state, device, queue, steps and their times",
    description=(
        "Exact-mode requests are queued, merged and computed by one runtime process per "
        "replica. Its state (running, down while its supervisor restarts it, starting, or not "
        "started yet), restarts and device; its queue as of its last figures (about once a "
        "second); and since the replica started: requests, rows, steps, cancelled, timed out "
        "and refused requests, rows per step, waits and compute times (means and histograms). "
        "The same figures are in /metrics as mbn_exact_*."
    ),
    responses=error_responses(401, 503),
)
async def get_runtime(handler: RuntimeHandlerDep) -> RuntimeOut:
    report = dataclasses.asdict(handler.report())
    for name in ("batch_rows", "wait_seconds", "compute_seconds"):
        histogram = report[name]
        if histogram is not None:  # JSON has no infinity: the last bucket's bound is left out
            histogram["bounds"] = [b for b in histogram["bounds"] if math.isfinite(b)]
    return RuntimeOut.model_validate(report)
