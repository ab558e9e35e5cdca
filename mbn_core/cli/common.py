"""What the commands of ``mbn`` share: user errors, their output, the Dask scheduler options."""

from __future__ import annotations

import argparse
import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


class UserError(Exception):
    """A mistake of the user's (a missing file, a bad option): one line on stderr, status 2."""


def say(line: str) -> None:
    """One line of the command's output."""
    print(line)  # noqa: T201 - the command's output


def os_message(error: OSError) -> str:
    """An OSError as one line: the file, then what went wrong."""
    where = f"{error.filename}: " if error.filename else ""
    return f"{where}{error.strerror or error}"


# What ``mbn embed --out`` writes, by suffix (.zarr through the chunked path).
OUTPUT_SUFFIXES = (".npy", ".csv", ".zarr")


def save_rows(path: Path, array: np.ndarray) -> None:
    """Write rows atomically (a temporary file beside it, then rename): CSV for a ``.csv``
    path (numbers in full float32 precision, integers as integers), else ``.npy``."""
    if not path.parent.is_dir():
        raise UserError(f"{path.parent}: no such directory")
    temporary = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        with temporary.open("xb") as handle:
            if path.suffix.lower() == ".csv":
                rows = array.reshape(len(array), -1)
                number = "%d" if array.dtype.kind in "iu" else "%.9g"
                np.savetxt(handle, rows, delimiter=",", fmt=number)
            else:
                np.save(handle, array, allow_pickle=False)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def add_scheduler_options(parser: argparse.ArgumentParser, purpose: str) -> None:
    """``--scheduler`` and ``--connect-timeout``, for a command that can use Dask."""
    parser.add_argument(
        "--scheduler",
        metavar="tcp://HOST:8786",
        help=f"{purpose} (needs the 'distributed' extra)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds to wait for the scheduler (default: 10)",
    )


@contextlib.contextmanager
def dask_client(args: argparse.Namespace, *, for_fit: bool) -> Iterator[Any]:
    """The Dask client of ``--scheduler`` (None without it), connected before any work; for a
    fit, every MBN fit inside runs its layers there (``use_dask``)."""
    if not args.scheduler:
        yield None
        return
    try:
        from mbn_core.mbn.backends import dask as distributed
    except ImportError as error:  # pragma: no cover - the module itself imports no Dask
        raise UserError(str(error)) from None
    try:
        context: contextlib.AbstractContextManager[Any]
        if for_fit:
            context = distributed.use_dask(args.scheduler, timeout=args.connect_timeout)
        else:
            context = contextlib.closing(
                distributed.connect(args.scheduler, timeout=args.connect_timeout)
            )
    except ImportError as error:
        raise UserError(str(error)) from None
    with context as client:
        yield client
