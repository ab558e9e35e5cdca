"""CSV data read in blocks of whole lines: bounded memory whatever the file's line lengths.

A CSV's first line decides whether it is a header (``is_header_row``); splitting a 30 MB line
of ``10,`` into Python strings to decide took gigabytes. Here a line is never split into more
than the cells needed to find one number, the file is parsed by numpy's C reader one block
of lines at a time (so a text cell anywhere is found before training, with its row), and a
line longer than ``MAX_LINE_BYTES`` is refused instead of held.
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ColumnChoice:
    """Which columns of a CSV are the data: ``columns`` (keep only these) or ``drop`` (leave
    these out), each entry a header name or a column number counted from 1, as the messages
    count them. Unless ``columns`` names it, a first column without a header name (the index
    pandas writes) is left out too."""

    columns: tuple[str | int, ...] | None = None
    drop: tuple[str | int, ...] | None = None

    def __post_init__(self) -> None:
        if self.columns is not None and self.drop is not None:
            raise ValueError("give columns or drop, not both")
        for entries in (self.columns, self.drop):
            if entries is not None and not entries:
                raise ValueError("columns and drop need at least one column")
            for entry in entries or ():
                if isinstance(entry, bool) or not isinstance(entry, str | int):
                    raise ValueError(f"a column is a header name or a number, got {entry!r:.80}")
                if isinstance(entry, int) and entry < 1:
                    raise ValueError(f"column numbers count from 1, got {entry}")

    @classmethod
    def parse(cls, columns: str | None = None, drop: str | None = None) -> ColumnChoice:
        """From comma-separated text (the command line's and a form's): a whole number is
        a column number, anything else a header name."""

        def entries(text: str | None) -> tuple[str | int, ...] | None:
            if text is None:
                return None
            parts = [part.strip() for part in text.split(",")]
            return tuple(int(part) if part.isdigit() else part for part in parts if part)

        return cls(entries(columns), entries(drop))

    @property
    def is_default(self) -> bool:
        return self.columns is None and self.drop is None


@dataclass
class _Layout:
    """What the first line decided: the header's names, the columns kept (0-based, None:
    all) and the file's column count once known."""

    header: list[str] | None
    keep: list[int] | None
    n_columns: int | None


def csv_blocks(
    path: str | Path,
    choice: ColumnChoice | None = None,
    notes: list[str] | None = None,
    *,
    names: list[str] | None = None,
) -> Iterator[np.ndarray]:
    """The CSV's numbers as float64 matrices, one per block of lines, after its header (a
    first line without a number), of the columns ``choice`` keeps. ValueError names the file
    and the data row and column (by its header name when there is one) of a bad cell, a
    short row or a value that is not finite, counted as ``load_training_data`` counts them.
    What was decided without being asked (a dropped index column) is appended to ``notes``,
    and the kept columns' header names to ``names`` (nothing without a header).
    """
    path = Path(path)
    choice = choice or ColumnChoice()
    rows = 0
    layout: _Layout | None = None
    for block in _blocks(path):
        if layout is None:
            block = block.removeprefix(_BOM)
            line = _first_line(block)
            if line is None:
                continue  # blank so far
            layout = _layout(path, line, choice, notes)
            if layout.header is not None and names is not None:
                kept = range(len(layout.header)) if layout.keep is None else layout.keep
                names.extend(layout.header[column] for column in kept)
            if layout.header is not None:
                end = block.find(b"\n", block.find(line))
                block = b"" if end < 0 else block[end + 1 :]
        lines = [line for line in _lines(block) if line.strip()]
        if not lines:
            continue
        layout.n_columns = _check_widths(path, lines, layout, rows)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            try:
                matrix = np.loadtxt(
                    lines,
                    delimiter=",",
                    ndmin=2,
                    dtype=np.float64,
                    encoding="utf-8",
                    usecols=layout.keep,
                )
            except ValueError as error:
                raise ValueError(
                    f"{path}: unreadable .csv file: {_place(str(error), rows, layout.header)}"
                ) from None
        _check_finite(path, matrix, rows, layout)
        rows += matrix.shape[0]
        yield matrix
    if rows == 0:
        raise ValueError(f"{path}: no data rows")


def _layout(path: Path, line: bytes, choice: ColumnChoice, notes: list[str] | None) -> _Layout:
    """The header (when the first line is one) and the columns ``choice`` keeps."""
    header = None
    if is_header_row(line):
        header = [_cell_name(cell) for cell in line.decode("utf-8", "replace").split(",")]
    n_columns = line.count(b",") + 1
    keep: list[int] | None = None
    width = n_columns if header is not None else None
    # pandas writes its index first, under an empty header cell: left out unless chosen.
    index = header is not None and header[0] == "" and n_columns > 1
    if choice.columns is not None:
        keep = [_column(path, entry, header, n_columns) for entry in choice.columns]
    else:
        dropped = {_column(path, entry, header, n_columns) for entry in choice.drop or ()}
        if index and 0 not in dropped:
            dropped.add(0)
            if notes is not None:
                notes.append(
                    f"{path.name}: the first column has no name in the header, as pandas "
                    "writes its index: it was left out (choose columns to keep it)"
                )
        if dropped:
            keep = [column for column in range(n_columns) if column not in dropped]
    if keep is not None and not keep:
        raise ValueError(f"{path}: no column is left to train on")
    if keep is not None and len(set(keep)) != len(keep):
        raise ValueError(f"{path}: a column is chosen twice")
    return _Layout(header, keep, width)


