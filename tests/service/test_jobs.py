"""The job store, on SQLite and on a real PostgreSQL, and the job data files."""

from __future__ import annotations

import io
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mbn_core.data.readers import load_training_data
from service.errors import Conflict, NotFound, Overloaded, Unavailable
from service.jobs import Job, JobFiles, JobStore, new_job_id
from service.schemas import JobOut


class ManualClock:
    """A clock that only moves when the test moves it: staleness and ordering are tested
    without sleeping. (The database's own clock, the default, is tested in
    test_migrations.py.)"""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> JobStore:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    else:
        url = request.getfixturevalue("postgres_url")
    job_store = JobStore(url, retry_after=7, clock=clock)
    job_store.create_schema()
    job_store.create_schema()  # idempotent
    request.addfinalizer(job_store.dispose)
    return job_store


def submit(store: JobStore, name: str = "m", max_queued: int | None = None) -> Job:
    return store.submit(
        job_id=new_job_id(),
        name=name,
        params={"n_clusterings": 20},
        data_file="data.npz",
        n_rows=10,
        n_features=3,
        max_queued=max_queued,
    )


def test_submit_get_list(store: JobStore, clock: ManualClock) -> None:
    first = submit(store, "a")
    first_time = clock.now
    clock.advance(0.001)
    second = submit(store, "b")
    assert first.status == "queued" and first.progress == 0 and first.attempts == 0
    assert (first.created_at, second.created_at) == (first_time, clock.now)
    assert store.get(first.id) == first
    assert first.params == {"n_clusterings": 20}
    assert [j.id for j in store.list_jobs()] == [second.id, first.id]
    assert store.list_jobs(status="running") == []
    assert [j.id for j in store.list_jobs(limit=1)] == [second.id]
    assert store.count_by_status() == {"queued": 2}
    out = JobOut.from_job(first)
    assert out.created_at.tzinfo is not None and out.started_at is None


def test_unknown_and_malformed_ids(store: JobStore) -> None:
    assert store.get(new_job_id()) is None
    assert store.get("../../etc/passwd") is None
    with pytest.raises(NotFound):
        store.require("nope")
    with pytest.raises(NotFound):
        store.cancel(new_job_id())


def test_queue_limit_refuses_with_retry_after(store: JobStore) -> None:
    submit(store, max_queued=2)
    submit(store, max_queued=2)
    with pytest.raises(Overloaded) as info:
        submit(store, max_queued=2)
    assert info.value.retry_after == 7  # the Retry-After header (service/errors.py)
    assert store.queued_count() == 2


def test_duplicate_id_is_a_conflict(store: JobStore) -> None:
    job = submit(store)
    with pytest.raises(Conflict):
        store.submit(
            job_id=job.id, name="x", params={}, data_file="data.npz", n_rows=1, n_features=1,
            max_queued=None,
        )  # fmt: skip


def test_claim_takes_the_oldest_and_marks_it_running(store: JobStore, clock: ManualClock) -> None:
    assert store.claim("w1") is None
    first = submit(store)
    clock.advance(0.001)
    submit(store)
    clock.advance(1.0)
    claimed = store.claim("w1")
    assert claimed is not None and claimed.id == first.id
    assert claimed.status == "running" and claimed.worker_id == "w1" and claimed.attempts == 1
    assert claimed.started_at == claimed.heartbeat_at == clock.now


def test_concurrent_claims_take_each_job_exactly_once(store: JobStore) -> None:
    ids = {submit(store).id for _ in range(24)}
    claims: list[str] = []
    lock = threading.Lock()

    def work(worker: str) -> None:
        while (job := store.claim(worker)) is not None:
            with lock:
                claims.append(job.id)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert Counter(claims) == Counter(ids)  # every job once, none twice


def test_heartbeat_and_finish(store: JobStore) -> None:
    submit(store)
    job = store.claim("w1")
    assert job is not None
    assert store.heartbeat(job.id, "w1", progress=0.4, phase="mbn")
    assert not store.heartbeat(job.id, "intruder", progress=0.9, phase="mbn")
    current = store.require(job.id)
    assert (current.progress, current.phase) == (0.4, "mbn")
    assert store.finish(job.id, "w1", status="succeeded", model_id="m-1")
    done = store.require(job.id)
    assert (done.status, done.progress, done.model_id) == ("succeeded", 1.0, "m-1")
    assert done.finished_at is not None
    # A result lands once: a second finish (or a heartbeat) of the same job is refused.
    assert not store.finish(job.id, "w1", status="failed", error="late")
    assert not store.heartbeat(job.id, "w1", progress=0.5, phase=None)
    with pytest.raises(Conflict):
        store.cancel(job.id)


