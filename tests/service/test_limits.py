"""Backpressure: body limits and the exact-mode gate."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from servicetest import assert_error, wait_for

from service import limits
from service.config import Settings
from service.errors import Overloaded
from service.limits import EXACT_THREAD_NICENESS, ExactGate, RowBudget


def test_exact_gate_refuses_at_once_when_full() -> None:
    rejected: list[int] = []
    gate = ExactGate(2, retry_after=3, on_reject=lambda: rejected.append(1))
    release = threading.Event()

    async def scenario() -> None:
        running = [asyncio.create_task(gate.run(release.wait)) for _ in range(2)]
        try:
            await asyncio.sleep(0.05)
            assert gate.in_flight == 2
            with pytest.raises(Overloaded) as info:
                await gate.run(lambda: None)
            assert info.value.retry_after == 3
        finally:  # a failed assertion must fail the test, not leave the pool blocked
            release.set()
        await asyncio.gather(*running)
        assert gate.in_flight == 0
        assert await gate.run(lambda: 42) == 42

    try:
        asyncio.run(scenario())
    finally:
        gate.shutdown()
    assert rejected == [1]


def test_exact_gate_threads_run_below_the_process_priority() -> None:
    gate = ExactGate(1, retry_after=1, on_reject=lambda: None)

    def own_niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    try:
        mine = own_niceness()
        assert asyncio.run(gate.run(own_niceness)) == min(19, mine + EXACT_THREAD_NICENESS)
        assert own_niceness() == mine  # the caller's thread is untouched
    finally:
        gate.shutdown()


def test_row_budget_admits_until_full_then_refuses_at_once() -> None:
    rejected: list[str] = []
    budget = RowBudget(max_rows=100, max_requests=2, retry_after=2, on_reject=rejected.append)
    with budget.request(), budget.request():
        with pytest.raises(Overloaded, match="2 /embed requests") as info, budget.request():
            pass
        assert info.value.retry_after == 2
    with budget.rows(60):
        with (
            budget.rows(40),  # exactly full
            pytest.raises(Overloaded, match="100 rows are being embedded"),
            budget.rows(1),
        ):
            pass
        with pytest.raises(Overloaded, match="60 rows"), budget.rows(41):
            pass
    with budget.rows(500):  # one batch alone is always admitted
        assert budget.rows_in_flight == 500
    assert (budget.rows_in_flight, budget.requests_in_flight) == (0, 0)
    assert rejected == ["requests", "rows", "rows"]


def test_inflight_rows_not_below_the_batch_limit() -> None:
    with pytest.raises(ValueError, match="MBN_MAX_INFLIGHT_ROWS"):
        Settings(max_inflight_rows=10, max_rows_per_request=100)


def test_declared_body_size_is_checked_before_reading(api: Callable[..., TestClient]) -> None:
    client = api(max_body_bytes=2048)
    response = client.post(
        "/embed", content=b"x" * 4096, headers={"content-type": "application/json"}
    )
    assert_error(response, 413, "payload_too_large")


def test_streamed_body_size_is_checked_while_reading(api: Callable[..., TestClient]) -> None:
    client = api(max_body_bytes=2048)

    def chunks():  # no Content-Length: chunked transfer
        for _ in range(8):
            yield b"[" * 512

    response = client.post("/embed", content=chunks(), headers={"content-type": "application/json"})
    assert_error(response, 413, "payload_too_large")


def test_training_uploads_get_their_own_limit(api: Callable[..., TestClient]) -> None:
    client = api(max_body_bytes=2048, max_upload_bytes=8192)
    rows = [[float(i), 1.0] for i in range(200)]  # about 2.4 kB of JSON, 1.8 kB as CSV
    csv = "\n".join(f"{a},{b}" for a, b in rows).encode()
    assert client.post("/train", files={"file": ("d.csv", csv)}).status_code == 202
    assert_error(client.post("/train", files={"file": ("d.csv", csv * 6)}), 413)
    # JSON rows become Python objects first: they are held to the body limit.
    assert_error(client.post("/train", json={"data": rows}), 413)
    assert_error(client.post("/embed", json={"inputs": rows}), 413)


@pytest.mark.slow
def test_overload_over_http(api: Callable[..., TestClient]) -> None:
    """With one exact slot, concurrent exact requests beyond it get 429 at once, and the
    fast path keeps answering meanwhile."""
    client = api(max_concurrent_exact=1, max_rows_per_request=4096)
    gate = client.app.state.exact_gate  # type: ignore[attr-defined]
    release = threading.Event()
    portal = client.portal  # type: ignore[attr-defined]
    # Occupy the only slot with a computation that waits for us.
    blocker = portal.start_task_soon(gate.run, release.wait)
    try:
        for _ in range(50):
            if gate.in_flight:
                break
            threading.Event().wait(0.01)
        response = client.post("/embed", json={"inputs": [[0.0] * 64], "mode": "exact"})
        assert_error(response, 429, "overloaded")
        assert response.headers["retry-after"] == "1"
        assert client.post("/embed", json={"inputs": [[0.0] * 64]}).status_code == 200
    finally:
        release.set()
        blocker.result(timeout=10)
    ok = client.post("/embed", json={"inputs": [[0.0] * 64], "mode": "exact"})
    assert ok.status_code == 200
    assert "mbn_rejected_total" in client.get("/metrics").text


def test_readiness_is_503_while_every_embed_slot_stays_taken(
    api: Callable[..., TestClient],
) -> None:
    """Readiness said 200 while every /embed was refused: a replica that refuses all new
    work is not ready for more of it."""
    client = api(max_inflight_requests=2, saturated_after_seconds=0.2)
    wait_for(lambda: client.get("/health/ready").status_code == 200, 30, "ready")
    budget = client.app.state.row_budget  # type: ignore[attr-defined]
    with budget.request(), budget.request():  # both slots held, as by two long requests
        assert_error(client.post("/embed", json={"inputs": [[0.0] * 64]}), 429)
        answer = wait_for(
            lambda: (r := client.get("/health/ready")).status_code == 503 and r, 30, "503"
        )
        message = assert_error(answer, 503)["message"]
        assert "MBN_MAX_INFLIGHT_REQUESTS=2" in message
    wait_for(lambda: client.get("/health/ready").status_code == 200, 30, "ready again")


def test_a_body_is_read_before_it_takes_a_slot(api: Callable[..., TestClient]) -> None:
    """The in-flight slot is taken once the body is in: a request whose body is still
    arriving holds no slot, so one slot serves the next complete request."""
    client = api(max_inflight_requests=1)
    budget = client.app.state.row_budget  # type: ignore[attr-defined]
    taken: list[int] = []
    original = budget.request

    def watching_request():  # type: ignore[no-untyped-def]
        taken.append(budget.buffered_bytes)  # bytes still held at the moment of admission
        return original()

    budget.request = watching_request
    body = b'{"inputs": [' + b",".join([b"[" + b"0.5," * 63 + b"0.5]"] * 50) + b"]}"

    def chunks():  # type: ignore[no-untyped-def]
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    answer = client.post("/embed", content=chunks(), headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert taken == [len(body)]  # admitted with the whole body read, not before
    assert budget.buffered_bytes == 0


def test_bodies_being_read_are_bounded_in_bytes(api: Callable[..., TestClient]) -> None:
    client = api(max_body_bytes=4096, max_buffered_body_bytes=4096)
    budget = client.app.state.row_budget  # type: ignore[attr-defined]
    with budget.buffering() as earlier:
        asyncio.run(earlier.add(b" " * 4000))  # an earlier body's bytes, still arriving
        answer = client.post("/embed", json={"inputs": [[0.0] * 64]})
    assert_error(answer, 429, "overloaded")
    assert budget.buffered_bytes == 0
    assert client.post("/embed", json={"inputs": [[0.0] * 64]}).status_code == 200


def _budget(max_buffered_bytes: int) -> RowBudget:
    return RowBudget(
        max_rows=10,
        max_requests=1,
        retry_after=1,
        on_reject=lambda _: None,
        threads=1,
        max_buffered_bytes=max_buffered_bytes,
    )


def test_a_body_being_read_takes_the_room_of_one_that_came_after_it() -> None:
    """At the bound, the later body is refused, not the one nearly in: the chunks of both
    arrive interleaved, and whichever chunk came at the bound used to be refused (under
    load, often the earlier body's)."""
    budget = _budget(100)

    async def interleaved() -> tuple[bytes, BaseException | None]:
        with budget.buffering() as first, budget.buffering() as later:
            await first.add(b"a" * 70)
            await later.add(b"b" * 30)  # the bound reached
            await first.add(b"a" * 30)  # the earlier body's last chunk still fits
            assert budget.buffered_bytes == 100
            try:
                await later.add(b"b")
            except Overloaded as error:
                refused: BaseException | None = error
            else:
                refused = None
            return first.take(), refused

    body, refused = asyncio.run(interleaved())
    assert body == b"a" * 100
    assert isinstance(refused, Overloaded) and refused.retry_after == 1
    assert budget.buffered_bytes == 0
    budget.shutdown()


def test_a_later_body_cannot_take_the_room_of_earlier_ones() -> None:
    budget = _budget(100)

    async def later_refused() -> None:
        with budget.buffering() as first, budget.buffering() as later:
            await first.add(b"a" * 90)
            with pytest.raises(Overloaded):
                await later.add(b"b" * 20)
            assert budget.buffered_bytes == 90  # the refused body's bytes are not counted

    asyncio.run(later_refused())
    assert budget.buffered_bytes == 0
    budget.shutdown()


def test_a_body_being_read_waits_for_the_room_of_bodies_worked_on() -> None:
    """A later body whose reading ended first is worked on, and its bytes stay counted
    until it is answered: an earlier body's chunk waits for them instead of being refused."""
    budget = _budget(100)

    async def wait_for_work() -> bytes:
        with budget.buffering() as first:
            await first.add(b"a" * 60)
            with budget.buffering() as later:
                await later.add(b"b" * 40)
                assert later.take() == b"b" * 40  # complete: worked on from here
                waiting = asyncio.create_task(first.add(b"a" * 40))
                await asyncio.sleep(0.05)
                assert not waiting.done()  # no room yet, and not refused
            await waiting  # the work ended: room
            return first.take()

    assert asyncio.run(wait_for_work()) == b"a" * 100
    assert budget.buffered_bytes == 0
    budget.shutdown()


def test_a_body_waiting_for_room_is_refused_when_the_work_does_not_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "ROOM_WAIT_SECONDS", 0.1)
    budget = _budget(100)

    async def work_never_ends() -> None:
        with budget.buffering() as first, budget.buffering() as worked_on:
            await first.add(b"a" * 60)
            await worked_on.add(b"b" * 40)
            worked_on.take()
            with pytest.raises(Overloaded):
                await first.add(b"a" * 40)

    asyncio.run(work_never_ends())
    assert budget.buffered_bytes == 0
    budget.shutdown()
