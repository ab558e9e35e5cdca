"""How much memory this host (or its container) gives a process: what a training job's
expected peak is checked against before it starts."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

# cgroup v2, then v1: a container's limit is lower than the host's memory.
_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


def memory_limit() -> int | None:
    """The smaller of the host's physical memory and the cgroup's limit, in bytes; None
    where neither can be read (not Linux)."""
    limits = []
    with contextlib.suppress(AttributeError, ValueError, OSError):  # not a POSIX host
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for path in _CGROUP_LIMITS:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max": no limit
            limits.append(int(text))
    return min(limits) if limits else None
