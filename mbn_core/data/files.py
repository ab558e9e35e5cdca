"""What a training data file holds, read from its headers alone, before anything is loaded.

A 1 kB ``.npy`` can claim a shape of 10^9 x 64 and a 3 MB ``.npz`` can inflate to gigabytes;
``np.load`` would try to allocate either. ``peek_data_file`` reads only the ``.npy`` headers
(``numpy.lib.format``), the ``.npz`` member sizes the zip directory declares
(``ZipInfo.file_size``) and, for ``.csv``, counts lines in a streaming pass, so a caller can
refuse a file by its shape and size first. It also checks that each header agrees with the
bytes that follow it (a file claiming more data than it holds is refused as truncated), which
is what keeps the later ``np.load`` bounded: numpy never reads past the declared size.
"""

from __future__ import annotations

import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from mbn_core.data.csv_scan import ColumnChoice, is_header_row, scan_csv
from mbn_core.data.npz_members import (
    HEADER_ERRORS,
    MEMBER_ERRORS,
    checked_members,
    open_member,
    read_member,
    sparse_format,
)

_NPY_MAGIC = b"\x93NUMPY"
# Headers numpy writes are a few hundred bytes; this bounds what a hostile one makes us parse.
_MAX_HEADER_BYTES = 10_000
# The arrays every scipy sparse .npz holds, whatever its format (csr, csc, bsr, coo, dia).
SPARSE_ARRAYS = frozenset({"format", "shape", "data"})
_SPARSE_MEMBERS = {f"{name}.npy" for name in SPARSE_ARRAYS}
# dtype kinds labels may have: compared and sorted (NMI, the map's colours), so numbers,
# booleans or strings, never mixed Python objects.
LABEL_KINDS = "biufUS"
# Members that are not numbers: a sparse .npz's format name, and labels (strings allowed).
_TEXT_MEMBERS = {"format.npy", "y.npy"}

__all__ = ["LABEL_KINDS", "SPARSE_ARRAYS", "DataShape", "is_header_row", "peek_data_file"]


@dataclass(frozen=True)
class DataShape:
    """What a data file holds, per its headers.

    Attributes
    ----------
    n_rows, n_features : int
        Shape of the data matrix.
    data_bytes : int
        Bytes of array data the file declares (decompressed, for ``.npz``): what loading it
        reads into memory, before conversion to float32.
    sparse : bool
        A scipy sparse ``.npz``.
    has_labels : bool
        An ``.npz`` with a ``y`` array.
    """

    n_rows: int
    n_features: int
    data_bytes: int
    sparse: bool = False
    has_labels: bool = False

    @property
    def loaded_bytes(self) -> int:
        """Bytes the data takes once read for training: its float32 rows when dense (or
        the file's own arrays, if larger); for sparse data, which training never makes
        dense, the file's arrays plus ``SPARSE_BYTES_PER_FEATURE`` for each feature."""
        if self.sparse:
            # A conversion to CSR (from COO, CSC...) makes a row pointer of n_rows + 1 int64s.
            return (
                self.data_bytes + self.n_features * SPARSE_BYTES_PER_FEATURE + (self.n_rows + 1) * 8
            )
        return max(self.data_bytes, self.n_rows * self.n_features * 4)


# What training holds per input feature of sparse data besides its nonzeros, rounded up: the
# V clusterings' chosen features as packed bits (V / 8 bytes; 50 at V = 400), per thread one
# clustering's draw and position lookup (about 13 bytes), the input map's fit (a peak of
# about 400 bytes under tracemalloc; ARPACK's workspace besides) and the range
# checks' sums (16 bytes).
SPARSE_BYTES_PER_FEATURE = 1024


