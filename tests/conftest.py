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


# Modules whose module-scoped fixture takes seconds to build (a pip install, a trained model
# served by a real server, a browser). Under `pytest -n 2` the scheduler below sends each of
# them to one worker as a whole, so the fixture is built once instead of once per worker;
# every other test is spread one by one, as xdist's default "load" does.
ONE_WORKER_MODULES = frozenset({
    "tests/test_install.py",
    "tests/service/test_e2e.py",
    "tests/service/test_browser.py",
    "tests/service/test_console.py",
    "tests/service/test_overload_http.py",
    "tests/mbn_core/test_bulk.py",
    "tests/mbn_core/test_cli.py",
    "tests/mbn_core/test_onnx.py",
    "tests/mbn_core/test_bundle.py",
    "tests/mbn_core/test_embedding_map.py",
    "tests/mbn_core/test_multilevel_method.py",
})  # fmt: skip


@pytest.hookimpl(optionalhook=True)  # the hook is xdist's: pytest -p no:xdist still runs
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's default scheduling, but with the modules above kept whole.

    Not ``--dist loadgroup`` with ``xdist_group`` marks: pytest-xdist 3.8 under pytest 9.2
    groups nothing (pytest-dev/pytest-xdist#1386), silently.
    """
    if config.getvalue("dist") != "load":
        return None  # an explicit --dist other than the default: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class ModuleFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER_MODULES else nodeid

    return ModuleFixtureScheduling(config, log)
