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
    with pytest.raises(ValueError, match="'setosa' is not a number: data row 700001, column 2"):
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
