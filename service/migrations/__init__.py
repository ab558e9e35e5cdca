"""Alembic migrations of the job store (``service.jobs.JobStore.create_schema`` runs them)."""
