"""MBN fitted on a real Dask LocalCluster of worker processes (mbn_core/mbn/backends/dask.py)."""

import contextlib
import os
import signal
import socket
import sys
import threading

import numpy as np
import pytest
import scipy.sparse as sp

distributed = pytest.importorskip("distributed")

from mbn_core import MBN, TrainingStopped, cli, model_to_arrays  # noqa: E402
from mbn_core.bundle import EXACT_FILE  # noqa: E402
from mbn_core.mbn.backends import dask as mbn_distributed  # noqa: E402
from mbn_core.mbn.backends import get_backend, use_backend  # noqa: E402
from mbn_core.mbn.backends.dask import DaskBackend, SchedulerUnreachable, use_dask  # noqa: E402

# Slow: MBN fitted on a Dask cluster of worker processes.
pytestmark = pytest.mark.slow

PARAMS = {"n_clusterings": 24, "random_state": 7}


@pytest.fixture(scope="module")
def rows(digits):
    """The first 500 digits."""
    return digits.X[:500]


@pytest.fixture
def client(dask_client):
    return dask_client


@contextlib.contextmanager
def recorded_dask(client, **options):
    """``use_dask(client, **options)`` that hands over the backends it builds (their
    ``transfers``)."""
    built: list[DaskBackend] = []

    def factory(**kwargs):
        built.append(DaskBackend(client, **options, **kwargs))
        return built[-1]

    with use_backend(factory, purposes=DaskBackend.purposes):
        yield built


def assert_same_model(a: MBN, b: MBN) -> None:
    arrays_a, arrays_b = model_to_arrays(a), model_to_arrays(b)
    assert arrays_a.keys() == arrays_b.keys()
    for name in arrays_a:
        assert arrays_a[name].dtype == arrays_b[name].dtype, name
        np.testing.assert_array_equal(arrays_a[name], arrays_b[name], err_msg=name)


@pytest.mark.parametrize("kind", ["whole-numbers", "floats", "sparse-cosine"])
def test_fit_on_cluster_is_bit_identical_to_local_fit(client, rows, kind):
    # Whole numbers travel as uint8, floats as float32, sparse input as float32 CSR.
    X = {"whole-numbers": rows, "floats": rows / 7.3, "sparse-cosine": sp.csr_matrix(rows)}[kind]
    params = {**PARAMS, "metric": "cosine" if kind == "sparse-cosine" else "euclidean"}
    local = MBN(**params, n_jobs=2)
    expected = local.fit_transform(X)
    remote = MBN(**params)
    with use_dask(client):
        embedding = remote.fit_transform(X)
    assert_same_model(local, remote)
    np.testing.assert_array_equal(embedding, expected)
    np.testing.assert_array_equal(remote.transform(X[:50]), expected[:50])


def test_each_worker_gets_a_layer_once_and_codes_come_back_compact(client, rows, dask_layer_builds):
    model = MBN(**PARAMS)
    with recorded_dask(client, clusterings_per_task=3) as built:
        model.fit(rows)
    [backend] = built
    transfers = backend.transfers
    assert [t.layer for t in transfers] == list(range(len(model.ks_)))
    for transfer, k in zip(transfers, model.ks_, strict=True):
        assert transfer.n_tasks == 8  # 24 clusterings, 3 per task, on 2 workers
        # Codes: one byte per point and clustering (k <= 256), nothing else.
        assert k <= 256
        assert transfer.gathered_bytes == len(rows) * PARAMS["n_clusterings"]
    # The bottom layer ships the digits as uint8 (they are whole numbers), not float64.
    # (in float32 alone they would be digits.nbytes / 2; the centers and norms ride along)
    assert transfers[0].scattered_bytes < rows.nbytes / 2
    # Every worker built each layer's shared arrays once, though it ran several tasks.
    builds = dask_layer_builds()
    for counts in builds.values():
        assert set(counts.values()) <= {1}
    # Each layer was built on at least one worker (8 tasks on 2 workers: usually both).
    layers_built = {key for counts in builds.values() for key in counts}
    assert len(layers_built) == len(model.ks_)


def test_callback_stops_a_distributed_fit_and_its_tasks(client, rows):
    model = MBN(**PARAMS, callback=lambda layer, done, total: layer == 1 and done == 2)
    with use_dask(client, clusterings_per_task=1), pytest.raises(TrainingStopped, match="layer 1"):
        model.fit(rows)
    assert not hasattr(model, "top_")

    def tasks_left(dask_scheduler) -> int:
        return len(dask_scheduler.tasks)

    # The cancelled tasks and the scattered layer input are released on the scheduler.
    event = threading.Event()
    while client.run_on_scheduler(tasks_left) and not event.wait(0.1):
        pass
    assert client.run_on_scheduler(tasks_left) == 0


def test_unreachable_scheduler_is_a_clear_error_before_any_work():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    called = []
    model = MBN(**PARAMS, callback=lambda *args: called.append(args))
    with (
        pytest.raises(SchedulerUnreachable, match=f"tcp://127.0.0.1:{port}"),
        use_dask(f"tcp://127.0.0.1:{port}", timeout=1),
    ):
        model.fit(np.zeros((10, 3)))
    assert called == []


