"""The jobs handler: reads and cancels training jobs (``GET /jobs``, ``POST .../cancel``)."""

from __future__ import annotations

from service.jobs import Job, JobFiles, JobStore


class JobsHandler:
    """Reads training jobs and cancels them.

    Parameters
    ----------
    store : JobStore
        Where the jobs are (raises ``NotFound``, ``Conflict``, ``Unavailable``).
    files : JobFiles
        The jobs' training data: a job cancelled before any worker took it leaves its data
        to nobody, so cancelling removes it.
    """

    def __init__(self, store: JobStore, files: JobFiles) -> None:
        self.store = store
        self.files = files

    def list_jobs(self, *, status: str | None = None, limit: int = 100) -> list[Job]:
        """Jobs newest first, only those in ``status`` when given, at most ``limit``."""
        return self.store.list_jobs(status=status, limit=limit)

    def get(self, job_id: str) -> Job:
        """The job, or ``NotFound``."""
        return self.store.require(job_id)

    def cancel(self, job_id: str) -> Job:
        """Cancel a queued or running job: ``NotFound``, or ``Conflict`` when it finished."""
        before = self.store.require(job_id)
        job = self.store.cancel(job_id)
        if before.status == "queued":
            self.files.remove(job_id)  # no worker will read it; a running job's worker cleans up
        return job
