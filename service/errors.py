"""One error hierarchy, mapped to HTTP in one place: here.

Code anywhere in the service raises a domain error (``service.domain``, re-exported here);
``STATUS`` gives each its HTTP status and error type, and ``install_error_handlers`` turns it
(and FastAPI's, Starlette's and pydantic's own errors) into the one JSON shape
``{"error": {"type": ..., "message": ...}}``. Anything else is a bug: logged with its
traceback and answered with a 500 that reveals nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from service.domain import (
    ClientGone,
    Conflict,
    ExpectationFailed,
    InsufficientStorage,
    InvalidInput,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
    ServiceError,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    shortened,
)
from service.metrics import CLIENT_CLOSED_REQUEST

__all__ = [
    "ClientGone",
    "Conflict",
    "ExpectationFailed",
    "InsufficientStorage",
    "InvalidInput",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "RequestTimeout",
    "ServiceError",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "install_error_handlers",
    "shortened",
    "status_of",
]

log = logging.getLogger(__name__)


# The one table of statuses: domain error -> (HTTP status, error type).
STATUS: dict[type[ServiceError], tuple[int, str]] = {
    InvalidInput: (422, "invalid_input"),
    Unauthorized: (401, "unauthorized"),
    NotFound: (404, "not_found"),
    Conflict: (409, "conflict"),
    RequestTimeout: (408, "request_timeout"),
    PayloadTooLarge: (413, "payload_too_large"),
    UnsupportedMediaType: (415, "unsupported_media_type"),
    ExpectationFailed: (417, "expectation_failed"),
    Overloaded: (429, "overloaded"),
    InsufficientStorage: (507, "insufficient_storage"),
    Unavailable: (503, "unavailable"),
    # Nginx's "client closed request": nobody reads it, the metrics tell it from failures.
    ClientGone: (CLIENT_CLOSED_REQUEST, "client_closed_request"),
}


def status_of(error: ServiceError) -> tuple[int, str]:
    """HTTP status and error type of a domain error (its nearest mapped class)."""
    for kind in type(error).__mro__:
        if kind in STATUS:
            return STATUS[kind]
    return 500, "internal_error"


# Starlette raises HTTPException for routing and protocol errors (unknown path, wrong method...).
_HTTP_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    417: "expectation_failed",
    422: "invalid_input",
    429: "overloaded",
    431: "headers_too_large",
    503: "unavailable",
    507: "insufficient_storage",
}


def error_body(error_type: str, message: str) -> dict[str, Any]:
    """The one JSON shape of every error answer."""
    return {"error": {"type": error_type, "message": message}}


def error_response(error: ServiceError) -> JSONResponse:
    status, error_type = status_of(error)
    headers = dict(error.headers)
    if error.retry_after is not None:
        headers["Retry-After"] = str(error.retry_after)
    message = error.message
    if len(message) > _MAX_MESSAGE_CHARS:  # a backstop: echoed input is shortened at its source
        message = f"{message[:_MAX_MESSAGE_CHARS]}... (truncated)"
    return JSONResponse(error_body(error_type, message), status_code=status, headers=headers)


# The longest error message answered.
_MAX_MESSAGE_CHARS = 2000


def describe_validation(errors: Sequence[Any], *, limit: int = 5) -> str:
    """A short human message from pydantic's error list (location: message; ...)."""
    parts = []
    for err in list(errors)[:limit]:
        loc = ".".join(shortened(str(p)) for p in err.get("loc", ()) if p != "body")
        msg = err.get("msg", "invalid value")
        parts.append(f"{loc}: {msg}" if loc else msg)
    if len(errors) > limit:
        parts.append(f"... and {len(errors) - limit} more")
    return "; ".join(parts) or "invalid request"


def invalid_from_validation(exc: ValidationError) -> InvalidInput:
    # include_input=False: echoing client data back (and into logs) helps nobody.
    return InvalidInput(describe_validation(exc.errors(include_url=False, include_input=False)))


def _allowed_methods(request: Request) -> list[str]:
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    """Map every error to the JSON shape; the only place status codes of errors are chosen."""

    async def on_service_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServiceError)
        if status_of(exc)[0] >= 500:  # e.g. not ready: debug, health probes ask every few seconds
            log.debug("%s %s: %s", request.method, request.url.path, exc.message)
        return error_response(exc)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(InvalidInput(describe_validation(exc.errors())))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        error_type = _HTTP_TYPES.get(exc.status_code, "http_error")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route matching the path only; a path
            # can have several (GET and DELETE /models/{model_id}).
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return JSONResponse(error_body(error_type, message), exc.status_code, headers)

    async def on_client_gone(request: Request, exc: Exception) -> JSONResponse:
        # Not a server error: nobody reads this answer; 499 (nginx's "client closed
        # request") keeps it apart from the server's own failures in the metrics.
        log.info("%s %s: the client left before its body was in", request.method, request.url.path)
        return JSONResponse(
            error_body("client_closed_request", "the client closed the connection"),
            status_code=CLIENT_CLOSED_REQUEST,
        )

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return JSONResponse(
            error_body("internal_error", "internal error; the server log has the details"),
            status_code=500,
        )

    app.add_exception_handler(ServiceError, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(ClientDisconnect, on_client_gone)
    app.add_exception_handler(Exception, on_unexpected)
