"""CSV files read in blocks of lines: bounded memory for any line length, every cell checked,
rows counted as the loader counts them."""

from __future__ import annotations

import contextlib
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from mbn_core.data import csv_scan
from mbn_core.data.files import is_header_row, peek_data_file
from mbn_core.data.readers import load_training_data


def peak_bytes(func, *args):  # type: ignore[no-untyped-def]
    tracemalloc.start()
    try:
        with contextlib.suppress(ValueError):
            func(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_very_long_first_line_is_checked_in_bounded_memory(tmp_path: Path) -> None:
    """A 30 MB first line of '10,' took the API process from 567 MB to 1.28 GB: the header
    test split it into Python strings. Lines up to the limit are parsed with numbers'
    memory (numpy's parser: up to twenty times a block's bytes), longer ones refused without
    being held."""
    bound = 20 * (csv_scan.MAX_LINE_BYTES + csv_scan.BLOCK_BYTES)
    cells = (csv_scan.MAX_LINE_BYTES - 16) // 3
    wide = tmp_path / "wide.csv"
    wide.write_bytes((b"10," * cells + b"10\n") * 2)
    assert peek_data_file(wide).n_rows == 2
    assert peak_bytes(peek_data_file, wide) < bound

    longest = tmp_path / "long.csv"
    longest.write_bytes(b"10," * (10 << 20) + b"10\n")  # 30 MB
    assert peak_bytes(peek_data_file, longest) < bound
    with pytest.raises(ValueError, match="longer than"):
        peek_data_file(longest)


@pytest.mark.slow
def test_a_long_header_line_is_tested_cell_by_cell() -> None:
    line = b"name," * 2_000_000
    tracemalloc.start()
    try:
        assert is_header_row(line)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()
    assert not is_header_row(b"a," * 1000 + b"3")
    assert is_header_row("\ufeffa,b") and not is_header_row("\ufeff1,b")


def test_a_text_cell_anywhere_is_refused_with_its_row(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    rows = [b"1,2"] * 700_000 + [b"3,setosa"]  # past the first block of lines
    path.write_bytes(b"a,b\n" + b"\n".join(rows) + b"\n")
    with pytest.raises(
        ValueError, match="'setosa' is not a number: data row 700001, column 'b' \\(2\\)"
    ):
        peek_data_file(path)


def test_a_short_row_in_a_later_block_is_refused_with_its_row(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes(b"1,2\n" * 600_000 + b"3\n")
    with pytest.raises(ValueError, match="data row 600001 has 1 column"):
        load_training_data(path)


def test_blocks_give_what_one_read_gives(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60_000, 7))
    path = tmp_path / "d.csv"
    text = "\ufeffc0,c1,c2,c3,c4,c5,c6\n\n" + "\n".join(",".join(map(str, r.tolist())) for r in x)
    path.write_text(text + "\r\n", encoding="utf-8")
    assert csv_scan.scan_csv(path) == (60_000, 7)
    assert np.array_equal(csv_scan.read_csv(path), x)


# ---------------------------------------------------------------------- a new user's CSVs


def write(tmp_path: Path, text: str, name: str = "d.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_pandas_index_column_is_left_out_and_said(tmp_path: Path) -> None:
    """pandas' to_csv writes the row number first, under an empty header cell: it was read
    as a feature, and the embedding's first dimension followed the row number."""
    path = write(tmp_path, ",a,b\n0,1.5,2\n1,3,4\n2,5,6\n")
    notes: list[str] = []
    x, _ = load_training_data(path, notes=notes)
    np.testing.assert_array_equal(x, [[1.5, 2], [3, 4], [5, 6]])
    assert notes and "pandas" in notes[0] and "left out" in notes[0]
    assert peek_data_file(path).n_features == 2
    kept, _ = load_training_data(path, csv_scan.ColumnChoice(columns=(1, "a", "b")))
    np.testing.assert_array_equal(kept[:, 0], [0, 1, 2])


def test_a_text_cell_is_named_by_its_column_header(tmp_path: Path) -> None:
    path = write(tmp_path, "age,height,species\n3,1.2,7\n4,1.5,setosa\n")
    with pytest.raises(
        ValueError, match=r"'setosa' is not a number: data row 2, column 'species' \(3\)"
    ):
        load_training_data(path)


def test_another_delimiter_is_named(tmp_path: Path) -> None:
    for text, name in (("a;b;c\n1;2;3\n4;5;6\n", "semicolons"), ("1\t2\n3\t4\n", "tabs")):
        with pytest.raises(ValueError, match=f"seems to be separated by {name}.*with commas"):
            load_training_data(write(tmp_path, text))


def test_missing_values_are_named_by_row_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "a,b\n1,2\n3,\n")
    with pytest.raises(ValueError, match=r"data row 2, column 'b' \(2\)"):
        load_training_data(path)
    path = write(tmp_path, "a,b\n1,2\n3,NaN\n5,6\n")
    with pytest.raises(ValueError, match=r"nan is not a finite number: data row 2, column 'b'"):
        load_training_data(path)


def test_columns_are_chosen_by_name_or_number(tmp_path: Path) -> None:
    path = write(tmp_path, "id,name,x,y\n7,ann,1,2\n8,bob,3,4\n9,cy,5,6\n")
    for choice in (
        csv_scan.ColumnChoice(columns=("x", "y")),
        csv_scan.ColumnChoice(columns=(3, 4)),
        csv_scan.ColumnChoice(drop=("id", "name")),
        csv_scan.ColumnChoice.parse(drop="1, name"),
    ):
        x, _ = load_training_data(path, choice)
        np.testing.assert_array_equal(x, [[1, 2], [3, 4], [5, 6]])
        assert peek_data_file(path, choice).n_features == 2
    for choice, message in (
        (csv_scan.ColumnChoice(columns=("X",)), r"no column named 'X' .*did you mean 'x'"),
        (csv_scan.ColumnChoice(columns=(5,)), "no column 5; the file has 4"),
        (csv_scan.ColumnChoice(drop=(1, 2, 3, 4)), "no column is left"),
        (csv_scan.ColumnChoice(columns=("x", 3)), "chosen twice"),
    ):
        with pytest.raises(ValueError, match=message):
            load_training_data(path, choice)
    with pytest.raises(ValueError, match="columns or drop, not both"):
        csv_scan.ColumnChoice.parse(columns="x", drop="y")
    with pytest.raises(ValueError, match="count from 1"):
        csv_scan.ColumnChoice(columns=(0,))
    headless = write(tmp_path, "1,2\n3,4\n", "h.csv")
    with pytest.raises(ValueError, match="no header row"):
        load_training_data(headless, csv_scan.ColumnChoice(columns=("x",)))
    npy = tmp_path / "d.npy"
    np.save(npy, np.eye(3))
    with pytest.raises(ValueError, match=r"of a \.csv file only"):
        load_training_data(npy, csv_scan.ColumnChoice(columns=(1,)))


def test_rows_of_another_width_are_refused_when_columns_are_chosen(tmp_path: Path) -> None:
    # numpy checks only the columns it reads: a short row passed unseen.
    path = write(tmp_path, "a,b,c\n1,2,3\n4,5\n")
    with pytest.raises(ValueError, match="data row 2 has 2 columns where the rows before have 3"):
        load_training_data(path, csv_scan.ColumnChoice(columns=("a", "b")))
    with pytest.raises(ValueError, match="data row 1 has 2 columns where the header has 3"):
        load_training_data(write(tmp_path, "a,b,c\n1,2\n"))
