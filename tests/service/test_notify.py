"""Stand-alone workers on PostgreSQL wake on LISTEN/NOTIFY when a job is queued, instead of
waiting for their next poll."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from digits_data import Digits
from servicetest import BUSY_MACHINE_SECONDS, TINY_PARAMS, make_settings, wait_for

from service.jobs import JobFiles, JobStore, new_job_id
from service.submission import Submitter, check_params
from service.worker import Worker

# Slow: stand-alone worker processes on PostgreSQL.
pytestmark = pytest.mark.slow


def test_a_queued_job_is_announced_to_listeners(postgres_url: str) -> None:
    store, other = JobStore(postgres_url), JobStore(postgres_url)  # two replicas
    store.create_schema()
    heard, stop = threading.Event(), threading.Event()
    calls: list[int] = []

    def wake() -> None:
        calls.append(1)
        if len(calls) > 1:  # the first call is the catch-up when listening starts
            heard.set()

    listener = threading.Thread(target=store.listen, args=(wake, stop), daemon=True)
    listener.start()
    try:
        wait_for(lambda: calls, 30, "the listener to connect")
        other.submit(
            job_id=new_job_id(), name="m", params={}, data_file="d.npy", n_rows=4,
            n_features=2, max_queued=None,
        )  # fmt: skip
        assert heard.wait(BUSY_MACHINE_SECONDS), "no notification for the queued job"
    finally:
        stop.set()
        listener.join(BUSY_MACHINE_SECONDS)
        store.dispose()
        other.dispose()
    assert not listener.is_alive()


class PollCounter(threading.Event):
    """A worker's wake-up event that counts the waits that ended in a poll (timed out)
    rather than in a wake-up."""

    def __init__(self) -> None:
        super().__init__()
        self.polls = 0

    def wait(self, timeout: float | None = None) -> bool:
        woken = super().wait(timeout)
        if not woken:
            self.polls += 1
        return woken


def test_an_idle_worker_is_woken_by_a_job_queued_elsewhere(
    postgres_url: str, tmp_path: Path, digits: Digits, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Polling once a minute, and every poll counted: the job must be taken with no poll in
    # between. (Counted, not timed: the wait below gives a busy machine longer than a poll.)
    settings = make_settings(tmp_path / "data", database_url=postgres_url, poll_interval_seconds=60)
    settings.models_path.mkdir(parents=True)
    store = JobStore(settings.db_url)
    store.create_schema()
    worker = Worker(settings, store)
    wake = PollCounter()
    monkeypatch.setattr(worker, "_wake", wake)
    worker.start()
    api_store = JobStore(settings.db_url)  # the API replica that takes the job
    try:
        # Idle: the worker has looked at the (empty) queue and is waiting.
        wait_for(lambda: worker.waiting, 60, "an idle worker")
        polls = wake.polls
        submitter = Submitter(settings, api_store, JobFiles(settings.jobs_path))
        job = submitter.submit_arrays("m", check_params(TINY_PARAMS), digits[0][:300], None)
        done = wait_for(
            lambda: (j := api_store.require(job.id)).status in ("running", "succeeded") and j,
            45,
            "the worker to take the job (it polls only once a minute)",
        )
        assert done.worker_id == worker.worker_id
        assert wake.polls == polls, "the job was taken at a poll: the notification was lost"
    finally:
        worker.stop(timeout=60)
        store.dispose()
        api_store.dispose()
