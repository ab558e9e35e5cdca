"""BLAS held at one thread while a network's own threads run, at the cost of a counter.

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
    global _controller, _modules_seen
    with _lock:
        if _controller is None or len(sys.modules) != _modules_seen:
            _controller = ThreadpoolController()
            _modules_seen = len(sys.modules)
        controller = _controller
    return controller.limit(limits=1, user_api="blas")
