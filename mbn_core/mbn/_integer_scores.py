"""Exact bottom-layer codes in integer arithmetic, for small-integer data (images).

When every input value and every center value is a whole number and they all lie within 256
consecutive integers, a clustering's nearest center needs no floating point at all:

- distances do not change when rows and centers are shifted by the same amount, so the rows
  are stored as ``x - low`` in uint8 and the centers as ``w - low - 128`` in int8;
- ``|x - w|^2 = |x|^2 - 2 x.w + |w|^2``, and every term that depends on the row alone drops
  out of the arg-min, so the nearest center maximises ``2 x'.b - |w'|^2`` with ``x' = x - low``,
  ``b = w' - 128`` and ``w' = w - low`` (a row constant ``128 * sum(x')`` dropped as well);
- ``x'.b`` is a u8 x s8 integer GEMM (ONNX Runtime's ``MatMulInteger``, VNNI on x86), exact in
  int32 while ``d * 255 * 128 < 2**31``; the rest is int64 in ``integer_best``, or, for
  cosine, float64 in ``cosine_best``.

The float path ranks in float32 and re-ranks near ties in float64, which for whole numbers is
exact: it returns the exact nearest center, lowest index on ties. These scores are exact, so
the arg-max with the lowest index gives the same codes with no re-rank. Cosine similarity is
rebuilt exactly as the float path's re-rank computes it (an exact integer dot product divided
by the float64 square root of an exact integer norm), so it matches too.

Data that does not qualify (fractions, a wider range, sparse input) is left to the float path:
``integer_rows`` returns None, and so does everything else here when the integer kernel would
not be exact on this machine (``kernel_is_exact``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
from numba import njit

# Values must fit in 256 consecutive integers: uint8 rows, int8 centers.
LEVELS = 256
_B_OFFSET = 128
# x'.b summed in int32 by the GEMM: |x'.b| <= d * 255 * 128 must stay below 2**31.
MAX_CHOSEN_DIMENSIONS = (2**31 - 1) // ((LEVELS - 1) * _B_OFFSET)
# Euclidean scores 2 x'.b - |w'|^2 stay in int32 (the fast arg-max) up to this many.
MAX_INT32_SCORE_DIMENSIONS = (2**31 - 1) // (2 * (LEVELS - 1) * _B_OFFSET + (LEVELS - 1) ** 2)
# Rows per GEMM call: the (rows, k) int32 products stay in a core's cache for the arg-max
# that reads them; at least one of the AMX kernel's 64-row strides.
_BLOCK_BYTES = 1 << 20
_MIN_BLOCK_ROWS = 64
# Batches of at least this many rows score against centers packed once (``BlockGemm``).
PACKED_ROWS = 1024
# Models of a constant b, by shape, that packed sessions load (with b supplied separately).
_TEMPLATES_KEPT = 4


@dataclass(frozen=True)
class IntegerRows:
    """Dense rows stored as ``values - low`` in uint8, the bottom layer's integer input.

    Attributes
    ----------
    shifted : ndarray of shape (n, d), uint8
        The rows minus ``low``.
    low : int
        The common shift; rows and the centers they are scored against all lie in
        [low, low + 255].
    """

    shifted: np.ndarray
    low: int

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.shifted.shape[0]), int(self.shifted.shape[1]))


# Integer dtypes whose every value is exact in float32.
_EXACT_IN_FLOAT32 = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16))


def integral_range(values: np.ndarray) -> tuple[int, int] | None:
    """(min, max) of ``values`` seen as float32 when all are whole numbers, else None.

    float32 is what the float path computes with, so a float64 value that rounds to a whole
    float32 number counts as that number there and here alike.
    """
    if values.size == 0:
        return None
    if values.dtype in _EXACT_IN_FLOAT32:  # every value a whole number as it is
        return int(values.min()), int(values.max())
    low = high = None
    for start in range(0, values.shape[0], 4096):
        block = np.asarray(values[start : start + 4096], dtype=np.float32)
        if not np.array_equal(block, np.rint(block)):  # NaN and inf fail here too
            return None
        block_low, block_high = float(block.min()), float(block.max())
        low = block_low if low is None else min(low, block_low)
        high = block_high if high is None else max(high, block_high)
    assert low is not None and high is not None
    return int(low), int(high)


def integer_rows(X: np.ndarray, center_data: np.ndarray) -> IntegerRows | None:
    """``X`` as ``IntegerRows`` for scoring against ``center_data``, or None when the rows
    and centers together are not whole numbers within 256 consecutive integers (or the
    integer kernel is not exact on this machine).

    ``X`` is the validated dense input (n, d); ``center_data`` the bottom layer's stored
    center rows (n_center_rows, d), whose values every center takes.
    """
    if not kernel_is_exact():
        return None
    rows_range = integral_range(X)
    centers_range = integral_range(center_data)
    if rows_range is None or centers_range is None:
        return None
    low = min(rows_range[0], centers_range[0])
    high = max(rows_range[1], centers_range[1])
    if high - low >= LEVELS:
        return None
    shifted = np.empty(X.shape, dtype=np.uint8)
    for start in range(0, X.shape[0], 4096):
        block = np.asarray(X[start : start + 4096], dtype=np.float32)
        shifted[start : start + 4096] = block - np.float32(low)
    return IntegerRows(shifted=shifted, low=low)


@dataclass(frozen=True)
class IntegerCenters:
    """One clustering's centers as the integer kernel scores them.

    Attributes
    ----------
    b : ndarray of shape (d_chosen, k), int8
        ``w - low - 128`` on the chosen dimensions, the GEMM's right operand.
    center_term : ndarray of shape (k,), int64
        ``|w - low|^2`` (euclidean) or ``|w|^2`` (cosine).
    b_sums : ndarray of shape (k,), int64
        Column sums of ``b`` (cosine; zeros for euclidean).
    metric : {"euclidean", "cosine"}
    """

    b: np.ndarray
    center_term: np.ndarray
    b_sums: np.ndarray
    metric: str


def integer_centers(
    data: np.ndarray,
    rows: np.ndarray,
    features: np.ndarray,
    low: int,
    metric: str,
    from_previous: np.ndarray | None = None,
) -> IntegerCenters:
    """The centers ``data[rows]`` on ``features``, as ``IntegerCenters`` for rows shifted by
    ``low``, built in one pass over the values they read.

    ``from_previous`` (bool, one per chosen feature) marks dimensions where center i takes
    center i - 1's value (cyclically): the bottom layer's random reconstruction. Values must
    be whole numbers in [low, low + 255] (what ``integer_rows`` checked).
    """
    n_chosen = len(features)
    if n_chosen > MAX_CHOSEN_DIMENSIONS:
        raise ValueError(
            f"{n_chosen} chosen dimensions exceed the integer kernel's exact range "
            f"({MAX_CHOSEN_DIMENSIONS}); integer_rows' caller must take the float path"
        )
    if from_previous is None:
        from_previous = np.zeros(n_chosen, dtype=np.bool_)
    k = len(rows)
    b = np.empty((n_chosen, k), dtype=np.int8)
    center_term = np.zeros(k, dtype=np.int64)
    b_sums = np.zeros(k, dtype=np.int64)
    cosine = metric == "cosine"
    _fill_integer_centers(
        data, np.asarray(rows), np.asarray(features), from_previous, np.int64(low), cosine,
        b, center_term, b_sums,
    )  # fmt: skip
    return IntegerCenters(b=b, center_term=center_term, b_sums=b_sums, metric=metric)


@njit(nogil=True, cache=True)
def _fill_integer_centers(data, rows, features, from_previous, low, cosine, b, term, b_sums):
    # Center by center (faster here than feature by feature, though b is written across).
    k = rows.shape[0]
    for i in range(k):
        row = rows[i]
        previous = rows[(i - 1) % k]
        total = np.int64(0)
        column_sum = np.int64(0)
        for j in range(features.shape[0]):
            source = previous if from_previous[j] else row
            shifted = np.int64(data[source, features[j]]) - low  # in [0, 255]
            b[j, i] = np.int8(shifted - _B_OFFSET)
            original = shifted + low if cosine else shifted
            total += original * original
            column_sum += shifted - _B_OFFSET
        term[i] = total
        if cosine:
            b_sums[i] = column_sum


def integer_codes(rows: IntegerRows, features: np.ndarray, centers: IntegerCenters) -> np.ndarray:
    """Nearest center of every row for one bottom clustering, exactly, in integers.

    Parameters
    ----------
    rows : IntegerRows
    features : ndarray of shape (d_chosen,)
        The clustering's chosen input dimensions.
    centers : IntegerCenters
        The clustering's centers on them (``integer_centers``, with ``rows.low``).

    Returns
    -------
    codes : ndarray of shape (n,), int32
        The float path's codes: the nearest center, lowest index on exact ties.
    """
    n_rows = rows.shape[0]
    b = centers.b
    n_chosen, n_centers = b.shape
    cosine = centers.metric == "cosine"
    fast = not cosine and n_chosen <= MAX_INT32_SCORE_DIMENSIONS
    center_term = centers.center_term.astype(np.int32) if fast else centers.center_term
    codes = np.empty(n_rows, dtype=np.int32)
    if cosine:
        norms, inverse_norms, center_offsets = cosine_center_terms(centers, rows.low)
    block = max(1, min(n_rows, max(_MIN_BLOCK_ROWS, _BLOCK_BYTES // (4 * max(n_centers, 1)))))
    gemm = BlockGemm(b, block, packed=n_rows >= PACKED_ROWS)
    for start in range(0, n_rows, block):
        stop = min(start + block, n_rows)
        part = gemm.rows(stop - start)
        gather_columns(rows.shifted, start, features, part)
        dots = gemm.run(stop - start)
        if fast:
            euclidean_best(dots, center_term, codes[start:stop])
            continue
        row_sums = part.sum(axis=1, dtype=np.int64)
        if cosine:
            # x.w = x'.b + (128 + low) (sum(x') + d low) + low sum(b): the row's part.
            row_terms = (_B_OFFSET + rows.low) * (row_sums + n_chosen * rows.low)
            cosine_best(dots, norms, inverse_norms, center_offsets, row_terms, codes[start:stop])
            continue
        integer_best(dots, center_term, codes[start:stop])
    return codes


class BlockGemm:
    """``a @ b`` for blocks of up to ``block`` rows, in buffers bound to a session once.

    ``session.run`` allocates each product and copies it into a new numpy array; binding the
    operands and the output to fixed buffers (``IOBinding``) avoids both, and keeps a block's
    products in cache for the arg-max that reads them next.

    ``packed``: ``b`` becomes a constant of a session of its own, which ONNX Runtime packs
    for its kernel once, where the shared session packs it again on every call. Building that
    session costs about as much as packing for several hundred rows, so it pays for large
    batches (a fit's) and not for small ones (a request's).
    """

    def __init__(self, b: np.ndarray, block: int, packed: bool) -> None:
        import onnxruntime as ort

        self._b = ort.OrtValue.ortvalue_from_numpy(b)
        # The session reads b's buffer (the OrtValue keeps it alive) for as long as it lives.
        self._session = _packed_session(b.shape, self._b) if packed else _session()
        self._packed = packed
        self._a = np.empty((block, b.shape[0]), dtype=np.uint8)
        self._out = np.empty((block, b.shape[1]), dtype=np.int32)
        self._bound_rows = 0  # the rows the binding is for (0: none yet)
        self._binding = None

    def rows(self, n_rows: int) -> np.ndarray:
        """The left operand's first ``n_rows`` rows, to fill before ``run``."""
        return self._a[:n_rows]

    def run(self, n_rows: int) -> np.ndarray:
        """The (n_rows, k) int32 products of the rows filled through ``rows``."""
        if n_rows != self._bound_rows:  # the full blocks, then a shorter last one
            import onnxruntime as ort

            binding = self._session.io_binding()
            a = self._a[:n_rows]
            out = self._out[:n_rows]
            binding.bind_ortvalue_input("A", ort.OrtValue.ortvalue_from_numpy(a))
            if not self._packed:
                binding.bind_ortvalue_input("B", self._b)
            binding.bind_output("Y", "cpu", 0, np.int32, out.shape, out.ctypes.data)
            self._binding = binding
            self._bound_rows = n_rows
        self._session.run_with_iobinding(self._binding)
        return self._out[:n_rows]


