"""Backpressure: request body limits and the bounded exact-mode gate.

Work beyond a limit is refused at once (413, or 429 with Retry-After) instead of queueing
without bound (text-embeddings-inference's semaphore, answered with 429 when full).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import (
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
    ServiceError,
    Unavailable,
    UnsupportedMediaType,
    error_response,
)

T = TypeVar("T")

log = logging.getLogger(__name__)

# How much less CPU priority the pools' threads get than the event loop (nice increments).
# On a saturated machine the kernel shares the cores evenly among runnable threads, so the
# loop, which answers health probes, refuses excess work and moves accepted requests' bytes,
# waited in the run queue behind the very work it was meant to bound. Exact work yields to
# fast work as well. Raising one's own nice value needs no privilege.
FAST_THREAD_NICENESS = 10
EXACT_THREAD_NICENESS = 15


def lower_thread_priority(increment: int) -> None:
    """Raise the calling thread's nice value by ``increment`` (a pool initializer). Where the
    platform cannot (not Linux, or a sandbox refusing it), the thread keeps the loop's
    priority: answers stay correct, only less prompt under saturation."""
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + increment))
    except (AttributeError, OSError) as error:
        log.debug("could not lower a pool thread's priority: %s", error)


def idle_thread_priority() -> None:
    """Put the calling thread (and the threads it starts) in Linux's ``SCHED_IDLE`` class:
    it runs only on a CPU nothing else wants, and a waking thread of any other class
    preempts it at once. A low nice value is not enough for background work beside
    latency-bound requests: the scheduler may let the running thread finish a time slice
    (milliseconds) before a woken request thread gets the CPU. Falls back to the highest
    nice value where the class is unavailable (a pool initializer)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread
    except (AttributeError, OSError) as error:
        log.debug("no SCHED_IDLE for a background thread (%s); nice 19 instead", error)
        lower_thread_priority(19)


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

# How long a chunk of a body being read waits for bodies already worked on to free the room
# it needs (RowBudget.buffering). Work ends on its own, usually in well under a second;
# past this the body is refused (429) rather than kept waiting with its bytes held.
ROOM_WAIT_SECONDS = 5.0


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


