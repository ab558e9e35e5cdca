"""HTTP routes: parse and answer; the work is done by the registry, the store and the worker."""

from service.routes import embed, health, jobs, models

__all__ = ["embed", "health", "jobs", "models"]
