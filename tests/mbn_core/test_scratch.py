"""Per-thread scratch arrays, and the bottom layer's use of them."""

import os
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from mbn_core.mbn._scratch import ScratchArrays
from mbn_core.mbn.bottom import bottom_clustering_codes, with_ones_column


def test_a_name_reuses_its_buffer_and_grows_only_when_asked_for_more():
    scratch = ScratchArrays()
    first = scratch.array("a", (4, 5), np.float32)
    smaller = scratch.array("a", (3, 2), np.float32)
    assert smaller.flags.c_contiguous and smaller.shape == (3, 2)
    assert np.shares_memory(first, smaller)
    larger = scratch.array("a", (10, 10), np.float32)
    assert not np.shares_memory(first, larger)
    assert np.shares_memory(larger, scratch.array("a", (4, 5), np.float32))
    assert scratch.array("a", (2,), np.float64).dtype == np.float64
    assert not np.shares_memory(scratch.array("b", (4, 5), np.float32), larger)


def test_each_thread_has_its_own_buffers():
    scratch = ScratchArrays()
    mine = scratch.array("a", (8,), np.float32)
    theirs: list[np.ndarray] = []
    thread = threading.Thread(target=lambda: theirs.append(scratch.array("a", (8,), np.float32)))
    thread.start()
    thread.join()
    assert not np.shares_memory(mine, theirs[0])


def _clustering(rng, n_rows, n_features, k):
    X = with_ones_column(rng.random((n_rows, n_features)).astype(np.float32))
    features = np.sort(rng.choice(n_features, n_features // 2, replace=False))
    centers = X[rng.choice(n_rows, k, replace=False)][:, features]
    return X, features, centers


def test_bottom_codes_from_threads_equal_the_codes_of_one_thread():
    # Several blocks per call (the last one partial) and calls of different shapes, from
    # two threads at once: every call must see only its own scratch.
    rng = np.random.default_rng(0)
    cases = [_clustering(rng, n, 40, k) for n, k in [(9000, 300), (5000, 1200), (9000, 300)]]
    serial = [bottom_clustering_codes(X, f, c, "euclidean") for X, f, c in cases]
    with ThreadPoolExecutor(2) as pool:
        threaded = list(pool.map(lambda case: bottom_clustering_codes(*case, "euclidean"),
                                 cases * 2))  # fmt: skip
    for got, want in zip(threaded, serial * 2, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_bottom_codes_do_not_fault_in_fresh_pages_per_block_under_dask_malloc_settings():
    # Dask's nanny sets MALLOC_TRIM_THRESHOLD_, which turns off glibc's dynamic mmap
    # threshold: per-block temporaries would then be mmap'd and faulted in on every block.
    script = textwrap.dedent(
        """
        import resource
        import numpy as np
        from mbn_core.mbn.bottom import bottom_clustering_codes, input_row_norms, with_ones_column

        rng = np.random.default_rng(0)
        data = rng.random((12288, 400)).astype(np.float32)
        X, norms = with_ones_column(data), input_row_norms(data)  # as a fit passes them
        features = np.arange(0, 400, 2)
        centers = X[rng.choice(len(X), 500, replace=False)][:, features]
        bottom_clustering_codes(X, features, centers, "euclidean", norms)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            bottom_clustering_codes(X, features, centers, "euclidean", norms)
        print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
        """
    )
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": "65536", "OPENBLAS_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    faults_per_call = float(result.stdout)
    # Fresh temporaries would fault in the gathered input and the scores of every block:
    # 12,288 x (201 + 500) float32, about 8,400 pages per call.
    temporaries_pages = 12288 * (201 + 500) * 4 / 4096
    assert faults_per_call < 0.1 * temporaries_pages, faults_per_call
