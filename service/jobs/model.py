"""A training job as the store records it: its statuses, its id, the row as a value."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mbn_core.methods import DEFAULT_METHOD

JOB_ID_PATTERN = r"^[0-9a-f]{32}$"
JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})

# The phase of a running job before its training process reports one.
STARTING_PHASE = "starting"


@dataclass(frozen=True)
class Job:
    """One row of the store."""

    id: str
    name: str
    status: str
    progress: float
    phase: str | None
    params: dict[str, Any]
    data_file: str
    n_rows: int
    n_features: int
    model_id: str | None
    error: str | None
    attempts: int
    worker_id: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    heartbeat_at: float | None
    method: str = DEFAULT_METHOD
    promote: bool = False

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Job:
        values = dict(row)
        values["params"] = json.loads(values["params"])
        return cls(**values)


def new_job_id() -> str:
    return uuid.uuid4().hex


def is_job_id(value: str) -> bool:
    return re.fullmatch(JOB_ID_PATTERN, value) is not None
