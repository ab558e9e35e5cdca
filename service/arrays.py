"""Turning request payloads into checked float32 matrices, and embeddings back into payloads.

Every check names what is wrong in words a client can act on; the messages become 422/413
answers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pybase64

from service.domain import InvalidInput, PayloadTooLarge


def rows_to_matrix(
    rows: Sequence[Sequence[float]], *, expected_dim: int | None, max_rows: int, what: str
) -> np.ndarray:
    """JSON rows -> (n, d) float32, refusing empty, ragged, mis-sized and non-finite input."""
    n = len(rows)
    if n == 0:
        raise InvalidInput(f"{what} is empty: send at least one row")
    _check_row_count(n, max_rows, what)
    dim = len(rows[0])
    if any(len(row) != dim for row in rows):
        lengths = sorted({len(row) for row in rows})
        raise InvalidInput(f"{what} rows have different lengths {lengths[:5]}: ragged rows")
    if dim == 0:
        raise InvalidInput(f"{what} rows are empty")
    _check_dim(dim, expected_dim, what)
    with np.errstate(over="ignore"):
        matrix = np.array(rows, dtype=np.float32)
    _check_finite(matrix, what)
    return matrix


def check_parsed_rows(
    matrix: np.ndarray, *, expected_dim: int | None, max_rows: int, what: str
) -> np.ndarray:
    """The checks of ``rows_to_matrix`` for rows already parsed into a non-empty float32
    matrix (``service.json_rows``)."""
    _check_row_count(matrix.shape[0], max_rows, what)
    _check_dim(matrix.shape[1], expected_dim, what)
    _check_finite(matrix, what)
    return matrix


def bytes_to_matrix(
    raw: bytes, *, dim: int, expected_dim: int | None, max_rows: int, what: str
) -> np.ndarray:
    """Little-endian float32 bytes, row-major -> (n, dim) float32."""
    row_bytes = 4 * dim
    if len(raw) == 0:
        raise InvalidInput(f"{what} is empty: send at least one row")
    if len(raw) % row_bytes:
        raise InvalidInput(
            f"{what} holds {len(raw)} bytes, not a whole number of rows of {dim} float32 "
            f"({row_bytes} bytes)"
        )
    n = len(raw) // row_bytes
    _check_row_count(n, max_rows, what)
    _check_dim(dim, expected_dim, what)
    matrix = np.frombuffer(raw, dtype="<f4").reshape(n, dim)
    _check_finite(matrix, what)
    return matrix.astype(np.float32, copy=False)


def matrix_to_b64(matrix: np.ndarray) -> str:
    return pybase64.b64encode(np.ascontiguousarray(matrix, dtype="<f4").tobytes()).decode("ascii")


def _check_row_count(n: int, max_rows: int, what: str) -> None:
    if n > max_rows:
        raise PayloadTooLarge(f"{what} has {n} rows; at most {max_rows} per request")


def _check_dim(dim: int, expected_dim: int | None, what: str) -> None:
    if expected_dim is not None and dim != expected_dim:
        raise InvalidInput(
            f"{what} rows have {dim} values but the model expects {expected_dim}: wrong dimension"
        )


def _check_finite(matrix: np.ndarray, what: str) -> None:
    if not np.isfinite(matrix).all():
        raise InvalidInput(f"{what} contains NaN, infinity or a value beyond the float32 range")
