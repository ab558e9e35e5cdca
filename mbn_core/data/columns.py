"""Training data checked a block of rows at a time: every value finite, and every column one
the input scaling can take, in bounded memory, before a job is queued.

A service checks an uploaded file's headers at submission and leaves the loading to the
training process; a NaN or a column too narrow for "standard" scaling then failed the job
minutes later. ``scan_rows`` reads the file's rows in blocks (a CSV through its parser, an
``.npy`` mapped, an ``.npz``'s ``x`` inflated a block at a time) and ``DataCheck`` keeps what
the checks need: the shape, each column's range, mean and spread (Chan's parallel update, in
float64), and the first value that is not finite, with its row and column.
"""

from __future__ import annotations

import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np

from mbn_core.data.checks import check_largest, check_variances
from mbn_core.data.csv_scan import ColumnChoice, csv_blocks
from mbn_core.data.files import SPARSE_ARRAYS
from mbn_core.data.npz_members import checked_members, open_member
from mbn_core.data.scaling import check_deviations, chosen_scaling, range_ratio

# Bytes of rows read at a time from an .npy or .npz (the float64 statistics take 2x).
BLOCK_BYTES = 16 << 20


@dataclass
class DataCheck:
    """What the submission checks need of a matrix seen a block of rows at a time.

    Attributes
    ----------
    n_rows : int
    low, high, mean, m2 : ndarray of shape (n_columns,), float64
        Each column's smallest and largest value, mean and sum of squared deviations.
    names : list of str or None
        The columns' names (a CSV's header), for the messages.
    """

    n_rows: int = 0
    low: np.ndarray = field(default_factory=lambda: np.empty(0))
    high: np.ndarray = field(default_factory=lambda: np.empty(0))
    mean: np.ndarray = field(default_factory=lambda: np.empty(0))
    m2: np.ndarray = field(default_factory=lambda: np.empty(0))
    names: list[str] | None = None
    first_column: int = 0  # of a block of columns checked apart (in the messages)

    @property
    def n_columns(self) -> int:
        return int(self.mean.shape[0])

    def add(self, block: np.ndarray, source: str = "data") -> np.ndarray:
        """Take the next rows and return them as float32; ValueError naming the first value
        that is not finite, or beyond float32's range (training's precision)."""
        with np.errstate(over="ignore", invalid="ignore"):  # refused below, by its place
            values = np.asarray(block, dtype=np.float64)
            rows32 = values.astype(np.float32)
        if not np.isfinite(rows32).all():
            row, column = (int(i) for i in np.argwhere(~np.isfinite(rows32))[0])
            value = float(values[row, column])
            what = (
                "is not a finite number"
                if not np.isfinite(value)
                else ("is beyond float32's range (training computes in float32)")
            )
            raise ValueError(
                f"{source}: {value!r} at row {self.n_rows + row + 1}, "
                f"{self._column(column)} {what}; fill in, rescale or drop such values"
            )
        n = values.shape[0]
        if n == 0:
            return rows32
        mean = values.mean(axis=0)
        m2 = ((values - mean) ** 2).sum(axis=0)
        if self.n_rows == 0:
            self.low, self.high = values.min(axis=0), values.max(axis=0)
            self.mean, self.m2 = mean, m2
        else:
            total = self.n_rows + n
            delta = mean - self.mean
            self.mean = self.mean + delta * (n / total)
            self.m2 = self.m2 + m2 + delta**2 * (self.n_rows * n / total)
            self.low = np.minimum(self.low, values.min(axis=0))
            self.high = np.maximum(self.high, values.max(axis=0))
        self.n_rows += n
        return rows32

    def check_spread(self, source: str = "data") -> None:
        """``mbn_core.data.checks.check_spread`` of the rows seen: values within range,
        rows that differ and spread."""
        check_largest(max(float(np.max(-self.low)), float(np.max(self.high))), source)
        check_variances(self.m2 / max(self.n_rows, 1), source)

    def check_scaling(self, requested: str) -> str:
        """The scaling ``requested`` chooses for these rows ("none" or "standard");
        ValueError when it is "standard" and a column cannot be scaled."""
        method = chosen_scaling(requested, range_ratio(self.low, self.high))
        if method == "standard" and self.n_rows:
            check_deviations(np.sqrt(self.m2 / self.n_rows), self.names)
        return method

    def _column(self, column: int) -> str:
        column += self.first_column
        names = self.names
        if names is not None and column < len(names) and names[column]:
            return f"column {names[column][:80]!r} ({column + 1})"
        return f"column {column + 1}"


