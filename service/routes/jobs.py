"""POST /train, GET /jobs, GET /jobs/{job_id}, POST /jobs/{job_id}/cancel."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from mbn_core.data.csv_scan import ColumnChoice
from service.deps import JobsHandlerDep, SettingsDep, TrainingHandlerDep, require_api_key
from service.errors import (
    InvalidInput,
    UnsupportedMediaType,
    invalid_from_validation,
)
from service.handlers import Job, TrainingHandler
from service.json_object import parse_integers, parse_rows
from service.routes._body import is_json, json_body, parse_json_text, parse_object, read_json_body
from service.routes._multipart import read_form
from service.schemas import JobList, JobOut, JobStatus, TrainOptions, TrainRequest, error_responses

router = APIRouter(tags=["jobs"], dependencies=[Depends(require_api_key)])

_FORM_FIELDS = ("file", "params", "name", "method", "promote", "align_to", "columns", "drop")
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
        "align_to": {
            "type": "string",
            "description": TrainOptions.model_fields["align_to"].description,
        },
        "columns": {
            "type": "string",
            "description": "A .csv file's columns to train on, comma-separated: header names, "
            "or numbers counted from 1. Default: every column but a first one without a "
            "header name (pandas' index).",
        },
        "drop": {
            "type": "string",
            "description": "A .csv file's columns to leave out (instead of columns), "
            "comma-separated: header names, or numbers counted from 1.",
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
    request: Request, response: Response, handler: TrainingHandlerDep, settings: SettingsDep
) -> JobOut:
    await run_in_threadpool(handler.admit)  # 429 before a large body is read
    content_type = request.headers.get("content-type", "")
    if content_type.lower().startswith("multipart/form-data"):
        job = await _train_multipart(request, handler, settings.spool_path)
    elif is_json(content_type):
        # Held to the (smaller) body limit; parsed beside the event loop, into arrays.
        body = await read_json_body(request, limit=settings.max_body_bytes)
        options, data, labels = await run_in_threadpool(_parse_train, body, settings.max_train_rows)
        del body
        job = await run_in_threadpool(
            lambda: handler.submit_rows(
                name=options.name,
                method=options.method,
                params=options.params,
                data=data,
                labels=labels,
                promote=options.promote,
                align_to=options.align_to,
            )
        )
    else:
        raise UnsupportedMediaType("send application/json (in UTF-8) or multipart/form-data")
    response.headers["Location"] = f"/jobs/{job.id}"
    return JobOut.from_job(job)


def _parse_train(body: bytes, max_rows: int) -> tuple[TrainOptions, np.ndarray, np.ndarray | None]:
    """A JSON training body: its options, its rows as a float32 matrix and its labels, each
    member refused or parsed before the next (``service.json_object``)."""
    options, large = parse_object(
        TrainOptions, body, large=("data", "labels"), known=tuple(TrainRequest.model_fields)
    )
    if "data" not in large:
        raise InvalidInput("the JSON body needs 'data': the training rows, at least 2")
    data = parse_rows(large["data"], what="data", max_rows=max_rows, min_rows=2, per="job")
    labels = None
    if "labels" in large:
        labels = parse_integers(large["labels"], what="labels", count=data.shape[0])
    return options, data, labels


async def _train_multipart(request: Request, handler: TrainingHandler, spool_dir: Path) -> Job:
    form = await read_form(request, spool_dir, max_files=1, max_fields=len(_FORM_FIELDS))
    try:
        unknown = sorted(set(form.keys()) - set(_FORM_FIELDS))
        if unknown:
            raise InvalidInput(f"unknown form fields {unknown}; expected {', '.join(_FORM_FIELDS)}")
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidInput("the form needs a 'file' part holding the training data")
        fields: dict[str, Any] = {}
        for key in _FORM_FIELDS:
            # Starlette keeps every repeat of a field and .get() the last: refuse the guess.
            if len(form.getlist(key)) > 1:
                raise InvalidInput(f"the form has the field {key!r} more than once")
        for key in _FORM_FIELDS[1:]:
            value = form.get(key)
            if value is None:
                continue
            if not isinstance(value, str):
                raise InvalidInput(f"{key!r} must be a text field, not a file")
            fields[key] = value
        if "params" in fields:
            fields["params"] = parse_json_text(fields["params"], "params")
        if "promote" in fields:
            # A form field is text: only the JSON words, so a typo is never read as "no".
            if fields["promote"] not in ("true", "false"):
                raise InvalidInput("promote must be true or false")
            fields["promote"] = fields["promote"] == "true"
        try:
            choice = ColumnChoice.parse(fields.pop("columns", None), fields.pop("drop", None))
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        try:
            options = TrainOptions.model_validate(fields)
        except ValidationError as exc:
            raise invalid_from_validation(exc) from None
        return await run_in_threadpool(
            lambda: handler.submit_upload(
                name=options.name,
                method=options.method,
                params=options.params,
                filename=upload.filename,
                source=upload.file,
                promote=options.promote,
                align_to=options.align_to,
                choice=choice,
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
    handler: JobsHandlerDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this state.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many.")] = 100,
) -> JobList:
    jobs = handler.list_jobs(status=status, limit=limit)
    return JobList(jobs=[JobOut.from_job(job) for job in jobs])


@router.get(
    "/jobs/{job_id}",
    response_model=JobOut,
    summary="One training job",
    responses=error_responses(401, 404, 503),
)
def get_job(job_id: str, handler: JobsHandlerDep) -> JobOut:
    return JobOut.from_job(handler.get(job_id))


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=JobOut,
    summary="Cancel a queued or running job (409 when it already finished)",
    responses=error_responses(401, 404, 409, 503),
)
def cancel_job(job_id: str, handler: JobsHandlerDep) -> JobOut:
    return JobOut.from_job(handler.cancel(job_id))