@njit(nogil=True, cache=True)
def gather_columns(values, start, columns, out):
    """out[i, c] = values[start + i, columns[c]] (a block of rows on the chosen columns)."""
    for i in range(out.shape[0]):
        for c in range(columns.shape[0]):
            out[i, c] = values[start + i, columns[c]]


@njit(nogil=True, cache=True)
def euclidean_best(dots, center_term, best):
    """First arg-max of ``2 * dots - center_term`` per row, in int32 (the caller checked
    that it cannot overflow): one vectorised pass for the scores and their maximum, one for
    the maximum's first index."""
    n_rows, k = dots.shape
    scores = np.empty(k, np.int32)
    for i in range(n_rows):
        row = dots[i]
        top = np.int32(-(2**31))
        for j in range(k):
            # numba widens int32 arithmetic to int64; the cast keeps the loop in int32
            # lanes (twice as many per vector), and the caller's bound makes it exact.
            score = np.int32(row[j] + row[j] - center_term[j])
            scores[j] = score
            top = score if score > top else top
        first = np.int32(k)
        for j in range(k):
            first = min(first, np.int32(j) if scores[j] == top else np.int32(k))
        best[i] = first


@njit(nogil=True, cache=True)
def integer_best(dots, center_term, best):
    """Each row's best Euclidean center (the first arg-max of ``2 * dots - center_term``,
    ``center_term`` = |w'|^2) from the exact integer products ``dots`` (= x'.b), in int64:
    for more dimensions than ``euclidean_best``'s int32 scores hold."""
    n_rows, k = dots.shape
    for i in range(n_rows):
        top = np.int64(-(2**62))
        top_at = 0
        for j in range(k):
            score = 2 * np.int64(dots[i, j]) - center_term[j]
            if score > top:
                top = score
                top_at = j
        best[i] = top_at


