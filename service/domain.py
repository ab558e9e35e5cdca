"""The service's domain errors: what went wrong, in its own terms, with no HTTP in sight.

The job store, the registry, the submitter and the handlers raise these; only
``service/errors.py`` decides which HTTP status and error type each one becomes.
"""

from __future__ import annotations

from collections.abc import Mapping

# A client's key, id or name can be megabytes long: an answer quotes only its start.
_MAX_LOCATION_CHARS = 80


def shortened(name: str) -> str:
    """``name`` as an answer may quote it: a client's key can be megabytes long."""
    if len(name) <= _MAX_LOCATION_CHARS:
        return name
    return f"{name[:_MAX_LOCATION_CHARS]}... ({len(name)} characters)"


class ServiceError(Exception):
    """Base of every error the service answers deliberately.

    Attributes
    ----------
    message : str
        Said to the client as it is: never a server path or a secret.
    headers : dict
        Protocol hints that belong to the error (an authentication scheme).
    retry_after : int or None
        Seconds after which trying again may succeed (overload, not ready).
    """

    def __init__(
        self,
        message: str,
        *,
        headers: Mapping[str, str] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.headers = dict(headers or {})
        self.retry_after = retry_after


class InvalidInput(ServiceError):
    """What was sent is well-formed but not acceptable."""


class Unauthorized(ServiceError):
    """Missing or wrong API key."""

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class NotFound(ServiceError):
    """Unknown model, job or path."""


class Conflict(ServiceError):
    """The resource is in the wrong state for this request."""


class PayloadTooLarge(ServiceError):
    """Body, upload or batch over the configured limits."""


class RequestTimeout(ServiceError):
    """The request's body (or head) arrived too slowly; the connection is closed."""


class UnsupportedMediaType(ServiceError):
    """A content type the endpoint does not read."""


class ExpectationFailed(ServiceError):
    """A request expectation (HTTP's ``Expect``) the service does not meet."""


class Overloaded(ServiceError):
    """Too much work in flight; retry later."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, retry_after=retry_after)


class ClientGone(ServiceError):
    """The client closed the connection before its answer was ready: nobody reads one."""


class InsufficientStorage(ServiceError):
    """The disk is full: what was sent cannot be stored."""


class Unavailable(ServiceError):
    """The service cannot answer yet: no model, store down, shutting down."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, retry_after=retry_after)