def test_missing_dask_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # what an absent package looks like
    with pytest.raises(ImportError, match=r"mbn-embeddings\[distributed\]"):
        mbn_distributed.connect("tcp://127.0.0.1:8786")


def test_killed_worker_mid_layer_does_not_change_the_model(client, rows):
    # The nanny restarts the killed worker; later tests wait for it (wait_for_workers).
    pids = client.run(os.getpid)
    victim = sorted(pids.values())[0]
    killed_at: list[tuple[int, int, int]] = []

    def kill_once(layer: int, done: int, total: int) -> None:
        if layer == 0 and not killed_at:
            os.kill(victim, signal.SIGKILL)
            killed_at.append((layer, done, total))

    expected = MBN(**PARAMS, n_jobs=2).fit(rows)
    model = MBN(**PARAMS, callback=kill_once)
    with use_dask(client, clusterings_per_task=1):
        model.fit(rows)
    _, done, total = killed_at[0]
    assert done < total  # the layer still had clusterings to run when the worker died
    with pytest.raises(ProcessLookupError):
        os.kill(victim, 0)
    model.set_params(callback=None)
    assert_same_model(model, expected)
    client.wait_for_workers(2)


# ---------------------------------------------------------------------- mbn train --scheduler

TRAIN_SMALL = [
    "--n-clusterings", "20", "--k1", "0.1", "--hidden-layer-sizes", "16", "--max-epochs", "2",
    "--quiet",
]  # fmt: skip


def test_mbn_train_on_the_cluster_writes_the_local_model(
    client, tmp_path, monkeypatch, capsys, digits
):
    X, y = digits
    np.savez(tmp_path / "digits.npz", x=X[:400], y=y[:400])
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "digits.npz", "--out", "local", *TRAIN_SMALL]) == 0
    address = client.scheduler.address
    argv = ["train", "digits.npz", "--out", "remote", "--scheduler", address, *TRAIN_SMALL]
    assert cli.main(argv) == 0
    assert f"on the Dask cluster at {address}" in capsys.readouterr().out
    with np.load(f"local/{EXACT_FILE}") as local, np.load(f"remote/{EXACT_FILE}") as remote:
        assert local.files == remote.files
        for name in local.files:
            np.testing.assert_array_equal(local[name], remote[name], err_msg=name)


def test_mbn_train_with_an_unreachable_scheduler_fails_before_work(
    tmp_path, monkeypatch, capsys, digits
):
    X, _ = digits
    np.save(tmp_path / "digits.npy", X)
    monkeypatch.chdir(tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = ["train", "digits.npy", "--out", "m", "--scheduler", f"tcp://127.0.0.1:{port}",
            "--connect-timeout", "1"]  # fmt: skip
    assert cli.main(argv) == cli.EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""  # not even "Training on ...": the data was never read
    [line] = captured.err.strip().splitlines()
    assert line.startswith(
        f"mbn train: error: cannot reach the Dask scheduler at 'tcp://127.0.0.1:{port}' within 1 s"
    )
    assert not (tmp_path / "m").exists()


def test_a_scheduler_without_workers_is_refused_before_any_work():
    with (
        distributed.LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as empty,
        pytest.raises(SchedulerUnreachable, match="has no workers"),
    ):
        mbn_distributed.connect(empty.scheduler_address, timeout=0.5)


def test_the_dask_backend_encodes_new_rows_as_the_local_one(client, rows):
    model = MBN(**PARAMS, n_jobs=2).fit(rows)
    new_rows = rows[::7] / 3.0
    with get_backend("local", n_jobs=2) as local:
        expected = [local.bottom_codes(model.bottom_layer_, new_rows)]
        for index, layer in enumerate(model.upper_layers_, start=1):
            expected.append(local.upper_codes(index, expected[-1], layer))
    with mbn_distributed.DaskBackend(client, clusterings_per_task=6) as remote:
        codes = [remote.bottom_codes(model.bottom_layer_, new_rows)]
        for index, layer in enumerate(model.upper_layers_, start=1):
            codes.append(remote.upper_codes(index, codes[-1], layer))
    assert [t.n_tasks for t in remote.transfers] == [4] * len(model.ks_)  # 24 clusterings / 6
    for got, want in zip(codes, expected, strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_transform_inside_use_dask_stays_on_local_threads(client, rows):
    model = MBN(**PARAMS, n_jobs=2).fit(rows)
    expected = model.transform(rows[::7])
    with recorded_dask(client) as built:
        model.fit(rows)  # the fit runs on the cluster ...
        [backend] = built
        fit_transfers = list(backend.transfers)
        embedding = model.transform(rows[::7])  # ... its embedding of new rows does not
    assert len(built) == 1 and backend.transfers == fit_transfers
    assert [t.layer for t in fit_transfers] == list(range(len(model.ks_)))
    np.testing.assert_array_equal(embedding, expected)


def test_dask_backend_by_name_takes_the_default_client(client):
    with get_backend("dask") as backend:
        assert isinstance(backend, mbn_distributed.DaskBackend)
        assert backend.client is distributed.default_client()
