"""An API process's side of the exact runtime: one connection, many requests in flight.

``ExactClient.embed`` sends a request's rows (in the frame, or for large requests through a
shared memory segment) and waits for its answer, its deadline, or its caller giving up (the
HTTP client left): then it tells the runtime to drop the rows. The connection is opened in
the background and opened again whenever it closes; while it is not open (the runtime is
starting or restarting), requests fail at once with ``RuntimeDown``, never wait. Requests in
flight when the connection closes fail the same way.

The runtime's figures (``wire.Stats``) arrive on the connection once a second and are kept
for the metrics and for readiness, counters carried over restarts.

Everything runs on the event loop it was started on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.exact import segments, wire

log = logging.getLogger(__name__)

# Requests whose rows take more than this travel through a shared memory segment.
SEGMENT_BYTES = 256 << 10
# Pauses between attempts to connect while the runtime is down.
RECONNECT_SECONDS = (0.05, 0.1, 0.2, 0.5, 1.0)
# How long a connection may take to say hello before it is dropped and made again.
HELLO_SECONDS = 30.0
# An answer overdue by this much past its deadline means the runtime lost it.
DEADLINE_GRACE_SECONDS = 5.0


class ExactFailure(Exception):
    """The runtime refused or failed a request: ``kind`` is a ``wire.FailureKind``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class RuntimeDown(ExactFailure):
    """The runtime is not connected (starting, restarting, stopped)."""

    def __init__(self, message: str) -> None:
        super().__init__("unavailable", message)


@dataclass(frozen=True)
class ExactAnswer:
    embedding: np.ndarray  # (n, dim) float32
    clusters: np.ndarray | None  # (n,) int64
    wait_ms: float
    compute_ms: float


@dataclass
class RuntimeState:
    """What an API process knows of the runtime, for readiness and the metrics."""

    connected: bool = False
    since: float = field(default_factory=time.monotonic)  # when ``connected`` last changed
    pid: int | None = None
    generation: int = 0
    device: str = ""
    device_note: str = ""
    stats: wire.Stats | None = None
    # Counters and histograms of earlier generations, so that the metrics never go back.
    carried: dict[str, Any] = field(default_factory=dict)
    problem: str = "not connected yet"

    def describe(self) -> str:
        if self.connected:
            note = f": {self.device_note}" if self.device_note else ""
            return f"running (process {self.pid}, generation {self.generation}, on " + (
                f"{self.device}{note})"
            )
        waited = time.monotonic() - self.since
        if self.generation == 0:
            return f"starting ({waited:.0f} s so far)"
        return f"down for {waited:.0f} s: {self.problem}"


@dataclass
class _Pending:
    future: asyncio.Future[wire.Done | wire.Failed]
    segment: segments.Segment | None
    payload: bytes | None = None


