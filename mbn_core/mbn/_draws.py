"""NumPy's legacy ``RandomState`` draws that MBN makes by the thousand, in numba without the
GIL: ``choice(n, k, replace=False)`` repeated (``choose_rows``), and ``random_sample`` compared
with a bound (``uniform_below``).

The upper layers' center draws (a permutation of the rows per clustering) run on a thread
of their own while the layers compute (``estimator._DrawsAhead``). NumPy's legacy shuffle
holds the GIL, which stalls the thread that launches the GPU's work; this module draws the
same numbers from the same generator state (MT19937, NumPy's legacy ``random_interval`` and
Fisher-Yates shuffle) in compiled code that releases it, and leaves the generator's state
where NumPy's calls would have left it. The tests compare it with NumPy's own calls.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# MT19937's constants (Matsumoto and Nishimura), as NumPy's ``mt19937.c``.
_N = 624
_M = 397
_MATRIX_A = np.uint64(0x9908B0DF)
_UPPER = np.uint64(0x80000000)
_LOWER = np.uint64(0x7FFFFFFF)
_TEMPER_B = np.uint64(0x9D2C5680)
_TEMPER_C = np.uint64(0xEFC60000)
# ``random_interval`` draws 32-bit words for bounds below this; beyond it, 64-bit ones.
_WORD_BOUND = 2**32


@njit(inline="always")
def _twist_one(key, i, following, ahead):
    y = (np.uint64(key[i]) & _UPPER) | (np.uint64(key[following]) & _LOWER)
    mixed = np.uint64(key[ahead]) ^ (y >> np.uint64(1))
    if y & np.uint64(1):
        mixed ^= _MATRIX_A
    key[i] = np.uint32(mixed)


@njit(nogil=True, cache=True)
def _twist(key: np.ndarray) -> None:
    # Word i from words i, i + 1 and i + M (indices mod N), in order: the three runs below
    # are the ranges where those indices wrap alike, so no index needs a division.
    for i in range(_N - _M):
        _twist_one(key, i, i + 1, i + _M)
    for i in range(_N - _M, _N - 1):
        _twist_one(key, i, i + 1, i + _M - _N)
    _twist_one(key, _N - 1, 0, _M - 1)


@njit(nogil=True, cache=True)
def _permutation_prefixes(key: np.ndarray, pos: int, n: int, out: np.ndarray) -> int:
    """Fill each row of ``out`` (times, k) with the first k entries of a legacy
    ``permutation(n)``; returns the generator's new position in ``key`` (updated in place)."""
    perm = np.empty(n, dtype=np.int64)
    for row in range(out.shape[0]):
        for i in range(n):
            perm[i] = i
        for i in range(n - 1, 0, -1):
            # random_interval(i): masked 32-bit words until one is <= i.
            mask = np.uint64(i)
            for shift in (1, 2, 4, 8, 16):
                mask |= mask >> np.uint64(shift)
            while True:
                if pos == _N:
                    _twist(key)
                    pos = 0
                y = np.uint64(key[pos])
                pos += 1
                y ^= y >> np.uint64(11)
                y ^= (y << np.uint64(7)) & _TEMPER_B
                y ^= (y << np.uint64(15)) & _TEMPER_C
                y ^= y >> np.uint64(18)
                value = y & mask
                if value <= np.uint64(i):
                    break
            j = np.int64(value)
            perm[i], perm[j] = perm[j], perm[i]
        out[row, :] = perm[: out.shape[1]]
    return pos


@njit(inline="always")
def _next_word(key, pos):
    """MT19937's next tempered 32-bit word and the new position (``mt19937_next32``)."""
    if pos == _N:
        _twist(key)
        pos = 0
    y = np.uint64(key[pos])
    y ^= y >> np.uint64(11)
    y ^= (y << np.uint64(7)) & _TEMPER_B
    y ^= (y << np.uint64(15)) & _TEMPER_C
    y ^= y >> np.uint64(18)
    return y, pos + 1


@njit(nogil=True, cache=True)
def _uniform_below(key: np.ndarray, pos: int, bound: float, out: np.ndarray) -> int:
    """out.flat[i] = (the i-th legacy ``random_sample`` double < bound); returns the new
    position. A double is NumPy's ``mt19937_next_double``: 27 and 26 bits of two words."""
    flat = out.reshape(-1)
    for i in range(flat.shape[0]):
        a, pos = _next_word(key, pos)
        b, pos = _next_word(key, pos)
        value = (np.float64(a >> np.uint64(5)) * 67108864.0 + np.float64(b >> np.uint64(6))) / (
            9007199254740992.0
        )
        flat[i] = value < bound
    return pos


def uniform_below(rng: np.random.RandomState, shape: tuple[int, ...], bound: float) -> np.ndarray:
    """``rng.random_sample(shape) < bound`` (bool), and the same state of ``rng`` after,
    without the (shape) float64 temporary. Other generators go to NumPy's own call."""
    lock = getattr(getattr(rng, "_bit_generator", None), "lock", None)
    state = rng.get_state(legacy=False)
    if lock is None or state.get("bit_generator") != "MT19937":
        return rng.random_sample(shape) < bound
    out = np.empty(shape, dtype=np.bool_)
    with lock:
        state = rng.get_state(legacy=False)
        key = np.array(state["state"]["key"], dtype=np.uint32)
        pos = _uniform_below(key, int(state["state"]["pos"]), float(bound), out)
        state["state"] = {"key": key, "pos": pos}
        rng.set_state(state)
    return out


def choose_rows(rng: np.random.RandomState, n: int, k: int, times: int) -> np.ndarray:
    """``np.stack([rng.choice(n, k, replace=False) for _ in range(times)])``: the same
    (times, k) int64 rows and the same state of ``rng`` after, drawn without the GIL.

    Generators other than MT19937, and arguments NumPy would refuse, go to NumPy's own calls.
    """
    # The generator's own lock, as NumPy's draws take it: another thread drawing from the
    # same generator (NumPy's global one, say) waits instead of being overwritten.
    lock = getattr(getattr(rng, "_bit_generator", None), "lock", None)
    state = rng.get_state(legacy=False)
    if lock is None or state.get("bit_generator") != "MT19937" or not 0 <= k <= n < _WORD_BOUND:
        return np.stack([rng.choice(n, k, replace=False) for _ in range(times)])
    with lock:
        state = rng.get_state(legacy=False)
        key = np.array(state["state"]["key"], dtype=np.uint32)
        out = np.empty((times, k), dtype=np.int64)
        pos = _permutation_prefixes(key, int(state["state"]["pos"]), int(n), out)
        state["state"] = {"key": key, "pos": pos}
        rng.set_state(state)
    return out
