"""Admission of /embed work: the in-flight request and row bounds and the bodies' bytes.

The bounds are counters kept on the event loop (no locks): past one, the work is refused at
once with ``Overloaded`` (429 with Retry-After) instead of queueing without bound
(text-embeddings-inference's semaphore, answered with 429 when full). Exact-mode work is
bounded by the exact runtime's own queue (``service.exact``), shared by every API process of
the replica. The ASGI middleware that applies these bounds before routing lives in
``service.limits``; nothing here knows HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from mbn_core.utils.priority import lower_thread_priority
from service.domain import Overloaded

T = TypeVar("T")

log = logging.getLogger(__name__)

# How much less CPU priority the fast pool's threads get than the event loop (nice
# increments). On a saturated machine the kernel shares the cores evenly among runnable
# threads, so the loop, which answers health probes, refuses excess work and moves accepted
# requests' bytes, waited in the run queue behind the very work it was meant to bound.
# Raising one's own nice value needs no privilege.
FAST_THREAD_NICENESS = 10

# How long a chunk of a body being read waits for bodies already worked on to free the room
# it needs (RowBudget.buffering). Work ends on its own, usually in well under a second;
# past this the body is refused (429) rather than kept waiting with its bytes held.
ROOM_WAIT_SECONDS = 5.0


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

    @contextmanager
    def waiting_elsewhere(self) -> Iterator[None]:
        """Inside ``request``: while inside, the request waits for work done outside this
        process (the exact runtime's queue, which has bounds of its own) and leaves its slot
        to others; it takes it back when the answer is there, over the bound if need be (the
        answer is computed: refusing it then would waste it)."""
        self.requests_in_flight -= 1
        self.full_since = None
        try:
            yield
        finally:
            self.requests_in_flight += 1
            if self.requests_in_flight >= self.max_requests and self.full_since is None:
                self.full_since = time.monotonic()

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


class ReadBudget:
    """Admission of expensive reads: a model comparison (both models' fast paths over the
    reference rows) and a monitor report (a k-means over the window when it changed). They
    are GETs that a console, a dashboard or a careless script may send in a loop, each
    costing tens to hundreds of milliseconds of CPU: on the default thread pool (40
    threads, at the event loop's priority) a flood of them ran side by side and took the
    cores from /embed. Here at most ``max_reads`` are admitted at a time, 429 with
    Retry-After past it, and they run on ``threads`` threads of their own at the fast pool's
    lower priority, so the reads queue behind each other and not in front of the loop.

    A read stays counted until its thread has finished, even when its client has left:
    leaving must not make room for more work than the threads can do."""

    def __init__(
        self,
        *,
        max_reads: int,
        retry_after: int,
        on_reject: Callable[[str], None],
        threads: int = 1,
    ) -> None:
        self.max_reads = max_reads
        self.retry_after = retry_after
        self._on_reject = on_reject
        self._lock = threading.Lock()  # released from the pool's threads
        self.in_flight = 0
        self._pool = ThreadPoolExecutor(
            max_workers=threads,
            thread_name_prefix="mbn-read",
            initializer=lower_thread_priority,
            initargs=(FAST_THREAD_NICENESS,),
        )

    async def run(self, what: str, func: Callable[..., T], *args: object) -> T:
        """``func(*args)`` on the reads' threads, or Overloaded (429) when ``max_reads``
        reads are in flight; ``what`` names the kind of read in the refusal and the metric."""
        with self._lock:
            if self.in_flight >= self.max_reads:
                full = True
            else:
                full = False
                self.in_flight += 1
        if full:
            self._on_reject(what)
            raise Overloaded(
                f"{self.max_reads} expensive reads (compare, monitor) are in flight on this "
                "process (MBN_MAX_INFLIGHT_READS); retry later",
                retry_after=self.retry_after,
            )
        try:
            future = self._pool.submit(func, *args)
        except BaseException:
            self._release()
            raise
        future.add_done_callback(lambda _: self._release())
        return await asyncio.wrap_future(future)

    def _release(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
