"""The exact runtime's queue and its adaptive batcher.

Requests wait in one queue per replica. Each of the runtime's ``lanes`` (compute threads) takes
a *step* at a time: rows of one model, from as many requests as fit under ``batch_rows``,
computed in one ``transform`` call and split back to their requests. Because ``transform`` of
a method that declares ``batch_independent_exact`` gives every row the same bits whatever rows
share its call, a request's answer is bit for bit what ``transform`` of that request alone
gives.

Which rows a step takes:

- **Priority.** Clients' requests first; the live monitor's rows (``BACKGROUND``) only when no
  client row waits, and in steps of their own, so a client's rows never wait for them beyond
  the one background step already running (kept short: ``background_rows``).
- **Model.** The model of the oldest waiting request of that priority.
- **Idle lanes share the work.** A client step takes only its lane's share of the waiting rows
  of its model, split among the idle lanes (this one included) into shares of at least
  ``SPLIT_ROWS``, at most ``batch_rows``; the next idle lane is woken for the rest. Sixteen
  one-row requests and two idle lanes make two steps of eight computed at once, not one of
  sixteen while the other lane idles (a row costs about the same in a call of eight as of
  sixteen); two one-row requests stay one step of two (a row costs more in a call of one).
- **Fair shares.** Each waiting request of that model gets an equal share of the step first,
  then what is left goes to the oldest (when more requests wait than the step has rows, the
  oldest get one row each). A large request is computed over several steps, interleaved with
  the small ones that arrive meanwhile: a one-row request waits for one step, never for a
  large request's whole computation (continuous batching, as text-generation servers do).
- **A short wait that adapts to load.** When a step answers several requests, their clients
  are likely to send again within a moment (closed-loop clients): the next step waits, up to
  ``max_wait`` after the last step ended (and at most a tenth of a step's duration), for the
  requests *expected*: those waiting when a step ends, plus those that step answered, plus
  those steps of other lanes answered whose clients have not sent again yet (each step taken
  counts its requests off; a wait that runs out forgets the rest). So clients that take turns
  in two cohorts (one computing while the other's answers travel) merge, and with several
  lanes the merged requests are then split among the idle ones. After a step that answered
  one request with none waiting or expected, nothing waits: a lone client never pays for
  batching.

Cancellation: a cancelled or expired request's waiting rows leave the queue at once and its
share of the bounds is freed; a running step whose every request is gone is abandoned by the
compute thread (``Step.wanted``), or, where the model cannot stop mid-call, computed and
thrown away. Everything here runs under one lock; idle lanes sleep on its condition.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np

from service.exact.wire import BACKGROUND, CLIENT

# The wait before a step is at most this share of the last step's duration: waiting longer
# would cost the requests already there more than batching saves them.
WAIT_SHARE_OF_STEP = 0.1
# Waiting rows are split among idle lanes only into shares of at least this many: a row costs
# less in a larger call up to about 8 rows (the small-batch kernel: 82 / 57 / 45 / 24 ms a row
# in calls of 1 / 2 / 4 / 8 on an MNIST model, 25 in 16), so smaller shares spend more CPU
# than they save in time, and take the core an idle lane leaves to the API processes.
SPLIT_ROWS = 8


class QueueFull(Exception):
    """The queue's bound is reached: refused at once (429)."""


@dataclass(eq=False)
class Job:
    """One request in the queue.

    Attributes
    ----------
    owner, request_id :
        Who asked (a connection) and its id for the request there.
    model : hashable
        Which exact model computes it.
    rows : ndarray of shape (n, dim), float32
    deadline : float
        ``time.monotonic()`` after which it is dropped unanswered.
    """

    owner: object
    request_id: int
    model: Hashable
    priority: int
    rows: np.ndarray
    deadline: float
    arrived: float
    # Whether its rows may share a step with other requests' and be split over several
    # steps (``Method.batch_independent_exact``); if not, it is computed alone, whole.
    mergeable: bool = True
    taken: int = 0  # rows handed to steps
    done: int = 0  # rows computed
    cancelled: bool = False
    first_step: float | None = None  # when its first rows went into a step
    compute: float = 0.0  # seconds of the steps its rows were in
    out: np.ndarray | None = None  # the raw embedding, filled step by step

    @property
    def n(self) -> int:
        return int(self.rows.shape[0])

    @property
    def waiting(self) -> int:
        """Rows not yet handed to a step."""
        return self.n - self.taken


