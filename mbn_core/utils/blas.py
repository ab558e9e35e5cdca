"""BLAS (or OpenMP) held at one thread while a network's own threads run, at the cost of a
counter.

``threadpoolctl.threadpool_limits`` finds the loaded BLAS libraries afresh at every call,
milliseconds that hold the interpreter lock, which a server pays on every exact request of
more than a few rows while its other threads wait for the lock. A
``ThreadpoolController`` finds them once; it is found again whenever a module has been
imported since (a newly imported extension may have loaded another BLAS).
"""

from __future__ import annotations

import sys
import threading
from contextlib import AbstractContextManager
from typing import Any

from threadpoolctl import ThreadpoolController

_lock = threading.Lock()
_controller: ThreadpoolController | None = None
_modules_seen = -1


def one_blas_thread() -> AbstractContextManager[Any]:
    """A context manager that limits every loaded BLAS to one thread, and restores them."""
    return _controller_now().limit(limits=1, user_api="blas")


def one_openmp_thread() -> AbstractContextManager[Any]:
    """A context manager that limits OpenMP (scikit-learn's compiled loops) to one thread.

    For calls too small to share: a neighbour search over a few hundred rows takes a few
    milliseconds on one thread, and on a busy machine 25 times that on two, whose workers
    spin at every barrier waiting for a core. The results do not depend on the threads.
    """
    return _controller_now().limit(limits=1, user_api="openmp")


def _controller_now() -> ThreadpoolController:
    global _controller, _modules_seen
    with _lock:
        if _controller is None or len(sys.modules) != _modules_seen:
            _controller = ThreadpoolController()
            _modules_seen = len(sys.modules)
        return _controller
