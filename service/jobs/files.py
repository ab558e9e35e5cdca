"""A job's training data on disk, by job id: never at a path a client chose."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from service.domain import InsufficientStorage, Unavailable
from service.jobs.model import is_job_id

log = logging.getLogger(__name__)


class JobFiles:
    """Training data on disk, ``<root>/<job_id>/<file>``; written atomically before the job
    is queued, removed when it finishes."""

    ALLOWED_SUFFIXES = (".npy", ".npz", ".csv")

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, job_id: str, data_file: str) -> Path:
        if not is_job_id(job_id) or data_file not in self._allowed_names():
            raise ValueError(f"bad job data reference {job_id}/{data_file}")
        return self.root / job_id / data_file

    @classmethod
    def _allowed_names(cls) -> tuple[str, ...]:
        return tuple(f"data{suffix}" for suffix in cls.ALLOWED_SUFFIXES)

    def write_arrays(self, job_id: str, x: np.ndarray, y: np.ndarray | None) -> str:
        """Store rows (and labels) as ``data.npz``; returns the file name."""

        def write(handle: BinaryIO) -> None:
            arrays = {"x": x} if y is None else {"x": x, "y": y}
            np.savez(handle, **arrays)  # type: ignore[arg-type]

        return self._write(job_id, "data.npz", write)

    def write_stream(self, job_id: str, suffix: str, source: BinaryIO, *, max_bytes: int) -> str:
        """Copy an upload into ``data<suffix>``; returns the file name."""
        if suffix not in self.ALLOWED_SUFFIXES:
            raise ValueError(f"unsupported data file type {suffix!r}")

        def write(handle: BinaryIO) -> None:
            copied = 0
            while chunk := source.read(1 << 20):
                copied += len(chunk)
                if copied > max_bytes:
                    raise OverflowError
                handle.write(chunk)

        return self._write(job_id, f"data{suffix}", write)

    def write_with(self, job_id: str, name: str, write: Callable[[BinaryIO], None]) -> str:
        """Write ``name`` (one of the allowed data files) with ``write(handle)``, atomically
        and flushed to disk; returns the name. ``write`` may use the job's directory."""
        return self._write(job_id, name, write)

    def remove(self, job_id: str) -> None:
        if is_job_id(job_id):
            shutil.rmtree(self.root / job_id, ignore_errors=True)

    def _write(self, job_id: str, name: str, write: Callable[[BinaryIO], None]) -> str:
        target = self.path(job_id, name)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".upload-", dir=target.parent)
        except OSError as exc:
            self.remove(job_id)
            raise _storage_error(exc) from None
        try:
            with os.fdopen(fd, "wb") as handle:
                write(handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except BaseException as exc:
            Path(tmp).unlink(missing_ok=True)
            self.remove(job_id)
            if isinstance(exc, OSError):
                raise _storage_error(exc) from None
            raise
        return name


def _storage_error(exc: OSError) -> Exception:
    """A clear ``InsufficientStorage`` or ``Unavailable`` for what the disk refused (the
    server log gets the details)."""
    log.error("cannot store training data: %s", exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientStorage(
            "no space left to store the training data; free disk space or retry later"
        )
    return Unavailable(
        f"cannot store the training data ({os.strerror(exc.errno or 0)}); retry later",
        retry_after=5,
    )
