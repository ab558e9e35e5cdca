"""Fixtures shared by the library and the service tests, and the quick tier's collection."""

import re
from pathlib import Path

import digits_data
import pytest

# A module whose every test is slow says so in one line (``pytestmark = pytest.mark.slow``).
_WHOLLY_SLOW = re.compile(r"^pytestmark = pytest\.mark\.slow$", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In the quick tier (``-m "not slow"``) a module marked slow as a whole is not imported:
    all its tests would be deselected anyway, and importing some of them (schemathesis and an
    app built at import, a browser driver, Dask) costs each worker seconds."""
    if config.getoption("markexpr", "") != "not slow":
        return None
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return True if _WHOLLY_SLOW.search(collection_path.read_text(encoding="utf-8")) else None


def pytest_report_header(config: pytest.Config) -> str:
    """The BLAS kernels in use: the goldens' float embeddings were computed with OpenBLAS's
    SkylakeX ones (scripts/test chooses them where the CPU can run them)."""
    from threadpoolctl import threadpool_info

    blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
    kernels = sorted({str(pool.get("architecture")) for pool in blas})
    return f"BLAS kernels: {', '.join(kernels) or 'none found'} (goldens: SkylakeX)"


@pytest.fixture(scope="session")
def digits() -> digits_data.Digits:
    """The digits, whole (``tests/digits_data.py``): every test module's data unless it says."""
    return digits_data.digits()


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


@pytest.fixture
def dask_layer_builds(dask_client):
    """How often each Dask worker built a layer's shared arrays while the test ran:
    ``dask_layer_builds()`` gives {worker: {layer key: builds}}. The count wraps the
    workers' builder for the test's duration (functions defined here travel by value)."""

    def start(dask_worker) -> None:
        from mbn_core.mbn.backends import dask as module

        original = module._build_encoder
        counts: dict[str, int] = {}

        def counting(shipped):
            counts[shipped.key] = counts.get(shipped.key, 0) + 1
            return original(shipped)

        dask_worker.mbn_layer_builds = (counts, original)
        module._build_encoder = counting

    def read(dask_worker) -> dict[str, int]:
        return dict(dask_worker.mbn_layer_builds[0])

    def stop(dask_worker) -> None:
        from mbn_core.mbn.backends import dask as module

        module._build_encoder = dask_worker.mbn_layer_builds[1]

    dask_client.run(start)
    yield lambda: dask_client.run(read)
    dask_client.run(stop)
