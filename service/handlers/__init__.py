"""The layer beneath the routes, in the manner of MLServer's data plane.

Routes parse requests and shape answers; a handler does the work in between: it resolves the
model or job a request names, checks that the request fits its state, talks to the registry,
the job store and the submitter, and returns plain values (a ``Job``, a ``ModelEntry``, an
``Embedding``). It knows nothing of HTTP or of the response schemas: it raises domain errors
(``service.domain``) and ``service/errors.py`` says what each one becomes.

Handlers that only wait on the job store and the model directory are plain, blocking methods:
their routes are plain functions, which FastAPI runs on its thread pool (and validates their
answers there too, off the event loop), or run them with ``run_in_threadpool`` after reading a
body. ``EmbedHandler`` is the exception: a coroutine, because it decides itself where each
computation runs (on the event loop, on the row budget's threads, in the exact runtime).

One module per handler:

- ``embed``: ``EmbedHandler`` (``POST /embed``);
- ``training``: ``TrainingHandler`` (``POST /train``: checks and queues jobs);
- ``jobs``: ``JobsHandler`` (listing, reading and cancelling jobs);
- ``models``: ``ModelsHandler`` (listing, promoting and deleting models);
- ``maps``: ``MapsHandler`` (a model's stored 2-D map, locating embeddings on it);
- ``runtime``: ``RuntimeHandler`` (the exact runtime's state and figures).
"""

from service.handlers.embed import Embedding, EmbedHandler
from service.handlers.jobs import Job, JobsHandler
from service.handlers.maps import Located, MapsHandler, ModelMapView
from service.handlers.models import ModelEntry, ModelListing, ModelsHandler
from service.handlers.runtime import RuntimeHandler, RuntimeReport
from service.handlers.training import TrainingHandler

__all__ = [
    "EmbedHandler",
    "Embedding",
    "Job",
    "JobsHandler",
    "Located",
    "MapsHandler",
    "ModelEntry",
    "ModelListing",
    "ModelMapView",
    "ModelsHandler",
    "RuntimeHandler",
    "RuntimeReport",
    "TrainingHandler",
]
