"""Checking and queueing training jobs: what POST /train and the demo model do.

Parameters, the data's shape and its values are checked before a job is queued, so a request
the training would refuse is refused at once (``InvalidInput``, ``PayloadTooLarge``), not a
failed job later: the parameters' ranges, list lengths and implied memory; the rows the method
needs; every value (finite, within float32, rows that differ, columns the input scaling can
take). Uploaded files are streamed to disk, their headers checked first
(``mbn_core.data.files``: a file claiming more than the limits is refused unread), then their
values read a block of rows at a time (``mbn_core.data.columns``): the API process never holds
a file's data whole. A CSV is stored as the float32 ``.npy`` of its chosen columns. Data is
written under the job's id (never a client-chosen path) and flushed to disk before the job row
exists: a queued job always has its data.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
import scipy.sparse as sp

from mbn_core.data.checks import check_spread
from mbn_core.data.columns import DataCheck, check_rows, write_csv_as_npy
from mbn_core.data.csv_scan import ColumnChoice
from mbn_core.data.files import DataShape, peek_data_file
from mbn_core.data.scaling import INPUT_SCALING
from mbn_core.pipeline.training import TrainingParams, check_feasible, check_memory
from service.config import Settings
from service.domain import Conflict, InvalidInput, Overloaded, PayloadTooLarge, shortened
from service.jobs import Job, JobFiles, JobStore, new_job_id

log = logging.getLogger(__name__)

T = TypeVar("T")
# (params, n_features, sparse) -> the job's params, once the data's shape is known.
Prepare = Callable[[dict[str, Any], int, bool], dict[str, Any]]
# Rows of an in-memory matrix checked at a time (float64 statistics of a block).
_CHECK_ROWS = 16_384

# Resources are the server's to give: threads come from MBN_TRAIN_THREADS, the device from
# MBN_TRAIN_DEVICE.
SERVER_PARAMS = {
    "n_jobs": "the server (MBN_TRAIN_THREADS)",
    "device": "the server (MBN_TRAIN_DEVICE)",
}

DEMO_NAME = "demo-digits"
# Small (V = 50, a 128-128 MLP for 30 epochs): its cross-fitted report, which the first
# model users see should have, measures 2 of 5 folds, and its map is laid out beside it. A
# clustering head shows off /embed's clusters.
DEMO_PARAMS: dict[str, Any] = {
    "n_clusterings": 50,
    "hidden_layer_sizes": [128, 128],
    "max_epochs": 30,
    "n_clusters": 10,
    "random_state": 0,
}
# A fixed id: replicas starting together on an empty model dir queue one demo job, not one
# each (the second insert is refused as a duplicate). New parameters, new id.
DEMO_JOB_ID = uuid.uuid5(uuid.NAMESPACE_URL, f"mbn-demo:{sorted(DEMO_PARAMS.items())}").hex


def server_params(params: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """A job's full parameters with the server's threads and, for methods that have one,
    device (a full set holds "device" exactly when the method has one). Applied at
    submission, so that a job's recorded params say what it runs with, and again by the
    worker that runs it, whose settings are the ones that count."""
    params = {**params, "n_jobs": settings.train_threads}
    if "device" in params:
        params["device"] = settings.train_device
    return params


def check_params(
    params: dict[str, Any], method: str | None = None, *, bound: int = 200_000
) -> dict[str, Any]:
    """The full parameter set (the method and every default filled in) or InvalidInput
    naming the bad key. ``method`` may come beside the params or inside them, not both;
    no integer option may exceed ``bound`` (the job's row limit)."""
    if method is not None:
        if params.get("method", method) != method:
            raise InvalidInput(f"method {method!r} disagrees with params.method")
        params = {**params, "method": method}
    _check_counts(params, bound)
    try:
        return TrainingParams.from_dict(params, set_elsewhere=SERVER_PARAMS).to_dict()
    except ValueError as exc:
        raise InvalidInput(f"params: {exc}") from None


# Options that are not counts: a seed may be any 32-bit value.
_NOT_COUNTS = frozenset({"random_state"})


def _check_counts(params: dict[str, Any], bound: int) -> None:
    """Refuse an integer option (or list entry) above ``bound``. The estimators bound few of
    their counts from above (clusterings, epochs, layer widths): 5,000,000 clusterings ran
    45 s at progress 0 before anything could stop them, and a layer of 10^18 units was queued.
    No count a job's data can use exceeds its row limit (MBN_MAX_TRAIN_ROWS)."""
    for key, value in params.items():
        if key in _NOT_COUNTS:
            continue
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, int) and not isinstance(item, bool) and abs(item) > bound:
                raise InvalidInput(
                    f"params: {shortened(str(key))} = {shortened(str(item))} is beyond what a "
                    f"job may use (at most {bound}, MBN_MAX_TRAIN_ROWS)"
                )


