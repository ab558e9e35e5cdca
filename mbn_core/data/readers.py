"""Reading a training data file into a checked matrix and labels.

``load_training_data`` reads ``.npy``, ``.npz`` (dense or scipy sparse) and ``.csv`` files for
``mbn train`` and the service's training processes; ``check_matrix`` checks an in-memory one.
Headers are checked before anything is loaded (``mbn_core.data.files``).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from mbn_core.data.csv_scan import ColumnChoice, read_csv
from mbn_core.data.files import LABEL_KINDS, SPARSE_ARRAYS, peek_data_file
from mbn_core.data.npz_members import (
    HEADER_ERRORS,
    MEMBER_ERRORS,
    checked_members,
    read_member,
    sparse_format,
)


def load_training_data(
    path: str | os.PathLike[str],
    choice: ColumnChoice | None = None,
    notes: list[str] | None = None,
) -> tuple[Any, np.ndarray | None]:
    """Read a data file: ``.npy``, ``.npz`` (``x`` and optional ``y``), scipy sparse ``.npz``
    or ``.csv`` (numbers only, and a header row when no cell of the first row is a number).

    A CSV's columns are those ``choice`` keeps (by default all but a first column without a
    header name: the index pandas writes); what was left out unasked is appended to
    ``notes``.

    Returns
    -------
    X : ndarray of shape (n_samples, n_features) float32, or CSR matrix float32
    y : ndarray of shape (n_samples,) or None
        Labels from an ``.npz``'s ``y``, used only to report fidelity.

    Raises
    ------
    ValueError
        Naming the file: missing, unreadable, an unknown format, or malformed content
        (not 2-D, not numeric, NaN or infinity, fewer than 2 rows).
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if not path.is_file():
        raise ValueError(f"{path}: not a file")
    suffix = path.suffix.lower()
    if suffix != ".csv" and choice is not None and not choice.is_default:
        raise ValueError(f"{path}: columns and drop choose the columns of a .csv file only")
    y = None
    try:
        _check_magic(path, suffix)
        if suffix in (".npy", ".npz"):
            # Headers that claim more data than the file holds are refused before numpy
            # allocates what they claim.
            peek_data_file(path)
        if suffix == ".npy":
            X = np.load(path, allow_pickle=False)
        elif suffix == ".npz":
            X, y = _read_npz(path)
        elif suffix == ".csv":
            # Blocks of lines in bounded memory; a bad cell is named with its row and column.
            X = read_csv(path, choice, notes)
        else:
            raise ValueError(
                f"{path}: unsupported format {suffix or '(no suffix)'!r}; use .npy, .npz or .csv"
            )
    except (OSError, *MEMBER_ERRORS, *HEADER_ERRORS) as error:
        raise ValueError(f"{path}: unreadable {suffix} file: {error}") from None
    except ValueError as error:
        message = str(error)
        if "allow_pickle" in message:  # numpy's advice to unpickle is not ours to give
            message = f"{path}: holds Python objects (pickled data), which mbn never loads"
        elif not message.startswith(str(path)):
            message = f"{path}: unreadable {suffix} file: {message}"
        raise ValueError(message) from None
    return check_matrix(X, str(path)), check_labels(y, X.shape[0], str(path))


def check_matrix(X, source: str = "X"):
    """``X`` as float32 (dense or CSR), or ValueError naming ``source``."""
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        values = X.data
    else:
        X = np.asarray(X)
        values = X
    if X.ndim != 2:
        raise ValueError(f"{source}: expected a 2-D matrix (rows = points), got shape {X.shape}")
    if X.dtype.kind not in "biuf":
        raise ValueError(f"{source}: expected numbers, got dtype {X.dtype}")
    if X.shape[0] < 2 or X.shape[1] < 1:
        raise ValueError(f"{source}: needs at least 2 rows and 1 column, got shape {X.shape}")
    values = values.astype(np.float32, copy=False)
    if not np.isfinite(values).all():
        raise ValueError(f"{source}: contains NaN, infinity or values beyond float32's range")
    return X.astype(np.float32, copy=False)


def _check_magic(path: Path, suffix: str) -> None:
    """Refuse files that are not what their suffix says, before numpy guesses at pickles."""
    magic = {".npy": b"\x93NUMPY", ".npz": b"PK"}.get(suffix)
    if magic is None:
        return
    with path.open("rb") as handle:
        if handle.read(len(magic)) != magic:
            raise ValueError(f"{path}: not a NumPy {suffix} file")


def _read_npz(path: Path):
    with zipfile.ZipFile(path) as archive:
        # The members peek_data_file checked, read from the same entries.
        members = checked_members(archive, f"{path}")
        if members.keys() >= SPARSE_ARRAYS:
            sparse_format(archive, members, f"{path}")  # scipy raised KeyError for a gap
            return _checked_sparse(sp.load_npz(path)), None
        if "x" not in members:
            raise ValueError(
                f"{path}: an .npz needs an array named 'x' (and optionally 'y'), "
                f"found {sorted(members)}"
            )
        x = read_member(archive, members["x"], f"{path}")
        y = read_member(archive, members["y"], f"{path}") if "y" in members else None
        return x, y


def _checked_sparse(X) -> sp.csr_matrix:
    """``X`` as CSR, its index arrays checked first: scipy's constructors check only their
    lengths, and the compiled conversions index memory with them (a decreasing ``indptr``
    raised a C++ RuntimeError; a column index past the shape went through)."""
    if hasattr(X, "check_format"):  # csr, csc, bsr: before any conversion reads them
        X.check_format(full_check=True)
    X = X.tocsr()
    X.check_format(full_check=True)
    return X


def check_labels(y, n_samples: int, source: str) -> np.ndarray | None:
    if y is None:
        return None
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != n_samples:
        raise ValueError(f"{source}: 'y' must be 1-D with one label per row of 'x'")
    if y.dtype.kind == "O":  # e.g. strings from pandas or fetch_openml: typed, if they are
        y = np.asarray(y.tolist())
    if y.dtype.kind not in LABEL_KINDS:
        raise ValueError(
            f"{source}: labels must be numbers, strings or booleans, got {y.dtype} values"
        )
    if y.dtype.kind == "f":
        if not np.isfinite(y).all():
            raise ValueError(f"{source}: labels contain NaN or infinity")
        # Labels name classes for the report's NMI: a continuous target would make each row
        # its own class and every embedding look perfect.
        fractional = np.flatnonzero(y != np.round(y))
        if fractional.size:
            row = int(fractional[0])
            raise ValueError(
                f"{source}: labels name classes (whole numbers, strings or booleans); row "
                f"{row} has {float(y[row])!r}, and {fractional.size} of {len(y)} are not "
                "whole numbers"
            )
    return y