def test_cancel_queued_and_running(store: JobStore) -> None:
    queued = submit(store)
    assert store.cancel(queued.id).status == "cancelled"
    with pytest.raises(Conflict, match="already cancelled"):
        store.cancel(queued.id)
    submit(store)
    running = store.claim("w1")
    assert running is not None
    assert store.cancel(running.id).status == "cancelled"
    # The worker learns it at its next heartbeat and cannot record a result any more.
    assert not store.heartbeat(running.id, "w1", progress=0.5, phase="mbn")
    assert not store.finish(running.id, "w1", status="succeeded", model_id="m")
    assert store.require(running.id).status == "cancelled"


def test_failed_job_keeps_its_error(store: JobStore) -> None:
    submit(store)
    job = store.claim("w1")
    assert job is not None
    assert store.finish(job.id, "w1", status="failed", error="ValueError: " + "x" * 10_000)
    failed = store.require(job.id)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.startswith("ValueError") and len(failed.error) <= 4000


def test_release_requeues_without_counting_the_attempt(store: JobStore) -> None:
    submit(store)
    job = store.claim("w1")
    assert job is not None
    assert store.release(job.id, "w1")
    again = store.require(job.id)
    assert (again.status, again.attempts, again.worker_id) == ("queued", 0, None)
    reclaimed = store.claim("w2")
    assert reclaimed is not None and reclaimed.attempts == 1


def test_stale_jobs_are_requeued_then_failed(store: JobStore, clock: ManualClock) -> None:
    submit(store)
    job = store.claim("dead-worker")
    assert job is not None
    clock.advance(59.0)
    assert store.recover_stale(stale_after=60.0, max_attempts=2) == []  # not yet stale
    clock.advance(2.0)
    assert store.recover_stale(stale_after=60.0, max_attempts=2) == [(job.id, "queued")]
    # The dead worker, should it wake up, owns nothing any more.
    assert not store.heartbeat(job.id, "dead-worker", progress=0.5, phase=None)
    second = store.claim("dead-worker-2")
    assert second is not None and second.attempts == 2
    # Heartbeats keep a job alive however long it runs ...
    for _ in range(3):
        clock.advance(50.0)
        assert store.heartbeat(job.id, "dead-worker-2", progress=0.5, phase=None)
        assert store.recover_stale(stale_after=60.0, max_attempts=2) == []
    # ... and the second worker's silence, once its attempts are used up, fails it.
    clock.advance(61.0)
    assert store.recover_stale(stale_after=60.0, max_attempts=2) == [(job.id, "failed")]
    failed = store.require(job.id)
    assert failed.status == "failed" and "2 times" in (failed.error or "")
    assert failed.finished_at == clock.now


def test_unreachable_database_is_unavailable() -> None:
    store = JobStore("postgresql+psycopg://nobody:pw@127.0.0.1:1/none", retry_after=3)
    try:
        assert not store.ping()
        with pytest.raises(Unavailable) as info:
            store.get(new_job_id())
        assert info.value.retry_after == 3  # errors.py makes it the Retry-After header
        assert "pw" not in info.value.message
    finally:
        store.dispose()


# ---------------------------------------------------------------------------- files


def test_job_files_round_trip(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    job_id = new_job_id()
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    y = np.array([0, 1, 0, 1])
    name = files.write_arrays(job_id, x, y)
    loaded_x, loaded_y = load_training_data(files.path(job_id, name))
    np.testing.assert_array_equal(loaded_x, x)
    np.testing.assert_array_equal(loaded_y, y)
    assert not [p for p in (tmp_path / job_id).iterdir() if p.name.startswith(".")]
    files.remove(job_id)
    assert not (tmp_path / job_id).exists()


def test_job_files_stream_limit_leaves_nothing(tmp_path: Path) -> None:
    files = JobFiles(tmp_path)
    job_id = new_job_id()
    with pytest.raises(OverflowError):
        files.write_stream(job_id, ".csv", io.BytesIO(b"1,2\n" * 1000), max_bytes=100)
    assert not (tmp_path / job_id).exists()
    assert files.write_stream(job_id, ".csv", io.BytesIO(b"1,2\n3,4\n"), max_bytes=100)


@pytest.mark.parametrize(
    ("job_id", "name"),
    [("../x", "data.npz"), ("0" * 32, "../../etc/passwd"), ("0" * 32, "data.pkl")],
)
def test_job_files_refuse_other_paths(tmp_path: Path, job_id: str, name: str) -> None:
    with pytest.raises(ValueError):
        JobFiles(tmp_path).path(job_id, name)
