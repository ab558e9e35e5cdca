"""Reading JSON bodies: placed and checked by ``service.json_object``, small members validated
by pydantic (its Rust parser straight to the model), large ones by their own parsers.

FastAPI's own body handling runs ``json.loads`` over the whole body and then validates the
Python objects: several times slower, and a body of small arrays grows to many times its size
before an unknown member is refused. The schema is published in OpenAPI by hand
(``json_body``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from service.errors import (
    InvalidInput,
    PayloadTooLarge,
    UnsupportedMediaType,
    invalid_from_validation,
)
from service.json_object import SMALL_MEMBER_BYTES, check_small, split_object
from service.schemas import LARGE_GIVEN

M = TypeVar("M", bound=BaseModel)


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


def parse_object(
    model: type[M],
    body: bytes | bytearray | memoryview,
    *,
    large: Collection[str] = (),
    known: Sequence[str] | None = None,
    context: dict[str, Any] | None = None,
    what: str = "the JSON body",
) -> tuple[M, dict[str, memoryview]]:
    """``body`` as ``model``: its small members validated by pydantic, and the raw JSON of
    its ``large`` members (those given) for their own parsers. Keys outside ``known`` (the
    model's fields by default) and repeated keys and oversized small members are refused
    before anything is parsed (``service.json_object``)."""
    known = tuple(model.model_fields) if known is None else tuple(known)
    split = split_object(body, known=known, large=large, what=what)
    check_small(split.small, what)
    context = {**(context or {}), LARGE_GIVEN: frozenset(split.large)}
    try:
        return model.model_validate_json(split.small, context=context), split.large
    except ValidationError as exc:
        raise invalid_from_validation(exc) from None


def parse_json_text(text: str, what: str) -> Any:
    """A small JSON text of a form field (``params``), refused over ``SMALL_MEMBER_BYTES``
    and with the checks of a body's small members."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > SMALL_MEMBER_BYTES:
        raise InvalidInput(f"{what} is {len(data)} bytes of JSON; at most {SMALL_MEMBER_BYTES}")
    check_small(data, what)
    try:
        return json.loads(data)
    except ValueError as exc:  # JSONDecodeError, or an integer of > 4,300 digits
        raise InvalidInput(f"{what} is not valid JSON: {str(exc)[:200]}") from None


def json_body(model: type[BaseModel], *, extra_content: dict[str, Any] | None = None) -> dict:
    """``openapi_extra`` documenting a JSON request body of ``model`` (flat models only)."""
    schema = model.model_json_schema()
    if "$defs" in schema:  # pragma: no cover - guarded by the schema tests
        raise TypeError(f"{model.__name__} must be flat to be published inline")
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    content.update(extra_content or {})
    return {"requestBody": {"required": True, "content": content}}
