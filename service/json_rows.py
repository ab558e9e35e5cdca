"""A JSON array of number rows (``[[1, 0.5], [2, 3e-1]]``) straight to a float32 matrix.

Large JSON batches spend most of their time becoming Python objects: for 256 MNIST rows,
parsing 200,000 numbers into lists (10 ms) and the lists into a matrix (8 ms) cost several
times the model itself. This parser reads the bytes once, in a numba kernel, and writes
float32 directly.

It only answers when it is certain to give what the general path gives (the number parsed to
the nearest float64, then rounded to float32): anything else — a malformed or non-numeric
value, ragged or empty rows, more than 19 significant digits, a value whose float32 rounding
could depend on the last bit of its float64 — returns ``None``, and the caller falls back to
the general path, which also words the error.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# Powers of ten 10**-_POW_BIAS .. 10**_POW_BIAS, each the float64 nearest the exact value
# (Python parses "1e-40" correctly rounded).
_POW_BIAS = 60
_POW10 = np.array([float(f"1e{q}") for q in range(-_POW_BIAS, _POW_BIAS + 1)])
# Clinger's fast path: an integer below 2**53 times or over 10**q, q <= 22, both exact in
# float64, is one correctly rounded operation.
_EXACT_MANTISSA = 1 << 53
_EXACT_POW = 22
_MAX_DIGITS = 18  # significant digits that fit an int64 (float reprs have at most 17)
# A float64 -> float32 rounding is decided by the 29 low mantissa bits; within this many
# float64 ulps of the halfway pattern, an approximate float64 might round the other way.
_HALF_ULP32 = 1 << 28
_LOW29 = (1 << 29) - 1
_TWO_53 = float(1 << 53)  # frexp's fraction times this is the 53-bit mantissa, exactly
_GUARD_ULPS = 8
_FLOAT32_MIN_NORMAL = 1.1754943508222875e-38
_FLOAT32_MAX = 3.4028234663852886e38

_OK = 0
_REFUSED = 1


@njit(nogil=True, cache=True)
def _parse_rows(buf, out, pow10):
    """Parse ``[[n, ...], ...]`` from ``buf`` into ``out``: (status, rows, columns).

    One function on purpose: numba compiles helper calls that return tuples into real calls,
    which cost several times more than the parsing itself.
    """
    n = buf.shape[0]
    i = 0
    rows = 0
    columns = -1
    k = 0
    depth = 0  # 0: before the outer '[', 1: between rows, 2: inside a row
    count = 0
    while True:
        while i < n and (buf[i] == 32 or buf[i] == 10 or buf[i] == 13 or buf[i] == 9):
            i += 1
        if depth < 2:
            if i >= n or buf[i] != 91:  # '['
                return _REFUSED, 0, 0
            i += 1
            depth += 1
            count = 0
            continue

        # A number (JSON grammar), as a mantissa of up to _MAX_DIGITS digits and exponent.
        negative = i < n and buf[i] == 45  # '-'
        if negative:
            i += 1
        if i >= n or not 48 <= buf[i] <= 57:
            return _REFUSED, 0, 0
        mantissa = 0  # wraps past _MAX_DIGITS digits: refused after the loops
        exponent = 0
        integer = True
        first = i  # of the first significant digit
        if buf[i] == 48:  # a leading '0' is the whole integer part
            i += 1
            if i < n and 48 <= buf[i] <= 57:
                return _REFUSED, 0, 0
            first = -1
        else:
            while i < n and 48 <= buf[i] <= 57:
                mantissa = mantissa * 10 + (buf[i] - 48)
                i += 1
        digits = i - first if first >= 0 else 0
        if i < n and buf[i] == 46:  # '.'
            integer = False
            i += 1
            if i >= n or not 48 <= buf[i] <= 57:
                return _REFUSED, 0, 0
            start = i
            if first == -1:  # 0.000ddd: leading zeros are not significant
                while i < n and buf[i] == 48:
                    i += 1
                first = i
            while i < n and 48 <= buf[i] <= 57:
                mantissa = mantissa * 10 + (buf[i] - 48)
                i += 1
            exponent = start - i
            digits = i - first
        if digits > _MAX_DIGITS:
            return _REFUSED, 0, 0
        if i < n and (buf[i] == 101 or buf[i] == 69):  # 'e', 'E'
            integer = False
            i += 1
            exp_negative = False
            if i < n and (buf[i] == 43 or buf[i] == 45):
                exp_negative = buf[i] == 45
                i += 1
            if i >= n or not 48 <= buf[i] <= 57:
                return _REFUSED, 0, 0
            written = 0
            while i < n and 48 <= buf[i] <= 57:
                if written < 100000:  # beyond any float: refused below either way
                    written = written * 10 + (buf[i] - 48)
                i += 1
            exponent += -written if exp_negative else written

        if mantissa == 0:
            value = 0.0
            negative = negative and not integer  # "-0" is the integer 0; "-0.0" is -0.0
        elif -_EXACT_POW <= exponent <= _EXACT_POW and mantissa <= _EXACT_MANTISSA:
            value = float(mantissa)
            if exponent < 0:
                value /= pow10[_POW_BIAS - exponent]
            elif exponent > 0:
                value *= pow10[_POW_BIAS + exponent]
        else:
            # Within 2 float64 ulps of the true value: certain after float32 rounding unless
            # it sits next to a float32 halfway point or outside the normal float32 range.
            if exponent < -_POW_BIAS or exponent > _POW_BIAS:
                return _REFUSED, 0, 0
            value = float(mantissa) * pow10[_POW_BIAS + exponent]
            if not _FLOAT32_MIN_NORMAL <= value < _FLOAT32_MAX:
                return _REFUSED, 0, 0
            fraction, _ = math.frexp(value)  # value = fraction * 2**e, 0.5 <= fraction < 1
            if abs((np.int64(fraction * _TWO_53) & _LOW29) - _HALF_ULP32) <= _GUARD_ULPS:
                return _REFUSED, 0, 0
        if negative:
            value = -value
        if k >= out.shape[0]:
            return _REFUSED, 0, 0
        out[k] = np.float32(value)
        k += 1
        count += 1

        # What follows a number: ',' and the next number, or ']' and the next row or the end.
        while i < n and (buf[i] == 32 or buf[i] == 10 or buf[i] == 13 or buf[i] == 9):
            i += 1
        if i < n and buf[i] == 44:  # ','
            i += 1
            continue
        if i >= n or buf[i] != 93:  # ']'
            return _REFUSED, 0, 0
        i += 1
        if columns == -1:
            columns = count
        elif count != columns:
            return _REFUSED, 0, 0
        rows += 1
        while i < n and (buf[i] == 32 or buf[i] == 10 or buf[i] == 13 or buf[i] == 9):
            i += 1
        if i < n and buf[i] == 44:
            i += 1
            depth = 1
            continue
        if i >= n or buf[i] != 93:
            return _REFUSED, 0, 0
        i += 1
        while i < n and (buf[i] == 32 or buf[i] == 10 or buf[i] == 13 or buf[i] == 9):
            i += 1
        if i != n:
            return _REFUSED, 0, 0
        return _OK, rows, columns


@njit(nogil=True, cache=True)
def _count_commas(buf):
    count = 0
    for i in range(buf.shape[0]):
        if buf[i] == 44:  # ','
            count += 1
    return count


def parse_number_rows(raw: bytes | bytearray | memoryview) -> np.ndarray | None:
    """The float32 (rows, columns) matrix of a JSON array of equal-length number rows, or
    None when the general path must decide (see the module docstring)."""
    buf = np.frombuffer(raw, dtype=np.uint8)
    # Numbers are separated by commas: at most one more than there are commas. (A bound
    # from the bytes, two per number, held twice the body for the longer numbers of real
    # data; counting costs a pass without the interpreter lock.)
    out = np.empty(_count_commas(buf) + 1, dtype=np.float32)
    status, rows, columns = _parse_rows(buf, out, _POW10)
    if status != _OK:
        return None
    return out[: rows * columns].reshape(rows, columns)


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel before the first request needs it."""
    parse_number_rows(b"[[0,1.5]]")
