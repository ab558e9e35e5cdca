"""Fixtures shared by the library and the service tests."""

import pytest


@pytest.fixture(scope="session")
def dask_client():
    """A client of a real LocalCluster: two single-threaded worker processes.

    Processes, as a real deployment has (not threads in this process): data and tasks are
    serialised and cross process boundaries. Skips when Dask (the 'distributed' extra) is
    not installed.
    """
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield client
