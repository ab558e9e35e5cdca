"""Process-wide thread limits of BLAS and OpenMP, shared by the threads that hold them.

A BLAS library's thread count is one setting for the whole process (OpenBLAS's own pool),
but a training job holds limits on several threads at once: the map's layout on its own
thread, the student's MLP and the exact embedding of held-out rows beside it.
``threadpoolctl.threadpool_limits`` cannot share it: it lets one Python thread at a time set
OpenBLAS's count (the others' limits are silently ignored), and on leaving restores what it
found on entering, whoever has set the count since. Here every holder registers its limit:
while any is held such a library runs on the smallest of them, and the last to leave
restores the count from before the first. OpenMP keeps its count per thread: each holder
sets its own thread's and restores it on leaving.

``threadpool_limits`` also finds the loaded libraries afresh at every call, milliseconds that
hold the interpreter lock, which a server pays on every exact request of more than a few rows
while its other threads wait for the lock. A ``ThreadpoolController`` finds them once; it is
found again whenever a module has been imported since (a newly imported extension may have
loaded another BLAS).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from threadpoolctl import ThreadpoolController

APIS = ("blas", "openmp")

_lock = threading.Lock()
_controller: ThreadpoolController | None = None
_modules_seen = -1
# Per API: the limits held now, and each library's thread count from before the first of
# them (``threadpoolctl``'s own limiter restores every library it found, of any API).
_held: dict[str, list[int]] = {api: [] for api in APIS}
_before: dict[str, list[tuple[Any, int]]] = {}


@contextmanager
def limited_threads(limit: int, user_api: str | None = None) -> Iterator[None]:
    """Run BLAS (``user_api="blas"``), OpenMP (``"openmp"``) or both (None) on at most
    ``limit`` threads within this context, on whichever thread holds it (see the module)."""
    limit = max(1, int(limit))
    apis = APIS if user_api is None else (user_api,)
    if any(api not in APIS for api in apis):
        raise ValueError(f"user_api={user_api!r} must be one of {APIS} or None")
    with _lock:
        libraries = [(api, _controller_now().select(user_api=api).lib_controllers) for api in apis]
        for api, found in libraries:
            _hold(api, limit, [library for library in found if not _per_thread(library)])
        own = [
            (library, library.num_threads)
            for _, found in libraries
            for library in found
            if _per_thread(library)
        ]
    # A per-thread setting (OpenMP's) is this thread's alone: set here, restored here.
    for library, _ in own:
        library.set_num_threads(limit)
    try:
        yield
    finally:
        for library, threads in reversed(own):
            library.set_num_threads(threads)
        with _lock:
            for api in apis:
                _release(api, limit)


def _per_thread(library: Any) -> bool:
    """Whether a library keeps its thread count per calling thread: OpenMP (and a BLAS built
    on it) does, while OpenBLAS's own threads and other BLAS keep one for the process."""
    return bool(
        library.user_api == "openmp" or getattr(library, "threading_layer", None) == "openmp"
    )


def one_blas_thread() -> AbstractContextManager[None]:
    """A context manager that limits every loaded BLAS to one thread, and restores them."""
    return limited_threads(1, "blas")


def one_openmp_thread() -> AbstractContextManager[None]:
    """A context manager that limits OpenMP (scikit-learn's compiled loops) to one thread.

    For calls too small to share: a neighbour search over a few hundred rows takes a few
    milliseconds on one thread, and on a busy machine 25 times that on two, whose workers
    spin at every barrier waiting for a core. The results do not depend on the threads.
    """
    return limited_threads(1, "openmp")


def _hold(api: str, limit: int, shared: list[Any]) -> None:
    """Register ``limit`` for ``api``'s process-wide libraries ``shared`` (those loaded
    now)."""
    held = _held[api]
    if not held:
        _before[api] = []
    # Libraries loaded since the first holder came (an import under a held limit) join in.
    known = {library.filepath for library, _ in _before[api]}
    for library in shared:
        if library.filepath not in known:
            _before[api].append((library, library.num_threads))
            _set_threads(library, min([limit, *held]))
    if held and limit < min(held):
        _set(api, limit)
    held.append(limit)


def _release(api: str, limit: int) -> None:
    held = _held[api]
    held.remove(limit)
    if not held:
        for library, threads in _before.pop(api):
            _set_threads(library, threads)
    elif limit < min(held):
        _set(api, min(held))


def _set(api: str, limit: int) -> None:
    for library, _ in _before[api]:
        _set_threads(library, limit)


def _set_threads(library: Any, threads: int) -> None:
    """Set one library's thread count from this thread. threadpoolctl lets only one Python
    thread at a time set a process-wide OpenBLAS pool (others are silently ignored); this
    module's lock already makes the setters take turns, so each takes the turn and gives it
    back."""
    give_back = getattr(type(library), "clear_controlling_thread", None)
    if give_back is not None:
        give_back(force=True)
    library.set_num_threads(threads)
    if give_back is not None:
        give_back(force=True)


def _controller_now() -> ThreadpoolController:
    global _controller, _modules_seen
    if _controller is None or len(sys.modules) != _modules_seen:
        _controller = ThreadpoolController()
        _modules_seen = len(sys.modules)
    return _controller
