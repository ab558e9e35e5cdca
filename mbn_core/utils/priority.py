"""A thread's CPU priority lowered, for work that others should not wait behind."""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

# Nice increments of a training job's work on threads of its own, which the job waits for
# later than for the student it runs beside: the student's MLP (one thread, the job's
# critical path) keeps its core, the held-out rows' embedding takes the other, and the map's
# layout, wanted only when the bundle is written, what is left.
HELD_OUT_NICENESS = 5
MAP_NICENESS = 10


def lower_thread_priority(increment: int) -> None:
    """Raise the calling thread's nice value by ``increment`` (Linux keeps one per thread;
    threads it starts inherit it; raising one's own needs no privilege). Where the platform
    refuses, the thread keeps its priority: results stay the same, only the share of a busy
    CPU differs."""
    if not increment:
        return
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + increment))
    except (AttributeError, OSError) as error:
        log.debug("could not lower a thread's priority: %s", error)
