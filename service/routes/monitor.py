"""GET /models/{model_id}/monitor (a model's live monitor on this replica) and
GET /models/{a}/compare/{b} (how comparable two models' vectors are)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from service.alignment import compare
from service.deps import EmbedHandlerDep, MonitorDep, ReadBudgetDep, require_api_key
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
        "also embedded by the exact runtime, behind clients' exact requests), beside "
        "training, the report measured when the model was trained. Rows outside the "
        "training range are counted (out_of_range_share, skipped_out_of_range) and not "
        "shadowed. A figure with no rows behind it is null (state and note say why). Each "
        "replica reports its own window (replica)."
    ),
    responses=error_responses(401, 404, 409, 429, 503),
)
async def get_monitor(
    model_id: str, embed: EmbedHandlerDep, monitor: MonitorDep, reads: ReadBudgetDep
) -> dict[str, Any]:
    bundle = await embed.resolve(model_id)
    # The fidelity of a changed window takes a k-means run: beside the event loop, admitted.
    return await reads.run("monitor", monitor.report, bundle)


@router.get(
    "/models/{model_a}/compare/{model_b}",
    response_model=dict[str, Any],
    summary="How comparable two models' vectors are (e.g. two versions of a name)",
    description=(
        "On reference rows (a's, else b's: a sample of training rows kept in each bundle): "
        "median cosine of each row's two vectors, overlap of their 10 nearest neighbours, "
        "and cluster agreement (clusters matched one to one), for both fast paths, and for "
        "both exact paths when the models share their reference rows (a version aligned "
        "to the other, with align_to). 409 when neither has reference rows."
    ),
    responses=error_responses(401, 404, 409, 422, 429, 503),
)
async def compare_models(
    model_a: str, model_b: str, embed: EmbedHandlerDep, reads: ReadBudgetDep
) -> dict[str, Any]:
    await embed.resolve(model_a)  # 404 before any work; may rescan off the loop
    await embed.resolve(model_b)
    return await reads.run("compare", compare, embed.registry, model_a, model_b)
