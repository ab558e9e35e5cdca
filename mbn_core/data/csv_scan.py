"""CSV data read in blocks of whole lines: bounded memory whatever the file's line lengths.

A CSV's first line decides whether it is a header (``is_header_row``); splitting a 30 MB line
of ``10,`` into Python strings to decide took gigabytes. Here a line is never split into more
than the cells needed to find one number, the file is parsed by numpy's C reader one block
of lines at a time (so a text cell anywhere is found before training, with its row), and a
line longer than ``MAX_LINE_BYTES`` is refused instead of held.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# Longest CSV line read: 500,000 features of 8 characters. Beyond it a line is refused rather
# than held whole in memory. numpy's parser takes up to twenty times a block's bytes (a block is
# BLOCK_BYTES plus at most one such line), so this bounds the scan to about 100 MB.
MAX_LINE_BYTES = 4 << 20
# Bytes read at a time; a block is this plus the rest of its last line.
BLOCK_BYTES = 1 << 20
_BOM = b"\xef\xbb\xbf"
# A cell longer than this is no number a CSV writer produces (float's repr is <= 24).
_MAX_NUMBER_CHARS = 64
# How the rows of a CSV message are counted.
_COUNTED = " (rows count from 1, without the header and blank lines)"


def is_header_row(line: bytes | str) -> bool:
    """Whether a CSV line is a header of column names: none of its cells is a number.

    A line with some numbers is data with a bad cell, which the loader reports with its place,
    rather than a header to drop in silence. A UTF-8 byte order mark before it is ignored.
    Cells are looked at one by one, up to the first number: bounded memory for any line.
    """
    data = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line
    data = data.removeprefix(_BOM)
    start = 0
    while True:
        end = data.find(b",", start)
        cell = data[start : (len(data) if end < 0 else end)]
        if len(cell) <= _MAX_NUMBER_CHARS and _is_number(cell):
            return False
        if end < 0:
            return True
        start = end + 1


def _is_number(cell: bytes) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _blocks(path: Path) -> Iterator[bytes]:
    """The file as blocks of whole lines (the last may lack its newline)."""
    pending = b""
    with path.open("rb") as handle:
        while chunk := handle.read(BLOCK_BYTES):
            cut = chunk.rfind(b"\n")
            # The line that began before this chunk, as far as it goes in it.
            head = len(pending) + (len(chunk) if cut < 0 else chunk.find(b"\n"))
            if head > MAX_LINE_BYTES:
                raise ValueError(f"{path}: a line is longer than {MAX_LINE_BYTES} bytes")
            if cut < 0:
                pending += chunk
                continue
            block, pending = pending + chunk[: cut + 1], chunk[cut + 1 :]
            yield block
    if pending:
        yield pending


def _first_line(block: bytes) -> bytes | None:
    for line in _lines(block):
        if line.strip():
            return line
    return None


def _lines(block: bytes) -> Iterator[bytes]:
    start = 0
    while start < len(block):
        end = block.find(b"\n", start)
        end = len(block) if end < 0 else end
        yield block[start:end]
        start = end + 1


def csv_blocks(path: str | Path) -> Iterator[np.ndarray]:
    """The CSV's numbers as float64 matrices, one per block of lines, after its header (a
    first line without a number). ValueError names the file and the data row of a bad cell
    or a short row, counted as ``load_training_data`` counts them."""
    path = Path(path)
    rows = 0
    columns = 0
    first = True
    for block in _blocks(path):
        if first:
            block = block.removeprefix(_BOM)
            line = _first_line(block)
            if line is None:
                continue  # blank so far
            first = False
            if is_header_row(line):
                end = block.find(b"\n", block.find(line))
                block = b"" if end < 0 else block[end + 1 :]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a block of blank lines
            try:
                matrix = np.loadtxt(
                    _lines(block), delimiter=",", ndmin=2, dtype=np.float64, encoding="utf-8"
                )
            except ValueError as error:
                raise ValueError(
                    f"{path}: unreadable .csv file: {_place(str(error), rows)}"
                ) from None
        if matrix.size == 0:
            continue
        if columns and matrix.shape[1] != columns:  # within a block, numpy checks
            raise ValueError(
                f"{path}: unreadable .csv file: data row {rows + 1} has {matrix.shape[1]} "
                f"columns where the rows before have {columns}{_COUNTED}"
            )
        columns = matrix.shape[1]
        rows += matrix.shape[0]
        yield matrix
    if rows == 0:
        raise ValueError(f"{path}: no data rows")


def scan_csv(path: str | Path) -> tuple[int, int]:
    """Data rows and columns of a CSV, every cell checked to be a number, in bounded memory."""
    rows = columns = 0
    for matrix in csv_blocks(path):
        rows += matrix.shape[0]
        columns = matrix.shape[1]
    return rows, columns


def read_csv(path: str | Path) -> np.ndarray:
    """The CSV's numbers as one float64 matrix (ValueError naming a bad cell's row)."""
    return np.concatenate(list(csv_blocks(path)), axis=0)


def _place(message: str, rows_before: int) -> str:
    """numpy's CSV message with one way of counting rows: from 1, data rows only, from the
    file's start. numpy counts a bad cell's row from 0 and a short row from 1, both within
    the block, without the header and blank lines, and suggests its own ``usecols``."""
    cell = re.fullmatch(
        r"could not convert string (.*) to float64 at row (\d+), column (\d+)\.", message
    )
    if cell:
        text, row, column = cell.groups()
        row_number = rows_before + int(row) + 1
        return f"{text[:80]} is not a number: data row {row_number}, column {column}{_COUNTED}"
    ragged = re.fullmatch(
        r"the number of columns changed from (\d+) to (\d+) at row (\d+);.*", message
    )
    if ragged:
        before, after, row = ragged.groups()
        columns = "column" if after == "1" else "columns"
        return (
            f"data row {rows_before + int(row)} has {after} {columns} where the rows before "
            f"have {before}{_COUNTED}"
        )
    return message[:300]
