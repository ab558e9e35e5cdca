"""one_blas_thread: every loaded BLAS at one thread inside, restored outside."""

from __future__ import annotations

import sys
import types

from threadpoolctl import threadpool_info

from mbn_core.utils import blas
from mbn_core.utils.blas import one_blas_thread


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
