"""Removing what dead processes left behind: upload folders and staging directories.

A worker killed with SIGKILL (or a machine gone) cannot clean up after itself, and a job
cancelled while its worker was gone has nobody left to remove its data. Every worker sweeps
at its recovery interval:

- ``<data>/jobs/<job id>``: removed when the job is finished (succeeded, failed, cancelled);
  when no job has that id, only once nothing in it changed for ``UNKNOWN_GRACE_SECONDS``
  (data is written before its job row exists, so a young folder may be a submit in flight);
- ``<data>/staging/<job id>-<attempt>``: removed unless that job is running that attempt;
- ``<models>/.deleted-*``: deletions interrupted between rename and removal.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from service.config import Settings
from service.jobs import JobStore, is_job_id

log = logging.getLogger(__name__)

UNKNOWN_GRACE_SECONDS = 3600.0


def sweep(settings: Settings, store: JobStore, *, now: float | None = None) -> list[Path]:
    """Remove leftovers; returns what was removed. Raises ``Unavailable`` if the store is."""
    now = time.time() if now is None else now
    removed = []
    for folder in _entries(settings.jobs_path):
        job = store.get(folder.name) if is_job_id(folder.name) else None
        if job is not None and not job.finished:
            continue
        if job is None and now - _newest_mtime(folder) < UNKNOWN_GRACE_SECONDS:
            continue
        removed.append(folder)
    for folder in _entries(settings.data_dir / "staging"):
        job_id, _, attempt = folder.name.rpartition("-")
        job = store.get(job_id) if is_job_id(job_id) else None
        if job is not None and job.status == "running" and str(job.attempts) == attempt:
            continue
        removed.append(folder)
    removed += [p for p in _entries(settings.models_path) if p.name.startswith(".deleted-")]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
        log.info("removed leftover %s", path)
    return removed


def _entries(directory: Path) -> list[Path]:
    try:
        return [p for p in directory.iterdir() if p.is_dir() and not p.is_symlink()]
    except FileNotFoundError:
        return []


def _newest_mtime(folder: Path) -> float:
    try:
        return max([folder.stat().st_mtime] + [p.stat().st_mtime for p in folder.iterdir()])
    except FileNotFoundError:  # removed or renamed meanwhile: look again next time
        return time.time()
