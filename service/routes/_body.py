"""Reading JSON bodies with pydantic in one pass (Rust parser straight to the model).

FastAPI's own body handling runs ``json.loads`` and then validates the Python objects, about
five times slower for a batch of 256 MNIST rows; the schema is published in OpenAPI by hand
(``json_body``).
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from fastapi import Request
from pydantic import BaseModel, ValidationError

from service.errors import InvalidInput, UnsupportedMediaType, invalid_from_validation

M = TypeVar("M", bound=BaseModel)

# Top-level members as raw JSON slices: finds and checks the syntax without building values.
_MEMBERS = msgspec.json.Decoder(dict[str, msgspec.Raw])


def is_json(content_type: str | None) -> bool:
    if not content_type:
        return True  # curl -d without -H; the body must still parse
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


async def read_json_body(request: Request) -> bytes:
    """The body of a request that must be JSON (415 for another content type, 422 empty)."""
    if not is_json(request.headers.get("content-type")):
        raise UnsupportedMediaType("send the body as application/json")
    body = await request.body()
    if not body:
        raise InvalidInput("the request body is empty; a JSON object is expected")
    return body


def parse_body(model: type[M], body: bytes, *, context: dict[str, Any] | None = None) -> M:
    try:
        return model.model_validate_json(body, context=context)
    except ValidationError as exc:
        raise invalid_from_validation(exc) from None


async def parse_json(request: Request, model: type[M]) -> M:
    return parse_body(model, await read_json_body(request))


def split_member(body: bytes, names: tuple[str, ...]) -> tuple[bytes, str, msgspec.Raw] | None:
    """A JSON object body without the first of its top-level members named in ``names``, that
    name and the member's raw JSON; None when the body is not a JSON object holding one of
    them (the caller parses it whole)."""
    try:
        members = _MEMBERS.decode(body)
    except msgspec.DecodeError:  # the general parser words the error
        return None
    name = next((name for name in names if name in members), None)
    if name is None:
        return None
    raw = members.pop(name)
    rest = (msgspec.json.encode(key) + b":" + bytes(value) for key, value in members.items())
    return b"{" + b",".join(rest) + b"}", name, raw


def json_body(model: type[BaseModel], *, extra_content: dict[str, Any] | None = None) -> dict:
    """``openapi_extra`` documenting a JSON request body of ``model`` (flat models only)."""
    schema = model.model_json_schema()
    if "$defs" in schema:  # pragma: no cover - guarded by the schema tests
        raise TypeError(f"{model.__name__} must be flat to be published inline")
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    content.update(extra_content or {})
    return {"requestBody": {"required": True, "content": content}}
