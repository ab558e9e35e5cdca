"""service.json_rows: JSON number rows straight to float32, the same bits as the general path
(parse to the nearest float64, round to float32), or a refusal."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.json_rows import parse_number_rows


def general_path(text: str) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.array(json.loads(text), dtype=np.float32)


def assert_same_bits(text: str) -> None:
    parsed = parse_number_rows(text.encode())
    assert parsed is not None, text
    expected = general_path(text)
    assert parsed.shape == expected.shape
    np.testing.assert_array_equal(parsed.view(np.uint32), expected.view(np.uint32), err_msg=text)


@pytest.mark.parametrize(
    "text",
    [
        "[[1,2],[3,4.5]]",
        " [ [ 1 , 2 ] ,\n\t[ 3 , 4 ]\r] ",
        "[[-0, -0.0, 0, 0.0, -0e5]]",
        "[[1e5, 1E-5, 2.5e+3, -7e0, 0.5e-0]]",
        "[[0.1, 0.2, 0.3, 0.000123, 100.000]]",
        "[[9007199254740992, 9007199254740993, 123456789012345678]]",  # 2**53 and above
        "[[1e22, 1e23, 1e-22, 1e-23, 4.35e-37, 3.4e38]]",  # both sides of the exact path
        "[[0.10980392156862745, 0.3843137254901961, 0.99999999999999989]]",  # 17-digit reprs
    ],
)
def test_matches_the_general_path(text: str) -> None:
    assert_same_bits(text)


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        "[[]]",
        "[[1,2],[3]]",  # ragged
        '[[1,"2"]]',
        "[[1,[2]]]",  # nested
        "[[true]]",
        "[[null]]",
        "[[NaN]]",
        "[[Infinity]]",
        "[[01]]",
        "[[1.]]",
        "[[.5]]",
        "[[+1]]",
        "[[-]]",
        "[[1e]]",
        "[[1,]]",
        "[[1]] x",
        "[[1]",
        "[1, 2]",
        '{"a": 1}',
        "[[1234567890123456789]]",  # 19 significant digits
        "[[1e-45]]",  # float32 subnormal
        "[[3.4028235e38]]",  # at the float32 maximum: approximate, refused
        "[[1e39]]",  # beyond float32: the general path words the error
        "[[1e400]]",
    ],
)
def test_refuses_what_it_cannot_be_sure_of(text: str) -> None:
    assert parse_number_rows(text.encode()) is None


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(finite, min_size=3, max_size=3), min_size=1, max_size=4))
def test_any_float_rows_match_or_are_refused_for_a_stated_reason(
    rows: list[list[float]],
) -> None:
    text = json.dumps(rows)
    parsed = parse_number_rows(text.encode())
    if parsed is None:
        # A refusal is allowed only where the parser documents one; a parser that refused
        # everything would fail here on the first ordinary number.
        assert any(may_refuse(value) for row in rows for value in row), text
        return
    expected = general_path(text)
    np.testing.assert_array_equal(parsed.view(np.uint32), expected.view(np.uint32), text)


def may_refuse(value: float) -> bool:
    """Whether the parser may refuse ``value`` as ``json.dumps`` writes it (at most 17
    significant digits): outside the normal float32 range, or so close to a float32 halfway
    point that an approximate float64 could round either way (with margin)."""
    magnitude = abs(value)
    if magnitude == 0:
        return False
    if not float(np.finfo(np.float32).tiny) <= magnitude < float(np.finfo(np.float32).max):
        return True
    fraction, _ = math.frexp(magnitude)
    low_bits = int(fraction * 2.0**53) & ((1 << 29) - 1)
    return abs(low_bits - (1 << 28)) <= 16


def test_ordinary_floats_are_not_refused() -> None:
    # The rule above has teeth: none of these may be refused.
    assert not any(may_refuse(v) for v in (0.0, -0.0, 1.5, 0.1, 1e-30, 3e38, -123.456))
    assert parse_number_rows(b"[[0.0, -0.0, 1.5, 0.1, 1e-30, 3e38, -123.456]]") is not None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(10**18) + 1, 10**18 - 1), min_size=1, max_size=8))
def test_integers_match(row: list[int]) -> None:
    assert_same_bits(json.dumps([row, row]))


def test_typical_batches_are_never_refused() -> None:
    rng = np.random.default_rng(0)
    for x in (
        rng.random((64, 32)),  # 16-17 digit reprs
        rng.standard_normal((64, 32)) * 10.0 ** rng.integers(-30, 30, (64, 32)),
        rng.random((64, 32)).astype(np.float32).astype(np.float64),
    ):
        assert_same_bits(json.dumps(x.tolist()))
    assert_same_bits(json.dumps(rng.integers(0, 256, (64, 784)).tolist()))
