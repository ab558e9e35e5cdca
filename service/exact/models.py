"""The exact models a runtime holds: mapped from their bundles, verified, least recently used
dropped, computing on the device the runtime was given.

A model is asked for by bundle id and the SHA-256 of its exact file as the API process
verified it: a bundle replaced under the same id since then is refused (the API process's
registry verifies it again) rather than silently computed with other arrays. A held model
whose file changes on disk (tampered with in place) is dropped at its next use and read
again, which verifies it again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cachetools import LRUCache

from mbn_core.bundle import BundleError, ExactModel, read_manifest, validate_model_id
from mbn_core.bundle.load import load_exact
from mbn_core.bundle.manifest import exact_file
from mbn_core.methods import get_method

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelKey:
    """Which exact model: the bundle id and its exact file's SHA-256."""

    id: str
    sha256: str


class ModelFailure(Exception):
    """A model that cannot compute: ``kind`` is a ``wire.FailureKind`` ("damaged",
    "not_found" or "unavailable"); the message names the model, never a server path."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class HeldModel:
    """An exact model in the runtime, and what it was read from."""

    key: ModelKey
    exact: ExactModel
    # The file's identity when it was verified: (inode, size, mtime).
    file_facts: tuple[int, int, int]
    path: Path
    # Whether ``transform`` gives each row the same bits whatever rows share the call
    # (``Method.batch_independent_exact``): only then are requests merged.
    batch_independent: bool
    device: str

    @property
    def nbytes(self) -> int:
        return self.exact.nbytes


class ModelCache:
    """Exact models by ``ModelKey``, at most ``capacity``, least recently used dropped.

    Parameters
    ----------
    model_dir : Path
    capacity : int
    threads : int
        Threads of each model's computation.
    device : {"cpu", "cuda"}
        Where models whose estimator has a ``device`` parameter compute (the same backend
        interface as training); others compute on the CPU.
    """

    def __init__(self, model_dir: Path, *, capacity: int, threads: int, device: str) -> None:
        self.model_dir = model_dir
        self.threads = threads
        self.device = device
        self._lock = threading.Lock()
        self._models: LRUCache[ModelKey, HeldModel] = LRUCache(maxsize=max(1, capacity))
        # One lock per model being read, so that lanes asking for it at once read it once.
        self._loading: dict[ModelKey, threading.Lock] = {}

    def get(self, key: ModelKey) -> HeldModel:
        """The model, read now if it is not held (blocking: a compute thread's job);
        ``ModelFailure`` when it cannot be."""
        held = self._current(key)
        if held is not None:
            return held
        with self._lock:
            loading = self._loading.setdefault(key, threading.Lock())
        try:
            with loading:
                held = self._current(key)  # read by the lane we waited for
                if held is None:
                    held = self._load(key)
                    with self._lock:
                        self._models[key] = held
                return held
        finally:
            with self._lock:
                self._loading.pop(key, None)

    def peek(self, key: ModelKey) -> HeldModel | None:
        """The model if it is held (and its file unchanged), without reading it."""
        return self._current(key)

    def _current(self, key: ModelKey) -> HeldModel | None:
        """The held model, unless its file changed on disk since it was read (then dropped)."""
        with self._lock:
            held = self._models.get(key)
        if held is None or _facts(held.path) == held.file_facts:
            return held
        log.warning("model %s: its exact file changed on disk; reading it again", key.id)
        self.drop(key)
        return None

    def drop(self, key: ModelKey) -> None:
        with self._lock:
            self._models.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._models)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(held.nbytes for held in self._models.values())

    def _load(self, key: ModelKey) -> HeldModel:
        try:
            validate_model_id(key.id)
        except ValueError:
            raise ModelFailure("not_found", f"no model {key.id[:80]!r}") from None
        path = self.model_dir / key.id
        if path.is_symlink() or not path.is_dir():
            raise ModelFailure("not_found", f"model {key.id!r} was deleted")
        try:
            manifest = read_manifest(path)
            name = exact_file(manifest)
            sha256 = manifest["files"][name]["sha256"]
            if sha256 != key.sha256:
                raise BundleError(
                    f"{path / name}: replaced since the model was verified (SHA-256 "
                    f"{sha256[:12]}..., not {key.sha256[:12]}...)"
                )
            facts = _facts(path / name)
            exact = load_exact(path, threads=self.threads, mapped=True)
            method = get_method(manifest["method"])
            device = self._place(exact)
        except BundleError as error:
            raise ModelFailure("damaged", self._describe(path, error)) from None
        except FileNotFoundError:
            raise ModelFailure("not_found", f"model {key.id!r} was deleted") from None
        except (MemoryError, OSError) as error:
            # Too little memory (or address space) to map or build the model.
            log.error("model %s cannot be read: %r", key.id, error)
            raise ModelFailure(
                "unavailable", f"model {key.id!r} cannot be loaded now (not enough memory?)"
            ) from None
        except ValueError as error:  # an unknown method (plug-in missing), a bad array
            raise ModelFailure("damaged", self._describe(path, error)) from None
        log.info(
            "model %s: exact model mapped (%.1f MiB of arrays, %s)",
            key.id,
            exact.nbytes / (1 << 20),
            device,
        )
        return HeldModel(key, exact, facts, path / name, method.batch_independent_exact, device)

    def _place(self, exact: ExactModel) -> str:
        """Put the estimator on the runtime's device, when it takes one."""
        estimator = exact.estimator
        if self.device != "cpu" and "device" in estimator.get_params(deep=False):
            estimator.set_params(device=self.device)
            return self.device
        return "cpu"

    def _describe(self, path: Path, error: Exception) -> str:
        """The error without server paths: files are named relative to the bundle."""
        message = str(error)
        for prefix, name in ((f"{path}/", ""), (str(path), path.name)):
            message = message.replace(prefix, name)
        return message.replace(str(self.model_dir), "<model dir>")


def _facts(path: Path) -> tuple[int, int, int]:
    with contextlib.suppress(OSError):
        st = os.stat(path)
        return st.st_ino, st.st_size, st.st_mtime_ns
    return (-1, -1, -1)


def embed_rows(held: HeldModel, rows: np.ndarray) -> np.ndarray:
    """The estimator's float32 embedding of checked, scaled ``rows`` (no alignment, no
    clustering head: those apply to a whole request, ``finish_request``)."""
    return held.exact.embed_raw(rows)
