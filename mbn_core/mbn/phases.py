"""Where a fit's time goes: seconds per phase of ``MBN.fit``, for whoever asks.

    with timed_phases() as times:
        MBN().fit(X)
    times.seconds  # {"auto": ..., "bottom": ..., "draws": ..., "upper": ..., "output": ...}

The phases:

- ``auto``: measuring the "auto" choices (the bottom layer's feature count, delta);
- ``draws``: every random draw of the layers (the bottom layer's chosen inputs and centers,
  and the upper layers' center rows, drawn on a thread of their own beside the layers, so
  their seconds overlap the ``upper`` ones);
- ``bottom``: the bottom layer's codes (its center rows packed, then every clustering);
- ``upper``: the upper layers' codes, each layer's shared structures included (the wall time
  of the fit's thread, waits for the draws included);
- ``output``: the embedding's output (the PCA of the top codes, or UMAP's layout).

Nothing is recorded, and nothing costs, outside ``timed_phases``. The record belongs to the
context that opened it (a ``ContextVar``): fits on other threads are not counted.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field

PHASES = ("auto", "draws", "bottom", "upper", "output")


@dataclass
class PhaseTimes:
    """Seconds spent in each phase (``PHASES``) of the fits timed by ``timed_phases``."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, phase: str, seconds: float) -> None:
        if phase not in self.seconds:
            raise ValueError(f"unknown phase {phase!r}; phases are {', '.join(PHASES)}")
        with self._lock:
            self.seconds[phase] += seconds

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the seconds the block takes to phase ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)


_current: ContextVar[PhaseTimes | None] = ContextVar("mbn_phase_times", default=None)


@contextlib.contextmanager
def timed_phases() -> Iterator[PhaseTimes]:
    """Record the phases of every fit made in this context into the ``PhaseTimes`` given."""
    times = PhaseTimes()
    token = _current.set(times)
    try:
        yield times
    finally:
        _current.reset(token)


def current_times() -> PhaseTimes | None:
    """The record of the enclosing ``timed_phases``, or None: what a thread that works for
    the fit (the draws') is handed, since a ``ContextVar`` does not follow it there."""
    return _current.get()


def phase(name: str, times: PhaseTimes | None = None) -> contextlib.AbstractContextManager[None]:
    """A block timed into phase ``name`` of ``times`` (by default the context's record); a
    no-op where nothing records."""
    times = times if times is not None else _current.get()
    return contextlib.nullcontext() if times is None else times.phase(name)
