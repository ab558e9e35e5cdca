"""The worker with real training processes: success, cancel, crash, shutdown, lost jobs."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from digits_data import Digits
from servicetest import LONG_PARAMS, TINY_PARAMS, make_settings, wait_for

from mbn_core.bundle import load_bundle
from service.aliases import Aliases, AliasFile
from service.config import Settings
from service.jobs import Job, JobFiles, JobStore
from service.submission import Submitter, check_params
from service.worker import Worker, model_id_for

# Slow: the worker with real training processes (each job trains for seconds).
pytestmark = pytest.mark.slow

# Long enough to be caught running (tens of seconds), stopped long before it ends.


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        self.settings: Settings = make_settings(tmp_path / "data")
        self.settings.models_path.mkdir(parents=True)
        self.store = JobStore(self.settings.db_url)
        self.store.create_schema()
        self.files = JobFiles(self.settings.jobs_path)
        self.submitter = Submitter(self.settings, self.store, self.files)
        self.published: list[Path] = []
        self.workers: list[Worker] = []

    def worker(self) -> Worker:
        worker = Worker(self.settings, self.store, on_model=self.published.append)
        worker.start()
        self.workers.append(worker)
        return worker

    def submit(
        self, x: np.ndarray, params: dict, y: np.ndarray | None = None, *, promote: bool = False
    ) -> Job:
        return self.submitter.submit_arrays("test", check_params(params), x, y, promote=promote)

    def wait_status(self, job: Job, statuses: set[str], timeout: float = 60) -> Job:
        return wait_for(
            lambda: (j := self.store.require(job.id)).status in statuses and j,
            timeout,
            f"job {job.id} to reach {statuses}",
        )

    def wait_running(self, job: Job) -> Job:
        """Running, with the training process reporting progress."""
        return wait_for(
            lambda: (j := self.store.require(job.id)).status == "running" and j.progress > 0 and j,
            60,
            f"job {job.id} to make progress",
        )


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = Setup(tmp_path)
    yield s
    for worker in s.workers:
        worker.stop(timeout=30)
    s.store.dispose()


def alive(pid: int | None) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def training_pid(worker: Worker, job: Job) -> int:
    pid = worker.training_pids.get(job.id)
    assert pid is not None and alive(pid)
    return pid


def test_a_stand_alone_worker_promotes_through_the_alias_file(setup: Setup, digits: Digits) -> None:
    """A worker without the API's registry records a promote=true job's model as the default
    and its name's version in the alias file (where every replica reads it); a job without
    promote records no choice."""
    aliases = AliasFile(setup.settings.models_path)
    setup.worker()
    quiet = setup.wait_status(setup.submit(digits[0][:300], TINY_PARAMS), {"succeeded", "failed"})
    assert quiet.status == "succeeded", quiet.error
    assert aliases.read() == Aliases()  # nothing chosen (no registry here records "auto")
    job = setup.submit(digits[0][:300], TINY_PARAMS, promote=True)
    done = setup.wait_status(job, {"succeeded", "failed"})
    assert done.status == "succeeded" and done.promote, done.error
    # The worker promotes after recording the job as succeeded, on its own thread.
    promoted = Aliases(done.model_id, "promoted", {"test": str(done.model_id)})
    wait_for(lambda: aliases.read() == promoted, 30, "the worker to promote the model")


def test_job_errors_name_no_server_directory(setup: Setup) -> None:
    # What the training process reports (a bundle directory that cannot be written, say)
    # reaches clients as the job's error: the worker hides the server's directories in it.
    worker = Worker(setup.settings, setup.store)
    staging = setup.settings.data_dir / "staging" / "m-1"
    error = f"{staging}: cannot write the bundle there (Read-only file system)"
    hidden = worker._hide_paths(error)
    assert hidden == "<data dir>/staging/m-1: cannot write the bundle there (Read-only file system)"
    model = setup.settings.models_path / "m-1"
    assert worker._hide_paths(ValueError(f"{model}: exists")) == "<model dir>/m-1: exists"


def test_cancel_stops_training_promptly(
    setup: Setup, digits: Digits, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="service.worker")
    job = setup.submit(digits[0], LONG_PARAMS)
    worker = setup.worker()
    setup.wait_running(job)
    pid = training_pid(worker, job)
    setup.store.cancel(job.id)
    # Events, not a stopwatch (the machine is shared): the process ends long before its
    # training could have, and the job ends cancelled, part-way through.
    wait_for(lambda: not alive(pid), 60, "the training process to end", interval=0.05)
    wait_for(lambda: not worker.running_jobs, 60, "the worker to finish with the job")
    cancelled = setup.store.require(job.id)
    assert cancelled.status == "cancelled" and cancelled.progress < 1.0
    assert list(setup.settings.models_path.iterdir()) == []
    assert not (setup.settings.jobs_path / job.id).exists()
    # A user's cancel is logged as one (it was "stopping training (lost)").
    stops = [r.getMessage() for r in caplog.records if "stopping training" in r.getMessage()]
    assert stops == [f"job {job.id}: stopping training (cancelled)"]


def test_a_crashing_training_process_fails_the_job(setup: Setup, digits: Digits) -> None:
    job = setup.submit(digits[0], LONG_PARAMS)
    worker = setup.worker()
    setup.wait_running(job)
    os.kill(training_pid(worker, job), signal.SIGKILL)  # what the kernel's OOM killer does
    failed = setup.wait_status(job, {"failed"}, timeout=20)
    assert "signal 9" in (failed.error or "")
    assert "the training process of method 'mbn' died" in (failed.error or "")  # named
    assert worker._thread is not None and worker._thread.is_alive()  # the worker lives on
    # ... and takes the next job.
    second = setup.submit(digits[0][:300], TINY_PARAMS)
    assert setup.wait_status(second, {"succeeded", "failed"}).status == "succeeded"


def test_a_training_error_fails_the_job_with_its_message(setup: Setup, digits: Digits) -> None:
    job = setup.submit(digits[0][:300], TINY_PARAMS)
    data = setup.files.path(job.id, job.data_file)
    data.write_bytes(b"damaged")
    setup.worker()
    failed = setup.wait_status(job, {"failed", "succeeded"})
    assert failed.status == "failed"
    assert failed.error is not None and "not a NumPy .npz file" in failed.error
    assert "ValueError" not in failed.error  # no Python class names to clients
    assert str(setup.settings.data_dir) not in failed.error  # no server paths to clients


def test_shutdown_gives_running_jobs_back(setup: Setup, digits: Digits) -> None:
    job = setup.submit(digits[0], LONG_PARAMS)
    worker = setup.worker()
    setup.wait_running(job)
    pid = training_pid(worker, job)
    worker.stop(timeout=120)
    # stop() returned because the worker's loop ended (not because the wait timed out), after
    # giving the job back and ending its training process.
    assert worker._thread is not None and not worker._thread.is_alive()
    again = setup.store.require(job.id)
    assert (again.status, again.attempts, again.worker_id) == ("queued", 0, None)
    assert not alive(pid)
    assert setup.files.path(job.id, job.data_file).exists()  # the next worker needs it


def test_a_job_taken_away_is_stopped_not_finished_twice(setup: Setup, digits: Digits) -> None:
    job = setup.submit(digits[0], LONG_PARAMS)
    worker = setup.worker()
    first = setup.wait_running(job)
    first_pid = training_pid(worker, job)
    # Another worker decided this one was dead (missed heartbeats) and requeued the job.
    # (A minus-second threshold: stale at once by the database's clock, no sleeping.)
    assert setup.store.recover_stale(stale_after=-1.0, max_attempts=5) == [(job.id, "queued")]
    # The worker notices at its next heartbeat, stops its training, and (being free) may
    # claim the job again as a new attempt; never two trainings of one job at once.
    second = wait_for(
        lambda: (j := setup.store.require(job.id)).attempts == 2 and j.status == "running" and j,
        20,
        "the second attempt",
        interval=0.05,
    )
    assert second.worker_id == first.worker_id == worker.worker_id
    assert not alive(first_pid)  # never two trainings of one job
    setup.store.cancel(job.id)


def test_a_new_attempt_removes_what_a_lost_one_published(setup: Setup, digits: Digits) -> None:
    """... and runs the job to a published model."""
    x, y = digits
    job = setup.submit(x[:300], TINY_PARAMS, y[:300])
    # Attempt 1 by a worker that died after publishing its model, before recording it.
    assert setup.store.claim("dead-worker") is not None
    leftover = setup.settings.models_path / model_id_for(job.id, 1)
    leftover.mkdir()
    (leftover / "manifest.json").write_text("{}")
    assert setup.store.recover_stale(stale_after=-1.0, max_attempts=3) == [(job.id, "queued")]
    setup.worker()
    done = setup.wait_status(job, {"succeeded", "failed"})
    assert done.status == "succeeded", done.error
    assert done.model_id == model_id_for(job.id, 2) and done.progress == 1.0
    assert sorted(p.name for p in setup.settings.models_path.iterdir()) == [done.model_id]
    bundle = load_bundle(setup.settings.models_path / done.model_id)
    assert (bundle.name, bundle.input_dim, bundle.n_clusters) == ("test", 64, 10)
    # The registry is told after the job is recorded as succeeded, on the worker's thread.
    wait_for(lambda: setup.published, 30, "the registry to be told of the model")
    assert setup.published == [setup.settings.models_path / done.model_id]
    assert not (setup.settings.jobs_path / job.id).exists()  # data removed
    assert list((setup.settings.data_dir / "staging").iterdir()) == []