def cosine_center_terms(
    centers: IntegerCenters, low: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(norms, inverse norms, per-center offsets) for ``cosine_best``: |w| as the float path
    computes it (a zero center's is 0, and so is its inverse), and ``low * sum(b)``, the
    center's part of x.w rebuilt from x'.b."""
    norms = np.sqrt(centers.center_term.astype(np.float64))
    inverse = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    return norms, inverse, np.int64(low) * centers.b_sums


# Centers fall in this many stripes (center j in group j % n_groups) for a row's best score
# (``cosine_best``, and ``_coarse_kernels``' coarse distances): elementwise extrema of
# contiguous stripes vectorise, where a running extremum does not, and a group is read again
# only when its extremum can hold the row's answer.
STRIPES = 16
# ``cosine_best`` scores exactly every center whose product estimate lies within this share
# of the best estimate: an estimate and the exact score differ by at most three units of
# float64's roundoff of the score, so the best score and its ties always fall within it.
COSINE_SLACK = 1e-12


@njit(nogil=True, cache=True)
def cosine_best(dots, norms, inverse_norms, center_offsets, row_terms, best):
    """Each row's best cosine center (the first arg-max of ``x.w / |w|``, a zero center
    scoring 0) from the exact integer products ``dots`` (= x'.b), with ``x.w`` rebuilt
    exactly as ``dots + row_terms[i] + center_offsets[j]``.

    The scores are estimated by a product with each center's inverse norm, which vectorises;
    only the centers whose estimate is within ``COSINE_SLACK`` of the best are scored as the
    float path scores them (a float64 division), and the best of those, lowest index on
    ties, is the row's center.
    """
    n_rows, k = dots.shape
    n_groups = (k + STRIPES - 1) // STRIPES
    estimates = np.full(n_groups * STRIPES, -np.inf)
    group_top = np.empty(n_groups)
    for i in range(n_rows):
        row_term = row_terms[i]
        for j in range(k):
            dot = np.int64(dots[i, j]) + row_term + center_offsets[j]
            estimates[j] = np.float64(dot) * inverse_norms[j]
        group_top[:] = estimates[:n_groups]
        for stripe in range(1, STRIPES):
            base = stripe * n_groups
            for g in range(n_groups):
                value = estimates[base + g]
                group_top[g] = value if value > group_top[g] else group_top[g]
        top = group_top[0]
        for g in range(1, n_groups):
            top = group_top[g] if group_top[g] > top else top
        floor = top - COSINE_SLACK * abs(top)
        best_score = -np.inf
        best_at = k
        for g in range(n_groups):
            if group_top[g] < floor:
                continue
            for j in range(g, k, n_groups):
                if estimates[j] >= floor:
                    dot = np.int64(dots[i, j]) + row_term + center_offsets[j]
                    score = np.float64(dot) / norms[j] if norms[j] > 0 else 0.0
                    if score > best_score or (score == best_score and j < best_at):
                        best_score = score
                        best_at = j
        best[i] = best_at


_lock = threading.RLock()
_state: dict[str, object] = {}


def kernel_is_exact() -> bool:
    """Whether ONNX Runtime's u8 x s8 ``MatMulInteger`` sums exactly on this machine.

    x86 CPUs without VNNI multiply u8 x s8 pairs with a saturating 16-bit instruction
    (``vpmaddubsw``), which clips large products; a probe of the extreme values (255 x -128
    pairs) and of random ones finds out once per process.
    """
    with _lock:
        if "exact" not in _state:
            _state["exact"] = _probe()
        return bool(_state["exact"])


def _probe() -> bool:
    try:
        session = _session()
    except Exception:  # no usable onnxruntime: the float path serves
        return False
    rng = np.random.default_rng(0)
    cases = [
        (np.full((8, 64), 255, np.uint8), np.full((64, 16), -128, np.int8)),
        (np.full((8, 64), 255, np.uint8), np.full((64, 16), 127, np.int8)),
        (
            rng.integers(0, 256, (64, 300), dtype=np.uint8),
            rng.integers(-128, 128, (300, 40), dtype=np.int8),
        ),
    ]
    for a, b in cases:
        got = session.run(None, {"A": a, "B": b})[0]
        if not np.array_equal(got, a.astype(np.int64) @ b.astype(np.int64)):
            return False
    return True


def _session():
    """One ONNX Runtime session holding a single MatMulInteger, shared by all threads
    (``run`` is thread-safe); one intra-op thread, since clusterings run in parallel."""
    with _lock:
        return _session_locked()


def _session_locked():
    session = _state.get("session")
    if session is None:
        import onnxruntime as ort

        session = ort.InferenceSession(
            _matmul_integer_model(), _one_thread_options(), providers=["CPUExecutionProvider"]
        )
        _state["session"] = session
    return session


def _packed_session(shape: tuple[int, int], b):
    """A session computing ``A @ b`` with b (an ``OrtValue`` of ``shape``, int8) a constant.

    Loads a cached model whose constant has b's shape, and substitutes b's buffer for it
    (``add_initializer``), so no per-call serialisation of b; one intra-op thread.
    """
    import onnxruntime as ort

    with _lock:
        templates = _state.setdefault("templates", {})
        assert isinstance(templates, dict)
        model = templates.get(shape)
        if model is None:
            model = _matmul_integer_model(shape)
            if len(templates) >= _TEMPLATES_KEPT:
                templates.pop(next(iter(templates)))
            templates[shape] = model
    options = _one_thread_options()
    # One node, nothing to optimise: the graph passes would only slow the build.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_initializer("B", b)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _one_thread_options():
    """Session options for one intra-op thread: the clusterings run in parallel instead."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return options


def _matmul_integer_model(constant_b: tuple[int, int] | None = None) -> bytes:
    """A model of one ``MatMulInteger``, A (uint8) @ B (int8) -> Y (int32): B an input, or,
    given ``constant_b`` (its shape), a constant of zeros for ``add_initializer`` to replace."""
    from onnx import TensorProto, helper, numpy_helper

    d, k = constant_b if constant_b is not None else (None, None)
    a = helper.make_tensor_value_info("A", TensorProto.UINT8, [None, d])
    y = helper.make_tensor_value_info("Y", TensorProto.INT32, [None, k])
    node = helper.make_node("MatMulInteger", ["A", "B"], ["Y"])
    if constant_b is None:
        b = helper.make_tensor_value_info("B", TensorProto.INT8, [None, None])
        graph = helper.make_graph([node], "mm", [a, b], [y])
    else:
        placeholder = numpy_helper.from_array(np.zeros(constant_b, dtype=np.int8), "B")
        graph = helper.make_graph([node], "mm", [a], [y], initializer=[placeholder])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return bytes(model.SerializeToString())
