"""HTTP routes: parse and answer; the work is done by the handlers (``service.handlers``)."""

from service.routes import console, embed, health, jobs, maps, models, monitor, runtime

__all__ = ["console", "embed", "health", "jobs", "maps", "models", "monitor", "runtime"]
