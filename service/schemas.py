"""Request and response models of the HTTP API (the contract of docs/DESIGN.md).

Request models forbid unknown fields and are strict (a string is not a number). They are
flat on purpose: the routes that read raw bodies publish these schemas inline in OpenAPI.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from mbn_core.methods import DEFAULT_METHOD
from service.jobs import Job

# A model id (mbn_core.bundle.manifest's rule) or a name given through the API: one path component,
# never "." or "..", no separators.
MODEL_REF_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# Names of bundles made elsewhere (the CLI) may be any printable text up to 200 characters;
# lookups only compare them with the loaded models, never build a path from them.
MODEL_LOOKUP_MAX = 200
# Validation context key: the names of the large members (rows, base64) that the body gave
# and the caller parses itself (service.json_object), validating the others with the model.
LARGE_GIVEN = "large_given"
# The longest row inputs_b64 may declare: far beyond any model's input, short enough that a
# message quoting it stays short.
MAX_DIM = 10_000_000

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
Mode = Literal["fast", "exact"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class EmbedRequest(_Request):
    """Rows to embed, as JSON numbers (``inputs``) or base64 little-endian float32
    (``inputs_b64`` with ``dim``: row-major, ``n * dim * 4`` bytes)."""

    # pydantic-core decodes base64 in Rust while parsing, faster than Python's base64.
    model_config = ConfigDict(extra="forbid", strict=True, val_json_bytes="base64")

    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=MODEL_LOOKUP_MAX,
        description="Model id, or name (the version promoted for it, else its first). "
        "Default: the default model.",
    )
    inputs: list[Annotated[list[float], Field(min_length=1)]] | None = Field(
        default=None,
        min_length=1,
        description="Rows of numbers, each of the model's input dimension.",
    )
    inputs_b64: bytes | None = Field(
        default=None,
        description="Base64 (standard or URL-safe alphabet, no line breaks) of the rows as "
        "little-endian float32, row-major; instead of inputs, for large batches.",
    )
    dim: int | None = Field(
        default=None, ge=1, le=MAX_DIM, description="Row length of inputs_b64 (required with it)."
    )
    mode: Mode = Field(
        default="fast",
        description="fast: the model's fast path (ONNX: a distilled network or the method's "
        "exported map); exact: the method's own exact model (slow, bounded).",
    )
    encoding_format: Literal["float", "base64"] = Field(
        default="float",
        description="float: embeddings as JSON numbers; base64: embeddings_b64 holds "
        "little-endian float32, row-major.",
    )
    return_clusters: bool = Field(
        default=True,
        description="Include cluster ids when the model has a clustering head.",
    )
    return_novelty: bool = Field(
        default=False,
        description="Include each row's novelty score (novelty), whether it is above "
        "the threshold calibrated on held-out training rows (novel), and whether it has a "
        "feature outside the training range (out_of_range).",
    )

    @model_validator(mode="after")
    def _one_input_form(self, info: ValidationInfo) -> EmbedRequest:
        parsed = (info.context or {}).get(LARGE_GIVEN, frozenset())
        inputs_given = self.inputs is not None or "inputs" in parsed
        b64_given = self.inputs_b64 is not None or "inputs_b64" in parsed
        if inputs_given == b64_given:
            raise ValueError("give exactly one of inputs and inputs_b64")
        if b64_given and self.dim is None:
            raise ValueError("inputs_b64 needs dim, the length of a row")
        if inputs_given and self.dim is not None:
            raise ValueError("dim goes with inputs_b64 only")
        return self


class EmbedResponse(BaseModel):
    model: str = Field(description="Id of the model that answered.")
    name: str = Field(description="Name of that model.")
    mode: Mode
    dim: int = Field(description="Embedding dimension.")
    n: int = Field(description="Number of rows embedded.")
    embeddings: list[list[float]] | None = Field(
        default=None, description="One embedding per input row (encoding_format float)."
    )
    embeddings_b64: str | None = Field(
        default=None,
        description="Base64 little-endian float32 n x dim, row-major (encoding_format base64).",
    )
    clusters: list[int] | None = Field(
        default=None, description="Cluster id per row, when the model has a clustering head."
    )
    novelty: list[float] | None = Field(
        default=None,
        description="Novelty score per row (return_novelty); null when the model has none.",
    )
    novel: list[bool] | None = Field(
        default=None,
        description="Whether each row's novelty is above the model's calibrated threshold "
        "(about 1% of rows like the training data are).",
    )
    out_of_range: list[bool] | None = Field(
        default=None,
        description="Whether each row has a feature outside the training range (widened by "
        "a margin) (return_novelty): rows scaled or shifted beyond what the model saw, which "
        "the novelty score may miss. Null when the model has no novelty model.",
    )
    novelty_unavailable: str | None = Field(
        default=None,
        description="Why novelty (or out_of_range) is null although asked for: no novelty "
        "model, or a degenerate calibration (then out_of_range is still given).",
    )


class TrainOptions(_Request):
    """What a training job is besides its data (the multipart form's name and params)."""

    name: str = Field(
        default="model",
        pattern=MODEL_REF_PATTERN,
        description="Model name. Requests naming it get the version an operator promoted, "
        "else its first.",
    )
    method: str | None = Field(
        default=None,
        description=f"Embedding method (a registered one; default {DEFAULT_METHOD}). Its options "
        "are the params.",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Training parameters of the method (those of `mbn train --method M`; "
        "n_jobs is the server's).",
    )
    promote: bool = Field(
        default=False,
        description="Once the job succeeds, make its model the default model and the version "
        "its name means (as POST /models/{id}/promote). Otherwise training moves neither.",
    )
    align_to: str | None = Field(
        default=None,
        min_length=1,
        max_length=MODEL_LOOKUP_MAX,
        description="An earlier model (id, or name: the version it resolves to) whose "
        "embedding space the new model's is mapped into, so that vectors of both stay "
        "comparable. It must take the same features and embed in as many dimensions.",
    )


class TrainRequest(TrainOptions):
    """A training job with its data inline; large data sets go as a multipart upload."""

    data: list[Annotated[list[float], Field(min_length=1)]] = Field(
        min_length=2, description="Training rows (at least 2)."
    )
    labels: list[int] | None = Field(
        default=None, description="Optional class label per row (for the fidelity report)."
    )


class JobOut(BaseModel):
    id: str
    name: str
    method: str = Field(default=DEFAULT_METHOD, description="The embedding method trained.")
    promote: bool = Field(
        default=False, description="Whether its model is promoted once the job succeeds."
    )
    status: JobStatus
    progress: float = Field(ge=0.0, le=1.0, description="Fraction done, 0..1.")
    phase: str | None = Field(
        default=None,
        description="Training phase now running: 'starting' (the training process loads its "
        "data), then the method's own ('fit', 'compressor', 'report', 'export'); null once "
        "the job ended.",
    )
    model_id: str | None = Field(default=None, description="The model made (succeeded jobs).")
    error: str | None = Field(default=None, description="Why it failed (failed jobs).")
    attempts: int = Field(description="Times a worker started it.")
    n_rows: int
    n_features: int
    params: dict[str, Any]
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    heartbeat_at: datetime | None = None

    @classmethod
    def from_job(cls, job: Job) -> JobOut:
        """The answer for a job of the store."""
        return cls(
            id=job.id,
            name=job.name,
            method=job.method,
            promote=job.promote,
            status=job.status,  # type: ignore[arg-type]
            progress=min(1.0, max(0.0, job.progress)),
            phase=job.phase,
            model_id=job.model_id,
            error=job.error,
            attempts=job.attempts,
            n_rows=job.n_rows,
            n_features=job.n_features,
            params=job.params,
            created_at=_datetime(job.created_at),
            started_at=None if job.started_at is None else _datetime(job.started_at),
            finished_at=None if job.finished_at is None else _datetime(job.finished_at),
            heartbeat_at=None if job.heartbeat_at is None else _datetime(job.heartbeat_at),
        )


class JobList(BaseModel):
    jobs: list[JobOut]


class ModelInfo(BaseModel):
    id: str
    name: str | None = Field(description="None only for a damaged model without a manifest.")
    created: str | None
    input_dim: int | None
    output_dim: int | None
    n_clusters: int | None
    default: bool = Field(description="Whether requests naming no model get this one.")
    current: bool = Field(
        default=False, description="Whether requests naming its name get this version."
    )
    state: Literal["ready", "damaged"] = Field(
        default="ready",
        description="damaged: its files failed verification; it is not served (409) until "
        "they are repaired or it is deleted.",
    )
    problem: str | None = Field(default=None, description="What failed, for damaged models.")


class ModelList(BaseModel):
    models: list[ModelInfo]
    default: str | None = Field(description="Id of the default model, if any.")
    default_source: Literal["promoted", "configured", "auto"] | None = Field(
        default=None,
        description="promoted (POST /models/{id}/promote), configured (MBN_DEFAULT_MODEL) or "
        "auto (the first model seen, e.g. the demo model).",
    )
    default_problem: str | None = Field(
        default=None, description="Why there is no default although one was chosen."
    )


class Health(BaseModel):
    status: Literal["ok", "ready", "not_ready"]
    checks: dict[str, bool] = Field(default_factory=dict)
    exact_runtime: str | None = Field(
        default=None,
        description="The replica's exact runtime, in words: running (its process, restarts, "
        "device), down and why, or not started yet. Readiness does not depend on it: while it "
        "restarts, exact requests get 503 and fast ones are served.",
    )


class HistogramOut(BaseModel):
    bounds: list[float] = Field(description="Upper bound of each bucket (the last is +Inf).")
    counts: list[int] = Field(description="Values in each bucket (not cumulative).")


class RuntimeOut(BaseModel):
    """The replica's exact runtime, as this API process last heard from it."""

    state: Literal["running", "down", "starting", "not started"]
    description: str = Field(description="The state in words, as readiness reports it.")
    pid: int | None = Field(description="The runtime's process while it runs.")
    generation: int = Field(description="Its start number: 1 for the first, then one per restart.")
    restarts: int
    device: str = Field(description="Where it computes: cpu, cuda, or none (cuda asked, absent).")
    device_note: str = Field(description="Why, when that is not what MBN_EXACT_DEVICE asked.")
    queued_requests: int = Field(description="Exact requests held: waiting or computing.")
    queued_rows: int = Field(description="Rows waiting for a step.")
    running_rows: int = Field(description="Rows of the step computing now.")
    models_loaded: int
    model_bytes: int = Field(description="Bytes of the held models' arrays (mapped pages too).")
    requests: int = Field(description="Exact requests answered since the replica started.")
    rows: int
    batches: int = Field(description="Steps computed (each one transform call).")
    cancelled: int = Field(description="Requests dropped because their client left.")
    abandoned: int = Field(description="Steps stopped mid-computation: nobody waited for them.")
    timed_out: int = Field(description="Requests dropped past MBN_EXACT_TIMEOUT_SECONDS.")
    rejected: int = Field(description="Requests refused because the queue was full (429).")
    mean_batch_rows: float | None
    mean_wait_ms: float | None = Field(description="Mean wait of a request for its first step.")
    mean_compute_ms: float | None = Field(description="Mean time of a step.")
    batch_rows: HistogramOut | None
    wait_seconds: HistogramOut | None
    compute_seconds: HistogramOut | None


class ErrorDetail(BaseModel):
    type: str = Field(description="Machine-readable kind, e.g. invalid_input, not_found.")
    message: str = Field(description="What went wrong, for a human.")


class ErrorResponse(BaseModel):
    error: ErrorDetail


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting the error shape for these status codes."""
    return {code: {"model": ErrorResponse} for code in codes}


def _datetime(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)
