"""Where the top-level members of a JSON object body lie, found without the interpreter lock.

``/embed`` parses its rows member with its own kernel (``service.json_rows``) and the few
other members with pydantic, so it first needs each member's place in the body. Finding them
with msgspec means scanning the whole body, rows included, while holding the interpreter
lock: 8 ms for a 1.7 MB batch, during which the event loop (health probes, refusals) cannot
run. This kernel does the same scan with the lock released.

It checks the object's own structure (keys, colons, commas, braces) and finds where each value
ends: strings by their unescaped closing quote, arrays and objects by matching brackets,
scalars by the next delimiter. It does not check what is inside a value; the parser each value
goes to does (pydantic for most members, the rows kernel or the base64 decoder for the rows),
and each of those refuses what is not valid JSON. A body it cannot place (not an object, a
bracket that does not match, more than ``MAX_MEMBERS`` members, nesting beyond
``MAX_DEPTH``) gives None, and the caller parses the body whole, which words any error.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MAX_MEMBERS = 64
MAX_DEPTH = 512

_NOT_PLACED = -1


def member_spans(body: bytes) -> np.ndarray | None:
    """(n_members, 4) int64 rows of (key start, key end, value start, value end), byte
    offsets with the ends exclusive and the key's quotes included, in body order; None when
    the body is not a JSON object this scan can place."""
    buf = np.frombuffer(body, dtype=np.uint8)
    spans = np.empty((MAX_MEMBERS, 4), dtype=np.int64)
    stack = np.empty(MAX_DEPTH, dtype=np.uint8)
    count = _scan_members(buf, spans, stack)
    if count == _NOT_PLACED:
        return None
    return spans[:count]


@njit(nogil=True, cache=True, inline="always")
def _skip_space(buf, i):
    n = buf.shape[0]
    while i < n and (buf[i] == 32 or buf[i] == 10 or buf[i] == 13 or buf[i] == 9):
        i += 1
    return i


@njit(nogil=True, cache=True, inline="always")
def _string_end(buf, i):
    """The offset past the string starting at ``buf[i] == '"'``, or -1 when it does not end
    (or holds a raw control character, which JSON forbids)."""
    n = buf.shape[0]
    i += 1
    while i < n:
        c = buf[i]
        if c == 34:  # '"'
            return i + 1
        if c == 92:  # '\\': the next byte is escaped
            i += 2
            continue
        if c < 32:
            return -1
        i += 1
    return -1


@njit(nogil=True, cache=True)
def _value_end(buf, i, stack):
    """The offset past the JSON value starting at ``buf[i]``, or -1."""
    n = buf.shape[0]
    if i >= n:
        return -1
    c = buf[i]
    if c == 34:
        return _string_end(buf, i)
    if c != 91 and c != 123:  # a scalar: up to the next delimiter
        start = i
        while i < n:
            c = buf[i]
            if c == 44 or c == 93 or c == 125 or c == 32 or c == 10 or c == 13 or c == 9:
                break
            if c == 34 or c == 91 or c == 123 or c == 58:
                return -1
            i += 1
        return i if i > start else -1
    depth = 0
    while i < n:
        c = buf[i]
        if c == 34:
            i = _string_end(buf, i)
            if i < 0:
                return -1
            continue
        if c == 91 or c == 123:  # '[' '{'
            if depth == stack.shape[0]:
                return -1
            stack[depth] = c
            depth += 1
        elif c == 93 or c == 125:  # ']' '}': must close the innermost bracket
            if depth == 0 or stack[depth - 1] != c - 2:
                return -1
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


@njit(nogil=True, cache=True)
def _scan_members(buf, spans, stack):
    n = buf.shape[0]
    i = _skip_space(buf, 0)
    if i >= n or buf[i] != 123:  # '{'
        return _NOT_PLACED
    i = _skip_space(buf, i + 1)
    count = 0
    if i < n and buf[i] == 125:  # '{}'
        i = _skip_space(buf, i + 1)
        return count if i == n else _NOT_PLACED
    while True:
        if count == spans.shape[0] or i >= n or buf[i] != 34:
            return _NOT_PLACED
        key_end = _string_end(buf, i)
        if key_end < 0:
            return _NOT_PLACED
        spans[count, 0] = i
        spans[count, 1] = key_end
        i = _skip_space(buf, key_end)
        if i >= n or buf[i] != 58:  # ':'
            return _NOT_PLACED
        i = _skip_space(buf, i + 1)
        value_end = _value_end(buf, i, stack)
        if value_end < 0:
            return _NOT_PLACED
        spans[count, 2] = i
        spans[count, 3] = value_end
        count += 1
        i = _skip_space(buf, value_end)
        if i < n and buf[i] == 44:  # ','
            i = _skip_space(buf, i + 1)
            continue
        if i < n and buf[i] == 125:  # '}'
            i = _skip_space(buf, i + 1)
            return count if i == n else _NOT_PLACED
        return _NOT_PLACED
