"""Typed settings of the service, read from ``MBN_*`` environment variables.

Every field has a description (it is the documentation of the variable) and a bound: a limit
that is zero, negative or absurdly large is refused at start-up rather than discovered under load.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from mbn_core.distribution import install_hint

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# What an API key may look like: long enough not to be guessed, printable, no separators
# (the variable is comma-separated, the header space-separated).
_API_KEY = re.compile(r"^[A-Za-z0-9._~+/=-]{16,256}$")
_DATABASE_SCHEMES = ("sqlite", "postgresql+psycopg")
# Plain PostgreSQL URLs mean the psycopg (3) driver, the one this package depends on.
_SCHEME_ALIASES = {"postgres": "postgresql+psycopg", "postgresql": "postgresql+psycopg"}


# Variables that no longer exist, and what replaced them: set, they stop the start with this
# message rather than being ignored.
_REMOVED = {
    "MBN_MAX_CONCURRENT_EXACT": "exact requests now wait in the replica's exact runtime; "
    "bound its queue with MBN_EXACT_QUEUE_REQUESTS and MBN_EXACT_QUEUE_ROWS",
}


class Settings(BaseSettings):
    """Configuration of the API process and of stand-alone workers.

    Values come from keyword arguments, then ``MBN_<FIELD>`` environment variables, then the
    defaults below. ``model_dir`` and ``database_url`` default to places inside ``data_dir``.
    """

    model_config = SettingsConfigDict(
        env_prefix="MBN_",
        extra="forbid",
        validate_default=True,
        frozen=True,
        # Errors end up in logs: never echo a key or a database password.
        hide_input_in_errors=True,
    )

    # --- where things live -------------------------------------------------------------------
    data_dir: Path = Field(
        default=Path("data"),
        description="Directory for everything the embedded default writes: the SQLite job "
        "store, uploaded training data (by job id) and, unless MBN_MODEL_DIR is set, the "
        "model bundles. With several replicas it must be a volume they all share.",
    )
    model_dir: Path | None = Field(
        default=None,
        description="Directory of model bundles, one sub-directory per model id. "
        "Default: $MBN_DATA_DIR/models.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the job store: sqlite:///path or "
        "postgresql+psycopg://user:pass@host/db. Default: SQLite file $MBN_DATA_DIR/jobs.sqlite3.",
    )
    api_keys: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        default=(),
        description="Comma-separated API keys (16-256 characters of [A-Za-z0-9._~+/=-]). "
        "Unset or empty: no authentication. Clients send 'Authorization: Bearer <key>'. "
        "Health endpoints stay open.",
    )
    metrics_require_key: bool = Field(
        default=True,
        description="Whether /metrics needs an API key when keys are configured.",
    )
    default_model: str | None = Field(
        default=None,
        description="Model id or name used when a request names none, unless an operator "
        "promoted another (POST /models/{id}/promote). Unset: the first model ever seen (the demo "
        "model on a fresh install). A training job moves it only when submitted with promote.",
    )
    demo_model: bool = Field(
        default=True,
        description="When no model exists at start-up, queue a training job for a small demo "
        "model on scikit-learn's digits, so /embed answers without any set-up.",
    )

    # --- request limits ----------------------------------------------------------------------
    max_body_bytes: int = Field(
        default=32 * MIB,
        ge=1 * KIB,
        le=1 * GIB,
        description="Largest request body in bytes, except training uploads (413 above it).",
    )
    max_upload_bytes: int = Field(
        default=512 * MIB,
        ge=1 * KIB,
        le=16 * GIB,
        description="Largest POST /train file upload in bytes (413 above it); must be at "
        "least MBN_MAX_BODY_BYTES. JSON training bodies are held to MBN_MAX_BODY_BYTES.",
    )
    max_rows_per_request: int = Field(
        default=8192,
        ge=1,
        le=1_000_000,
        description="Most rows one /embed request may carry (413 above it).",
    )
    max_train_rows: int = Field(
        default=200_000,
        ge=10,
        le=100_000_000,
        description="Most rows a training job may have (413 above it).",
    )
    max_train_bytes: int = Field(
        default=4 * GIB,
        ge=1 * MIB,
        le=1024 * GIB,
        description="Most bytes a training job's data may take once read (rows x features x "
        "4, and the arrays a file declares, decompressed; a scipy sparse file is never made "
        "dense: its arrays and 1,024 bytes per feature): checked from the file's headers "
        "before anything is read, so a decompression bomb is refused at once (413).",
    )
    max_train_memory_bytes: int | None = Field(
        default=None,
        ge=1 * MIB,
        le=1 << 50,
        description="Most memory a training job may need, as estimated from its parameters "
        "and data shape at submission (an upper estimate: the rows, the method's fit, the "
        "distilled MLP); 422 above it. Unset: the memory of the host or container the API "
        "runs on.",
    )
    min_free_bytes: int = Field(
        default=64 * MIB,
        ge=0,
        le=1024 * GIB,
        description="Free disk space the data and model directories need for /health/ready "
        "to answer 200 (uploads and bundles are written there).",
    )
    max_inflight_rows: int = Field(
        default=32_768,
        ge=1,
        le=100_000_000,
        description="Fast-mode rows being embedded at once by one process; a request that "
        "would pass it is refused with 429 and Retry-After at once. At least "
        "MBN_MAX_ROWS_PER_REQUEST.",
    )
    max_inflight_requests: int = Field(
        default=8,
        ge=1,
        le=100_000,
        description="/embed requests one process parses and computes at once (a slot is "
        "taken once the body has been read); one more is refused with 429 and Retry-After.",
    )
    max_inflight_reads: int = Field(
        default=4,
        ge=1,
        le=10_000,
        description="Expensive reads (GET /models/{a}/compare/{b}, GET /models/{id}/monitor) "
        "one process admits at once; they run one at a time beside the event loop and one "
        "more is refused with 429 and Retry-After.",
    )
    fast_threads: int = Field(
        default=2,
        ge=1,
        le=256,
        description="Threads computing admitted fast-mode work beside the event loop "
        "(large-body parsing, the model, answers); about one per core.",
    )
    exact_cache_size: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Exact models (the full MBN, large) the exact runtime keeps mapped; least "
        "recently used ones are dropped beyond this.",
    )
    body_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="How long a request body may take beyond what MBN_MIN_BODY_RATE allows "
        "(the body must be in by this many seconds plus one second per MBN_MIN_BODY_RATE bytes "
        "received); a slower body is dropped with 408 and its connection closed.",
    )
    min_body_rate: int = Field(
        default=16 * KIB,
        ge=1,
        le=1 * GIB,
        description="Slowest request body accepted, in bytes per second, past the first "
        "MBN_BODY_TIMEOUT_SECONDS.",
    )
    max_buffered_body_bytes: int = Field(
        default=256 * MIB,
        ge=1 * KIB,
        le=64 * GIB,
        description="/embed bodies are read whole before they take an in-flight slot; at most "
        "this many bytes of them are held at once (429 with Retry-After past it). At least "
        "MBN_MAX_BODY_BYTES.",
    )
    max_header_bytes: int = Field(
        default=32 * KIB,
        ge=1 * KIB,
        le=16 * MIB,
        description="Largest request line plus headers, in bytes (431 above it), checked as "
        "the bytes arrive, before any header is parsed.",
    )
    header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="How long a request's line and headers may take to arrive once the first "
        "byte has (408 and the connection closed after it).",
    )
    saturated_after_seconds: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="/health/ready answers 503 once every /embed in-flight slot has been "
        "taken for this long without a break (the replica refuses all new /embed work).",
    )
    max_queued_jobs: int = Field(
        default=16,
        ge=1,
        le=100_000,
        description="Queued training jobs allowed; one more POST /train is refused with 429.",
    )
    onnx_threads: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Threads of each model's onnxruntime session (fast mode).",
    )
    inline_fast_rows: int = Field(
        default=64,
        ge=0,
        le=100_000,
        description="Fast-mode batches up to this many rows are computed on the event loop "
        "(cheaper than a thread hop); larger ones in a thread, beside the loop.",
    )
    retry_after_seconds: int = Field(
        default=1,
        ge=1,
        le=3600,
        description="Retry-After value sent with 429 and 503 answers.",
    )

    # --- exact mode: the replica's exact runtime ---------------------------------------------
    exact_queue_requests: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="Exact-mode requests one replica holds at once, waiting or computing, "
        "from all its API processes (the exact runtime's queue); one more is refused with "
        "429 and Retry-After. Replaces MBN_MAX_CONCURRENT_EXACT, which is refused at start.",
    )
    exact_queue_rows: int = Field(
        default=65_536,
        ge=1,
        le=100_000_000,
        description="Rows of exact-mode requests one replica holds at once; a request that "
        "would pass it is refused with 429 and Retry-After (a request alone always fits).",
    )
    exact_batch_rows: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="Most rows the exact runtime computes in one step: concurrent requests' "
        "rows are merged up to it, and a larger request is computed over several steps, "
        "interleaved with the requests that arrive meanwhile.",
    )
    exact_max_wait_ms: float = Field(
        default=50.0,
        ge=0.0,
        le=1000.0,
        description="Longest a step of the exact runtime waits, from the end of the last "
        "step, for the requests it expects (those the last step answered and those waiting "
        "then) to merge with; never more than a tenth of the last step's time, and never for "
        "a lone client. 0: never waits.",
    )
    exact_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="An exact-mode request not answered within this many seconds, queue "
        "included, is dropped and answered 503 with Retry-After.",
    )
    exact_threads: int = Field(
        default=0,
        ge=0,
        le=256,
        description="Steps the exact runtime computes side by side, one thread each (the "
        "rows of one large request are spread over them too); 0: the cores this process may "
        "run on. One on a GPU.",
    )
    exact_niceness: int = Field(
        default=10,
        ge=0,
        le=19,
        description="How much lower the CPU priority of the exact runtime's compute "
        "threads is than the API processes' (a nice increment): on a replica whose cores are "
        "busy, fast requests get the CPU first and exact steps what is left (the threads "
        "that take exact requests in and answer them keep the API's priority). 0: the same "
        "priority.",
    )
    exact_device: Literal["cpu", "cuda", "auto"] = Field(
        default="cpu",
        description="Where the exact runtime computes MBN models: cpu, cuda (one NVIDIA GPU; "
        "needs the 'gpu' extra; without a usable GPU exact requests are answered 503 saying "
        "why) or auto (a GPU when one is usable, else the CPU). The embeddings are the same "
        "on every device.",
    )
    exact_runtime_socket: Path | None = Field(
        default=None,
        description="Unix socket of an exact runtime started outside this process: `mbn "
        "serve` starts one per replica and gives its API processes this path. Unset: the "
        "process starts its own runtime when exact mode is first used.",
    )

    # --- monitoring ----------------------------------------------------------------------------
    shadow_fraction: float = Field(
        default=0.01,
        ge=0.0,
        le=1.0,
        description="Share of fast-mode rows sampled for the live monitor "
        "(GET /models/{id}/monitor): each gets a novelty score and an exact embedding from "
        "the exact runtime, behind every client's exact request (shadow rows), that measures "
        "the fast path's live fidelity. 0 turns monitoring off.",
    )
    shadow_max_delay: float = Field(
        default=30.0,
        ge=0.0,
        le=3600.0,
        description="Seconds a sampled row may wait to be processed with others: the "
        "monitor embeds sampled rows exactly in batches (a few hundred rows, or whatever "
        "waited this long), which costs the CPU several times less per row than one at a "
        "time. 0: processed as soon as the monitor's thread is free.",
    )
    monitor_window: int = Field(
        default=1000,
        ge=10,
        le=100_000,
        description="Sampled rows and shadow rows the monitor keeps per model (the sliding "
        "window its figures are computed on).",
    )
    replica_name: str | None = Field(
        default=None,
        max_length=100,
        description="This replica's name in the monitor and its metrics' replica label; "
        "unset: the host name.",
    )

    # --- jobs and workers --------------------------------------------------------------------
    embedded_worker: bool = Field(
        default=True,
        description="Run a training worker inside the API process. Set false on API replicas "
        "when stand-alone `mbn worker` processes run the jobs.",
    )
    worker_concurrency: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Training jobs one worker runs at once (each in its own child process).",
    )
    train_threads: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Threads each training job may use.",
    )
    train_device: Literal["cpu", "cuda", "auto"] = Field(
        default="cpu",
        description="Where MBN training jobs compute their layers: cpu, cuda (one NVIDIA GPU; "
        "needs the 'gpu' extra, and jobs fail when none is visible) or auto (a GPU when one "
        "is present). The models, and the codes they give, are the same on every device.",
    )
    dask_scheduler: str | None = Field(
        default=None,
        description="Address of a Dask scheduler (tcp://host:8786): training jobs run each "
        "MBN layer's clusterings on its workers (needs the 'distributed' extra). Unset or "
        "empty: jobs train on the worker's own threads.",
    )
    dask_connect_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="How long a training job waits for the Dask scheduler before failing.",
    )
    poll_interval_seconds: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="How often an idle worker looks for a queued job.",
    )
    heartbeat_seconds: float = Field(
        default=2.0,
        gt=0,
        le=300,
        description="How often a worker records that its running job is alive (and reads "
        "whether it was cancelled).",
    )
    stale_after_seconds: float = Field(
        default=30.0,
        gt=0,
        le=86_400,
        description="A running job without a heartbeat for this long is considered orphaned: "
        "its worker died. Must exceed 2 x MBN_HEARTBEAT_SECONDS.",
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Times a job is started before an orphaned job is failed instead of requeued.",
    )
    job_timeout_seconds: float = Field(
        default=6 * 3600,
        gt=0,
        le=7 * 86_400,
        description="A training job running longer than this is stopped and failed.",
    )
    rescan_seconds: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="How often the registry rescans the model dir for bundles written or "
        "deleted by other replicas (it also rescans when a request names an unknown model).",
    )
    shutdown_grace_seconds: float = Field(
        default=10.0,
        ge=0,
        le=600,
        description="On shutdown, how long in-flight requests may take to finish.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level of the service's loggers."
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, keys: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for index, key in enumerate(keys):
            # The key itself never appears in the message: messages end up in logs.
            if not _API_KEY.match(key.get_secret_value()):
                raise ValueError(
                    f"API key #{index + 1} must be 16-256 characters of [A-Za-z0-9._~+/=-]"
                )
        return keys

    @field_validator("data_dir", "model_dir")
    @classmethod
    def _not_root(cls, path: Path | None) -> Path | None:
        if path is not None and path.expanduser().resolve() == Path("/"):
            raise ValueError("must not be the file system root")
        return path

    @field_validator("database_url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        if url is None:
            return url
        scheme, sep, rest = url.partition("://")
        if sep and scheme in _SCHEME_ALIASES:
            scheme = _SCHEME_ALIASES[scheme]
            url = f"{scheme}://{rest}"
        if not sep or scheme not in _DATABASE_SCHEMES:
            raise ValueError(
                f"database URL scheme must be one of {', '.join(_DATABASE_SCHEMES)}, "
                f"got {scheme if sep else 'none'!r}"
            )
        return url

    @field_validator("dask_scheduler")
    @classmethod
    def _check_scheduler(cls, address: str | None) -> str | None:
        if address is None or not address.strip():
            return None
        address = address.strip()
        if not re.fullmatch(r"(tcp|tls|ucx|inproc)://[^\s/]+", address):
            raise ValueError(f"{address!r} is not a Dask scheduler address like tcp://host:8786")
        if importlib.util.find_spec("distributed") is None:
            raise ValueError(
                f"training on a Dask cluster needs Dask: {install_hint('distributed')}"
            )
        return address

    @field_validator("default_model")
    @classmethod
    def _check_default_model(cls, ref: str | None) -> str | None:
        if ref is not None and not (1 <= len(ref) <= 200 and ref.isprintable()):
            raise ValueError("default model must be 1-200 printable characters")
        return ref

    @model_validator(mode="after")
    def _derived_and_consistent(self) -> Settings:
        data_dir = self.data_dir.expanduser().absolute()
        object.__setattr__(self, "data_dir", data_dir)
        model_dir = (self.model_dir or data_dir / "models").expanduser().absolute()
        object.__setattr__(self, "model_dir", model_dir)
        if self.database_url is None:
            object.__setattr__(self, "database_url", f"sqlite:///{data_dir / 'jobs.sqlite3'}")
        if self.stale_after_seconds <= 2 * self.heartbeat_seconds:
            raise ValueError(
                "stale_after_seconds must exceed 2 x heartbeat_seconds, or live jobs would "
                "be taken for orphans"
            )
        for name, instead in _REMOVED.items():
            if name in os.environ:
                raise ValueError(f"{name} was removed: {instead}")
        if self.max_inflight_rows < self.max_rows_per_request:
            raise ValueError(
                f"MBN_MAX_INFLIGHT_ROWS ({self.max_inflight_rows}) must be at least "
                f"MBN_MAX_ROWS_PER_REQUEST ({self.max_rows_per_request})"
            )
        if self.max_buffered_body_bytes < self.max_body_bytes:
            raise ValueError(
                f"MBN_MAX_BUFFERED_BODY_BYTES ({self.max_buffered_body_bytes}) must be at least "
                f"MBN_MAX_BODY_BYTES ({self.max_body_bytes})"
            )
        if self.max_upload_bytes < self.max_body_bytes:
            raise ValueError(
                f"MBN_MAX_UPLOAD_BYTES ({self.max_upload_bytes}) must be at least "
                f"MBN_MAX_BODY_BYTES ({self.max_body_bytes})"
            )
        return self

    # Typed views of the derived fields (always set after validation).
    @property
    def models_path(self) -> Path:
        """The model directory, absolute."""
        assert self.model_dir is not None
        return self.model_dir

    @property
    def jobs_path(self) -> Path:
        """Where training data is kept, one sub-directory per job id."""
        return self.data_dir / "jobs"

    @property
    def spool_path(self) -> Path:
        """Where uploads are spooled while a multipart body is read (not the system's
        temporary directory: its disk is the one readiness watches)."""
        return self.data_dir / "spool"

    def make_directories(self) -> None:
        """Create the data, model, job and spool directories (``OSError`` when one cannot
        be)."""
        for directory in (self.data_dir, self.models_path, self.jobs_path, self.spool_path):
            directory.mkdir(parents=True, exist_ok=True)

    @property
    def exact_thread_count(self) -> int:
        """Threads of the exact runtime's computation (``exact_threads``, 0: the usable cores)."""
        return self.exact_threads or max(1, len(os.sched_getaffinity(0)))

    @property
    def db_url(self) -> str:
        """The job store's SQLAlchemy URL."""
        assert self.database_url is not None
        return self.database_url


def settings_markdown() -> str:
    """The settings as a Markdown table (variable, default, meaning): what docs/DEPLOYMENT.md
    shows, generated from the fields so the two cannot disagree (``scripts/gen_docs.py``)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.default
        if default is None or default == ():
            shown = "unset"
        elif isinstance(default, bool):
            shown = f"`{str(default).lower()}`"
        else:
            shown = f"`{default}`"
        description = " ".join((field.description or "").split())
        rows.append(f"| `MBN_{name.upper()}` | {shown} | {description} |")
    return "\n".join(rows)
