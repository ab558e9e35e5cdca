"""The ASGI middleware of backpressure: request body limits, and /embed's admission.

Work beyond a limit is refused at once (413, or 429 with Retry-After) instead of queueing
without bound (text-embeddings-inference's semaphore, answered with 429 when full). The
bounds themselves, which know nothing of HTTP, are ``service.admission``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.admission import BodyBuffer, RowBudget
from service.errors import (
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
    ServiceError,
    UnsupportedMediaType,
    error_response,
)


class BodyLimitMiddleware:
    """413 for bodies over the limit: at once from Content-Length, or as soon as a streamed
    body passes it. ``upload_paths`` get the (larger) upload limit. 415 for a compressed
    body (a Content-Encoding other than identity). 408 for a body slower than ``pace``
    allows, its connection closed.

    An answer given before the body was read (401, 429, 415...) waits until the rest of the
    body is read and dropped: closing a connection whose client is still sending makes the
    kernel answer with a reset, which can destroy the answer before the client reads it
    (RFC 9112, section 9.6). That drain stops at the limit and after ``LINGER_SECONDS``, and
    at most ``MAX_LINGERING`` answers drain at once."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        max_upload_bytes: int,
        pace: BodyPace | None = None,
        upload_paths: frozenset[str] = frozenset({"/train"}),
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes
        self.pace = pace or BodyPace()
        self.upload_paths = upload_paths
        self.lingering = 0  # answers waiting for the rest of their body (event loop only)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"].rstrip("/") or "/"
        limit = self.max_upload_bytes if path in self.upload_paths else self.max_body_bytes
        length = _content_length(scope)
        if length is not None and length > limit:
            error = PayloadTooLarge(f"request body over the limit of {limit} bytes")
            await _send_error(scope, receive, send, error)
            return
        received = 0
        body_done = length == 0 or (length is None and not _has_header(scope, b"transfer-encoding"))
        timed_out = False
        loop = asyncio.get_running_loop()
        started = loop.time()
        # Expect: 100-continue: the body comes only once asked for (uvicorn says 100 then).
        uninvited = _has_header(scope, b"expect")

        async def limited_receive() -> Message:
            nonlocal received, body_done, timed_out
            if body_done:
                return await receive()  # a disconnect, whenever it comes: no deadline
            try:
                async with asyncio.timeout_at(self.pace.deadline(started, received)):
                    message = await receive()
            except TimeoutError:
                body_done = timed_out = True  # no more is read: the connection is closed
                raise RequestTimeout(self.pace.refusal(received, loop.time() - started)) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if received > limit:
                    body_done = True  # no more is read: the connection is closed
                    raise PayloadTooLarge(f"request body over the limit of {limit} bytes")
            else:  # http.disconnect
                body_done = True
            return message

        async def app_receive() -> Message:
            nonlocal uninvited
            uninvited = False
            return await limited_receive()

        async def lingering_send(message: Message) -> None:
            if message["type"] == "http.response.start" and (timed_out or uninvited):
                # The client is slow or gone, or was never asked for its body (it expected a
                # 100 Continue): nothing of its body is waited for.
                headers = list(message.get("headers", ()))
                if _CLOSE not in headers:
                    message = {**message, "headers": [*headers, _CLOSE]}
            elif (
                message["type"] == "http.response.start"
                and not body_done
                and self.lingering < MAX_LINGERING
            ):
                self.lingering += 1
                try:
                    with contextlib.suppress(PayloadTooLarge, RequestTimeout, TimeoutError):
                        async with asyncio.timeout(LINGER_SECONDS):
                            while not body_done:
                                await limited_receive()
                finally:
                    self.lingering -= 1
            await send(message)

        coding = _content_coding(scope)
        if coding is not None and not body_done:
            # Nothing here inflates bodies: a compressed one would be read as what it is not,
            # and the limits above would bound its compressed size only. Answered like any
            # early refusal: after the rest of the body is drained.
            refusal = UnsupportedMediaType(
                f"Content-Encoding {coding!r} is not accepted; send the body uncompressed"
            )
            await error_response(refusal)(scope, limited_receive, lingering_send)
            return
        await self.app(scope, app_receive, lingering_send)


_CLOSE = (b"connection", b"close")


