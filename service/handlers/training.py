"""The /train handler: checks a training request and queues its job."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import PurePath
from typing import Any, BinaryIO

import numpy as np

from mbn_core.data.csv_scan import ColumnChoice
from service.alignment import aligned_params
from service.arrays import check_parsed_rows, rows_to_matrix
from service.domain import InvalidInput
from service.jobs import Job
from service.registry import ModelRegistry
from service.submission import Prepare, Submitter, check_params, server_params


class TrainingHandler:
    """Checks training requests and queues their jobs (``POST /train``).

    Checks run in the order a client reads them: the queue's room first, then the method
    and its parameters, then the data (its size against the limits and against what the
    parameters need). Data is stored under the job's id before the job is queued.

    Parameters
    ----------
    submitter : Submitter
        Checks the data, stores it and queues the job.
    wake : callable or None
        Called once a job is queued: the embedded worker, so it starts at once instead of at
        its next poll (None: no embedded worker).
    registry : ModelRegistry or None
        Resolves the model a job is aligned to (``align_to``); None refuses alignment.
    """

    def __init__(
        self,
        submitter: Submitter,
        wake: Callable[[], object] | None = None,
        registry: ModelRegistry | None = None,
    ) -> None:
        self.submitter = submitter
        self.wake = wake
        self.registry = registry

    def _aligned(self, align_to: str | None) -> Prepare:
        """What makes a job's params once its data's width is known: with ``align_to``, the
        model's id after the checks (404, 409, 422)."""
        if align_to is None:
            return lambda params, n_features, sparse: params
        registry = self.registry
        if registry is None:
            raise InvalidInput("align_to needs the model registry, which this server lacks")
        return lambda params, n_features, sparse: aligned_params(
            registry, align_to, params, n_features, sparse=sparse
        )

    def admit(self) -> None:
        """``Overloaded`` when the queue is full: cheap, before a large body is read (the
        submission checks again, exactly)."""
        self.submitter.refuse_if_full()

    def submit_rows(
        self,
        *,
        name: str,
        method: str | None,
        params: dict[str, Any],
        data: np.ndarray | Sequence[Sequence[float]],
        labels: np.ndarray | Sequence[int] | None,
        promote: bool,
        align_to: str | None = None,
    ) -> Job:
        """Queue a job whose rows (a float32 matrix parsed from the body, or rows) and
        optional labels came inline."""
        settings = self.submitter.settings
        full_params = server_params(
            check_params(params, method, bound=settings.max_train_rows), settings
        )
        max_rows = self.submitter.settings.max_train_rows
        if isinstance(data, np.ndarray):
            x = check_parsed_rows(data, expected_dim=None, max_rows=max_rows, what="data")
        else:
            x = rows_to_matrix(data, expected_dim=None, max_rows=max_rows, what="data")
        y = None if labels is None else _labels(labels)
        job = self.submitter.submit_arrays(
            name, full_params, x, y, promote=promote, prepare=self._aligned(align_to)
        )
        return self._queued(job)

    def submit_upload(
        self,
        *,
        name: str,
        method: str | None,
        params: dict[str, Any],
        filename: str | None,
        source: BinaryIO,
        promote: bool,
        align_to: str | None = None,
        choice: ColumnChoice | None = None,
    ) -> Job:
        """Queue a job whose data is an uploaded file (its type by ``filename``'s suffix),
        copying ``source`` to disk; ``choice``: a CSV's columns to train on."""
        settings = self.submitter.settings
        full_params = server_params(
            check_params(params, method, bound=settings.max_train_rows), settings
        )
        suffix = PurePath(filename or "").suffix.lower()
        job = self.submitter.submit_file(
            name,
            full_params,
            suffix,
            source,
            promote=promote,
            prepare=self._aligned(align_to),
            choice=choice,
        )
        return self._queued(job)

    def _queued(self, job: Job) -> Job:
        if self.wake is not None:
            self.wake()
        return job


def _labels(labels: np.ndarray | Sequence[int]) -> np.ndarray:
    if isinstance(labels, np.ndarray):
        return labels
    try:
        return np.asarray(labels, dtype=np.int64)
    except OverflowError:
        raise InvalidInput("labels must be integers within 64 bits") from None
