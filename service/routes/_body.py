"""Reading JSON bodies with pydantic in one pass (Rust parser straight to the model).

FastAPI's own body handling runs ``json.loads`` and then validates the Python objects, about
five times slower for a batch of 256 MNIST rows; the schema is published in OpenAPI by hand
(``json_body``).
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import msgspec
import numpy as np
from fastapi import Request
from pydantic import BaseModel, ValidationError

from service.errors import (
    InvalidInput,
    PayloadTooLarge,
    UnsupportedMediaType,
    invalid_from_validation,
    shortened,
)
from service.json_members import member_spans

M = TypeVar("M", bound=BaseModel)

_KEY = msgspec.json.Decoder(str)
_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])


def is_json(content_type: str | None) -> bool:
    """Whether a body of this Content-Type is read as JSON: JSON media types in UTF-8 (the
    only encoding JSON has, RFC 8259), and no type at all (curl -d without -H)."""
    if not content_type:
        return True  # the body must still parse
    media, _, parameters = content_type.partition(";")
    media = media.strip().lower()
    if not (media == "application/json" or media.endswith("+json")):
        return False
    charsets = [
        value.strip().strip('"').lower()
        for name, _, value in (parameter.partition("=") for parameter in parameters.split(";"))
        if name.strip().lower() == "charset"
    ]
    return all(charset in ("utf-8", "utf8", "us-ascii", "ascii") for charset in charsets)


async def read_json_body(request: Request, *, limit: int | None = None) -> bytes:
    """The body of a request that must be JSON (415 for another content type, 422 empty,
    413 over ``limit`` bytes when given: tighter than the middleware's limit of the path)."""
    if not is_json(request.headers.get("content-type")):
        raise UnsupportedMediaType("send the body as application/json in UTF-8")
    if limit is None:
        body = await request.body()
    else:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(
                    f"JSON body over {limit} bytes; send large training sets as a file "
                    "(multipart/form-data)"
                )
            chunks.append(chunk)
        body = b"".join(chunks)
    if not body:
        raise InvalidInput("the request body is empty; a JSON object is expected")
    return body


def parse_body(
    model: type[M],
    body: bytes,
    *,
    context: dict[str, Any] | None = None,
    checked: bool = False,
) -> M:
    """``body`` validated as ``model``, after ``check_structure`` unless already ``checked``."""
    if not checked:
        check_structure(body)
    try:
        return model.model_validate_json(body, context=context)
    except ValidationError as exc:
        raise invalid_from_validation(exc) from None


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> None:
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)
    # None: the values are not needed, only the check (keeps the parse small).


def check_structure(
    body: bytes, skip: memoryview | None = None, what: str = "the JSON body"
) -> None:
    """Refuse what the fast parsers would silently accept: duplicate keys (where pydantic
    and msgspec keep the last one) and nesting too deep to parse (``RecursionError``).

    ``skip`` is a member of ``body`` (a view into it, as ``split_member`` returns) that a
    fast path already parsed as plain number rows or a base64 string, so it holds no
    objects; it is replaced by ``0`` before the check, which keeps the check small for
    large batches. Syntax errors are left to pydantic, which words them. ``what`` names the
    text in the messages (a form field's JSON, for one).
    """
    skeleton: bytes | str = body
    if skip is not None:
        start = _offset_in(body, skip)
        if start is not None:
            skeleton = b"".join((body[:start], b"0", body[start + len(skip) :]))
    try:
        json.loads(skeleton, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as exc:
        raise InvalidInput(
            f"{what} has the key {shortened(exc.args[0])!r} twice in one object; keys must be "
            "unique"
        ) from None
    except RecursionError:
        raise InvalidInput(f"{what} is nested too deeply") from None
    except ValueError:  # not JSON, or not UTF-8: pydantic's message names the place
        return


def _offset_in(body: bytes, member: memoryview) -> int | None:
    """Where ``member`` starts inside ``body``, when it is a view into it."""
    view = memoryview(member)
    if len(view) == 0 or len(body) == 0:
        return None
    start = int(
        np.frombuffer(view, np.uint8).ctypes.data - np.frombuffer(body, np.uint8).ctypes.data
    )
    if 0 <= start <= len(body) - len(view):
        return start
    return None


async def parse_json(request: Request, model: type[M], *, limit: int | None = None) -> M:
    return parse_body(model, await read_json_body(request, limit=limit))


def split_member(body: bytes, names: tuple[str, ...]) -> tuple[bytes, str, memoryview] | None:
    """A JSON object body without the first of its top-level members named in ``names``, that
    name and the member's raw JSON (a view into ``body``); None when the body is not a JSON
    object holding one of them (the caller parses it whole).

    The members are placed by ``service.json_members`` with the interpreter lock released;
    the keys are decoded here (a later duplicate wins, as in a dict) and ``rest``, a few
    small members, is checked to be JSON. The member returned is checked by its own parser.
    """
    spans = member_spans(body)
    if spans is None:
        return None
    members: dict[str, tuple[int, int]] = {}
    for key_start, key_end, value_start, value_end in spans.tolist():
        try:
            key = _KEY.decode(body[key_start:key_end])
        except (msgspec.DecodeError, UnicodeDecodeError):
            return None
        members[key] = (value_start, value_end)
    name = next((name for name in names if name in members), None)
    if name is None:
        return None
    start, end = members.pop(name)
    rest = (
        b"{"
        + b",".join(msgspec.json.encode(k) + b":" + body[a:b] for k, (a, b) in members.items())
        + b"}"
    )
    try:
        _OBJECT.decode(rest)  # small: the values the scan did not check, checked here
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None  # not JSON: parsed whole, so the message points into the body sent
    return rest, name, memoryview(body)[start:end]


def json_body(model: type[BaseModel], *, extra_content: dict[str, Any] | None = None) -> dict:
    """``openapi_extra`` documenting a JSON request body of ``model`` (flat models only)."""
    schema = model.model_json_schema()
    if "$defs" in schema:  # pragma: no cover - guarded by the schema tests
        raise TypeError(f"{model.__name__} must be flat to be published inline")
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    content.update(extra_content or {})
    return {"requestBody": {"required": True, "content": content}}