@dataclass(frozen=True)
class BodyPace:
    """How slowly a request body may arrive (Apache's ``mod_reqtimeout`` body rule): it must
    be complete within ``timeout`` seconds plus one second per ``min_rate`` bytes received.
    A client that sends one byte and waits holds its connection ``timeout`` seconds, not for
    as long as it likes; a large body on a link faster than ``min_rate`` is never cut."""

    timeout: float = 10.0
    min_rate: int = 16 * 1024  # bytes per second

    def deadline(self, started: float, received: int) -> float:
        return started + self.timeout + received / self.min_rate

    def refusal(self, received: int, elapsed: float) -> str:
        return (
            f"the request body arrived too slowly ({received} bytes in {elapsed:.0f} s; at "
            f"least {self.min_rate} bytes per second are needed past the first "
            f"{self.timeout:g} s)"
        )


# How long an answer given before its request's body was read waits for the rest of it, and
# how many such answers wait at once. Every byte drained passes through the event loop: under
# a flood of refused large bodies, draining them all saturated the loop and health probes
# waited behind the drains (docs/decisions/0012-overload-admission.md); past this many, the
# answer is sent and the connection closed at once, and a client still sending may see a
# reset instead.
LINGER_SECONDS = 5.0
MAX_LINGERING = 2


def _has_header(scope: Scope, wanted: bytes) -> bool:
    return any(name == wanted for name, _ in scope.get("headers", ()))


def _content_coding(scope: Scope) -> str | None:
    """The first coding other than identity in the request's Content-Encoding lines."""
    for name, value in scope.get("headers", ()):
        if name == b"content-encoding":
            for coding in value.decode("latin-1").split(","):
                coding = coding.strip()
                if coding and coding.lower() != "identity":
                    return coding[:40]
    return None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_error(scope: Scope, receive: Receive, send: Send, error: ServiceError) -> None:
    """Below the app, where no exception handler runs: the answer errors.py gives, closing
    the connection (the request's body may be left unread)."""
    response = error_response(error)
    response.headers["connection"] = "close"
    await response(scope, receive, send)


class AdmissionMiddleware:
    """Admission of the budget's paths: the body is read whole first, then the request takes
    an in-flight slot or is refused at once (429). Under overload most requests are
    refused: through routing, dependencies and the exception handlers a refusal cost the
    event loop several times more, and the loop must also accept connections and answer health
    probes; here it is a counter and a prepared answer. (So during overload a request
    without a valid key is refused with 429 before its key is checked; it never reaches
    anything the key protects.)

    A slot is held by work, never by a client's bytes: a client that sends its headers and
    then trickles its body (or nothing) holds only its connection and the bytes it sent,
    until BodyLimitMiddleware's pace drops it. The bytes of bodies, being read or worked
    on, are bounded by the budget's ``max_buffered_bytes`` instead (see
    ``RowBudget.buffering`` for which body is refused when they are at their bound). A
    refused body's bytes are dropped before its answer waits for the rest of the body."""

    def __init__(
        self, app: ASGIApp, *, budget: RowBudget, paths: frozenset[str] = frozenset({"/embed"})
    ) -> None:
        self.app = app
        self.budget = budget
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        with self.budget.buffering() as buffer:
            try:
                body = await self._read_body(receive, buffer)
            except ServiceError as error:  # too large, too slow, or no room for more bodies
                # The answer may wait seconds for the rest of the body to be drained: the
                # bytes read so far are of no use, and other bodies need their room now.
                buffer.release()
                await _send_error(scope, receive, send, error)
                return
            if body is None:
                return  # the client left before its body was in: nobody to answer
            with contextlib.ExitStack() as admitted:
                try:
                    admitted.enter_context(self.budget.request())
                except Overloaded as error:
                    await _send_error(scope, receive, send, error)
                    return
                await self.app(scope, _replay(body, receive), send)

    @staticmethod
    async def _read_body(receive: Receive, buffer: BodyBuffer) -> bytes | None:
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            # Called for an empty chunk too: a body refused while its client was silent
            # learns it here.
            await buffer.add(message.get("body", b""))
            if not message.get("more_body", False):
                return buffer.take()


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` as one message, then the client's later events."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
