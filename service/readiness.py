"""Readiness computed beside the traffic, answered from memory.

``/health/ready`` must answer at once even when every request thread is busy and the job
store is slow: a probe that queues behind work times out and gets a healthy replica killed.
So the checks (job store, disk, models) run every ``interval`` seconds on a thread of their
own, and the endpoint reads the latest result. A check that hangs makes the result stale,
which is itself reported as not ready. Changes of state are logged (loudly when a replica
stops being ready), so an operator sees when and why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

Result = tuple[dict[str, bool], list[str]]


class ReadinessMonitor:
    """Runs ``check`` every ``interval`` seconds on its own thread; ``current`` reads it.

    Parameters
    ----------
    check : callable
        Returns ``(checks, problems)``; ready when ``problems`` is empty.
    interval : float
    stale_after : float
        A result older than this (the check hangs) counts as not ready.
    """

    def __init__(self, check: Callable[[], Result], *, interval: float, stale_after: float):
        self._check = check
        self.interval = interval
        self.stale_after = stale_after
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mbn-readiness")
        self._latest: Result | None = None
        self._at = 0.0
        self._was_ready = False

    def current(self) -> Result:
        """The latest result (never blocks)."""
        if self._latest is None:
            return {"models_scanned": False}, ["starting"]
        checks, problems = self._latest
        age = time.monotonic() - self._at
        if age > self.stale_after:
            return checks, [*problems, f"readiness checks have not answered for {age:.0f} s"]
        return checks, problems

    async def run_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                result = await loop.run_in_executor(self._pool, self._check)
            except Exception as exc:
                log.exception("readiness check failed")
                result = ({}, [f"readiness check failed ({type(exc).__name__})"])
            self._record(result)
            await asyncio.sleep(self.interval)

    def _record(self, result: Result) -> None:
        before = None if self._latest is None else self._latest[1]
        self._latest, self._at = result, time.monotonic()
        problems = result[1]
        if problems == before:
            return
        if problems and self._was_ready:
            log.error("NOT READY: %s", "; ".join(problems))
        elif problems:
            log.info("not ready yet: %s", "; ".join(problems))
        elif self._was_ready:
            log.warning("ready again (was: %s)", "; ".join(before or []))
        else:
            log.info("ready")
        self._was_ready = self._was_ready or not problems

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
