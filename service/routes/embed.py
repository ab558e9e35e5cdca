"""POST /embed."""

from __future__ import annotations

import functools

import msgspec
import numpy as np
from fastapi import APIRouter, Depends, Request, Response

from mbn_core.bundle import Bundle
from service.arrays import bytes_to_matrix, check_parsed_rows, matrix_to_b64
from service.deps import EmbedHandlerDep, require_api_key
from service.handlers.embed import RowNovelty
from service.json_object import parse_base64, parse_rows
from service.metrics import MODE_SCOPE_KEY
from service.routes._body import json_body, parse_object, read_json_body
from service.schemas import EmbedRequest, EmbedResponse, error_responses

router = APIRouter(tags=["embed"], dependencies=[Depends(require_api_key)])

# Bodies larger than this (about 300 rows of 64 numbers) are parsed on the budget's threads
# rather than on the event loop.
OFF_LOOP_PARSE_BYTES = 64 << 10


@router.post(
    "/embed",
    response_model=EmbedResponse,
    summary="Embed rows with a model",
    description=(
        "Fast mode answers from the model's ONNX fast path; exact mode runs the method's own "
        "exact model in the replica's exact runtime, whose queue merges concurrent requests "
        "(429 with Retry-After when it is full, 503 with Retry-After while it restarts or "
        "when a request outlives MBN_EXACT_TIMEOUT_SECONDS); past the in-flight budget "
        "(MBN_MAX_INFLIGHT_REQUESTS, MBN_MAX_INFLIGHT_ROWS) every request gets 429 with "
        "Retry-After at once. Headers: X-Model-Id, X-Compute-Time-Ms (model time only) and "
        "Server-Timing."
    ),
    responses=error_responses(401, 404, 409, 413, 415, 422, 429, 503),
    openapi_extra=json_body(EmbedRequest),
)
async def embed(request: Request, handler: EmbedHandlerDep) -> Response:
    # Past MBN_MAX_INFLIGHT_REQUESTS, limits.AdmissionMiddleware refused it before routing.
    # One dependency besides the key: FastAPI resolves each for every request (~40 us).
    budget = handler.budget
    body = await read_json_body(request)
    max_rows = handler.max_rows_per_request
    if len(body) > OFF_LOOP_PARSE_BYTES:
        # Large bodies are parsed beside the event loop (the scans and the number parser
        # release the GIL), so health probes and small requests are not held up behind them.
        req, parsed = await budget.run(_parse, body, max_rows)
    else:
        # Small ones on the loop: the thread hop would cost more than the parse.
        req, parsed = _parse(body, max_rows)
    del body  # the rows are parsed: only they are held while the model runs
    request.scope[MODE_SCOPE_KEY] = req.mode
    bundle = await handler.resolve(req.model)
    x = _matrix(req, parsed, bundle, handler.max_rows_per_request)
    # An exact request may wait in the runtime's queue: if the client leaves meanwhile, its
    # rows are dropped there rather than computed for nobody.
    # (A function, not a coroutine: one refused before it is awaited would leak.)
    gone = functools.partial(_disconnected, request) if req.mode == "exact" else None
    result = await handler.embed(bundle, x, req.mode, req.return_clusters, gone)
    embeddings, clusters, compute_ms = result.embeddings, result.clusters, result.compute_ms
    novelty = await handler.novelty(bundle, x) if req.return_novelty else None

    if x.shape[0] <= handler.inline_fast_rows:
        content = _encode(req, bundle, embeddings, clusters, novelty)
    else:  # several milliseconds for large batches: beside the event loop
        content = await budget.run(_encode, req, bundle, embeddings, clusters, novelty)
    return Response(
        content=content,
        media_type="application/json",
        headers={
            "X-Model-Id": bundle.id,
            "X-Compute-Time-Ms": f"{compute_ms:.3f}",
            "Server-Timing": f"compute;dur={compute_ms:.3f}",
        },
    )


async def _disconnected(request: Request) -> None:
    """Returns once the client has closed the connection (the body is read already, so
    the next event the server can give is the disconnection)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _encode(
    req: EmbedRequest,
    bundle: Bundle,
    embeddings: np.ndarray,
    clusters: np.ndarray | None,
    novelty: RowNovelty | None = None,
) -> bytes:
    payload: dict[str, object] = {
        "model": bundle.id,
        "name": bundle.name,
        "mode": req.mode,
        "dim": int(embeddings.shape[1]),
        "n": int(embeddings.shape[0]),
    }
    if req.encoding_format == "base64":
        payload["embeddings_b64"] = matrix_to_b64(embeddings)
    else:
        payload["embeddings"] = _json_matrix(embeddings)
    if clusters is not None:
        payload["clusters"] = clusters.tolist()
    if novelty is not None:
        payload["novelty"] = _optional_list(novelty.scores)
        payload["novel"] = _optional_list(novelty.novel)
        payload["out_of_range"] = _optional_list(novelty.out_of_range)
        if novelty.unavailable is not None:
            payload["novelty_unavailable"] = novelty.unavailable
    return msgspec.json.encode(payload)


def _optional_list(values: np.ndarray | None) -> list | None:
    return None if values is None else values.tolist()


# Rows per slice of a JSON answer. Each slice is one call that holds the interpreter lock
# (Python floats made and written); between slices the event loop can take the lock, where a
# large answer in one call kept it waiting for milliseconds.
_ENCODE_ROWS = 512


def _json_matrix(matrix: np.ndarray) -> list | msgspec.Raw:
    """``matrix`` as JSON rows: the bytes ``msgspec`` writes for ``matrix.tolist()``."""
    if len(matrix) <= _ENCODE_ROWS:
        return matrix.tolist()
    parts = (
        msgspec.json.encode(matrix[start : start + _ENCODE_ROWS].tolist())[1:-1]
        for start in range(0, len(matrix), _ENCODE_ROWS)
    )
    return msgspec.Raw(b"[" + b",".join(parts) + b"]")


def _parse(body: bytes, max_rows: int) -> tuple[EmbedRequest, np.ndarray | bytes]:
    """The request, and its rows: ``inputs`` as a float32 matrix, ``inputs_b64`` as bytes.
    Unknown members are refused before anything is parsed, and the rows never become Python
    objects as a whole (``service.json_object``)."""
    req, large = parse_object(EmbedRequest, body, large=("inputs", "inputs_b64"))
    if "inputs" in large:
        return req, parse_rows(large["inputs"], what="inputs", max_rows=max_rows)
    return req, parse_base64(large["inputs_b64"], what="inputs_b64")


def _matrix(
    req: EmbedRequest, parsed: np.ndarray | bytes, bundle: Bundle, max_rows: int
) -> np.ndarray:
    if isinstance(parsed, np.ndarray):
        return check_parsed_rows(
            parsed, expected_dim=bundle.input_dim, max_rows=max_rows, what="inputs"
        )
    assert req.dim is not None
    return bytes_to_matrix(
        parsed,
        dim=req.dim,
        expected_dim=bundle.input_dim,
        max_rows=max_rows,
        what="inputs_b64",
    )
