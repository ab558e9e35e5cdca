"""The exact runtime's queue and batcher (``service.exact.batching``): bounds, fair shares,
priorities, the adaptive wait, cancellation and deadlines, with a clock the test moves."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from service.exact.batching import SPLIT_ROWS, ExactQueue, Job, QueueFull, Step
from service.exact.wire import BACKGROUND, CLIENT

DIM = 3


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def queue(clock: Clock, **overrides: object) -> ExactQueue:
    values: dict[str, object] = {
        "max_requests": 8,
        "max_rows": 1000,
        "batch_rows": 16,
        "background_rows": 4,
        "max_wait": 0.005,
        "clock": clock,
    }
    values.update(overrides)
    return ExactQueue(**values)  # type: ignore[arg-type]


def job(clock: Clock, request_id: int, n: int, **fields: object) -> Job:
    values: dict[str, object] = {
        "owner": "api",
        "request_id": request_id,
        "model": "m",
        "priority": CLIENT,
        # Row i of request r holds r * 1000 + i: which rows a step took is readable.
        "rows": (request_id * 1000 + np.arange(n, dtype=np.float32))[:, None].repeat(DIM, 1),
        "deadline": clock.now + 60,
        "arrived": clock.now,
    }
    values.update(fields)
    return Job(**values)  # type: ignore[arg-type]


def taken(step: Step) -> list[tuple[int, int, int]]:
    return [(part.request_id, start, stop) for part, start, stop in step.parts]


def test_bounds_refuse_at_once_and_a_request_alone_always_fits() -> None:
    clock = Clock()
    q = queue(clock, max_requests=2, max_rows=10)
    q.submit(job(clock, 1, 50))  # alone: admitted although over the row bound
    with pytest.raises(QueueFull, match="50 exact-mode rows"):
        q.submit(job(clock, 2, 1))
    assert q.cancel("api", 1) is not None
    q.submit(job(clock, 2, 6))
    q.submit(job(clock, 3, 4))
    with pytest.raises(QueueFull, match="2 exact-mode requests"):
        q.submit(job(clock, 4, 1))
    # The background has a bound of its own: clients are never refused because of it.
    for i in range(4):
        q.submit(job(clock, 10 + i, 1, priority=BACKGROUND))
    with pytest.raises(QueueFull, match="background"):
        q.submit(job(clock, 20, 1, priority=BACKGROUND))


def test_a_step_shares_rows_fairly_and_splits_large_requests() -> None:
    clock = Clock()
    q = queue(clock)
    q.submit(job(clock, 1, 100))  # a large request first
    q.submit(job(clock, 2, 1))
    q.submit(job(clock, 3, 3))
    step = q.next_step(timeout=0)
    assert step is not None
    # Equal shares (16 // 3 = 5 each, the small ones whole), then the rest to the oldest.
    assert taken(step) == [(1, 0, 12), (2, 0, 1), (3, 0, 3)]
    np.testing.assert_array_equal(step.rows[:, 0], [*range(1000, 1012), 2000, 3000, 3001, 3002])
    done = q.finish(step, 0.01)
    assert [j.request_id for j in done] == [2, 3]  # answered after one step
    # The large one goes on; a small one arriving meanwhile shares the very next step.
    q.submit(job(clock, 4, 2))
    step = q.next_step(timeout=0)
    assert step is not None and taken(step) == [(1, 12, 26), (4, 0, 2)]


def test_models_are_never_mixed_and_the_oldest_request_picks_the_model() -> None:
    clock = Clock()
    q = queue(clock)
    q.submit(job(clock, 1, 2, model="a"))
    q.submit(job(clock, 2, 2, model="b"))
    q.submit(job(clock, 3, 2, model="a"))
    step = q.next_step(timeout=0)
    assert step is not None and step.model == "a" and taken(step) == [(1, 0, 2), (3, 0, 2)]
    q.finish(step, 0.0)
    step = q.next_step(timeout=0)
    assert step is not None and step.model == "b"


def test_background_rows_wait_for_every_client_row_and_come_in_short_steps() -> None:
    clock = Clock()
    q = queue(clock)
    q.submit(job(clock, 1, 10, priority=BACKGROUND))
    q.submit(job(clock, 2, 1))
    step = q.next_step(timeout=0)
    assert step is not None and taken(step) == [(2, 0, 1)]
    q.finish(step, 0.0)
    step = q.next_step(timeout=0)
    assert step is not None and step.priority == BACKGROUND and taken(step) == [(1, 0, 4)]
    q.submit(job(clock, 3, 1))  # a client arrives while a background step computes
    q.finish(step, 0.0)
    step = q.next_step(timeout=0)
    assert step is not None and taken(step) == [(3, 0, 1)]


def test_requests_that_may_not_share_are_computed_alone_and_whole() -> None:
    clock = Clock()
    q = queue(clock, batch_rows=4)
    q.submit(job(clock, 1, 10, mergeable=False))
    q.submit(job(clock, 2, 1))
    step = q.next_step(timeout=0)
    assert step is not None and taken(step) == [(1, 0, 10)]  # past batch_rows, in one call
    q.finish(step, 0.0)
    q.submit(job(clock, 3, 1, mergeable=False))
    step = q.next_step(timeout=0)
    assert step is not None and taken(step) == [(2, 0, 1)]  # never with request 3


def test_the_wait_adapts_to_how_many_requests_the_last_step_answered() -> None:
    clock = Clock()
    q = queue(clock)
    for i in range(3):
        q.submit(job(clock, i, 1))
    step = q.next_step(timeout=0)
    assert step is not None and len(step.parts) == 3
    q.finish(step, 0.2)  # three answered by a step of 200 ms: their clients send again soon
    q.submit(job(clock, 10, 1))
    assert q.next_step(timeout=0) is None  # waits for more, up to 5 ms
    clock.now += 0.004
    q.submit(job(clock, 11, 1))
    assert q.next_step(timeout=0) is None
    clock.now += 0.001  # the first waited max_wait: go with what is there
    step = q.next_step(timeout=0)
    assert step is not None and taken(step) == [(10, 0, 1), (11, 0, 1)]
    q.finish(step, 0.2)
    for i in (20, 21):  # as many as the last step answered: no wait at all
        q.submit(job(clock, i, 1))
    step = q.next_step(timeout=0)
    assert step is not None and len(step.parts) == 2
    q.finish(step, 0.2)
    q.submit(job(clock, 30, 1))
    assert q.next_step(timeout=0) is None
    clock.now += 0.005
    step = q.next_step(timeout=0)
    assert step is not None
    q.finish(step, 0.2)
    # After a step that answered one request, a lone client never waits.
    q.submit(job(clock, 31, 1))
    assert q.next_step(timeout=0) is not None


def test_clients_taking_turns_in_two_cohorts_merge_into_one_step() -> None:
    # 8 closed-loop clients, 4 computing while the other 4 wait: the step that ends waits
    # (from its end, at most max_wait) for its own 4 to send again, and takes all 8.
    clock = Clock()
    q = queue(clock, max_wait=0.05)
    for i in range(4):
        q.submit(job(clock, i, 1))
    step = q.next_step(timeout=0)
    assert step is not None and len(step.parts) == 4
    clock.now += 0.5
    for i in range(4, 8):
        q.submit(job(clock, i, 1))  # arrived while the step computed
    q.finish(step, 0.5)
    assert q.next_step(timeout=0) is None  # 4 waiting, 8 expected
    clock.now += 0.01
    for i in range(10, 14):
        q.submit(job(clock, i, 1))  # the answered clients again
    step = q.next_step(timeout=0)
    assert step is not None and len(step.parts) == 8
    # When they do not come back within max_wait of the step's end, the step goes without.
    clock.now += 0.5
    q.finish(step, 0.5)
    q.submit(job(clock, 20, 1))
    assert q.next_step(timeout=0) is None
    clock.now += 0.05
    step = q.next_step(timeout=0)
    assert step is not None and taken(step) == [(20, 0, 1)]


def test_the_wait_is_a_tenth_of_a_step_at_most() -> None:
    clock = Clock()
    q = queue(clock, max_wait=1.0)
    for i in range(2):
        q.submit(job(clock, i, 1))
    step = q.next_step(timeout=0)
    assert step is not None
    q.finish(step, 0.01)  # a 10 ms step: at most 1 ms of waiting
    q.submit(job(clock, 5, 1))
    assert q.next_step(timeout=0) is None
    clock.now += 0.001
    assert q.next_step(timeout=0) is not None


def test_cancelled_rows_leave_the_queue_and_free_their_room() -> None:
    clock = Clock()
    q = queue(clock, max_requests=3, max_rows=300, batch_rows=8)
    for i in range(3):
        q.submit(job(clock, i, 100))
    step = q.next_step(timeout=0)
    assert step is not None and {part.request_id for part, _, _ in step.parts} == {0, 1, 2}
    for i in range(3):  # their clients leave while the step computes
        assert q.cancel("api", i) is not None
    assert step.abandoned
    assert q.depth() == (0, 0, 8)
    q.submit(job(clock, 9, 1))  # room again at once
    assert q.finish(step, 0.1) == []  # computed, thrown away: nobody is answered
    step = q.next_step(timeout=0)
    assert step is not None and taken(step) == [(9, 0, 1)]
    assert q.cancel("api", 12345) is None


def test_a_connection_that_closes_cancels_its_requests() -> None:
    clock = Clock()
    q = queue(clock)
    q.submit(job(clock, 1, 2, owner="a"))
    q.submit(job(clock, 1, 2, owner="b"))  # the same id on another connection
    assert [j.owner for j in q.cancel_owner("a")] == ["a"]
    step = q.next_step(timeout=0)
    assert step is not None and [p.owner for p, _, _ in step.parts] == ["b"]


def test_requests_past_their_deadline_are_dropped_and_handed_back() -> None:
    clock = Clock()
    q = queue(clock)
    q.submit(job(clock, 1, 2, deadline=clock.now + 1))
    q.submit(job(clock, 2, 2, deadline=clock.now + 10))
    clock.now += 2
    assert q.next_step(timeout=0) is None  # expired jobs are answered first
    assert [j.request_id for j in q.take_expired()] == [1]
    step = q.next_step(timeout=0)
    assert step is not None and taken(step) == [(2, 0, 2)]


def test_a_failed_step_hands_back_its_requests_once() -> None:
    clock = Clock()
    q = queue(clock)
    q.submit(job(clock, 1, 2))
    q.submit(job(clock, 2, 2, model="other"))
    q.submit(job(clock, 3, 2))
    step = q.next_step(timeout=0)
    assert step is not None
    assert sorted(j.request_id for j in q.abort(step)) == [1, 3]
    assert [j.request_id for j in q.cancel_model("other")] == [2]
    assert q.depth() == (0, 0, 0)


def test_close_hands_back_every_request_and_refuses_new_ones() -> None:
    clock = Clock()
    q = queue(clock)
    q.submit(job(clock, 1, 2))
    assert [j.request_id for j in q.close()] == [1]
    assert q.next_step(timeout=0) is None
    with pytest.raises(QueueFull, match="stopping"):
        q.submit(job(clock, 2, 1))


# --- several lanes ----------------------------------------------------------------------------


def test_idle_lanes_split_the_waiting_rows_and_compute_at_once() -> None:
    # 16 one-row requests and two idle lanes: two steps of 8 computed side by side, not one
    # step of 16 while the other lane idles.
    clock = Clock()
    q = queue(clock, max_requests=64, lanes=2)
    for i in range(16):
        q.submit(job(clock, i, 1))
    first = q.next_step(timeout=0)
    second = q.next_step(timeout=0)
    assert first is not None and second is not None
    assert taken(first) == [(i, 0, 1) for i in range(8)]
    assert taken(second) == [(i, 0, 1) for i in range(8, 16)]
    assert q.running() == 2 and q.depth() == (16, 0, 16)
    assert q.next_step(timeout=0) is None  # nothing left for a third
    # One lane alone takes them all, as before.
    q = queue(clock, max_requests=64)
    for i in range(16):
        q.submit(job(clock, i, 1))
    step = q.next_step(timeout=0)
    assert step is not None and len(step.parts) == 16


def test_a_busy_lane_leaves_the_whole_share_to_the_idle_one() -> None:
    clock = Clock()
    q = queue(clock, lanes=2, batch_rows=256, max_requests=64)
    q.submit(job(clock, 1, 300))  # a large request: split evenly over both lanes
    first, second = q.next_step(timeout=0), q.next_step(timeout=0)
    assert first is not None and second is not None
    assert taken(first) == [(1, 0, 150)] and taken(second) == [(1, 150, 300)]
    q.finish(first, 0.1)
    for i in range(10, 20):  # while the other lane computes, this one takes them all
        q.submit(job(clock, i, 1))
    step = q.next_step(timeout=0)
    assert step is not None and len(step.parts) == 10
    q.finish(second, 0.1)
    q.finish(step, 0.1)
    assert q.running() == 0 and q.depth() == (0, 0, 0)
    # Three lanes: 26 rows make 9, 9 and 8; a step never takes more than batch_rows.
    for batch_rows, rows, sizes in ((16, 26, [9, 9, 8]), (2, 26, [2, 2, 2]), (16, 17, [9, 8])):
        q = queue(clock, lanes=3, batch_rows=batch_rows)
        q.submit(job(clock, 1, rows))
        steps = [q.next_step(timeout=0) for _ in range(len(sizes))]
        assert [len(step.rows) for step in steps if step] == sizes


def test_idle_lanes_are_given_no_share_smaller_than_split_rows() -> None:
    # A row costs more in a smaller call: fewer rows than two shares of SPLIT_ROWS stay one
    # step, and the other lane stays idle (its core left to the API processes).
    clock = Clock()
    q = queue(clock, lanes=2)
    assert SPLIT_ROWS == 8
    for rows in (2, 15):
        q.submit(job(clock, rows, rows))
        step = q.next_step(timeout=0)
        assert step is not None and len(step.rows) == rows
        assert q.next_step(timeout=0) is None
        q.finish(step, 0.0)
    q.submit(job(clock, 1, 1))
    q.submit(job(clock, 2, 1))
    step = q.next_step(timeout=0)
    assert step is not None and taken(step) == [(1, 0, 1), (2, 0, 1)]


def test_a_step_takes_no_more_rows_than_its_bound_when_many_requests_wait() -> None:
    clock = Clock()
    q = queue(clock, batch_rows=4)
    for i in range(6):
        q.submit(job(clock, i, 1))
    step = q.next_step(timeout=0)
    assert step is not None and taken(step) == [(i, 0, 1) for i in range(4)]  # the oldest


def test_lone_clients_never_wait_with_several_lanes() -> None:
    clock = Clock()
    q = queue(clock, lanes=2, max_wait=1.0)
    q.submit(job(clock, 1, 1))
    a = q.next_step(timeout=0)
    q.submit(job(clock, 2, 1))
    b = q.next_step(timeout=0)  # one client on each lane
    assert a is not None and b is not None and taken(a) == [(1, 0, 1)]
    for round_ in range(3):
        clock.now += 1.0
        q.finish(a, 1.0)
        q.submit(job(clock, 10 + round_, 1))  # its client again: taken at once
        a = q.next_step(timeout=0)
        assert a is not None and taken(a) == [(10 + round_, 0, 1)]
        clock.now += 0.5
        q.finish(b, 1.0)
        q.submit(job(clock, 20 + round_, 1))
        b = q.next_step(timeout=0)
        assert b is not None and taken(b) == [(20 + round_, 0, 1)]
    # A lone client's 16-row requests are split over both lanes, and never wait.
    q = queue(clock, lanes=2, max_wait=1.0)
    for request in range(30, 33):
        q.submit(job(clock, request, 16))
        a, b = q.next_step(timeout=0), q.next_step(timeout=0)
        assert a is not None and b is not None
        assert taken(a) == [(request, 0, 8)] and taken(b) == [(request, 8, 16)]
        clock.now += 1.0
        assert q.finish(a, 1.0) == []
        assert q.finish(b, 1.0)[0].request_id == request


def test_two_lanes_cohorts_merge_then_split_among_the_idle_lanes() -> None:
    # Two lanes of 8 closed-loop clients each. The answers of both steps are expected back
    # (the second lane's end adds its 8 to the first's): the step waits for all 16, then the
    # two lanes take 8 each.
    clock = Clock()
    q = queue(clock, lanes=2, max_requests=64, max_wait=0.05)
    for i in range(16):
        q.submit(job(clock, i, 1))
    a, b = q.next_step(timeout=0), q.next_step(timeout=0)
    assert a is not None and b is not None
    clock.now += 0.5
    q.finish(a, 0.5)
    for i in range(100, 103):  # 3 of the first lane's clients are back
        q.submit(job(clock, i, 1))
    assert q.next_step(timeout=0) is None  # 3 waiting, 8 expected
    clock.now += 0.001
    q.finish(b, 0.5)
    for i in range(103, 108):  # the first lane's other 5
        q.submit(job(clock, i, 1))
    assert q.next_step(timeout=0) is None  # 8 waiting, 16 expected
    clock.now += 0.001
    for i in range(108, 116):
        q.submit(job(clock, i, 1))
    a, b = q.next_step(timeout=0), q.next_step(timeout=0)
    assert a is not None and b is not None  # the second lane takes the rest without waiting
    assert len(a.parts) == 8 and len(b.parts) == 8
    # When fewer come back than expected, the wait runs out and what is there is split.
    clock.now += 0.5
    q.finish(a, 0.5)
    q.finish(b, 0.5)
    for i in range(200, 206):
        q.submit(job(clock, i, 1))
    assert q.next_step(timeout=0) is None
    clock.now += 0.05
    a = q.next_step(timeout=0)
    assert a is not None and len(a.parts) == 6  # too few rows to split
    # ... and the rest of the expectation is forgotten: a late one is taken at once.
    q.submit(job(clock, 300, 1))
    step = q.next_step(timeout=0)
    assert step is not None and taken(step) == [(300, 0, 1)]


def test_a_step_aborted_after_its_finish_frees_its_lane_once() -> None:
    clock = Clock()
    q = queue(clock, lanes=2)
    q.submit(job(clock, 1, 16))
    a, b = q.next_step(timeout=0), q.next_step(timeout=0)
    assert a is not None and b is not None and q.running() == 2
    q.finish(a, 0.1)
    q.abort(a)  # answering failed after the finish (the runtime aborts the step again)
    assert q.running() == 1 and q.depth() == (0, 0, 8)
    q.abort(b)
    assert q.running() == 0 and q.depth() == (0, 0, 0)


def test_an_idle_lane_is_woken_for_the_rest_of_a_split_step() -> None:
    # Two lane threads sleep in next_step while a cohort of 16 gathers (the wait for the
    # requests a step answered); the one woken when the 16th arrives takes 8 and wakes the
    # other for the other 8, long before the wait would have ended.
    q = ExactQueue(max_requests=64, max_rows=1000, batch_rows=16, max_wait=5.0, lanes=2)
    clock = Clock()
    clock.now = time.monotonic()
    for i in range(16):
        q.submit(job(clock, i, 1))
    first, second = q.next_step(timeout=0), q.next_step(timeout=0)
    assert first is not None and second is not None
    q.finish(first, 60.0)  # 8 answered by a long step each: 16 expected, a wait of 5 s
    q.finish(second, 60.0)
    steps: list[Step] = []

    def lane() -> None:
        step = q.next_step(timeout=10)
        if step is not None:
            steps.append(step)

    threads = [threading.Thread(target=lane) for _ in range(2)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    for i in range(100, 116):
        if i == 115:  # both asleep in next_step again (on a busy machine the test is weaker)
            time.sleep(0.3)
        clock.now = time.monotonic()
        q.submit(job(clock, i, 1))  # wakes one lane
    for thread in threads:
        thread.join(timeout=10)
    assert time.monotonic() - started < 2.5
    assert sorted(len(step.parts) for step in steps) == [8, 8]