@dataclass(frozen=True)
class _Header:
    shape: tuple[int, ...]
    dtype: np.dtype
    data_offset: int  # bytes of magic + header

    @property
    def data_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def peek_data_file(path: str | os.PathLike[str], choice: ColumnChoice | None = None) -> DataShape:
    """The shape of the data in ``path`` (``.npy``, ``.npz`` or ``.csv``, of the columns
    ``choice`` keeps) from its headers.

    Raises
    ------
    ValueError
        Naming the file: an unknown format, an unreadable or inconsistent header (a shape
        larger than the data present, Python objects, not numbers, not 2-D).
    """
    path = Path(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            with path.open("rb") as handle:
                header = _npy_header(handle, f"{path}")
                _check_size(header, path.stat().st_size, f"{path}")
            return _matrix_shape(header, f"{path}")
        if suffix == ".npz":
            return _peek_npz(path)
        if suffix == ".csv":
            return _peek_csv(path, choice)
    except (OSError, *MEMBER_ERRORS) as error:
        raise ValueError(f"{path}: unreadable {suffix} file: {error}") from None
    raise ValueError(
        f"{path}: unsupported format {suffix or '(no suffix)'!r}; use .npy, .npz or .csv"
    )


def _npy_header(handle: IO[bytes], source: str, *, numeric: bool = True) -> _Header:
    if handle.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
        raise ValueError(f"{source}: not a NumPy .npy array")
    handle.seek(-len(_NPY_MAGIC), os.SEEK_CUR)
    try:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, _fortran, dtype = np.lib.format.read_array_header_1_0(
                handle, max_header_size=_MAX_HEADER_BYTES
            )
        elif version == (2, 0):
            shape, _fortran, dtype = np.lib.format.read_array_header_2_0(
                handle, max_header_size=_MAX_HEADER_BYTES
            )
        else:
            raise ValueError(f"format version {version[0]}.{version[1]} is not supported")
    except (ValueError, *HEADER_ERRORS) as error:
        raise ValueError(f"{source}: unreadable .npy header: {error}") from None
    if dtype.hasobject:
        raise ValueError(f"{source}: holds Python objects (pickled data), which mbn never loads")
    if numeric and dtype.kind not in "biuf":
        raise ValueError(f"{source}: expected numbers, got dtype {dtype}")
    return _Header(tuple(int(n) for n in shape), dtype, handle.tell())


def _check_size(header: _Header, file_bytes: int, source: str) -> None:
    expected = header.data_offset + header.data_bytes
    if file_bytes != expected:
        raise ValueError(
            f"{source}: its header claims shape {header.shape} of {header.dtype} "
            f"({expected} bytes with the header) but it holds {file_bytes} bytes"
        )


def _matrix_shape(header: _Header, source: str, **flags: bool) -> DataShape:
    if len(header.shape) != 2:
        raise ValueError(
            f"{source}: expected a 2-D matrix (rows = points), got shape {header.shape}"
        )
    rows, features = header.shape
    return DataShape(rows, features, header.data_bytes, **flags)


def _peek_npz(path: Path) -> DataShape:
    with zipfile.ZipFile(path) as archive:
        # The members the checks below read are the ones training reads (npz_members).
        members = checked_members(archive, f"{path}")
        headers = {}
        for info in members.values():
            name = info.filename
            source = f"{path}: member {name!r}"
            with open_member(archive, info, f"{path}") as handle:
                # A scipy sparse .npz names its format ("csr") in a string array.
                header = _npy_header(handle, source, numeric=name not in _TEXT_MEMBERS)
            if name == "y.npy" and header.dtype.kind not in LABEL_KINDS:
                raise ValueError(
                    f"{source}: labels must be numbers, strings or booleans, got dtype "
                    f"{header.dtype}"
                )
            # The size the zip directory declares, checked against the header before a
            # byte is inflated: a decompression bomb is refused here, and zipfile never
            # inflates more than the declared size.
            _check_size(header, info.file_size, source)
            headers[name] = header
        if headers.keys() >= _SPARSE_MEMBERS:
            return _sparse_shape(path, archive, members, headers)
        if "x.npy" not in headers:
            raise ValueError(
                f"{path}: an .npz needs an array named 'x' (and optionally 'y'), "
                f"found {sorted(members)}"
            )
        x = headers["x.npy"]
        data_bytes = sum(h.data_bytes for h in headers.values())
        shape = _matrix_shape(x, f"{path}: member 'x'", has_labels="y.npy" in headers)
        return DataShape(shape.n_rows, shape.n_features, data_bytes, has_labels=shape.has_labels)


def _sparse_shape(
    path: Path,
    archive: zipfile.ZipFile,
    members: dict[str, zipfile.ZipInfo],
    headers: dict[str, _Header],
) -> DataShape:
    shape_header = headers["shape.npy"]
    if shape_header.shape != (2,) or shape_header.dtype.kind not in "iu":
        raise ValueError(f"{path}: a sparse .npz needs a 'shape' of two integers")
    sparse_format(archive, members, f"{path}")
    rows, features = (int(n) for n in read_member(archive, members["shape"], f"{path}"))
    if rows < 0 or features < 0:
        raise ValueError(f"{path}: negative sparse shape ({rows}, {features})")
    data_bytes = sum(h.data_bytes for h in headers.values())
    return DataShape(rows, features, data_bytes, sparse=True)


def _peek_csv(path: Path, choice: ColumnChoice | None = None) -> DataShape:
    """Rows and columns of a CSV, every cell checked to be a number, in bounded memory
    (blocks of lines, ``mbn_core.data.csv_scan``): a file training would refuse for a text cell
    is refused here, with its row."""
    rows, features = scan_csv(path, choice)
    return DataShape(rows, features, rows * features * 8)
