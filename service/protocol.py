"""The HTTP/1.1 connection of ``mbn serve``: uvicorn's httptools protocol, guarded.

Before a request reaches the application, uvicorn parses its line and headers with no bound on
their size or on how long they take: one 40 MB header took seconds of the event loop (httptools
joins a header's pieces as they arrive), and a client sending its headers a byte at a time held
its connection for as long as it liked. Here, as nginx's ``large_client_header_buffers`` and
``client_header_timeout`` do:

- the request line and headers are counted as their bytes arrive, before they are parsed, each
  request's apart (requests pipelined in one write are each held to the limit); past
  ``max_head_bytes`` the client gets 431 and the connection is closed;
- they must be complete within ``head_timeout`` seconds of their first byte (408, closed);
- a request the parser refuses (malformed line or header, Content-Length with
  Transfer-Encoding...) is answered in the service's JSON error shape, not uvicorn's plain text.

uvicorn builds one protocol object per connection from the class, so the limits are the
class's: ``configure`` sets them in the serving process (``service.main``) before it accepts
connections.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from service.errors import error_body

log = logging.getLogger(__name__)


def error_bytes(status: int, error_type: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer in the service's error shape, closing the connection."""
    body = json.dumps(error_body(error_type, message)).encode()
    return b"".join(
        (
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        )
    )


# After a refused head, how long and how many bytes of the client's are read and dropped
# before the connection is closed (the lingering close).
LINGER_SECONDS = 2.0
LINGER_BYTES = 64 << 20


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounded request heads (see the module docstring)."""

    max_head_bytes = 32 * 1024
    head_timeout = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # reading a request line and headers (not a body)
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._discarding = 0  # bytes dropped after a refusal (lingering close)
        # A refusal waiting for the answers to requests pipelined before it.
        self._pending_refusal: tuple[int, str, str] | None = None

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            self._discarding += len(data)
            if self._discarding > LINGER_BYTES:
                self.transport.close()
            return
        if self.transport.is_closing():
            return
        while data:
            if not self._in_head:
                # A body: the parser knows its length, and what follows it in this chunk
                # (at most one read of the socket) is the next request's head.
                super().data_received(data)
                return
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(self.head_timeout, self._head_too_slow)
            # One head at a time: requests pipelined in one write are each held to the limit
            # (a piece ends where a head ends, or where the room does).
            room = self.max_head_bytes - self._head_bytes
            end = data.find(b"\r\n\r\n", 0, room)
            piece = data[: end + 4] if end >= 0 else data[:room]
            self._head_bytes += len(piece)
            super().data_received(piece)
            data = data[len(piece) :]
            if self.transport.is_closing():
                return
            if end < 0 and self._in_head and self._head_bytes >= self.max_head_bytes:
                self._refuse(
                    431,
                    "headers_too_large",
                    f"the request line and headers are over {self.max_head_bytes} bytes",
                )
                return

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # The next bytes on this connection begin the next request's head.
        self._in_head = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self._cancel_head_timer()
        if self.transport.is_closing():
            return
        self.transport.write(
            error_bytes(400, "bad_request", "malformed HTTP request; it was not read")
        )
        self.transport.close()

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self._in_head and self._head_bytes:
            self._refuse(
                408,
                "request_timeout",
                f"the request line and headers did not arrive within {self.head_timeout:g} s",
            )

    def _refuse(self, status: int, error_type: str, message: str) -> None:
        """Answer and close; a client still sending is read (and dropped) for a while
        first, as nginx's lingering close does: closing with its bytes unread makes the
        kernel reset the connection, which can destroy the answer before it is read. Requests
        pipelined before the refused one are answered first, in order."""
        self._cancel_head_timer()
        log.info("refused a request head: %s", message)
        if self.transport.is_closing():
            return
        self._discarding = 1  # nothing more of this connection is parsed
        if self._answers_pending():
            self._pending_refusal = (status, error_type, message)
            return
        self._answer_refusal(status, error_type, message)

    def _answers_pending(self) -> bool:
        return bool(self.pipeline) or (self.cycle is not None and not self.cycle.response_complete)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._pending_refusal is not None and not self._answers_pending():
            refusal, self._pending_refusal = self._pending_refusal, None
            if not self.transport.is_closing():
                self._answer_refusal(*refusal)

    def _answer_refusal(self, status: int, error_type: str, message: str) -> None:
        self.transport.write(error_bytes(status, error_type, message))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None


def configure(*, max_head_bytes: int, head_timeout: float) -> None:
    """Set the limits of every connection this process accepts from now on."""
    GuardedHttpProtocol.max_head_bytes = max_head_bytes
    GuardedHttpProtocol.head_timeout = head_timeout
