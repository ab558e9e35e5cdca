"""GET /models/{model_id}/monitor: the live monitor of a model on this replica."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from service.deps import EmbedHandlerDep, MonitorDep, require_api_key
from service.schemas import error_responses

router = APIRouter(tags=["models"], dependencies=[Depends(require_api_key)])


@router.get(
    "/models/{model_id}/monitor",
    response_model=dict[str, Any],
    summary="Live fidelity and input novelty of a model, on this replica's recent traffic",
    description=(
        "A share of fast-mode rows (MBN_SHADOW_FRACTION) is sampled: novelty_share and "
        "out_of_range_share are over the last MBN_MONITOR_WINDOW sampled rows; live is the "
        "fast path's fidelity against the exact model on the last shadow rows (sampled rows "
        "also embedded exactly while the exact pool was idle), beside training, the report "
        "measured when the model was trained. A model without traffic answers zeros and a "
        "note saying so. Each replica reports its own window (replica)."
    ),
    responses=error_responses(401, 404, 409, 503),
)
async def get_monitor(model_id: str, embed: EmbedHandlerDep, monitor: MonitorDep) -> dict[str, Any]:
    bundle = await embed.resolve(model_id)
    # The fidelity of a changed window takes a k-means run: beside the event loop.
    return await run_in_threadpool(monitor.report, bundle)