@dataclass(eq=False)
class Step:
    """Rows of one model from one or more jobs: ``parts`` are (job, start, stop) slices of
    each job's rows, in the order of ``rows``."""

    model: Hashable
    priority: int
    parts: list[tuple[Job, int, int]]
    started: float = 0.0
    rows: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        pieces = [job.rows[start:stop] for job, start, stop in self.parts]
        self.rows = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    @property
    def jobs(self) -> list[Job]:
        return [job for job, _, _ in self.parts]

    @property
    def abandoned(self) -> bool:
        """Every job with rows in this step was cancelled: its result has no taker."""
        return all(job.cancelled for job, _, _ in self.parts)

    def wanted(self, now: float) -> bool:
        """Whether any job with rows in this step still waits for them (not cancelled, not
        past its deadline)."""
        return any(not job.cancelled and job.deadline > now for job, _, _ in self.parts)


class ExactQueue:
    """The queue of one runtime; see the module docstring.

    Parameters
    ----------
    max_requests, max_rows : int
        Clients' requests, and their rows, held at once (waiting or computing); one more is
        refused with ``QueueFull``.
    batch_rows : int
        Most rows in a step of clients' rows.
    background_rows : int
        Most rows in a step of background rows.
    max_background : int
        Background requests held at once (the monitor sends one batch at a time).
    max_wait : float
        Seconds a step may wait for more requests (0: never).
    lanes : int
        Compute threads taking steps from this queue: a client step takes its share of the
        waiting rows among the idle ones.
    clock : callable
        ``time.monotonic`` (tests pass their own).
    """

    def __init__(
        self,
        *,
        max_requests: int,
        max_rows: int,
        batch_rows: int,
        background_rows: int = 32,
        max_background: int = 4,
        max_wait: float = 0.05,
        lanes: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, not {lanes}")
        self.max_requests = max_requests
        self.max_rows = max_rows
        self.batch_rows = batch_rows
        self.background_rows = background_rows
        self.max_background = max_background
        self.max_wait = max_wait
        self.lanes = lanes
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # Jobs held, by priority, in arrival order (dicts: ordered, cheap removal).
        self._held: dict[int, dict[Job, None]] = {CLIENT: {}, BACKGROUND: {}}
        self._by_request: dict[tuple[object, int], Job] = {}
        self._client_rows = 0  # rows of held client jobs
        # Steps handed to lanes and not finished or aborted yet (a lane runs one at a time).
        self._running: dict[Step, None] = {}
        self._running_rows = 0
        self._expired: list[Job] = []
        self._closed = False
        # What the adaptive wait learns from client steps: the requests to expect (waiting
        # when a step ended, plus those answered and not taken again since; see the module
        # docstring), the last step's time, and when it ended.
        self._expected = 0
        self._last_step_seconds = 0.0
        self._last_finished = float("-inf")

    # --- the connections' side ------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Hold ``job`` until it is computed, cancelled or expired; ``QueueFull`` when the
        bound of its priority is reached."""
        with self._lock:
            if self._closed:
                raise QueueFull("the exact runtime is stopping")
            held = self._held[job.priority]
            if job.priority == CLIENT:
                if len(held) >= self.max_requests:
                    raise QueueFull(
                        f"{len(held)} exact-mode requests are queued or computing (bound "
                        f"{self.max_requests})"
                    )
                if held and self._client_rows + job.n > self.max_rows:
                    raise QueueFull(
                        f"{self._client_rows} exact-mode rows are queued or computing (bound "
                        f"{self.max_rows})"
                    )
                self._client_rows += job.n
            elif len(held) >= self.max_background:
                raise QueueFull("the background queue is full")
            held[job] = None
            self._by_request[job.owner, job.request_id] = job
            self._wake.notify()

    def cancel(self, owner: object, request_id: int) -> Job | None:
        """Drop the request's waiting rows and free its share of the bounds; the job, or None
        when it is not held (answered already, or never submitted)."""
        with self._lock:
            job = self._by_request.get((owner, request_id))
            if job is None:
                return None
            job.cancelled = True
            self._release(job)
            return job

    def cancel_owner(self, owner: object) -> list[Job]:
        """Cancel every request of ``owner`` (its connection closed)."""
        with self._lock:
            jobs = [job for (who, _), job in self._by_request.items() if who is owner]
            for job in jobs:
                job.cancelled = True
                self._release(job)
            return jobs

    def cancel_model(self, model: Hashable) -> list[Job]:
        """Cancel every held request for ``model`` (it cannot be loaded: to answer)."""
        with self._lock:
            jobs = [job for held in self._held.values() for job in held if job.model == model]
            for job in jobs:
                job.cancelled = True
                self._release(job)
            return jobs

    def take_expired(self) -> list[Job]:
        """Jobs dropped because their deadline passed, since the last call (to answer them)."""
        with self._lock:
            expired, self._expired = self._expired, []
            return expired

    # --- the compute thread's side ---------------------------------------------------------
    def next_step(self, timeout: float | None = None) -> Step | None:
        """The next step to compute, waiting for one; None when closed, after ``timeout``
        seconds without work, or as soon as expired jobs wait to be answered
        (``take_expired``)."""
        give_up = None if timeout is None else self._clock() + timeout
        with self._lock:
            while not self._closed:
                now = self._clock()
                self._expire(now)
                if self._expired:
                    return None
                priority = self._priority()
                if priority is None:
                    if not self._sleep(give_up, None):
                        return None
                    continue
                jobs = self._candidates(priority)
                short = priority == CLIENT and self._short(jobs)
                if short:
                    until = self._wait_until(jobs)
                    if until > now:
                        if not self._sleep(give_up, until):
                            return None
                        continue
                step = self._take(priority, jobs, now)
                if priority == CLIENT:
                    # The requests it took were expected, or, after a wait that ran out, the
                    # rest are not coming soon: expect none more.
                    self._expected = 0 if short else max(0, self._expected - len(step.parts))
                if self._priority() is not None and len(self._running) < self.lanes:
                    self._wake.notify()  # an idle lane takes the rest
                return step
            return None

    def finish(self, step: Step, seconds: float) -> list[Job]:
        """Record that ``step`` was computed in ``seconds`` (its rows written into each
        job's ``out`` by the caller); the jobs it completed, released from the queue.
        Cancelled jobs are never returned."""
        complete = []
        with self._lock:
            self._stop_running(step)
            for job, start, stop in step.parts:
                job.done += stop - start
                job.compute += seconds
                if job.done == job.n and not job.cancelled:
                    self._release(job)
                    complete.append(job)
            if step.priority == CLIENT:
                # Its clients send again soon; so do those of other lanes' steps, counted
                # already when they ended unless their requests were taken since.
                waiting = sum(1 for job in self._held[CLIENT] if job.waiting)
                self._expected = max(self._expected, waiting) + len(complete)
                self._last_step_seconds = seconds
                self._last_finished = self._clock()
        return complete

    def abort(self, step: Step) -> list[Job]:
        """``step`` failed: cancel its jobs; those that were not cancelled yet (to answer)."""
        with self._lock:
            self._stop_running(step)
            failed = []
            for job in dict.fromkeys(step.jobs):
                if not job.cancelled:
                    job.cancelled = True
                    self._release(job)
                    failed.append(job)
            return failed

    def close(self) -> list[Job]:
        """Refuse new jobs and wake the compute thread; the jobs still held (to answer)."""
        with self._lock:
            self._closed = True
            held = [job for jobs in self._held.values() for job in jobs]
            for job in held:
                self._release(job)
            self._wake.notify_all()
            return held

    # --- figures ----------------------------------------------------------------------------
    def depth(self) -> tuple[int, int, int]:
        """(requests held, rows waiting, rows in the running steps)."""
        with self._lock:
            requests = sum(len(jobs) for jobs in self._held.values())
            waiting = sum(job.waiting for jobs in self._held.values() for job in jobs)
            return requests, waiting, self._running_rows

    def running(self) -> int:
        """Steps the lanes compute now."""
        with self._lock:
            return len(self._running)

    # --- under the lock ---------------------------------------------------------------------
    def _priority(self) -> int | None:
        for priority in (CLIENT, BACKGROUND):
            if any(job.waiting for job in self._held[priority]):
                return priority
        return None

    def _candidates(self, priority: int) -> list[Job]:
        """The waiting jobs of the oldest waiting job's model that may share its step,
        oldest first: that job alone when it may share with none."""
        waiting = [job for job in self._held[priority] if job.waiting]
        first = waiting[0]
        if not first.mergeable:
            return [first]
        return [job for job in waiting if job.mergeable and job.model == first.model]

    def _short(self, jobs: list[Job]) -> bool:
        """Whether fewer client requests wait than expected (and could still merge)."""
        return (
            jobs[0].mergeable
            and len(jobs) < self._expected
            and sum(job.waiting for job in jobs) < self.batch_rows
        )

    def _wait_until(self, jobs: list[Job]) -> float:
        """How long a short step may wait: neither the oldest request nor the last step's
        end is its share past."""
        budget = min(self.max_wait, WAIT_SHARE_OF_STEP * self._last_step_seconds)
        return max(jobs[0].arrived, self._last_finished) + budget

    def _take(self, priority: int, jobs: list[Job], now: float) -> Step:
        if not jobs[0].mergeable:
            cap = jobs[0].waiting  # whole: its rows' results depend on their company
        elif priority == CLIENT:
            # This lane's share among the idle lanes (itself included), so that they compute
            # at once, in shares of at least SPLIT_ROWS.
            idle = max(1, self.lanes - len(self._running))
            rows = sum(job.waiting for job in jobs)
            shares = max(1, min(idle, rows // SPLIT_ROWS))
            cap = min(self.batch_rows, -(-rows // shares))
        else:
            cap = self.background_rows
        jobs = jobs[:cap]  # more requests than rows: the oldest, a row each
        share = max(1, cap // len(jobs))
        amounts = [min(job.waiting, share) for job in jobs]
        left = cap - sum(amounts)
        for index, job in enumerate(jobs):  # what the shares left, oldest first
            if left <= 0:
                break
            more = min(job.waiting - amounts[index], left)
            amounts[index] += more
            left -= more
        parts = []
        for job, amount in zip(jobs, amounts, strict=True):
            if amount:
                parts.append((job, job.taken, job.taken + amount))
                job.taken += amount
                if job.first_step is None:
                    job.first_step = now
        step = Step(jobs[0].model, priority, parts, started=now)
        self._running[step] = None
        self._running_rows += len(step.rows)
        return step

    def _stop_running(self, step: Step) -> None:
        """``step`` is no longer computed (idempotent: a step may be aborted after its
        finish, when answering failed)."""
        if step in self._running:
            del self._running[step]
            self._running_rows -= len(step.rows)

    def _expire(self, now: float) -> None:
        for jobs in self._held.values():
            for job in [job for job in jobs if job.deadline <= now]:
                job.cancelled = True
                self._release(job)
                self._expired.append(job)

    def _release(self, job: Job) -> None:
        """Take ``job`` out of the queue and the bounds (idempotent)."""
        held = self._held[job.priority]
        if job not in held:
            return
        del held[job]
        self._by_request.pop((job.owner, job.request_id), None)
        if job.priority == CLIENT:
            self._client_rows -= job.n

    def _sleep(self, give_up: float | None, until: float | None) -> bool:
        """Wait on the condition until woken, ``until`` or ``give_up``; False once past
        ``give_up``."""
        now = self._clock()
        if give_up is not None and now >= give_up:
            return False
        deadlines = [t for t in (give_up, until, self._next_deadline()) if t is not None]
        self._wake.wait(None if not deadlines else max(0.0, min(deadlines) - now))
        return True

    def _next_deadline(self) -> float | None:
        deadlines = [job.deadline for jobs in self._held.values() for job in jobs]
        return min(deadlines) if deadlines else None