class ExactClient:
    """The connection of one API process to its replica's runtime.

    Parameters
    ----------
    socket_path : Path
    max_payload : int
        Largest answer payload accepted, in bytes.
    """

    def __init__(self, socket_path: Path, *, max_payload: int) -> None:
        self.socket_path = socket_path
        self.max_payload = max_payload
        self.state = RuntimeState()
        self._segment_dir = segments.directory()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._connected = asyncio.Event()

    async def start(self) -> None:
        """Start connecting in the background (returns at once)."""
        self._task = asyncio.create_task(self._run(), name="mbn-exact-connection")

    async def wait_connected(self, timeout: float) -> bool:
        """Whether the runtime is connected within ``timeout`` seconds (for start-up)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._connected.wait()
        return self.state.connected

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._disconnected("this server process is stopping")

    # --- requests ---------------------------------------------------------------------------
    async def embed(
        self,
        *,
        model: str,
        sha256: str,
        rows: np.ndarray,
        priority: int,
        deadline: float,
        mergeable: bool = True,
        out_dim: int = 0,
        offload: Callable[[Callable[[], None]], Awaitable[None]] | None = None,
    ) -> ExactAnswer:
        """The runtime's exact embedding of ``rows`` (float32, C order) with model ``model``
        (whose embeddings have ``out_dim`` dimensions: room for the answer in a segment).

        Raises ``ExactFailure`` (``RuntimeDown`` when there is no runtime to ask). When the
        awaiting task is cancelled (the client left, the server stops), the runtime is told
        to drop the rows and ``CancelledError`` propagates. ``offload`` runs the copy of a
        large request into its segment beside the event loop.
        """
        writer = self._writer
        if writer is None or not self.state.connected:
            raise RuntimeDown(f"the exact runtime is {self.state.describe()}")
        n, dim = rows.shape
        request_id = next(self._ids)
        loop = asyncio.get_running_loop()
        segment = None
        payload = b""
        answer_bytes = n * (4 * out_dim + 8)  # the embedding and the cluster ids
        if rows.nbytes > SEGMENT_BYTES and self._segment_dir is not None:
            segment = segments.Segment.create(self._segment_dir, max(rows.nbytes, answer_bytes))
        if segment is not None:
            memory = segment.memory

            def copy_in() -> None:
                view = np.frombuffer(memory, dtype=np.float32, count=rows.size)
                view[:] = rows.reshape(-1)
                del view

            if offload is None:
                copy_in()
            else:
                await offload(copy_in)
        else:
            payload = np.ascontiguousarray(rows, dtype=np.float32).tobytes()
        pending = _Pending(loop.create_future(), segment)
        self._pending[request_id] = pending
        message = wire.Submit(
            id=request_id,
            model=model,
            sha256=sha256,
            priority=priority,
            deadline=deadline,
            n=n,
            dim=dim,
            segment=None if segment is None else segment.name,
            mergeable=mergeable,
        )
        try:
            writer.writelines(wire.frame(message, payload))
            timeout = max(0.0, deadline - time.monotonic()) + DEADLINE_GRACE_SECONDS
            try:
                async with asyncio.timeout(timeout):
                    result = await pending.future
            except TimeoutError:
                self._cancel(request_id)
                raise ExactFailure(
                    "timeout", "the exact runtime did not answer within the request's deadline"
                ) from None
            except asyncio.CancelledError:
                self._cancel(request_id)
                raise
            if isinstance(result, wire.Failed):
                raise ExactFailure(result.kind, result.message)
            return self._answer(result, pending)
        finally:
            self._pending.pop(request_id, None)
            if segment is not None:
                segment.close()

    def _answer(self, done: wire.Done, pending: _Pending) -> ExactAnswer:
        size = done.n * done.dim * 4
        if done.in_segment:
            assert pending.segment is not None
            source: Any = pending.segment.memory
        else:
            source = pending.payload
        expected = size + (done.n * 8 if done.clusters else 0)
        if source is None or len(source) < expected:
            raise ExactFailure("unavailable", "the exact runtime's answer was cut short; retry")
        embedding = np.frombuffer(source, dtype=np.float32, count=done.n * done.dim)
        embedding = embedding.reshape(done.n, done.dim).copy()
        clusters = None
        if done.clusters:
            clusters = np.frombuffer(source, dtype=np.int64, count=done.n, offset=size).copy()
        return ExactAnswer(embedding, clusters, done.wait_ms, done.compute_ms)

    def _cancel(self, request_id: int) -> None:
        writer = self._writer
        if writer is not None and not writer.is_closing():
            writer.writelines(wire.frame(wire.Cancel(request_id)))

    # --- the connection ---------------------------------------------------------------------
    async def _run(self) -> None:
        attempt = 0
        while not self._closed:
            try:
                reader, writer = await asyncio.open_unix_connection(
                    str(self.socket_path), limit=1 << 20
                )
            except OSError as error:
                self.state.problem = f"cannot connect ({error.strerror or error})"
                await asyncio.sleep(RECONNECT_SECONDS[min(attempt, len(RECONNECT_SECONDS) - 1)])
                attempt += 1
                continue
            try:
                await self._serve(reader, writer)
                problem = "the exact runtime closed the connection (restarting?)"
            except (OSError, EOFError, asyncio.IncompleteReadError):
                problem = "the connection to the exact runtime broke (restarting?)"
            except wire.ProtocolError as error:
                log.error("the exact runtime sent a malformed frame: %s", error)
                problem = "the exact runtime sent a malformed frame"
            except TimeoutError:
                problem = f"the exact runtime did not answer within {HELLO_SECONDS:.0f} s"
            finally:
                writer.close()
            if self.state.connected:
                log.warning("exact runtime lost: %s", problem)
            self.state.problem = problem
            self._disconnected(
                "the exact runtime restarted while computing this request; retry (another "
                "replica may answer)"
            )
            attempt = 0
            await asyncio.sleep(RECONNECT_SECONDS[0])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The runtime says hello once it is ready: a connection made while it starts waits.
        async with asyncio.timeout(HELLO_SECONDS):
            hello, _ = await self._read(reader)
        if not isinstance(hello, wire.Hello):
            raise wire.ProtocolError(f"expected a hello, got {type(hello).__name__}")
        state = self.state
        if hello.generation != state.generation and state.stats is not None:
            _carry(state)
        state.pid, state.generation = hello.pid, hello.generation
        state.device, state.device_note = hello.device, hello.device_note
        self._writer = writer
        state.connected, state.since = True, time.monotonic()
        self._connected.set()
        log.info("connected to the exact runtime: %s", state.describe())
        while True:
            message, payload = await self._read(reader)
            if isinstance(message, wire.Stats):
                state.stats = message
            elif isinstance(message, wire.Done | wire.Failed):
                pending = self._pending.get(message.id)
                if pending is not None and not pending.future.done():
                    pending.payload = payload
                    pending.future.set_result(message)

    async def _read(self, reader: asyncio.StreamReader) -> tuple[wire.FromRuntime, bytes | None]:
        prefix = await reader.readexactly(wire.prefix_size())
        size, payload_size = wire.parse_prefix(prefix, self.max_payload)
        message = wire.decode_from_runtime(await reader.readexactly(size))
        payload = await reader.readexactly(payload_size) if payload_size else None
        return message, payload

    def _disconnected(self, message: str) -> None:
        self._writer = None
        if self.state.connected:
            self.state.connected, self.state.since = False, time.monotonic()
        self._connected.clear()
        pending, self._pending = self._pending, {}
        for item in pending.values():
            if not item.future.done():
                item.future.set_exception(RuntimeDown(message))


# The Stats fields that count since the runtime's start (carried over its restarts).
_COUNTERS = ("requests", "rows", "batches", "cancelled", "abandoned", "timed_out", "rejected")
_SUMS = ("batch_rows_sum", "wait_sum", "compute_sum")
_BUCKETS = ("batch_rows_buckets", "wait_buckets", "compute_buckets")


def _carry(state: RuntimeState) -> None:
    """Add the last figures of the generation that ended to what earlier ones carried."""
    stats, carried = state.stats, state.carried
    assert stats is not None
    for name in (*_COUNTERS, *_SUMS):
        carried[name] = carried.get(name, 0) + getattr(stats, name)
    for name in _BUCKETS:
        previous = carried.get(name) or [0] * len(getattr(stats, name))
        carried[name] = [a + b for a, b in zip(previous, getattr(stats, name), strict=True)]
    state.stats = None


def totals(state: RuntimeState) -> dict[str, Any]:
    """Counters, sums and histogram buckets since the replica started (every generation)."""
    stats, carried = state.stats, state.carried
    out: dict[str, Any] = {}
    for name in (*_COUNTERS, *_SUMS):
        out[name] = carried.get(name, 0) + (getattr(stats, name) if stats else 0)
    for name in _BUCKETS:
        current = getattr(stats, name) if stats else None
        previous = carried.get(name)
        if current is None:
            out[name] = previous
        elif previous is None:
            out[name] = list(current)
        else:
            out[name] = [a + b for a, b in zip(previous, current, strict=True)]
    return out