class RowBudget:
    """Admission control of /embed (text-embeddings-inference's ``max_concurrent_requests``
    and ``max_batch_tokens``, in rows): at most ``max_requests`` requests in flight (reading,
    parsing, computing) and at most ``max_rows`` fast-mode rows being computed. Past either,
    429 with Retry-After at once: the work a replica accepts stays bounded, so accepted
    requests keep a bounded latency and health probes are not starved.

    The work of admitted requests that runs beside the event loop (parsing large bodies,
    the model, encoding answers) runs on a pool of ``threads`` of its own: parts of it hold
    the GIL, and with one thread per request the event loop would get a share of the GIL too
    small to even answer a health probe or refuse a request quickly.

    Counters are used from the event loop only, so they need no lock.
    """

    def __init__(
        self,
        *,
        max_rows: int,
        max_requests: int,
        retry_after: int,
        on_reject: Callable[[str], None],
        threads: int = 2,
        max_buffered_bytes: int = 256 << 20,
    ) -> None:
        self.max_rows = max_rows
        self.max_requests = max_requests
        self.retry_after = retry_after
        self.max_buffered_bytes = max_buffered_bytes
        self.rows_in_flight = 0
        self.requests_in_flight = 0
        self.buffered_bytes = 0
        # Bodies being read, oldest first (a dict: ordered, and removal by key is cheap).
        self._reading: dict[BodyBuffer, None] = {}
        # Futures of body chunks waiting for bytes to be freed (each made on the running loop).
        self._room_waiters: list[asyncio.Future[None]] = []
        # Since when every request slot is taken (monotonic seconds), None while one is free:
        # readiness reads it from its own thread (a float assignment is atomic).
        self.full_since: float | None = None
        self._on_reject = on_reject
        self._pool = ThreadPoolExecutor(
            max_workers=threads,
            thread_name_prefix="mbn-fast",
            initializer=lower_thread_priority,
            initargs=(FAST_THREAD_NICENESS,),
        )

    async def run(self, func: Callable[..., T], *args: object) -> T:
        """``func(*args)`` on the budget's thread pool."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, func, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @contextmanager
    def request(self) -> Iterator[None]:
        """One more request in flight while inside, or Overloaded (429) when full."""
        if self.requests_in_flight >= self.max_requests:
            self._reject("requests", f"{self.max_requests} /embed requests are in flight")
        self.requests_in_flight += 1
        if self.requests_in_flight >= self.max_requests and self.full_since is None:
            self.full_since = time.monotonic()
        try:
            yield
        finally:
            self.requests_in_flight -= 1
            self.full_since = None

    def saturated_for(self) -> float:
        """Seconds every request slot has been taken without a break (0 while one is free)."""
        since = self.full_since
        return 0.0 if since is None else time.monotonic() - since

    @contextmanager
    def buffering(self) -> Iterator[BodyBuffer]:
        """A request's body, its bytes counted while inside: being read (``BodyBuffer.add``),
        then, once taken, worked on. The bodies held never pass ``max_buffered_bytes``.

        When a chunk does not fit, the body that arrived later loses, never the one that
        has been arriving longer: a body nearly in would otherwise be refused because
        bodies that came after it took the room it was about to fill, and both clients then
        got 429 (each refused body held its bytes while its answer waited). So a chunk of an
        older body takes the room of bodies still being read that started after it (they
        are refused, their bytes dropped at once), and waits up to ``ROOM_WAIT_SECONDS`` for
        bodies already worked on, which end on their own; only when neither would make room
        is it refused itself. Nothing is reserved for bytes not yet sent: a client that
        declares a large body and sends nothing holds nothing, so slow clients cannot keep
        others out."""
        body = BodyBuffer(self)
        self._reading[body] = None
        try:
            yield body
        finally:
            body.release()

    def _reading_after(self, body: BodyBuffer) -> list[BodyBuffer]:
        """The bodies being read that started after ``body``, oldest first."""
        reading = list(self._reading)
        return reading[reading.index(body) + 1 :] if body in self._reading else []

    async def _make_room(self, body: BodyBuffer, n: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ROOM_WAIT_SECONDS
        while True:
            if body.refusal is not None:
                raise body.refusal
            if self.buffered_bytes + n <= self.max_buffered_bytes:
                break
            later = self._reading_after(body)
            if self.buffered_bytes - sum(b.held for b in later) + n <= self.max_buffered_bytes:
                for victim in reversed(later):  # the one that started last goes first
                    if self.buffered_bytes + n <= self.max_buffered_bytes:
                        break
                    victim.refuse(self._refusal("buffered", self._full()))
                break
            worked_on = self.buffered_bytes - sum(b.held for b in self._reading)
            freeable = worked_on + sum(b.held for b in later)
            if self.buffered_bytes - freeable + n > self.max_buffered_bytes:
                self._reject("buffered", self._full())  # older bodies hold the room
            if loop.time() >= deadline:
                self._reject("buffered", self._full())
            waiter = loop.create_future()
            self._room_waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except TimeoutError:
                pass  # checked once more, then refused
            finally:
                with contextlib.suppress(ValueError):
                    self._room_waiters.remove(waiter)
        self.buffered_bytes += n

    def _freed(self, n: int) -> None:
        self.buffered_bytes -= n
        if n:
            waiters, self._room_waiters = self._room_waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _full(self) -> str:
        return f"{self.buffered_bytes} bytes of /embed bodies are being read"

    @contextmanager
    def rows(self, n: int) -> Iterator[None]:
        # A batch alone always fits (max_rows >= MBN_MAX_ROWS_PER_REQUEST, checked at start).
        if self.rows_in_flight and self.rows_in_flight + n > self.max_rows:
            self._reject(
                "rows", f"{self.rows_in_flight} rows are being embedded (budget {self.max_rows})"
            )
        self.rows_in_flight += n
        try:
            yield
        finally:
            self.rows_in_flight -= n

    def _reject(self, reason: str, what: str) -> None:
        raise self._refusal(reason, what)

    def _refusal(self, reason: str, what: str) -> Overloaded:
        self._on_reject(reason)
        return Overloaded(f"overloaded: {what}; retry later", retry_after=self.retry_after)


class BodyBuffer:
    """One /embed body in a RowBudget: its chunks while it is read, then the bytes counted
    while it is worked on. Event loop only, like the budget's counters."""

    def __init__(self, budget: RowBudget) -> None:
        self._budget = budget
        self._chunks: list[bytes] = []
        self.held = 0  # bytes counted in the budget for this body
        self.refusal: Overloaded | None = None  # set when a body that came earlier needed the room

    async def add(self, chunk: bytes) -> None:
        """Count and keep ``chunk``, waiting for room if need be, or raise Overloaded (429):
        no room, or this body was refused to make room for an earlier one."""
        if self.refusal is not None:
            raise self.refusal
        if chunk:
            await self._budget._make_room(self, len(chunk))
            self._chunks.append(chunk)
            self.held += len(chunk)

    def take(self) -> bytes:
        """The whole body, read: from here on it is worked on, and keeps its bytes counted
        until ``buffering`` ends (no later body can take its room)."""
        if self.refusal is not None:
            raise self.refusal
        self._budget._reading.pop(self, None)
        body = b"".join(self._chunks)
        self._chunks = []
        return body

    def refuse(self, refusal: Overloaded) -> None:
        """Refused while still being read: its bytes are dropped now, and its reader raises
        ``refusal`` at its next chunk."""
        self.refusal = refusal
        self.release()

    def release(self) -> None:
        """Drop the body and its count (idempotent)."""
        self._budget._reading.pop(self, None)
        self._chunks = []
        held, self.held = self.held, 0
        self._budget._freed(held)


class ExactGate:
    """At most ``limit`` exact computations at once, each on its own pool thread; one more
    is refused with 429 immediately (never queued)."""

    def __init__(self, limit: int, *, retry_after: int, on_reject: Callable[[], None]) -> None:
        self.limit = limit
        self.retry_after = retry_after
        self.in_flight = 0
        self._on_reject = on_reject
        self._pool = ThreadPoolExecutor(
            max_workers=limit,
            thread_name_prefix="mbn-exact",
            initializer=lower_thread_priority,
            initargs=(EXACT_THREAD_NICENESS,),
        )

    @contextmanager
    def _slot(self) -> Iterator[None]:
        # Runs on the event loop only, so a plain counter is race-free.
        if self.in_flight >= self.limit:
            self._on_reject()
            raise Overloaded(
                f"{self.limit} exact-mode requests are already running; retry later or use "
                "mode 'fast'",
                retry_after=self.retry_after,
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    async def run(self, func: Callable[[], T]) -> T:
        with self._slot():
            future = asyncio.get_running_loop().run_in_executor(self._pool, func)
            try:
                return await future
            except asyncio.CancelledError:
                # uvicorn cancels requests still running when the shutdown grace ends; the
                # client gets a clear 503 instead of a dropped connection. (The computation
                # itself cannot be interrupted; shutdown waits for its thread.)
                raise Unavailable(
                    "the server is shutting down and this exact-mode request did not finish "
                    "within the shutdown grace period; retry (another replica will answer)",
                    retry_after=self.retry_after,
                ) from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
