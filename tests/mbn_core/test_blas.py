"""Thread limits: every loaded BLAS at one thread inside ``one_blas_thread``, restored
outside; limits held on several threads at once overlap without leaving a wrong count."""

from __future__ import annotations

import sys
import threading
import types

import pytest
from threadpoolctl import threadpool_info

from mbn_core.utils import blas
from mbn_core.utils.blas import limited_threads, one_blas_thread


def _blas_threads() -> list[int]:
    return [info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"]


def test_blas_is_one_thread_inside_and_restored_after():
    before = _blas_threads()
    assert before  # numpy's BLAS at least
    with one_blas_thread():
        assert set(_blas_threads()) == {1}
    assert _blas_threads() == before


def test_the_libraries_are_found_once_and_again_after_an_import():
    with one_blas_thread():
        pass
    found = blas._controller
    with one_blas_thread():
        pass
    assert blas._controller is found  # nothing imported since: the same controller
    sys.modules["_mbn_test_new_module"] = types.ModuleType("_mbn_test_new_module")
    try:
        with one_blas_thread():
            assert set(_blas_threads()) == {1}
        assert blas._controller is not found  # an import may have loaded another BLAS
    finally:
        del sys.modules["_mbn_test_new_module"]


def test_limits_held_on_two_threads_overlap_and_the_last_restores():
    # The order that left threadpoolctl's own limits wrong: the first holder leaves while
    # the second still holds, then the second leaves.
    before = _blas_threads()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with one_blas_thread():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with one_blas_thread():
            second_in.set()
            first_out.wait(5)
            seen["second alone"] = _blas_threads()
        seen["after both"] = _blas_threads()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert set(seen["second alone"]) == {1}  # still held by the second
    assert seen["after both"] == before


def test_the_smallest_limit_held_applies_until_it_is_released():
    before = _blas_threads()
    with limited_threads(4, "blas"):
        at_four = _blas_threads()
        with limited_threads(1):  # BLAS and OpenMP
            assert set(_blas_threads()) == {1}
            with limited_threads(3, "blas"):  # a larger limit held beside it changes nothing
                assert set(_blas_threads()) == {1}
            assert set(_blas_threads()) == {1}
        assert _blas_threads() == at_four == [4] * len(before)
    assert _blas_threads() == before


def test_an_unknown_library_kind_is_refused():
    with pytest.raises(ValueError, match="user_api='cuda'"), limited_threads(1, "cuda"):
        pass


def _openmp_threads() -> list[int]:
    return [info["num_threads"] for info in threadpool_info() if info["user_api"] == "openmp"]


def test_an_openmp_limit_is_set_in_every_holders_own_thread():
    # OpenMP keeps its count per thread: a second holder must set its own thread's even
    # while another thread already holds the same limit.
    import sklearn.cluster  # noqa: F401  (loads OpenMP)

    if not _openmp_threads():
        pytest.skip("no OpenMP library loaded")
    before = _openmp_threads()
    first_in, second_done = threading.Event(), threading.Event()
    seen = {}

    def first():
        with limited_threads(1, "openmp"):
            first_in.set()
            second_done.wait(5)

    def second():
        first_in.wait(5)
        with limited_threads(1, "openmp"):
            seen["inside"] = _openmp_threads()
        seen["after"] = _openmp_threads()
        second_done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert set(seen["inside"]) == {1}
    assert seen["after"] == before and _openmp_threads() == before