def check_data(
    shape: tuple[int, int],
    params: dict[str, Any],
    *,
    sparse: bool = False,
    memory_limit: int | None = None,
) -> None:
    """Refuse data the training would fail on by its size (too few rows for the layers,
    the compressor, the embedding or the clustering head; too few features for the method;
    more memory than ``memory_limit``
    bytes, None: this host's) or kind (sparse input for a method or a scaling that cannot
    take it)."""
    kind = "sparse " if sparse else ""
    n_rows = shape[0]
    try:
        training = TrainingParams.from_dict(params)
        check_feasible(training, n_rows, sparse=sparse, n_features=shape[1])
        check_memory(training, shape, memory_limit)
    except ValueError as exc:
        raise InvalidInput(f"params do not fit {n_rows} {kind}rows: {exc}") from None


def _check_values(check: DataCheck, params: dict[str, Any], source: str) -> None:
    """What training would refuse in the rows' values (ValueError naming ``source``): out
    of range, rows all alike, a column the input scaling cannot take."""
    check.check_spread(source)
    check.check_scaling(params[INPUT_SCALING.name])


class Submitter:
    """Queues training jobs (blocking: call from a thread)."""

    def __init__(self, settings: Settings, store: JobStore, files: JobFiles) -> None:
        self.settings = settings
        self.store = store
        self.files = files

    def refuse_if_full(self) -> None:
        """Cheap early ``Overloaded``, before a large body is read (submit checks again,
        exactly)."""
        limit = self.settings.max_queued_jobs
        if self.store.queued_count() >= limit:
            raise Overloaded(
                f"{limit} training jobs are already queued; retry later",
                retry_after=self.settings.retry_after_seconds,
            )

    def submit_arrays(
        self,
        name: str,
        params: dict[str, Any],
        x: np.ndarray,
        y: np.ndarray | None,
        *,
        job_id: str | None = None,
        promote: bool = False,
        prepare: Prepare | None = None,
    ) -> Job:
        """Store the rows and queue their job; ``prepare(params, n_features, sparse)``
        gives the job's params after the data's checks (it may refuse the job)."""
        if x.shape[0] > self.settings.max_train_rows:
            raise PayloadTooLarge(
                f"data has {x.shape[0]} rows; at most {self.settings.max_train_rows} per job"
            )
        if y is not None and y.shape != (x.shape[0],):
            raise InvalidInput(f"labels has {y.shape[0]} entries for {x.shape[0]} rows of data")
        sparse = sp.issparse(x)
        self._check_data(x.shape, params, sparse=sparse)
        try:
            if sparse:
                check_spread(x, "data")  # constant rows, or values float32 cannot train on
            else:
                check = DataCheck()
                for start in range(0, x.shape[0], _CHECK_ROWS):
                    check.add(x[start : start + _CHECK_ROWS], "data")
                _check_values(check, params, "data")
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        if prepare is not None:
            params = prepare(params, x.shape[1], sparse)
        job_id = job_id or new_job_id()
        data_file = self.files.write_arrays(job_id, x, y)
        return self._queue(job_id, name, params, data_file, x.shape, promote)

    def submit_file(
        self,
        name: str,
        params: dict[str, Any],
        suffix: str,
        source: BinaryIO,
        *,
        promote: bool = False,
        prepare: Prepare | None = None,
        choice: ColumnChoice | None = None,
    ) -> Job:
        """Store an uploaded data file and queue its job; ``prepare(params, n_features,
        sparse)`` gives the job's params once the file's width is known (it may refuse the
        job). Every value is checked here (finite, and columns the input scaling can take),
        so that the job cannot fail on them later; a CSV is stored as the float32 ``.npy``
        of the columns ``choice`` keeps (a pandas index column left out)."""
        if suffix not in JobFiles.ALLOWED_SUFFIXES:
            raise InvalidInput(
                f"the file name must end in one of {', '.join(JobFiles.ALLOWED_SUFFIXES)}"
            )
        if suffix != ".csv" and choice is not None and not choice.is_default:
            raise InvalidInput("columns and drop choose the columns of a .csv file only")
        job_id = new_job_id()
        try:
            data_file = self.files.write_stream(
                job_id, suffix, source, max_bytes=self.settings.max_upload_bytes
            )
        except OverflowError:
            self.files.remove(job_id)
            raise PayloadTooLarge(
                f"upload over the limit of {self.settings.max_upload_bytes} bytes"
            ) from None
        path = self.files.path(job_id, data_file)
        check: DataCheck | None
        try:
            if suffix == ".csv":
                data_file, shape, check = self._csv_as_npy(job_id, path, choice)
            else:
                shape = self._check_file(path)
                check = self._checked(path, lambda: check_rows(path))
            if check is not None:
                self._checked(path, lambda: _check_values(check, params, "file"))
            self._check_data((shape.n_rows, shape.n_features), params, sparse=shape.sparse)
            if prepare is not None:
                params = prepare(params, shape.n_features, shape.sparse)
        except BaseException:
            self.files.remove(job_id)
            raise
        shape_2d = (shape.n_rows, shape.n_features)
        return self._queue(job_id, name, params, data_file, shape_2d, promote)

    def _check_data(self, shape: tuple[int, int], params: dict[str, Any], *, sparse: bool) -> None:
        check_data(shape, params, sparse=sparse, memory_limit=self.settings.max_train_memory_bytes)

    def _csv_as_npy(
        self, job_id: str, path: Path, choice: ColumnChoice | None
    ) -> tuple[str, DataShape, DataCheck]:
        """The uploaded CSV checked and stored as ``data.npy`` (``write_csv_as_npy``), the
        CSV removed; its shape within the job's limits."""
        notes: list[str] = []
        result: list[DataCheck] = []
        scratch = path.with_name(".rows")

        def write(handle: BinaryIO) -> None:
            result.append(
                self._checked(path, lambda: write_csv_as_npy(path, handle, scratch, choice, notes))
            )

        data_file = self.files.write_with(job_id, "data.npy", write)
        path.unlink()
        for note in notes:
            log.info("job %s: %s", job_id, note.replace(path.name, "the upload"))
        (check,) = result
        shape = DataShape(check.n_rows, check.n_columns, check.n_rows * check.n_columns * 4)
        self._check_limits(shape)
        return data_file, shape, check

    def _checked(self, path: Path, step: Callable[[], T]) -> T:
        """``step()``, its ValueError an InvalidInput that calls the file "file"."""
        try:
            return step()
        except ValueError as exc:
            # The message names our storage path; to the client it is "file".
            raise InvalidInput(str(exc).replace(str(path), "file")) from None

    def _check_file(self, path: Path) -> DataShape:
        """The shape of an uploaded file from its headers, within the limits."""
        shape = self._checked(path, lambda: peek_data_file(path))
        self._check_limits(shape)
        return shape

    def _check_limits(self, shape: DataShape) -> None:
        limit = self.settings.max_train_rows
        if shape.n_rows > limit:
            raise PayloadTooLarge(f"file has {shape.n_rows} rows; at most {limit} per job")
        limit = self.settings.max_train_bytes
        if shape.loaded_bytes > limit:
            kind = "sparse " if shape.sparse else ""
            raise PayloadTooLarge(
                f"file holds {shape.n_rows} x {shape.n_features} {kind}values "
                f"({shape.loaded_bytes} bytes once read); "
                f"at most {limit} bytes per job (MBN_MAX_TRAIN_BYTES)"
            )
        if shape.n_features < 1:
            raise InvalidInput("file has no columns")

    def submit_demo(self) -> Job | None:
        """Queue the demo model's job unless it was queued before (by any replica)."""
        if self.store.get(DEMO_JOB_ID) is not None:
            return None
        from sklearn.datasets import load_digits

        digits = load_digits()
        params = server_params(check_params(DEMO_PARAMS), self.settings)
        x = digits.data.astype(np.float32)
        try:
            job = self.submit_arrays(
                DEMO_NAME, params, x, digits.target.astype(np.int64), job_id=DEMO_JOB_ID
            )
        except Conflict:
            return None
        log.info("no model yet: queued job %s to train the demo model %r", job.id, DEMO_NAME)
        return job

    def _queue(
        self,
        job_id: str,
        name: str,
        params: dict[str, Any],
        data_file: str,
        shape: Any,
        promote: bool = False,
    ) -> Job:
        try:
            return self.store.submit(
                job_id=job_id,
                name=name,
                params=params,
                data_file=data_file,
                n_rows=int(shape[0]),
                n_features=int(shape[1]),
                max_queued=self.settings.max_queued_jobs,
                promote=promote,
            )
        except Conflict:
            if job_id != DEMO_JOB_ID:
                self.files.remove(job_id)
            raise
        except BaseException:
            self.files.remove(job_id)
            raise
