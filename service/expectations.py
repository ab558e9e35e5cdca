"""``Expect: 100-continue`` answered before the body is invited.

uvicorn answers ``100 Continue`` as soon as the application first asks for the body, and the
service asks early: ``/embed``'s admission reads the whole body before routing (so that a slot
is held by work, not by a client's bytes). A client that announced 30 MB with
``Expect: 100-continue`` and a wrong key was invited to send them all, then told 401. Here,
before anything reads the body (RFC 9110, section 10.1.1):

- an expectation other than ``100-continue`` is refused with 417;
- a request to a route that needs an API key, without a valid one, gets its 401 at once, with
  ``Connection: close``: the client was never invited, so nothing of its body is waited for.

Requests without ``Expect`` pass untouched (their key is checked by the route, as before).
"""

from __future__ import annotations

import re
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from service.domain import ExpectationFailed, ServiceError, Unauthorized
from service.errors import error_response


class ExpectMiddleware:
    """Answers what ``Expect`` asks before the body is read (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            expectation = _expectation(scope)
            if expectation is not None:
                refusal = self._refusal(scope, expectation)
                if refusal is not None:
                    response = error_response(refusal)
                    response.headers["connection"] = "close"
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, expectation: str) -> ServiceError | None:
        if expectation != "100-continue":
            return ExpectationFailed(
                f"the expectation {expectation[:40]!r} is not supported; only 100-continue is"
            )
        app = scope["app"]
        if not _needs_key(app, scope["method"], scope["path"]):
            return None
        authorization = next(
            (value for name, value in scope.get("headers", ()) if name == b"authorization"), None
        )
        try:
            app.state.api_keys.check(
                None if authorization is None else authorization.decode("latin-1")
            )
        except Unauthorized as error:
            return error
        return None


def _expectation(scope: Scope) -> str | None:
    values = [value for name, value in scope.get("headers", ()) if name == b"expect"]
    if not values:
        return None
    return ",".join(value.decode("latin-1") for value in values).strip().lower()


def _needs_key(app: Any, method: str, path: str) -> bool:
    """Whether the operation at ``method`` ``path`` requires a key, as the OpenAPI document
    says (``service.app`` makes it tell the truth: security optional where no key is
    checked). Read once per app."""
    keyed = getattr(app.state, "keyed_operations", None)
    if keyed is None:
        keyed = []
        for template, item in app.openapi()["paths"].items():
            for verb, operation in item.items():
                security = operation.get("security")
                if security and {} not in security:
                    keyed.append((verb.upper(), _template_pattern(template)))
        app.state.keyed_operations = keyed
    return any(verb == method and pattern.fullmatch(path) for verb, pattern in keyed)


def _template_pattern(template: str) -> re.Pattern[str]:
    """``/models/{model_id}`` as a pattern matching its paths."""
    parts = re.split(r"(\{[^}]*\})", template)
    return re.compile(
        "".join(
            (".*" if part.endswith(":path}") else "[^/]+")
            if part.startswith("{")
            else re.escape(part)
            for part in parts
        )
    )
