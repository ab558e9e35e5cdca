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
``MAX_DEPTH``) gives None; ``scan_members`` also says which of those it was.

``array_chunks`` cuts a JSON array (a member's value) into runs of whole elements of about a
given size, so that a parser that builds Python objects can take a large array a run at a
time, in bounded memory.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MAX_MEMBERS = 64
MAX_DEPTH = 512

# Why a body could not be placed (what ``scan_members`` returns instead of the spans).
MALFORMED = -1  # not JSON where the scan looked (a bracket, a key, a separator)
TOO_DEEP = -2  # nesting beyond MAX_DEPTH
TOO_MANY = -3  # more than MAX_MEMBERS members
NOT_OBJECT = -4  # a JSON value that is not an object
_NOT_PLACED = MALFORMED


def member_spans(body: bytes | bytearray | memoryview) -> np.ndarray | None:
    """(n_members, 4) int64 rows of (key start, key end, value start, value end), byte
    offsets with the ends exclusive and the key's quotes included, in body order; None when
    the body is not a JSON object this scan can place."""
    spans, _ = scan_members(body)
    return spans


def scan_members(body: bytes | bytearray | memoryview) -> tuple[np.ndarray | None, int]:
    """``member_spans`` and, when it is None, why: ``MALFORMED``, ``TOO_DEEP``,
    ``TOO_MANY`` or ``NOT_OBJECT`` (0 when placed)."""
    buf = np.frombuffer(body, dtype=np.uint8)
    spans = np.empty((MAX_MEMBERS, 4), dtype=np.int64)
    stack = np.empty(MAX_DEPTH, dtype=np.uint8)
    count = _scan_members(buf, spans, stack)
    if count < 0:
        return None, int(count)
    return spans[:count], 0


def array_chunks(
    body: bytes | bytearray | memoryview, start: int, end: int, target: int
) -> tuple[int, np.ndarray] | None:
    """The JSON array ``body[start:end]`` as runs of whole elements of about ``target``
    bytes each: (number of elements, offsets) where run ``i`` is
    ``body[offsets[i]:offsets[i + 1]]`` with the separating commas and spaces included at
    its ends. None when the text is not an array whose elements this scan can place."""
    buf = np.frombuffer(body, dtype=np.uint8)
    stack = np.empty(MAX_DEPTH, dtype=np.uint8)
    offsets = np.empty((end - start) // max(1, target) + 3, dtype=np.int64)
    count, n_offsets = _array_chunks(buf, start, end, target, stack, offsets)
    if count < 0:
        return None
    return int(count), offsets[:n_offsets]


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
                return TOO_DEEP
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
    if i < n and buf[i] != 123:  # '{'
        end = _value_end(buf, i, stack)
        return NOT_OBJECT if end >= 0 and _skip_space(buf, end) == n else end
    if i >= n:
        return _NOT_PLACED
    i = _skip_space(buf, i + 1)
    count = 0
    if i < n and buf[i] == 125:  # '{}'
        i = _skip_space(buf, i + 1)
        return count if i == n else _NOT_PLACED
    while True:
        if count == spans.shape[0]:
            return TOO_MANY
        if i >= n or buf[i] != 34:
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
            return value_end
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


@njit(nogil=True, cache=True)
def _array_chunks(buf, start, end, target, stack, offsets):
    """(elements, offsets written) for the array ``buf[start:end]``; (-1, 0) when it is not
    one (see ``array_chunks``)."""
    view = buf[:end]
    i = _skip_space(view, start)
    if i >= end or view[i] != 91:  # '['
        return -1, 0
    i = _skip_space(view, i + 1)
    offsets[0] = i
    written = 1
    if i < end and view[i] == 93:  # '[]'
        return (0, 1) if _skip_space(view, i + 1) == end else (-1, 0)
    count = 0
    run_start = i
    while True:
        value_end = _value_end(view, i, stack)
        if value_end < 0:
            return -1, 0
        count += 1
        i = _skip_space(view, value_end)
        if i < end and view[i] == 44:  # ','
            i = _skip_space(view, i + 1)
            if i - run_start >= target:
                if written == offsets.shape[0]:
                    return -1, 0  # cannot happen: a run is at least ``target`` bytes
                offsets[written] = i
                written += 1
                run_start = i
            continue
        if i < end and view[i] == 93:  # ']'
            if _skip_space(view, i + 1) != end:
                return -1, 0
            offsets[written] = i
            return count, written + 1
        return -1, 0