def _cell_name(cell: str) -> str:
    return cell.strip().strip('"').strip()


def _column(path: Path, entry: str | int, header: list[str] | None, n_columns: int) -> int:
    """The 0-based index of a chosen column (a name of the header, or a number from 1)."""
    if isinstance(entry, int):
        if entry > n_columns:
            raise ValueError(f"{path}: there is no column {entry}; the file has {n_columns}")
        return entry - 1
    if header is None:
        raise ValueError(
            f"{path}: has no header row, so column {entry[:80]!r} cannot be found by name; "
            "give column numbers (from 1)"
        )
    if entry not in header:
        close = [name for name in header if name.lower() == entry.lower()]
        close = close or difflib.get_close_matches(entry, header, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{path}: no column named {entry[:80]!r} in the header{hint}")
    return header.index(entry)


def _check_widths(path: Path, lines: list[bytes], layout: _Layout, rows_before: int) -> int:
    """The block's column count (every line's), or ValueError naming the first line whose
    count differs from the rows before; numpy checks only the columns it reads."""
    counts = np.fromiter((line.count(b",") for line in lines), dtype=np.int64, count=len(lines))
    expected = layout.n_columns or int(counts[0]) + 1
    wrong = np.flatnonzero(counts != expected - 1)
    if wrong.size:
        row = rows_before + int(wrong[0]) + 1
        got = int(counts[wrong[0]]) + 1
        before = (
            "the header has" if layout.header is not None and row == 1 else ("the rows before have")
        )
        raise ValueError(
            f"{path}: unreadable .csv file: data row {row} has {got} "
            f"{'column' if got == 1 else 'columns'} where {before} {expected}{_COUNTED}"
        )
    return expected


def _check_finite(path: Path, matrix: np.ndarray, rows_before: int, layout: _Layout) -> None:
    """ValueError naming the first cell that is NaN or infinite (numpy reads "nan", "inf")."""
    if np.isfinite(matrix).all():
        return
    row, position = (int(i) for i in np.argwhere(~np.isfinite(matrix))[0])
    column = position if layout.keep is None else layout.keep[position]
    raise ValueError(
        f"{path}: {float(matrix[row, position])!r} is not a finite number: data row "
        f"{rows_before + row + 1}, {_column_name(column, layout.header)}{_COUNTED}; "
        "fill in or drop the missing values"
    )


def _column_name(column: int, header: list[str] | None) -> str:
    """A 0-based column as the messages name it: by its header name, and its number."""
    if header is not None and column < len(header) and header[column]:
        return f"column {header[column][:80]!r} ({column + 1})"
    return f"column {column + 1}"


def scan_csv(path: str | Path, choice: ColumnChoice | None = None) -> tuple[int, int]:
    """Data rows and columns of a CSV, every cell checked to be a number, in bounded memory."""
    rows = columns = 0
    for matrix in csv_blocks(path, choice):
        rows += matrix.shape[0]
        columns = matrix.shape[1]
    return rows, columns


def read_csv(
    path: str | Path, choice: ColumnChoice | None = None, notes: list[str] | None = None
) -> np.ndarray:
    """The CSV's numbers as one float64 matrix (ValueError naming a bad cell's row)."""
    return np.concatenate(list(csv_blocks(path, choice, notes)), axis=0)


def _place(message: str, rows_before: int, header: list[str] | None = None) -> str:
    """numpy's CSV message with one way of counting rows: from 1, data rows only, from the
    file's start (numpy counts a bad cell's row from 0 within the block), the column by its
    header name, and the delimiter named when the file uses another."""
    cell = re.fullmatch(
        r"could not convert string (.*) to float64 at row (\d+), column (\d+)\.", message
    )
    if cell:
        text, row, column = cell.groups()
        row_number = rows_before + int(row) + 1
        where = _column_name(int(column) - 1, header)
        placed = f"{text[:80]} is not a number: data row {row_number}, {where}{_COUNTED}"
        # numpy quotes the cell as repr does: a tab is a backslash and a t.
        for delimiter, name in ((";", "semicolons"), ("\\t", "tabs"), ("|", "vertical bars")):
            if delimiter in text:
                placed += (
                    f"; the file seems to be separated by {name}, and mbn reads "
                    "comma-separated values: save it with commas"
                )
                break
        return placed
    return message[:300]
