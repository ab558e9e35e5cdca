"""Admission of /embed work: the in-flight bounds (``service.admission``)."""

from __future__ import annotations

import asyncio

import pytest

from service import admission
from service.admission import RowBudget
from service.domain import Overloaded


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


def test_a_request_waiting_on_the_exact_runtime_leaves_its_slot_to_others() -> None:
    budget = RowBudget(max_rows=100, max_requests=1, retry_after=1, on_reject=lambda _: None)
    with budget.request():
        assert budget.full_since is not None  # every slot taken, since then
        with budget.waiting_elsewhere():
            assert budget.full_since is None and budget.saturated_for() == 0.0
            with budget.request():  # another request takes the slot meanwhile
                pass
        assert budget.requests_in_flight == 1 and budget.full_since is not None
        with pytest.raises(Overloaded), budget.request():
            pass
    assert budget.requests_in_flight == 0 and budget.saturated_for() == 0.0


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
    monkeypatch.setattr(admission, "ROOM_WAIT_SECONDS", 0.1)
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
