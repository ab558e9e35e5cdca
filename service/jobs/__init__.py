"""Training jobs: what a job is (``model``), the table and its migrations (``schema``), the
database connections and the SQLite file's checks (``database``), the store that moves jobs
through their statuses exactly once (``store``), and their training data on disk (``files``).

Importers use the names below.
"""

from service.jobs.files import JobFiles
from service.jobs.model import (
    JOB_ID_PATTERN,
    JOB_STATUSES,
    STARTING_PHASE,
    TERMINAL_STATUSES,
    Job,
    is_job_id,
    new_job_id,
)
from service.jobs.schema import (
    BASELINE_REVISION,
    MIGRATIONS,
    NOTIFY_CHANNEL,
    VERSION_TABLE,
    jobs_table,
    metadata,
)
from service.jobs.store import JobStore

__all__ = [
    "BASELINE_REVISION",
    "JOB_ID_PATTERN",
    "JOB_STATUSES",
    "MIGRATIONS",
    "NOTIFY_CHANNEL",
    "STARTING_PHASE",
    "TERMINAL_STATUSES",
    "VERSION_TABLE",
    "Job",
    "JobFiles",
    "JobStore",
    "is_job_id",
    "jobs_table",
    "metadata",
    "new_job_id",
]