def check_rows(
    path: str | Path, choice: ColumnChoice | None = None, notes: list[str] | None = None
) -> DataCheck | None:
    """Every row of a dense data file checked (``DataCheck``); None for a scipy sparse
    ``.npz`` (its values are checked when it is read; no scaling centres it). The file's
    headers must have been checked (``peek_data_file``); ``choice`` applies to a CSV only."""
    path = Path(path)
    check = DataCheck()
    if path.suffix.lower() == ".csv":
        names: list[str] = []
        for block in csv_blocks(path, choice, notes, names=names):
            check.names = names or None
            check.add(block, str(path))
        return check
    if choice is not None and not choice.is_default:
        raise ValueError(f"{path}: columns and drop choose the columns of a .csv file only")
    if path.suffix.lower() == ".npy":
        matrix = np.load(path, mmap_mode="r", allow_pickle=False)
        step = _rows_per_block(matrix.shape[1], matrix.itemsize)
        for start in range(0, matrix.shape[0], step):
            check.add(np.asarray(matrix[start : start + step]), str(path))
        return check
    with zipfile.ZipFile(path) as archive:
        members = checked_members(archive, str(path))
        if members.keys() >= SPARSE_ARRAYS:
            return None
        with open_member(archive, members["x"], str(path)) as handle:
            _check_member(handle, check, str(path))
    return check


def write_csv_as_npy(
    source: str | Path,
    target: IO[bytes],
    scratch: Path,
    choice: ColumnChoice | None = None,
    notes: list[str] | None = None,
) -> DataCheck:
    """The CSV ``source``'s chosen columns written to ``target`` as a float32 ``.npy``, every
    row checked on the way (``DataCheck``), in bounded memory: the rows go to the file
    ``scratch`` first (removed after), since the header needs their count."""
    check = DataCheck()
    names: list[str] = []
    try:
        with scratch.open("wb") as rows:
            for block in csv_blocks(source, choice, notes, names=names):
                check.names = names or None
                check.add(block, str(source)).astype("<f4").tofile(rows)
        header = {
            "descr": "<f4",
            "fortran_order": False,
            "shape": (check.n_rows, check.n_columns),
        }
        np.lib.format.write_array_header_1_0(target, header)
        with scratch.open("rb") as rows:
            shutil.copyfileobj(rows, target, 1 << 20)
    finally:
        scratch.unlink(missing_ok=True)
    return check


def _rows_per_block(n_columns: int, itemsize: int) -> int:
    return max(1, BLOCK_BYTES // max(1, n_columns * itemsize))


def _check_member(handle: IO[bytes], check: DataCheck, source: str) -> None:
    """An ``.npz`` member's array (its header checked before), inflated a block at a time:
    rows of a C-ordered array, columns of a Fortran-ordered one."""
    version = np.lib.format.read_magic(handle)
    read_header = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    (n_rows, n_columns), fortran, dtype = read_header(handle)
    if not fortran:
        step = _rows_per_block(n_columns, dtype.itemsize)
        for start in range(0, n_rows, step):
            count = min(step, n_rows - start)
            data = handle.read(count * n_columns * dtype.itemsize)
            check.add(np.frombuffer(data, dtype=dtype).reshape(count, n_columns), source)
        return
    # Column-major: each block is whole columns, checked on its own and then put together.
    step = _rows_per_block(n_rows, dtype.itemsize)
    parts = []
    for start in range(0, n_columns, step):
        count = min(step, n_columns - start)
        data = handle.read(count * n_rows * dtype.itemsize)
        part = DataCheck(first_column=start)
        part.add(np.frombuffer(data, dtype=dtype).reshape(count, n_rows).T, source)
        parts.append((start, part))
    check.n_rows = n_rows
    for name in ("low", "high", "mean", "m2"):
        setattr(check, name, np.concatenate([getattr(part, name) for _, part in parts]))
