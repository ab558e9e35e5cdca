"""A Python client of the HTTP service (``mbn serve``): embed, train, models, monitor.

::

    from mbn_core.client import Client

    client = Client("http://localhost:8000", api_key="...")   # api_key: when keys are set
    result = client.embed(X, model="digits")                  # NumPy in, NumPy out
    result.embeddings, result.clusters
    job = client.train("digits.npz", {"n_clusters": 10}, name="digits")
    job.wait(progress=lambda job: print(job.phase, job.progress))
    client.promote(job.model_id)

It needs httpx only (the ``client`` extra) and imports nothing of the server. Rows travel as
base64 float32 both ways (a quarter of JSON's bytes, and no float printing), in batches of at
most ``batch_rows``. Answers of 429 and 503 (overload, not ready) are retried after the
server's ``Retry-After``, up to ``retries`` times; any other error answer raises ``ApiError``
with the server's own message.
"""

from __future__ import annotations

import base64
import io
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mbn_core.utils.npz import npz_bytes

try:
    import httpx
except ImportError as error:  # pragma: no cover - depends on the environment
    from mbn_core.distribution import install_hint

    raise ImportError(f"mbn_core.client needs httpx: {install_hint('client')}") from error

__all__ = ["ApiError", "Client", "Embedding", "Job"]

# Statuses retried after Retry-After: the server refused at once (overloaded, not ready),
# having done nothing, so the same request is safe to send again.
RETRIED = (429, 503)
# Seconds waited when a retried answer names none.
DEFAULT_RETRY_AFTER = 1.0
FINISHED = ("succeeded", "failed", "cancelled")


class ApiError(Exception):
    """An error answer of the service.

    Attributes
    ----------
    status : int
        The HTTP status (422 invalid input, 404 unknown model, 429 overloaded, ...).
    type : str
        The service's error type (``invalid_input``, ``not_found``, ...).
    message : str
        The service's message, as it wrote it.
    retry_after : float or None
        Seconds the service asked to wait before trying again.
    """

    def __init__(
        self, status: int, type: str, message: str, retry_after: float | None = None
    ) -> None:
        super().__init__(f"{status} {type}: {message}")
        self.status = status
        self.type = type
        self.message = message
        self.retry_after = retry_after


@dataclass(frozen=True)
class Embedding:
    """What ``Client.embed`` got back.

    Attributes
    ----------
    embeddings : ndarray of shape (n, dim), float32
    clusters : ndarray of shape (n,), int64, or None
        Cluster ids, when the model has a clustering head.
    novelty : ndarray of shape (n,), float64, or None
        Novelty scores (``return_novelty``; None when the model has no novelty model).
    novel : ndarray of shape (n,), bool, or None
        Whether each row is novel.
    model, name, mode : str
        The model that answered (its id and name) and the mode.
    out_of_range : ndarray of shape (n,), bool, or None
        Whether each row has a feature outside the training range (``return_novelty``).
    novelty_unavailable : str or None
        Why ``novelty`` (or ``out_of_range``) is None although asked for.
    """

    embeddings: np.ndarray
    clusters: np.ndarray | None
    novelty: np.ndarray | None
    novel: np.ndarray | None
    model: str
    name: str
    mode: str
    out_of_range: np.ndarray | None = None
    novelty_unavailable: str | None = None


