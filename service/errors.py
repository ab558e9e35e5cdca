"""One error hierarchy, mapped to HTTP in one place.

Code anywhere in the service raises a ``ServiceError`` subclass; ``install_error_handlers``
turns it (and FastAPI's, Starlette's and pydantic's own errors) into the one JSON shape
``{"error": {"type": ..., "message": ...}}``. Anything else is a bug: logged with its
traceback and answered with a 500 that reveals nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """Base of every error the service answers deliberately."""

    status_code: ClassVar[int] = 500
    error_type: ClassVar[str] = "internal_error"

    def __init__(self, message: str, *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = dict(headers or {})


class InvalidInput(ServiceError):
    """The request is well-formed HTTP but its content is not acceptable (422)."""

    status_code = 422
    error_type = "invalid_input"


class Unauthorized(ServiceError):
    """Missing or wrong API key (401)."""

    status_code = 401
    error_type = "unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class NotFound(ServiceError):
    """Unknown model, job or path (404)."""

    status_code = 404
    error_type = "not_found"


class Conflict(ServiceError):
    """The resource is in the wrong state for this request (409)."""

    status_code = 409
    error_type = "conflict"


class PayloadTooLarge(ServiceError):
    """Body, upload or batch over the configured limits (413)."""

    status_code = 413
    error_type = "payload_too_large"


class UnsupportedMediaType(ServiceError):
    """A content type the endpoint does not read (415)."""

    status_code = 415
    error_type = "unsupported_media_type"


class Overloaded(ServiceError):
    """Too much work in flight; retry later (429)."""

    status_code = 429
    error_type = "overloaded"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


class InsufficientStorage(ServiceError):
    """The disk is full: the request cannot be stored (507)."""

    status_code = 507
    error_type = "insufficient_storage"


class Unavailable(ServiceError):
    """The service cannot answer yet: no model, store down (503)."""

    status_code = 503
    error_type = "unavailable"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)})


# Starlette raises HTTPException for routing and protocol errors (unknown path, wrong method...).
_HTTP_TYPES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_input",
    429: "overloaded",
    503: "unavailable",
    507: "insufficient_storage",
}


def error_body(error_type: str, message: str) -> dict[str, Any]:
    """The one JSON shape of every error answer."""
    return {"error": {"type": error_type, "message": message}}


def error_response(error: ServiceError) -> JSONResponse:
    return JSONResponse(
        error_body(error.error_type, error.message),
        status_code=error.status_code,
        headers=error.headers,
    )


def describe_validation(errors: Sequence[Any], *, limit: int = 5) -> str:
    """A short human message from pydantic's error list (location: message; ...)."""
    parts = []
    for err in list(errors)[:limit]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
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
        if exc.status_code >= 500:  # e.g. not ready: debug, health probes ask every few seconds
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

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return JSONResponse(
            error_body("internal_error", "internal error; the server log has the details"),
            status_code=500,
        )

    app.add_exception_handler(ServiceError, on_service_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
