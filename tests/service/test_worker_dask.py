"""Training jobs on a Dask cluster (MBN_DASK_SCHEDULER): progress, cancel, an unreachable one."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from digits_data import Digits
from servicetest import LONG_PARAMS, TINY_PARAMS, make_settings, wait_for
from test_worker import Setup, alive, training_pid

from mbn_core.bundle import load_bundle

# Slow: training jobs on a Dask cluster of worker processes.
pytestmark = pytest.mark.slow

pytest.importorskip("distributed")


class DaskSetup(Setup):
    def __init__(self, tmp_path: Path, scheduler: str) -> None:
        super().__init__(tmp_path)
        self.settings = make_settings(
            tmp_path / "data", dask_scheduler=scheduler, dask_connect_timeout_seconds=1
        )


@pytest.fixture
def cluster_setup(tmp_path: Path, dask_client) -> Iterator[DaskSetup]:
    s = DaskSetup(tmp_path, dask_client.scheduler.address)
    yield s
    for worker in s.workers:
        worker.stop(timeout=30)
    s.store.dispose()


def test_a_job_trains_on_the_cluster_with_progress(
    cluster_setup, digits: Digits, dask_layer_builds
):
    job = cluster_setup.submit(digits[0][:400], TINY_PARAMS, digits[1][:400])
    cluster_setup.worker()
    done = cluster_setup.wait_status(job, {"succeeded", "failed"}, timeout=120)
    assert done.status == "succeeded", done.error
    assert done.progress == 1.0
    # The registry is told on the worker's thread after the job is recorded as succeeded.
    wait_for(lambda: cluster_setup.published, 30, "the registry to be told of the model")
    assert load_bundle(cluster_setup.published[0]).manifest["training"]["n_samples"] == 400
    # The clusterings ran on the Dask workers.
    assert any(builds for builds in dask_layer_builds().values())


def test_cancel_stops_a_job_on_the_cluster_and_its_tasks(cluster_setup, digits, dask_client):
    job = cluster_setup.submit(digits[0], LONG_PARAMS)
    worker = cluster_setup.worker()
    cluster_setup.wait_running(job)
    pid = training_pid(worker, job)
    cluster_setup.store.cancel(job.id)
    # The training process polls its callback while tasks run: it ends without waiting for
    # the layer (minutes here), well within this wait.
    wait_for(lambda: not alive(pid), 20, "the training process to end", interval=0.05)
    assert cluster_setup.wait_status(job, {"cancelled"}).status == "cancelled"
    assert list(cluster_setup.settings.models_path.iterdir()) == []

    def tasks_left(dask_scheduler) -> int:
        return len(dask_scheduler.tasks)

    wait_for(lambda: dask_client.run_on_scheduler(tasks_left) == 0, 20, "tasks to be released")


def test_an_unreachable_scheduler_fails_the_job_without_the_address(tmp_path: Path, digits):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    setup = DaskSetup(tmp_path, f"tcp://127.0.0.1:{port}")
    try:
        job = setup.submit(digits[0][:300], TINY_PARAMS)
        setup.worker()
        failed = setup.wait_status(job, {"failed", "succeeded"})
        assert failed.status == "failed"
        assert "training cluster (Dask scheduler) cannot be reached" in (failed.error or "")
        assert str(port) not in (failed.error or "")
    finally:
        for worker in setup.workers:
            worker.stop(timeout=30)
        setup.store.dispose()


def test_settings_check_the_scheduler_address() -> None:
    assert make_settings(Path("d"), dask_scheduler="").dask_scheduler is None
    assert make_settings(Path("d"), dask_scheduler=" tcp://h:8786 ").dask_scheduler == (
        "tcp://h:8786"
    )
    with pytest.raises(ValueError, match="not a Dask scheduler address"):
        make_settings(Path("d"), dask_scheduler="h:8786/x")
