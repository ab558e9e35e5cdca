"""The model registry: every verified bundle of the model directory, addressable by id or name.

Readers take one immutable ``Snapshot`` reference and use it; writers (start-up scan, periodic
or on-miss rescans, a finished job, a delete) build a new snapshot beside it and swap the
reference under a lock, so a request never sees a half-loaded model set (MLServer's "swap,
don't mutate"). Bundles are verified (hashes, format version) before they enter a snapshot.

Names and ids from requests are matched against the snapshot only; the one place a path is
built from them (``delete``) checks the id's syntax first and that the path stays directly
inside the model directory.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mbn_core.bundle import Bundle, BundleError, load_bundle, validate_model_id
from service.errors import InvalidInput, NotFound, Unavailable

log = logging.getLogger(__name__)


def is_model_id(value: str) -> bool:
    """Whether ``value`` is a valid bundle id, i.e. a safe directory name."""
    try:
        validate_model_id(value)
    except ValueError:
        return False
    return True


def _newest_first_key(bundle: Bundle) -> tuple[str, str]:
    return (str(bundle.created), bundle.id)


@dataclass(frozen=True)
class Snapshot:
    """An immutable view of the loaded models."""

    by_id: dict[str, Bundle] = field(default_factory=dict)
    by_name: dict[str, Bundle] = field(default_factory=dict)  # newest version of each name
    default: Bundle | None = None

    @classmethod
    def build(cls, bundles: Iterable[Bundle], default_ref: str | None) -> Snapshot:
        by_id = {b.id: b for b in bundles}
        by_name: dict[str, Bundle] = {}
        for bundle in sorted(by_id.values(), key=_newest_first_key):
            by_name[bundle.name] = bundle  # later (newer) ones win
        default = None
        if default_ref is not None:
            default = by_id.get(default_ref) or by_name.get(default_ref)
        if default is None and by_id:
            default = max(by_id.values(), key=_newest_first_key)
        return cls(by_id=by_id, by_name=by_name, default=default)

    def resolve(self, ref: str | None) -> Bundle | None:
        if ref is None:
            return self.default
        return self.by_id.get(ref) or self.by_name.get(ref)


class ModelRegistry:
    """Loads, verifies, caches and serves the bundles of ``model_dir``.

    Parameters
    ----------
    model_dir : Path
        One sub-directory per model id. Directories starting with "." are in-progress
        writes or deletions and are skipped.
    onnx_threads : int
        Threads of each bundle's onnxruntime session.
    exact_cache_size : int
        Exact models (the full MBN) kept loaded; the least recently used are dropped.
    default_ref : str or None
        Id or name of the default model; None (or not found) means the newest model.
    min_rescan_seconds : float
        Rescans triggered by unknown model names run at most this often.
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        onnx_threads: int = 1,
        exact_cache_size: int = 2,
        default_ref: str | None = None,
        min_rescan_seconds: float = 1.0,
    ) -> None:
        self.model_dir = model_dir
        self.onnx_threads = onnx_threads
        self.exact_cache_size = exact_cache_size
        self.default_ref = default_ref
        self.min_rescan_seconds = min_rescan_seconds
        self._snapshot = Snapshot()
        self._write_lock = threading.Lock()
        self._last_scan = 0.0
        # Bundles that failed verification, by directory name -> mtime: not retried until
        # the directory changes, so a broken bundle costs one log line, not one per scan.
        self._broken: dict[str, float] = {}
        self._exact_lock = threading.Lock()
        self._exact_lru: OrderedDict[str, None] = OrderedDict()

    # --- reading -----------------------------------------------------------------------------
    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def __len__(self) -> int:
        return len(self._snapshot.by_id)

    def models(self) -> list[Bundle]:
        """Loaded models, newest first."""
        return sorted(self._snapshot.by_id.values(), key=_newest_first_key, reverse=True)

    def get(self, ref: str | None, *, rescan: bool = True) -> Bundle:
        """The model with this id, or the newest of this name, or the default (None).

        A miss rescans the directory once (rate-limited): another replica may have written
        the bundle. Raises ``NotFound``, or ``Unavailable`` when no model exists at all.
        """
        bundle = self._snapshot.resolve(ref)
        if bundle is None and rescan:
            if ref is not None and is_model_id(ref):
                self._load_new(ref)  # an id names its directory: no need to wait for a scan
            if self._snapshot.resolve(ref) is None:
                self.rescan(force=False)
            bundle = self._snapshot.resolve(ref)
        if bundle is not None:
            return bundle
        if ref is None:
            raise Unavailable("no model is loaded yet; train one with POST /train", retry_after=5)
        raise NotFound(f"no model {ref!r}")

    def lookup(self, ref: str | None) -> Bundle | None:
        """Like ``get`` without rescanning (never blocks): for the event loop's fast path."""
        return self._snapshot.resolve(ref)

    def note_exact_use(self, bundle: Bundle) -> None:
        """Record that ``bundle``'s exact model is (about to be) loaded; beyond
        ``exact_cache_size`` loaded exact models, the least recently used one is dropped."""
        with self._exact_lock:
            self._exact_lru[bundle.id] = None
            self._exact_lru.move_to_end(bundle.id)
            evicted = []
            while len(self._exact_lru) > self.exact_cache_size:
                evicted.append(self._exact_lru.popitem(last=False)[0])
        for model_id in evicted:
            self._release_exact(model_id)

    @property
    def exact_loaded(self) -> int:
        return sum(1 for b in self._snapshot.by_id.values() if b.exact_loaded)

    # --- writing -----------------------------------------------------------------------------
    def rescan(self, *, force: bool = True) -> None:
        """Bring the snapshot in line with the directory: load new bundles, drop gone ones.
        Unless ``force``, does nothing when the last scan is recent."""
        with self._write_lock:
            now = time.monotonic()
            if not force and now - self._last_scan < self.min_rescan_seconds:
                return
            self._last_scan = now
            current = self._snapshot.by_id
            present = {}
            for entry in self._candidates():
                if entry.name in current:
                    present[entry.name] = current[entry.name]
                    continue
                bundle = self._load(entry)
                if bundle is not None:
                    present[bundle.id] = bundle
            gone = set(current) - set(present)
            for model_id in gone:
                log.info("model %s disappeared from %s; dropped", model_id, self.model_dir)
            self._swap(present.values())
            self._forget_exact(gone)

    def add(self, path: Path) -> Bundle:
        """Load and verify one bundle (a finished job's) and swap it in."""
        with self._write_lock:
            bundle = load_bundle(path, threads=self.onnx_threads)
            bundles = dict(self._snapshot.by_id)
            bundles[bundle.id] = bundle
            self._swap(bundles.values())
            log.info("model %s (%s) added", bundle.id, bundle.name)
            return bundle

    def _load_new(self, model_id: str) -> None:
        """Load bundle ``model_id`` if its directory exists and it is not loaded yet."""
        path = self.model_dir / model_id  # a valid id is one plain path component
        if path.is_symlink() or not (path / "manifest.json").is_file():
            return
        with self._write_lock:
            if model_id in self._snapshot.by_id:
                return
            bundle = self._load(path)
            if bundle is not None:
                self._swap([*self._snapshot.by_id.values(), bundle])

    def delete(self, model_id: str) -> None:
        """Remove a model: from the snapshot at once, and its directory from disk."""
        if not is_model_id(model_id):
            raise NotFound(f"no model {model_id!r}")
        with self._write_lock:
            bundle = self._snapshot.by_id.get(model_id)
            if bundle is None:
                raise NotFound(f"no model {model_id!r}")
            path = self._inside(model_id)
            # Rename first: other replicas stop seeing it at once, even if the removal of a
            # large directory is slow or interrupted (dot-directories are skipped by scans).
            trash = self.model_dir / f".deleted-{model_id}-{uuid.uuid4().hex[:8]}"
            with contextlib.suppress(FileNotFoundError):  # another replica was first
                path.rename(trash)
            bundles = {k: v for k, v in self._snapshot.by_id.items() if k != model_id}
            self._swap(bundles.values())
            self._forget_exact({model_id})
        shutil.rmtree(trash, ignore_errors=True)
        log.info("model %s deleted", model_id)

    # --- helpers -----------------------------------------------------------------------------
    def _swap(self, bundles: Iterable[Bundle]) -> None:
        self._snapshot = Snapshot.build(bundles, self.default_ref)

    def _candidates(self) -> list[Path]:
        try:
            entries = list(self.model_dir.iterdir())
        except FileNotFoundError:
            return []
        return sorted(
            e
            for e in entries
            if not e.is_symlink()
            and e.is_dir()
            and not e.name.startswith(".")
            and is_model_id(e.name)
        )

    def _load(self, path: Path) -> Bundle | None:
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return None
        if self._broken.get(path.name) == mtime:
            return None
        try:
            bundle = load_bundle(path, threads=self.onnx_threads)
        except (BundleError, OSError, ValueError) as exc:
            self._broken[path.name] = mtime
            log.error("skipping model directory %s: %s", path.name, exc)
            return None
        if bundle.id != path.name:
            self._broken[path.name] = mtime
            log.error("skipping model directory %s: its manifest says id %s", path.name, bundle.id)
            return None
        self._broken.pop(path.name, None)
        log.info("model %s (%s) loaded", bundle.id, bundle.name)
        return bundle

    def _inside(self, model_id: str) -> Path:
        root = self.model_dir.resolve()
        path = (root / model_id).resolve()
        if path.parent != root:
            raise InvalidInput(f"model id {model_id!r} does not name a model directory")
        return path

    def _forget_exact(self, model_ids: Iterable[str]) -> None:
        with self._exact_lock:
            for model_id in model_ids:
                self._exact_lru.pop(model_id, None)

    def _release_exact(self, model_id: str) -> None:
        """Drop a model's exact MBN from memory: Bundle caches it for its lifetime, so the
        bundle is replaced by a freshly loaded one (swap, don't mutate; requests holding the
        old object finish with it)."""
        with self._write_lock:
            old = self._snapshot.by_id.get(model_id)
            if old is None or not old.exact_loaded:
                return
            try:
                fresh = load_bundle(old.path, threads=self.onnx_threads)
            except (BundleError, OSError, ValueError) as exc:
                log.warning("model %s: could not reload to free its exact model: %s", model_id, exc)
                return
            bundles = dict(self._snapshot.by_id)
            bundles[model_id] = fresh
            self._swap(bundles.values())
            log.info(
                "model %s: exact model dropped from memory (cache of %d)",
                model_id,
                self.exact_cache_size,
            )
