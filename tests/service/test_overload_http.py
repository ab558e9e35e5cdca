"""Backpressure over real HTTP (uvicorn): what a refused client receives, and the CPU
priority of the threads that do the work."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from servicetest import Process, Server, read_answer, wait_for

from service.admission import FAST_THREAD_NICENESS, RowBudget

# Slow: uvicorn servers pushed into backpressure.
pytestmark = pytest.mark.slow

KEY = "a-key-of-twenty-characters"
BIG = b"[" + b"0," * (4 << 20) + b"0]"  # 8 MiB: more than the socket buffers hold
HELD = 16 << 20  # the bytes of /embed bodies the server holds at once


@pytest.fixture
def one_request_server(tmp_path: Path, processes: list[Process]) -> Iterator[Server]:
    env = {
        "MBN_DATA_DIR": str(tmp_path),
        "MBN_DEMO_MODEL": "false",
        "MBN_EMBEDDED_WORKER": "false",
        "MBN_MAX_INFLIGHT_REQUESTS": "1",
        "MBN_MAX_BODY_BYTES": str(HELD),
        "MBN_MAX_BUFFERED_BODY_BYTES": str(HELD),
        "MBN_API_KEYS": KEY,
    }
    server = Server(env, tmp_path / "server.log")
    processes.append(server)
    yield server.start()


def _post_head(length: int, key: str | None = KEY) -> bytes:
    auth = b"Authorization: Bearer %s\r\n" % key.encode() if key else b""
    return (
        b"POST /embed HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\n%sContent-Length: %d\r\n\r\n" % (auth, length)
    )


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def test_a_refused_client_still_sending_its_body_reads_the_429(
    one_request_server: Server,
) -> None:
    """A refusal can come before the body is all read (here: the bytes of bodies held are
    at their bound). Closing the connection while the client is still sending would make
    the kernel reset it, and the client would see a broken connection instead of the 429:
    the server reads the rest of the body first. The held body, which came first, keeps its
    room: its last MiB is read and it is answered, not refused."""
    address = ("127.0.0.1", one_request_server.port)
    with socket.create_connection(address, timeout=30) as holder:
        # A body of HELD bytes, all but the last MiB sent: the server holds them.
        holder.sendall(_post_head(HELD) + b" " * (HELD - (1 << 20)))

        def refused() -> bool:
            with socket.create_connection(address, timeout=30) as probe:
                body = b" " * (2 << 20)
                probe.sendall(_post_head(len(body)) + body)
                return _status(read_answer(probe)) == 429

        wait_for(refused, 30, "the held body to fill the server's bound")

        with socket.create_connection(address, timeout=30) as sender:
            sender.sendall(_post_head(len(BIG)) + BIG)
            answer = read_answer(sender)
        assert _status(answer) == 429
        assert b"retry-after: " in answer.lower()

        holder.sendall(b" " * (1 << 20))
        assert _status(read_answer(holder)) != 429  # the held request itself was admitted


def test_a_body_declared_but_not_sent_holds_no_room(one_request_server: Server) -> None:
    """Nothing is reserved for bytes a client has not sent: a client promising a body of
    HELD bytes and sending none does not get others refused (it would take the room of
    MBN_MAX_BUFFERED_BODY_BYTES / MBN_MAX_BODY_BYTES such clients for as long as the
    body pace lets them wait)."""
    address = ("127.0.0.1", one_request_server.port)
    with socket.create_connection(address, timeout=30) as idle:
        idle.sendall(_post_head(HELD) + b" ")
        with socket.create_connection(address, timeout=30) as sender:
            body = b" " * (8 << 20)
            sender.sendall(_post_head(len(body)) + body)
            assert _status(read_answer(sender)) == 422  # read and worked on: not JSON


def test_any_answer_given_before_the_body_is_read_reaches_the_client(
    one_request_server: Server,
) -> None:
    """The same for a refusal from further in (the key is checked before the body is read)."""
    address = ("127.0.0.1", one_request_server.port)
    with socket.create_connection(address, timeout=30) as sender:
        sender.sendall(_post_head(len(BIG), key=None) + BIG)
        assert _status(read_answer(sender)) == 401


def test_work_threads_run_at_a_lower_priority_than_the_event_loop() -> None:
    budget = RowBudget(max_rows=10, max_requests=1, retry_after=1, on_reject=lambda _: None)
    loop_niceness = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def pool_niceness() -> int:
        return await budget.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    try:
        niceness = asyncio.run(pool_niceness())
    finally:
        budget.shutdown()
    assert niceness == min(19, loop_niceness + FAST_THREAD_NICENESS)


def test_start_up_takes_the_long_lived_objects_out_of_the_collectors_work(
    api: Callable[..., TestClient],
) -> None:
    """Full collections walked about 200,000 library objects and stopped every thread for
    100-200 ms at a time under load; frozen after the first scan, they are skipped."""
    gc.unfreeze()
    api()
    assert gc.get_freeze_count() > 50_000