@dataclass
class Job:
    """A training job, as the service last described it (``refresh`` asks again).

    Attributes
    ----------
    id, name, method, status : str
        ``status`` is one of queued, running, succeeded, failed, cancelled.
    progress : float
        Fraction done, 0..1.
    phase : str or None
        The phase running (fit, compressor, report, export).
    model_id : str or None
        The model made, once the job succeeded.
    error : str or None
        Why it failed.
    info : dict
        Everything the service said of it (params, shape, times).
    """

    id: str
    name: str
    method: str
    status: str
    progress: float
    phase: str | None
    model_id: str | None
    error: str | None
    info: dict[str, Any] = field(repr=False)
    _client: Client = field(repr=False, compare=False)

    @classmethod
    def _of(cls, client: Client, info: dict[str, Any]) -> Job:
        return cls(
            id=info["id"],
            name=info["name"],
            method=info.get("method", ""),
            status=info["status"],
            progress=float(info.get("progress", 0.0)),
            phase=info.get("phase"),
            model_id=info.get("model_id"),
            error=info.get("error"),
            info=info,
            _client=client,
        )

    @property
    def done(self) -> bool:
        return self.status in FINISHED

    def refresh(self) -> Job:
        """Ask the service again; returns self, updated."""
        fresh = self._client.job(self.id)
        for name in ("status", "progress", "phase", "model_id", "error", "info"):
            setattr(self, name, getattr(fresh, name))
        return self

    def wait(
        self,
        progress: Callable[[Job], object] | None = None,
        *,
        timeout: float | None = None,
        poll: float = 1.0,
    ) -> Job:
        """Poll until the job ends; ``progress(job)`` after each change of its progress or
        phase. Returns self; raises ``ApiError`` when it failed or was cancelled (its status
        is 200: the job's own), and ``TimeoutError`` past ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seen: tuple[str, float, str | None] | None = None
        while True:
            now = (self.status, self.progress, self.phase)
            if progress is not None and now != seen:
                progress(self)
                seen = now
            if self.done:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.id} still {self.status} after {timeout} s")
            time.sleep(poll)
            self.refresh()
        if self.status != "succeeded":
            reason = self.error or "cancelled"
            raise ApiError(200, f"job_{self.status}", f"job {self.id} {self.status}: {reason}")
        return self

    def cancel(self) -> Job:
        """Cancel the job (ApiError 409 when it already finished); returns self, updated."""
        info = self._client._request("POST", f"/jobs/{self.id}/cancel").json()
        fresh = Job._of(self._client, info)
        for name in ("status", "progress", "phase", "model_id", "error", "info"):
            setattr(self, name, getattr(fresh, name))
        return self


class Client:
    """A client of one ``mbn serve`` (or of the load balancer in front of several).

    Parameters
    ----------
    url : str
        The service's base URL, e.g. ``http://localhost:8000``.
    api_key : str, default=None
        Sent as ``Authorization: Bearer <key>`` (servers with ``MBN_API_KEYS``).
    timeout : float, default=120
        Seconds each request may take.
    retries : int, default=5
        Times an answer of 429 or 503 is retried, after the server's ``Retry-After``.
    max_retry_wait : float, default=60
        The longest single wait between tries, whatever ``Retry-After`` says.
    batch_rows : int, default=4096
        Rows per ``/embed`` request; larger inputs are sent in batches.
    transport : httpx.BaseTransport, default=None
        For httpx's own options (proxies, certificates go through ``client_options``).
    client_options : mapping, default=None
        More keyword arguments of ``httpx.Client``.
    """

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float = 120.0,
        retries: int = 5,
        max_retry_wait: float = 60.0,
        batch_rows: int = 4096,
        transport: httpx.BaseTransport | None = None,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        if retries < 0 or batch_rows < 1:
            raise ValueError("retries must be >= 0 and batch_rows >= 1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.retries = retries
        self.max_retry_wait = max_retry_wait
        self.batch_rows = batch_rows
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            transport=transport,
            **dict(client_options or {}),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------- embedding

    def embed(
        self,
        X,
        *,
        model: str | None = None,
        mode: str = "fast",
        return_novelty: bool = False,
        return_clusters: bool = True,
    ) -> Embedding:
        """Embed the rows of ``X`` (array-like of shape (n, d), or one row of shape (d,))
        with ``model`` (id or name; None: the default model), in ``mode`` "fast" or
        "exact". Rows go as float32, in batches of ``batch_rows``."""
        rows = np.asarray(X, dtype=np.float32)
        if rows.ndim == 1:
            rows = rows[None, :]
        if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[1] == 0:
            raise ValueError(f"X must be a non-empty 2-D array of rows, got shape {rows.shape}")
        options = (model, mode, return_novelty, return_clusters)
        parts = [
            self._embed_batch(rows[start : start + self.batch_rows], *options)
            for start in range(0, rows.shape[0], self.batch_rows)
        ]
        first = parts[0]

        def joined(name: str) -> np.ndarray | None:
            values = [getattr(part, name) for part in parts]
            return None if any(v is None for v in values) else np.concatenate(values)

        embeddings = joined("embeddings")
        assert embeddings is not None
        return Embedding(
            embeddings=embeddings,
            clusters=joined("clusters"),
            novelty=joined("novelty"),
            novel=joined("novel"),
            model=first.model,
            name=first.name,
            mode=first.mode,
            out_of_range=joined("out_of_range"),
            novelty_unavailable=first.novelty_unavailable,
        )

    def _embed_batch(
        self, rows: np.ndarray, model: str | None, mode: str, novelty: bool, clusters: bool
    ) -> Embedding:
        body: dict[str, Any] = {
            "inputs_b64": base64.b64encode(np.ascontiguousarray(rows, "<f4").tobytes()).decode(),
            "dim": int(rows.shape[1]),
            "mode": mode,
            "encoding_format": "base64",
            "return_clusters": clusters,
            "return_novelty": novelty,
        }
        if model is not None:
            body["model"] = model
        answer = self._request("POST", "/embed", json=body).json()
        embeddings = np.frombuffer(base64.b64decode(answer["embeddings_b64"]), dtype="<f4")
        embeddings = embeddings.reshape(answer["n"], answer["dim"]).astype(np.float32)

        def array(name: str, dtype: Any) -> np.ndarray | None:
            values = answer.get(name)
            return None if values is None else np.asarray(values, dtype=dtype)

        return Embedding(
            embeddings=embeddings,
            clusters=array("clusters", np.int64),
            novelty=array("novelty", np.float64),
            novel=array("novel", bool),
            model=answer["model"],
            name=answer["name"],
            mode=answer["mode"],
            out_of_range=array("out_of_range", bool),
            novelty_unavailable=answer.get("novelty_unavailable"),
        )

    # ---------------------------------------------------------------------- training

    def train(
        self,
        data,
        params: Mapping[str, Any] | None = None,
        *,
        name: str = "model",
        method: str | None = None,
        labels=None,
        promote: bool = False,
        align_to: str | None = None,
        columns: str | list[str | int] | None = None,
        drop: str | list[str | int] | None = None,
    ) -> Job:
        """Start a training job and return it (``Job.wait`` follows it).

        ``data`` is a path to a data file (.npy, .npz with ``x`` and optional ``y``, or
        .csv: ``columns`` or ``drop`` choose its columns) or an array of rows (sent as an
        .npy file, with ``labels`` as the .npz's ``y``). ``params`` are the method's
        training options (those of ``mbn train``)."""
        form: dict[str, str] = {"name": name, "params": json.dumps(dict(params or {}))}
        if method is not None:
            form["method"] = method
        if promote:
            form["promote"] = "true"
        if align_to is not None:
            form["align_to"] = align_to
        for key, value in (("columns", columns), ("drop", drop)):
            if value is not None:
                form[key] = value if isinstance(value, str) else ",".join(map(str, value))
        if isinstance(data, str | os.PathLike):
            path = Path(data)
            if labels is not None:
                raise ValueError("labels go with rows; a file brings its own (an .npz's y)")
            content, filename = path.read_bytes(), path.name
        else:
            rows = np.asarray(data, dtype=np.float32)
            if labels is None:
                buffer = io.BytesIO()
                np.save(buffer, rows, allow_pickle=False)
                content, filename = buffer.getvalue(), "data.npy"
            else:
                content = npz_bytes({"x": rows, "y": np.asarray(labels)})
                filename = "data.npz"
        answer = self._request(
            "POST", "/train", data=form, files={"file": (filename, content)}
        ).json()
        return Job._of(self, answer)

    def job(self, job_id: str) -> Job:
        """A training job by its id."""
        return Job._of(self, self._request("GET", f"/jobs/{job_id}").json())

    def jobs(self, status: str | None = None, limit: int = 100) -> list[Job]:
        """Training jobs, newest first (``status``: only those in it)."""
        query: dict[str, Any] = {"limit": limit}
        if status is not None:
            query["status"] = status
        answer = self._request("GET", "/jobs", params=query).json()
        return [Job._of(self, info) for info in answer["jobs"]]

    # ---------------------------------------------------------------------- models

    def models(self) -> list[dict[str, Any]]:
        """The models the service has (id, name, dimensions, ``default``, ``current``)."""
        return self._request("GET", "/models").json()["models"]

    def model(self, ref: str) -> dict[str, Any]:
        """A model's manifest (by id, or by name: the version it resolves to)."""
        return self._request("GET", f"/models/{ref}").json()

    def promote(self, model_id: str, *, default: bool = True) -> dict[str, Any]:
        """Make ``model_id`` the version its name resolves to and (unless ``default`` is
        False) the default model."""
        query = {"default": "true" if default else "false"}
        return self._request("POST", f"/models/{model_id}/promote", params=query).json()

    def delete(self, model_id: str, *, force: bool = False) -> None:
        """Delete a model (ApiError 409 for the default, a name's chosen version or a
        model others are aligned to, unless ``force``)."""
        query = {"force": "true"} if force else {}
        self._request("DELETE", f"/models/{model_id}", params=query)

    def monitor(self, model: str) -> dict[str, Any]:
        """The live monitor of ``model`` on the replica that answers: live fidelity of the
        fast path and input novelty on recent traffic."""
        return self._request("GET", f"/models/{model}/monitor").json()

    def compare(self, model_a: str, model_b: str) -> dict[str, Any]:
        """How comparable two models' vectors are, on reference rows."""
        return self._request("GET", f"/models/{model_a}/compare/{model_b}").json()

    def ready(self) -> bool:
        """Whether the service says it is ready for traffic (``/health/ready``)."""
        return self._http.get("/health/ready").status_code == 200

    # ---------------------------------------------------------------------- transport

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send, retrying 429 and 503 after Retry-After; ApiError for any other error."""
        for attempt in range(self.retries + 1):
            response = self._http.request(method, path, **kwargs)
            if response.status_code < 400:
                return response
            error = _api_error(response)
            if response.status_code not in RETRIED or attempt == self.retries:
                raise error
            wait = error.retry_after if error.retry_after is not None else DEFAULT_RETRY_AFTER
            time.sleep(min(max(wait, 0.0), self.max_retry_wait))
        raise AssertionError("unreachable")  # pragma: no cover


def _api_error(response: httpx.Response) -> ApiError:
    retry_after = None
    header = response.headers.get("retry-after")
    if header is not None:
        try:
            retry_after = float(header)
        except ValueError:  # an HTTP date: not sent by the service; wait the default
            retry_after = None
    try:
        detail = response.json()["error"]
        kind, message = str(detail["type"]), str(detail["message"])
    except (ValueError, KeyError, TypeError):
        kind, message = "http_error", response.text[:500] or response.reason_phrase
    return ApiError(response.status_code, kind, message, retry_after)
