"""JSON object bodies read in bounded memory: every member placed, named and sized before any
is parsed.

A body's top-level members are placed by ``service.json_members`` with the interpreter lock
released. Before anything is built from them:

- a key the request does not define is refused, with the nearest known key;
- a key given twice is refused;
- a small member (a name, a mode, the training parameters) over ``SMALL_MEMBER_BYTES`` is
  refused.

The small members are then parsed as one small JSON object (by pydantic, which words its
errors), and the large ones (rows of numbers, base64, labels) by parsers that write straight
into arrays: ``service.json_rows`` for plain number rows, and, for what that kernel leaves to
the general path, msgspec a run of elements at a time (``RUN_BYTES``). No request holds more
than its body plus the arrays its large members decode to, and those are at most twice the
body: a JSON number takes at least two bytes with its separator, a float32 four. Nothing here
holds the interpreter lock for long, so callers run it beside the event loop.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pybase64

from service.domain import InvalidInput, PayloadTooLarge, shortened
from service.json_members import (
    MAX_DEPTH,
    MAX_MEMBERS,
    NOT_OBJECT,
    TOO_DEEP,
    TOO_MANY,
    array_chunks,
    scan_members,
)
from service.json_rows import parse_number_rows

# The largest small member: a model name, a mode, the training parameters (a few hundred
# bytes; their lists are bounded in length far below this).
SMALL_MEMBER_BYTES = 64 << 10
# Elements parsed into Python objects at a time by the general path: about this many bytes
# of JSON (a few MB of objects at worst, freed before the next run).
RUN_BYTES = 256 << 10

_KEY = msgspec.json.Decoder(str)
_STRING = msgspec.json.Decoder(str)
_ROWS = msgspec.json.Decoder(list[list[float]])
_INTEGERS = msgspec.json.Decoder(list[int])
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_BEYOND_INT64 = "an integer beyond 64 bits"
_PATH = re.compile(r"\$((?:\[\d+\])*)")


@dataclass(frozen=True)
class SplitBody:
    """A JSON object body split by size.

    Attributes
    ----------
    small : bytes
        A JSON object of the small members (their raw JSON, unchecked inside).
    large : dict
        The raw JSON of each large member present (views into the body), by name.
    """

    small: bytes
    large: dict[str, memoryview]


def split_object(
    body: bytes | bytearray | memoryview,
    *,
    known: Sequence[str],
    large: Collection[str] = (),
    what: str = "the JSON body",
    small_limit: int = SMALL_MEMBER_BYTES,
) -> SplitBody:
    """``body`` (a JSON object) split into its small members and its ``large`` ones, after
    refusing unknown keys (``known`` are the defined ones), repeated keys and small members
    over ``small_limit`` bytes, all before any member is parsed. A ``null`` large member is
    left with the small ones (it means "not given"). InvalidInput naming the problem."""
    spans, reason = scan_members(body)
    if spans is None:
        raise InvalidInput(_unplaced(body, reason, what, known))
    view = memoryview(body)
    small: list[bytes] = []
    found: dict[str, memoryview] = {}
    seen: set[str] = set()
    for key_start, key_end, value_start, value_end in spans.tolist():
        try:
            key = _KEY.decode(view[key_start:key_end])
        except (msgspec.DecodeError, UnicodeDecodeError):
            raise InvalidInput(f"{what} has a key that is not a valid JSON string") from None
        if key in seen:
            raise InvalidInput(
                f"{what} has the key {shortened(key)!r} twice in one object; keys must be unique"
            )
        seen.add(key)
        if key not in known:
            raise InvalidInput(unknown_key_message(key, known, what))
        value = view[value_start:value_end]
        if key in large and bytes(value[:4]) != b"null":
            found[key] = value
            continue
        if len(value) > small_limit:
            raise InvalidInput(
                f"{what}: {key!r} is {len(value)} bytes of JSON; at most {small_limit}"
            )
        small.append(msgspec.json.encode(key) + b":" + bytes(value))
    return SplitBody(b"{" + b",".join(small) + b"}", found)


def unknown_key_message(key: str, known: Sequence[str], what: str) -> str:
    """Words for a key that ``known`` lacks, with the nearest one when there is one."""
    message = f"{what} has the unknown member {shortened(key)!r}"
    close = difflib.get_close_matches(key, list(known), n=1)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    return f"{message}; expected {', '.join(known)}"


def _unplaced(body: bytes | bytearray | memoryview, reason: int, what: str, known) -> str:
    if reason == TOO_DEEP:
        return f"{what} is nested too deeply (more than {MAX_DEPTH} levels)"
    if reason == TOO_MANY:
        return f"{what} has more than {MAX_MEMBERS} members; expected {', '.join(known)}"
    if reason == NOT_OBJECT:
        return f"{what} must be a JSON object"
    if not bytes(memoryview(body)[:64]).strip():
        return f"{what} is empty; a JSON object is expected"
    return f"{what} is not valid JSON: {_syntax_error(body)}"


def _syntax_error(body: bytes | bytearray | memoryview) -> str:
    """msgspec's words for why ``body`` is not JSON; it checks the text without building
    anything from it."""
    try:
        msgspec.json.decode(body, type=msgspec.Raw)
    except msgspec.DecodeError as error:
        return str(error)
    except RecursionError:
        return "nested too deeply"
    return "a bracket or separator out of place"


def check_small(small: bytes, what: str = "the JSON body") -> None:
    """Refuse what pydantic would silently accept in the small members: a key repeated in
    an object inside them (pydantic keeps the last) and nesting too deep to parse. Syntax
    errors are left to pydantic, which words them."""
    try:
        json.loads(small, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise InvalidInput(
            f"{what} has the key {shortened(exc.args[0])!r} twice in one object; keys must be "
            "unique"
        ) from None
    except RecursionError:
        raise InvalidInput(f"{what} is nested too deeply") from None
    except ValueError:
        return


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> None:
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)


# ---------------------------------------------------------------------- large members


def parse_rows(
    raw: memoryview, *, what: str, max_rows: int, min_rows: int = 1, per: str = "request"
) -> np.ndarray:
    """A JSON array of equal-length number rows as a float32 matrix; InvalidInput naming
    the row and column of a bad value, PayloadTooLarge past ``max_rows`` (counted before
    any row is parsed). Values beyond float32 become infinity (the caller's finiteness check
    refuses them, as for every other input form)."""
    fast = parse_number_rows(raw)
    if fast is not None and fast.shape[0] >= min_rows:
        _check_rows(fast.shape[0], max_rows, what, per)
        return fast
    chunks = array_chunks(raw, 0, len(raw), RUN_BYTES)
    if chunks is None:
        if bytes(raw[:1]) != b"[":
            raise InvalidInput(f"{what} must be an array of rows (arrays of numbers)")
        raise InvalidInput(f"{what} is not valid JSON: {_syntax_error(raw)}{_FINITE}")
    n_rows, offsets = chunks
    if n_rows < min_rows:
        raise InvalidInput(f"{what} should have at least {min_rows} item{'s' * (min_rows > 1)}")
    _check_rows(n_rows, max_rows, what, per)
    matrix: np.ndarray | None = None
    done = 0
    for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        rows = _decode_run(_ROWS, raw[start:end], what, done)
        if matrix is None:
            width = len(rows[0])
            # Each number takes two bytes at least: more rows than that is ragged for sure,
            # and is refused before the matrix is allocated.
            if width == 0 or n_rows * width > len(raw) // 2 + 1:
                _ragged_or_empty(rows, what, done, width)
            matrix = np.empty((n_rows, width), dtype=np.float32)
        if any(len(row) != matrix.shape[1] for row in rows):
            _ragged_or_empty(rows, what, done, matrix.shape[1])
        with np.errstate(over="ignore"):
            matrix[done : done + len(rows)] = rows
        done += len(rows)
    assert matrix is not None and done == n_rows
    return matrix


def _check_rows(n_rows: int, max_rows: int, what: str, per: str) -> None:
    if n_rows > max_rows:
        raise PayloadTooLarge(f"{what} has {n_rows} rows; at most {max_rows} per {per}")


_FINITE = " (numbers must be finite JSON numbers: no NaN or Infinity)"


def _ragged_or_empty(rows: list[list[float]], what: str, first: int, width: int) -> None:
    for index, row in enumerate(rows):
        if not row:
            raise InvalidInput(f"{what}.{first + index}: a row should have at least 1 item")
        if len(row) != width:
            raise InvalidInput(
                f"{what} rows have different lengths ({width} and {len(row)} at row "
                f"{first + index}): ragged rows"
            )
    raise InvalidInput(f"{what} rows have different lengths: ragged rows")


def parse_integers(raw: memoryview, *, what: str, count: int) -> np.ndarray:
    """A JSON array of ``count`` integers (int64); InvalidInput naming the bad entry."""
    chunks = array_chunks(raw, 0, len(raw), RUN_BYTES)
    if chunks is None:
        if bytes(raw[:1]) != b"[":
            raise InvalidInput(f"{what} must be an array of integers")
        raise InvalidInput(f"{what} is not valid JSON: {_syntax_error(raw)}")
    n, offsets = chunks
    if n != count:
        raise InvalidInput(f"{what} has {n} entries for {count} rows of data")
    values = np.empty(n, dtype=np.int64)
    done = 0
    for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        run = _decode_run(_INTEGERS, raw[start:end], what, done)
        beyond = next(
            (i for i, value in enumerate(run) if not _INT64_MIN <= value <= _INT64_MAX), None
        )
        if beyond is not None:
            raise InvalidInput(f"{what}.{done + beyond}: {_BEYOND_INT64}")
        values[done : done + len(run)] = run
        done += len(run)
    return values


def parse_base64(raw: memoryview, *, what: str) -> bytes:
    """The bytes of a JSON string of base64 (standard or URL-safe alphabet, padded or not);
    InvalidInput otherwise."""
    text = bytes(raw)
    if not text.startswith(b'"'):
        raise InvalidInput(f"{what} must be a base64 string")
    if b"\\" in text:  # escapes: the JSON string decoded first
        try:
            text = _STRING.decode(text).encode("ascii")
        except (msgspec.DecodeError, UnicodeError):
            raise InvalidInput(f"{what}: not a string of base64 characters") from None
    else:
        text = text[1:-1] if len(text) >= 2 and text.endswith(b'"') else b"\x00"
    urlsafe = b"-" in text or b"_" in text
    altchars = b"-_" if urlsafe else None
    text += b"=" * (-len(text) % 4)
    data = None
    if not (urlsafe and (b"+" in text or b"/" in text)):  # one alphabet, not a mix
        with contextlib.suppress(ValueError):  # binascii.Error: stays None
            data = pybase64.b64decode(text, altchars=altchars, validate=True)
    # The last symbol's unused bits must be zero (one text per byte string, as pydantic
    # decodes): checked on the last four characters.
    last = len(data) % 3 or 3 if data else 0
    if data is None or (text and pybase64.b64encode(data[-last:], altchars) != text[-4:]):
        raise InvalidInput(
            f"{what}: not valid base64 (standard or URL-safe alphabet, no line breaks)"
        )
    return data


def _decode_run(decoder: msgspec.json.Decoder, run: memoryview, what: str, first: int) -> Any:
    """One run of array elements (``array_chunks``) decoded; errors name the element by its
    index in the whole array."""
    text = bytes(run).rstrip(b" \t\r\n")
    if text.endswith(b","):
        text = text[:-1]
    try:
        return decoder.decode(b"[" + text + b"]")
    except msgspec.ValidationError as error:
        raise InvalidInput(_validation_message(str(error), what, first)) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as error:
        raise InvalidInput(f"{what} is not valid JSON: {error}{_FINITE}") from None
    except RecursionError:
        raise InvalidInput(f"{what} is nested too deeply") from None


def _validation_message(message: str, what: str, first: int) -> str:
    """msgspec's ``Expected `float`, got `str` - at `$[3][1]``` in the service's words:
    ``inputs.3.1: should be a number, got a string``."""
    text, _, where = message.partition(" - at ")
    match = _PATH.search(where)
    location = what
    if match:
        indices = [int(index) for index in re.findall(r"\d+", match.group(1))]
        if indices:
            indices[0] += first
        location = ".".join([what, *(str(index) for index in indices)])
    expected = re.search(r"Expected `(\w+)`, got `(\w+)`", text)
    if expected:
        wanted = {"float": "a number", "int": "an integer", "array": "an array"}.get(
            expected.group(1), expected.group(1)
        )
        return f"{location}: should be {wanted}, got {_KINDS.get(expected.group(2), 'a value')}"
    if "out of range" in text:
        beyond = _BEYOND_INT64 if "Integer" in text else "a number beyond the float64 range"
        return f"{location}: {beyond}"
    return f"{location}: {text}"


_KINDS = {
    "str": "a string",
    "bool": "a boolean",
    "null": "null",
    "array": "an array",
    "object": "an object",
    "float": "a number with a fraction",
    "int": "an integer",
}
