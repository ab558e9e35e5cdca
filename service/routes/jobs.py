"""POST /train, GET /jobs, GET /jobs/{job_id}, POST /jobs/{job_id}/cancel."""

from __future__ import annotations

import json
from pathlib import PurePath
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from service.arrays import rows_to_matrix
from service.deps import FilesDep, StoreDep, SubmitterDep, WorkerDep, require_api_key
from service.errors import (
    InvalidInput,
    ServiceError,
    UnsupportedMediaType,
    invalid_from_validation,
)
from service.jobs import Job
from service.routes._body import is_json, json_body, parse_json
from service.schemas import JobList, JobOut, JobStatus, TrainOptions, TrainRequest, error_responses
from service.submission import Submitter, check_params

router = APIRouter(tags=["jobs"], dependencies=[Depends(require_api_key)])

_FORM_FIELDS = ("file", "params", "name", "method", "promote")
_MULTIPART_SCHEMA = {
    "type": "object",
    "required": ["file"],
    "additionalProperties": False,
    "properties": {
        "file": {
            "type": "string",
            "format": "binary",
            "description": "Training data: .npy, .npz (x and optional y) or .csv.",
        },
        "params": {"type": "string", "description": "Training parameters, a JSON object."},
        "name": TrainOptions.model_json_schema()["properties"]["name"],
        "method": TrainOptions.model_json_schema()["properties"]["method"],
        "promote": {
            "type": "string",
            "enum": ["true", "false"],
            "default": "false",
            "description": TrainOptions.model_json_schema()["properties"]["promote"]["description"],
        },
    },
}


@router.post(
    "/train",
    status_code=202,
    response_model=JobOut,
    summary="Start a training job",
    description=(
        "JSON with the rows inline, or multipart/form-data with a data file (.npy, .npz, "
        ".csv) and params as a JSON string. Parameters and data are checked at once (422); "
        "the data is stored under the job's id and the job queued (429 when the queue is "
        "full). Answers 202 with Location: /jobs/{id}."
    ),
    responses=error_responses(401, 413, 415, 422, 429, 503),
    openapi_extra=json_body(
        TrainRequest, extra_content={"multipart/form-data": {"schema": _MULTIPART_SCHEMA}}
    ),
)
async def train(
    request: Request, response: Response, submitter: SubmitterDep, worker: WorkerDep
) -> JobOut:
    await run_in_threadpool(submitter.refuse_if_full)
    content_type = request.headers.get("content-type", "")
    if content_type.lower().startswith("multipart/form-data"):
        job = await _train_multipart(request, submitter)
    elif is_json(content_type):
        # JSON rows become Python objects first: bounded by the (smaller) body limit.
        req = await parse_json(request, TrainRequest, limit=submitter.settings.max_body_bytes)
        params = check_params(req.params, req.method)
        x = rows_to_matrix(
            req.data,
            expected_dim=None,
            max_rows=submitter.settings.max_train_rows,
            what="data",
        )
        y = None if req.labels is None else _labels(req.labels)
        job = await run_in_threadpool(
            lambda: submitter.submit_arrays(req.name, params, x, y, promote=req.promote)
        )
    else:
        raise UnsupportedMediaType("send application/json or multipart/form-data")
    if worker is not None:
        worker.wake()
    response.headers["Location"] = f"/jobs/{job.id}"
    return JobOut.from_job(job)


def _labels(labels: list[int]) -> Any:
    import numpy as np

    return np.asarray(labels, dtype=np.int64)


async def _train_multipart(request: Request, submitter: Submitter) -> Job:
    try:
        form = await request.form(max_files=1, max_fields=len(_FORM_FIELDS))
    except ServiceError:
        raise  # e.g. the body limit, hit while the form is read
    except Exception as exc:  # malformed multipart or too many parts: Starlette's own errors
        raise InvalidInput(f"unreadable multipart body: {exc}") from None
    try:
        unknown = sorted(set(form.keys()) - set(_FORM_FIELDS))
        if unknown:
            raise InvalidInput(f"unknown form fields {unknown}; expected {', '.join(_FORM_FIELDS)}")
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidInput("the form needs a 'file' part holding the training data")
        fields: dict[str, Any] = {}
        for key in ("params", "name", "method", "promote"):
            value = form.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise InvalidInput(f"{key!r} must be a text field, not a file")
            fields[key] = value
        if "params" in fields:
            try:
                fields["params"] = json.loads(fields["params"])
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"params is not valid JSON: {exc}") from None
        if "promote" in fields:
            # A form field is text: only the JSON words, so a typo is never read as "no".
            if fields["promote"] not in ("true", "false"):
                raise InvalidInput("promote must be true or false")
            fields["promote"] = fields["promote"] == "true"
        try:
            options = TrainOptions.model_validate(fields)
        except ValidationError as exc:
            raise invalid_from_validation(exc) from None
        params = check_params(options.params, options.method)
        suffix = PurePath(upload.filename or "").suffix.lower()
        return await run_in_threadpool(
            lambda: submitter.submit_file(
                options.name, params, suffix, upload.file, promote=options.promote
            )
        )
    finally:
        await form.close()


@router.get(
    "/jobs",
    response_model=JobList,
    summary="List training jobs, newest first",
    responses=error_responses(401, 422, 503),
)
def list_jobs(
    store: StoreDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many.")] = 100,
) -> JobList:
    jobs = store.list_jobs(status=status, limit=limit)
    return JobList(jobs=[JobOut.from_job(job) for job in jobs])


@router.get(
    "/jobs/{job_id}",
    response_model=JobOut,
    summary="One training job",
    responses=error_responses(401, 404, 503),
)
def get_job(job_id: str, store: StoreDep) -> JobOut:
    return JobOut.from_job(store.require(job_id))


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=JobOut,
    summary="Cancel a queued or running job (409 when it already finished)",
    responses=error_responses(401, 404, 409, 503),
)
def cancel_job(job_id: str, store: StoreDep, files: FilesDep) -> JobOut:
    before = store.require(job_id)
    job = store.cancel(job_id)
    if before.status == "queued":
        files.remove(job_id)  # no worker will read it; a running job's worker cleans up
    return JobOut.from_job(job)
