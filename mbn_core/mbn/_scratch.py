"""Per-thread scratch arrays, reused from one call to the next.

The bottom layer's GEMM blocks need megabytes of temporaries per block (the gathered input and
the scores), thousands of times per fit. Freshly allocated, arrays that large come from
``mmap``: every page is faulted in and zeroed by the kernel, and freed again at once. glibc's
dynamic mmap threshold hides this in a plain process, but it is off wherever
``MALLOC_TRIM_THRESHOLD_`` is set, as Dask's nanny does for every worker: there the faults
cost a noticeable share of the bottom layer's CPU time
(docs/decisions/0014-dask-scratch-buffers-and-task-grouping.md). Reusing one buffer per thread
costs nothing anywhere.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import numpy.typing as npt


class ScratchArrays(threading.local):
    """Named buffers of the calling thread, grown on demand and never shrunk.

    ``array(name, shape, dtype)`` returns a C-contiguous view of the thread's buffer for
    ``name``; its contents are undefined, and it stays valid until the same thread asks for
    ``name`` again. A thread therefore holds at most the largest request per name.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def array(self, name: str, shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
        size = math.prod(shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.size < size:
            buffer = np.empty(size, dtype=dtype)
            self._buffers[name] = buffer
        return buffer[:size].reshape(shape)
