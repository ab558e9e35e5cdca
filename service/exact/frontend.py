"""The API process's door to the exact runtime: bundles in, embeddings or domain errors out.

``ExactFrontend`` wraps the connection (``service.exact.client``) with what the API process
knows about models (the bundle's id, its exact file's digest, whether its method may merge
requests) and turns the runtime's refusals into the service's domain errors. When this
process started the runtime itself, it also holds its supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from mbn_core.bundle import Bundle, BundleError
from mbn_core.bundle.manifest import exact_file
from mbn_core.methods import get_method
from service.domain import (
    ClientGone,
    Conflict,
    InvalidInput,
    NotFound,
    Overloaded,
    ServiceError,
    Unavailable,
)
from service.exact import segments, wire
from service.exact.client import (
    ExactAnswer,
    ExactClient,
    ExactFailure,
    RuntimeDown,
    RuntimeState,
)
from service.exact.process import RuntimeConfig
from service.exact.supervisor import Supervisor

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long a background (monitor) request may wait behind clients' work.
BACKGROUND_TIMEOUT_SECONDS = 120.0


def runtime_config(
    *,
    model_dir: Path,
    lanes: int,
    device: str,
    cache_size: int,
    max_requests: int,
    max_rows: int,
    batch_rows: int,
    max_wait: float,
    max_payload: int,
    log_level: str,
    niceness: int = 0,
) -> RuntimeConfig:
    """The runtime's configuration (the supervisor fills in the process's own fields)."""
    where = segments.directory()
    return RuntimeConfig(
        listen_fd=-1,
        model_dir=str(model_dir),
        generation=0,
        parent_pid=os.getpid(),
        lanes=lanes,
        device=device,
        cache_size=cache_size,
        max_requests=max_requests,
        max_rows=max_rows,
        batch_rows=batch_rows,
        max_wait=max_wait,
        max_payload=max_payload,
        segment_dir=None if where is None else str(where),
        log_level=log_level,
        niceness=niceness,
    )


class ExactFrontend:
    """Exact embeddings from the replica's runtime, for ``/embed`` and the live monitor.

    Parameters
    ----------
    socket_path : Path or None
        The socket of a runtime started by another process (``mbn serve`` starts one per
        replica); None: this process starts its own, with ``config``, when exact mode is
        first used (an app that never serves exact mode starts no process).
    config : RuntimeConfig
        The runtime's configuration, for a runtime of this process's own.
    mark_damaged : callable
        ``mark_damaged(bundle, error) -> Conflict``: takes a model whose exact file failed
        verification out of service (the registry's).
    timeout : float
        Seconds a client's request may take, queue included.
    retry_after : int
        Retry-After of the 429 and 503 answers.
    """

    def __init__(
        self,
        *,
        socket_path: Path | None,
        config: RuntimeConfig,
        mark_damaged: Callable[[Bundle, Exception], Conflict],
        timeout: float,
        retry_after: int,
    ) -> None:
        self.socket_path = socket_path
        self.config = config
        self._mark_damaged = mark_damaged
        self.timeout = timeout
        self.retry_after = retry_after
        self.supervisor: Supervisor | None = None
        self.client: ExactClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Lock | None = None
        self._closed = False

    async def start(self) -> None:
        """Connect to the replica's runtime when another process runs it (in the background:
        returns at once); otherwise nothing starts before exact mode is used."""
        self._loop = asyncio.get_running_loop()
        self._starting = asyncio.Lock()
        if self.socket_path is not None:
            await self._open_client(self.socket_path)

    async def close(self) -> None:
        self._closed = True
        if self.client is not None:
            await self.client.close()
        if self.supervisor is not None:
            await asyncio.to_thread(self.supervisor.stop)

    @property
    def started(self) -> bool:
        return self.client is not None

    @property
    def state(self) -> RuntimeState | None:
        """What this process knows of the runtime; None before it was first needed."""
        return None if self.client is None else self.client.state

    def describe(self) -> str:
        state = self.state
        if state is None:
            return "not started (it starts with the first exact-mode request)"
        return state.describe()

    async def embed(
        self,
        bundle: Bundle,
        x: np.ndarray,
        *,
        gone: Callable[[], Awaitable[object]] | None = None,
        offload: Callable[[Callable[[], None]], Awaitable[None]] | None = None,
    ) -> ExactAnswer:
        """A client's exact request: ``x`` (checked, float32) embedded with ``bundle``'s exact
        model. ``gone()`` completes when the client leaves: the rows are dropped and
        ``ClientGone`` raised. Domain errors otherwise (429 full, 503 down or too slow, 409
        damaged, 404 deleted, 422 rows the model cannot embed)."""
        deadline = time.monotonic() + self.timeout
        try:
            client = await self._client(deadline)
            request = client.embed(
                model=bundle.id,
                sha256=_exact_digest(bundle),
                rows=x,
                priority=wire.CLIENT,
                deadline=deadline,
                mergeable=_mergeable(bundle),
                out_dim=bundle.output_dim,
                offload=offload,
            )
            if gone is None:
                return await request
            return await _unless_gone(request, gone)
        except ExactFailure as failure:
            raise self._domain_error(bundle, failure) from None
        except asyncio.CancelledError:
            # The server stops and its grace period ended: a clear 503, not a dropped
            # connection (the rows were dropped from the runtime's queue).
            raise Unavailable(
                "the server is shutting down and this exact-mode request did not finish "
                "within the shutdown grace period; retry (another replica will answer)",
                retry_after=self.retry_after,
            ) from None

    def shadow(self, bundle: Bundle, rows: np.ndarray) -> np.ndarray | None:
        """The monitor's exact embedding of sampled rows, at background priority (behind every
        client's request), from a thread other than the event loop's; None when the runtime
        could not compute it now (busy, down, the model unusable)."""
        loop = self._loop
        if loop is None or loop.is_closed() or self._closed:
            return None
        future = asyncio.run_coroutine_threadsafe(self._shadow(bundle, rows), loop)
        try:
            return future.result(BACKGROUND_TIMEOUT_SECONDS + 30)
        except ExactFailure as failure:
            log.info("model %s: no shadow embedding (%s)", bundle.id, failure.message)
        except (TimeoutError, asyncio.CancelledError):
            future.cancel()
        return None

    async def _shadow(self, bundle: Bundle, rows: np.ndarray) -> np.ndarray:
        deadline = time.monotonic() + BACKGROUND_TIMEOUT_SECONDS
        client = await self._client(deadline)
        answer = await client.embed(
            model=bundle.id,
            sha256=_exact_digest(bundle),
            rows=np.ascontiguousarray(rows, dtype=np.float32),
            priority=wire.BACKGROUND,
            deadline=deadline,
            mergeable=_mergeable(bundle),
            out_dim=bundle.output_dim,
        )
        return answer.embedding

    async def _client(self, deadline: float) -> ExactClient:
        """The connection, once the runtime is started (started now, for this process's own
        runtime, and waited for until ``deadline``)."""
        assert self._starting is not None, "start() first"
        async with self._starting:
            if self.client is None:
                if self._closed:
                    raise RuntimeDown("the server is shutting down")
                supervisor = await asyncio.to_thread(lambda: Supervisor(self.config).start())
                self.supervisor = supervisor
                await self._open_client(supervisor.socket_path)
        assert self.client is not None
        if self.client.state.generation == 0:
            # Starting (never connected yet): the first requests wait for it. Once it has
            # run, a runtime that is down is answered at once (503), never waited for.
            await self.client.wait_connected(max(0.0, deadline - time.monotonic()))
        return self.client

    async def _open_client(self, path: Path) -> None:
        client = ExactClient(path, max_payload=self.config.max_payload)
        await client.start()
        self.client = client

    def _domain_error(self, bundle: Bundle, failure: ExactFailure) -> ServiceError:
        kind, message = failure.kind, failure.message
        if kind == "overloaded":
            return Overloaded(message, retry_after=self.retry_after)
        if kind == "damaged":
            # Verified again at the next scan once its files change.
            return self._mark_damaged(bundle, BundleError(message))
        if kind == "not_found":
            return NotFound(message)
        if kind in ("out_of_range", "invalid"):
            return InvalidInput(message)
        if not message.startswith(f"model {bundle.id!r}"):
            message = f"model {bundle.id!r}: exact mode is unavailable: {message}"
        return Unavailable(message, retry_after=self.retry_after)


async def _unless_gone(request: Awaitable[T], gone: Callable[[], Awaitable[object]]) -> T:
    work = asyncio.ensure_future(request)
    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return work.result()
        work.cancel()  # tells the runtime to drop the rows
        with contextlib.suppress(asyncio.CancelledError, ExactFailure):
            await work
        raise ClientGone("the client closed the connection")
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, ExactFailure):
                await work


def _exact_digest(bundle: Bundle) -> str:
    return str(bundle.manifest["files"][exact_file(bundle.manifest)]["sha256"])


def _mergeable(bundle: Bundle) -> bool:
    try:
        return get_method(bundle.method).batch_independent_exact
    except ValueError:  # the runtime reports the unknown method
        return False
