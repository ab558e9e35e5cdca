"""The model registry: every verified bundle of the model directory, addressable by id or name.

Readers take one immutable ``Snapshot`` reference and use it; writers (start-up scan, periodic
or on-miss rescans, a finished job, a delete) build a new snapshot beside it and swap the
reference under a lock, so a request never sees a half-loaded model set (MLServer's "swap,
don't mutate"). Bundles are verified (hashes, format version) before they enter a snapshot.

Which model a request gets never moves under it: a name resolves to the version the
operator chose (``service.aliases``; the first version of the name until one is promoted),
and the default model is the one promoted, else ``MBN_DEFAULT_MODEL``, else the first model
ever seen (the demo model on a fresh install). Training never changes either unless the job
asked to promote its model. A chosen model that is damaged or gone is refused, never
silently replaced by another.

A bundle that fails verification (at a scan, or when the exact runtime reads its exact model)
is kept as *damaged*: listed with the reason, refused with 409, never served. Scans compare
each bundle's files' (size, mtime, inode) with what was verified, so a bundle changed or
repaired in place is verified again at the next scan without touching its directory. The
exact models themselves are held by the exact runtime (``service.exact``), not here.

Names and ids from requests are matched against the snapshot only; the one place a path is
built from them (``delete``) checks the id's syntax first and that the path stays directly
inside the model directory. Messages never contain server paths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mbn_core.bundle import (
    DATA_FILES,
    MANIFEST,
    OPTIONAL_FILES,
    Bundle,
    BundleError,
    load_bundle,
    read_manifest,
    validate_model_id,
)
from service.aliases import Aliases, AliasFile
from service.domain import (
    Conflict,
    InsufficientStorage,
    InvalidInput,
    NotFound,
    Unavailable,
    shortened,
)

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


# What a bundle's files looked like when they were verified: (name, size, mtime, inode).
Signature = tuple[tuple[str, int, int, int], ...]


def signature(path: Path) -> Signature | None:
    """The stat facts of a bundle's files (None when the directory is gone): any change,
    in place or by replacement, changes it."""
    facts = []
    for name in (MANIFEST, *DATA_FILES, *OPTIONAL_FILES):
        try:
            st = (path / name).stat()
        except FileNotFoundError:
            facts.append((name, -1, 0, 0))
            continue
        except OSError:
            return None
        facts.append((name, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(facts)


@dataclass(frozen=True)
class Damaged:
    """A model directory whose bundle failed verification."""

    id: str
    problem: str  # without server paths
    name: str | None = None  # from its manifest, when that much is readable
    created: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """An immutable view of the models and the choices that apply to them."""

    by_id: dict[str, Bundle] = field(default_factory=dict)
    by_name: dict[str, Bundle] = field(default_factory=dict)  # the version each name means
    default: Bundle | None = None
    default_source: str | None = None  # "promoted", "configured" or "auto"
    default_problem: str | None = None  # why there is no default although one was chosen
    damaged: dict[str, Damaged] = field(default_factory=dict)
    aliases: Aliases = field(default_factory=Aliases)

    @classmethod
    def build(
        cls,
        bundles: Iterable[Bundle],
        aliases: Aliases,
        configured: str | None = None,
        damaged: dict[str, Damaged] | None = None,
    ) -> Snapshot:
        damaged = dict(damaged or {})
        by_id = {b.id: b for b in bundles if b.id not in damaged}
        by_name: dict[str, Bundle] = {}
        for bundle in sorted(by_id.values(), key=_newest_first_key, reverse=True):
            by_name[bundle.name] = bundle  # older ones win: a new version does not move it
        for name, model_id in aliases.names.items():
            chosen = by_id.get(model_id)
            if chosen is not None and chosen.name == name:
                by_name[name] = chosen
            elif model_id in damaged:
                by_name.pop(name, None)  # refused (``refusal``), never another version
        snapshot = cls(by_id=by_id, by_name=by_name, damaged=damaged, aliases=aliases)
        return snapshot._with_default(configured)

    def _with_default(self, configured: str | None) -> Snapshot:
        aliases = self.aliases
        if aliases.default is not None and aliases.default_source == "promoted":
            ref, source = aliases.default, "promoted"
        elif configured is not None:
            ref, source = configured, "configured"
        elif aliases.default is not None:
            ref, source = aliases.default, "auto"
        else:
            return self
        default = self.by_id.get(ref) or self.by_name.get(ref)
        problem = None
        if default is None:
            gone = self.damaged.get(ref)
            problem = (
                f"the default model {ref!r} ({source}) is damaged: {gone.problem}"
                if gone is not None
                else f"the default model {ref!r} ({source}) is not available"
            )
        return dataclasses.replace(
            self, default=default, default_source=source, default_problem=problem
        )

    def resolve(self, ref: str | None) -> Bundle | None:
        if ref is None:
            return self.default
        return self.by_id.get(ref) or self.by_name.get(ref)

    def refusal(self, ref: str | None) -> Exception | None:
        """Why ``ref`` (None: the default) cannot be served although it exists: a Conflict
        for a damaged model, Unavailable for a chosen default that is gone."""
        if ref is None:
            if self.default is None and self.default_problem is not None:
                return Unavailable(self.default_problem + "; promote another model", retry_after=5)
            return None
        chosen = self.aliases.names.get(ref)
        for model_id in (ref, chosen):
            if model_id is not None and model_id in self.damaged:
                return Conflict(
                    f"model {model_id!r} failed verification and is not served: "
                    f"{self.damaged[model_id].problem}"
                )
        return None


class ModelRegistry:
    """Loads, verifies, caches and serves the bundles of ``model_dir``.

    Parameters
    ----------
    model_dir : Path
        One sub-directory per model id. Directories starting with "." are in-progress
        writes or deletions and are skipped.
    onnx_threads : int
        Threads of each bundle's onnxruntime session.
    default_ref : str or None
        Id or name of the default model (``MBN_DEFAULT_MODEL``), unless an operator promoted
        one; None: the first model seen.
    min_rescan_seconds : float
        Rescans triggered by unknown model names run at most this often.
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        onnx_threads: int = 1,
        default_ref: str | None = None,
        min_rescan_seconds: float = 1.0,
    ) -> None:
        self.model_dir = model_dir
        self.onnx_threads = onnx_threads
        self.default_ref = default_ref
        self.min_rescan_seconds = min_rescan_seconds
        self._snapshot = Snapshot()
        self._write_lock = threading.RLock()
        self._last_scan = 0.0
        self._alias_file = AliasFile(model_dir)
        # What each loaded or damaged bundle's files looked like when verified: a damaged
        # bundle is verified again only when its files change (one log line, not one per
        # scan), a loaded one when they changed under it (tampered, or replaced in place).
        self._signatures: dict[str, Signature | None] = {}
        self._damaged: dict[str, Damaged] = {}
        self._on_removed: list[Callable[[Bundle], None]] = []

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
        """The model with this id, or the chosen version of this name, or the default (None).

        A miss rescans the directory once (rate-limited): another replica may have written
        the bundle. Raises ``NotFound``, ``Conflict`` for a damaged model, or
        ``Unavailable`` when there is no model (or the chosen default is gone).
        """
        bundle = self._snapshot.resolve(ref)
        if bundle is None and rescan and self._snapshot.refusal(ref) is None:
            if ref is not None and is_model_id(ref):
                self._load_new(ref)  # an id names its directory: no need to wait for a scan
            if self._snapshot.resolve(ref) is None:
                self.rescan(force=False)
            bundle = self._snapshot.resolve(ref)
        if bundle is not None:
            return bundle
        refusal = self._snapshot.refusal(ref)
        if refusal is not None:
            raise refusal
        if ref is None:
            raise Unavailable("no model is loaded yet; train one with POST /train", retry_after=5)
        raise NotFound(f"no model {shortened(ref)!r}")

    def damaged(self) -> list[Damaged]:
        """Model directories whose bundles failed verification, by id."""
        return sorted(self._snapshot.damaged.values(), key=lambda d: d.id)

    def mark_damaged(self, bundle: Bundle, error: Exception) -> Conflict:
        """``bundle`` failed verification after it was loaded (its exact model): take it out
        of service until its files change. Returns the error to answer with."""
        problem = self._describe(bundle.path, error)
        log.error("model %s failed verification and is no longer served: %s", bundle.id, problem)
        with self._write_lock:
            if bundle.id in self._snapshot.by_id:
                self._damaged[bundle.id] = Damaged(bundle.id, problem, bundle.name, bundle.created)
                self._swap(self._snapshot.by_id.values())
        return Conflict(f"model {bundle.id!r} failed verification and is not served: {problem}")

    def promote(self, model_id: str, *, default: bool = True) -> Bundle:
        """Make ``model_id`` the version its name resolves to and (``default``) the default
        model, for every replica sharing the model directory."""
        with self._write_lock:
            bundle = self.get(model_id)
            if bundle.id != model_id:
                raise NotFound(f"no model with id {shortened(model_id)!r} (promote takes an id)")
            with _storage_errors("record the promotion"):
                self._alias_file.promote(bundle.id, bundle.name, default=default)
            self._swap(self._snapshot.by_id.values())
        log.info("model %s promoted (%s)", model_id, "default and name" if default else "name")
        return bundle

    def lookup(self, ref: str | None) -> Bundle | None:
        """Like ``get`` without rescanning (never blocks): for the event loop's fast path."""
        return self._snapshot.resolve(ref)

    # --- writing -----------------------------------------------------------------------------
    def rescan(self, *, force: bool = True) -> None:
        """Bring the snapshot in line with the directory: load new bundles, verify again
        those whose files changed, drop gone ones. Unless ``force``, does nothing when the
        last scan is recent."""
        with self._write_lock:
            now = time.monotonic()
            if not force and now - self._last_scan < self.min_rescan_seconds:
                return
            self._last_scan = now
            current = self._snapshot.by_id
            present = {}
            seen = set()
            for entry in self._candidates():
                seen.add(entry.name)
                loaded = current.get(entry.name)
                known = entry.name in self._signatures
                if known and self._signatures[entry.name] == signature(entry):
                    if loaded is not None:
                        present[entry.name] = loaded
                    continue  # unchanged: loaded, or damaged and not repaired
                if known:
                    log.info("model %s: its files changed; verifying it again", entry.name)
                bundle = self._load(entry)
                if bundle is not None:
                    present[bundle.id] = bundle
            for model_id in set(current) - seen:
                log.info("model %s disappeared from the model directory; dropped", model_id)
            for model_id in set(self._signatures) - seen:
                self._signatures.pop(model_id, None)
                self._damaged.pop(model_id, None)
            self._swap(present.values())

    def add(self, path: Path) -> Bundle:
        """Load and verify one bundle (a finished job's) and swap it in."""
        with self._write_lock:
            before = signature(path)
            bundle = load_bundle(path, threads=self.onnx_threads)
            self._signatures[bundle.id] = before
            self._damaged.pop(bundle.id, None)
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
            if model_id in self._snapshot.by_id or model_id in self._damaged:
                return  # a damaged one is verified again when a scan sees its files change
            bundle = self._load(path)
            if bundle is not None:
                self._swap([*self._snapshot.by_id.values(), bundle])

    def delete(self, model_id: str, *, force: bool = False) -> None:
        """Remove a model: from the snapshot at once, and its directory from disk.

        The default model, and the chosen version of a name that has other versions, are
        ``Conflict`` unless ``force``: deleting them would move requests to another model.
        A forced delete forgets those choices."""
        if not is_model_id(model_id):
            raise NotFound(f"no model {shortened(model_id)!r}")
        with self._write_lock:
            snapshot = self._snapshot
            bundle = snapshot.by_id.get(model_id)
            if bundle is None and model_id not in snapshot.damaged:
                named = snapshot.by_name.get(model_id)
                if named is not None:
                    # GET and /embed take names; a delete removes one version: say which id.
                    raise NotFound(
                        f"no model with id {shortened(model_id)!r}; {shortened(model_id)!r} is "
                        f"a name (now version {named.id!r}): delete takes a model id, see "
                        "GET /models"
                    )
                raise NotFound(f"no model {shortened(model_id)!r}")
            if not force:
                self._refuse_moving_delete(snapshot, model_id, bundle)
            path = self._inside(model_id)
            # Rename first: other replicas stop seeing it at once, even if the removal of a
            # large directory is slow or interrupted (dot-directories are skipped by scans).
            trash = self.model_dir / f".deleted-{model_id}-{uuid.uuid4().hex[:8]}"
            # The choices that name it are forgotten first: a write the disk refuses (507)
            # leaves the model and the choices as they were, never a default naming a model
            # that is gone. (No write at all when no choice names it.)
            with _storage_errors("forget the choices naming the model"):
                before = self._alias_file.read()
                self._alias_file.update(lambda aliases: aliases.without(model_id))
            try:
                with contextlib.suppress(FileNotFoundError):  # another replica was first
                    path.rename(trash)
            except OSError:
                with contextlib.suppress(OSError):
                    self._alias_file.update(lambda _: before)
                raise
            self._signatures.pop(model_id, None)
            self._damaged.pop(model_id, None)
            bundles = {k: v for k, v in self._snapshot.by_id.items() if k != model_id}
            self._swap(bundles.values())
        shutil.rmtree(trash, ignore_errors=True)
        log.info("model %s deleted%s", model_id, " (forced)" if force else "")

    @staticmethod
    def _refuse_moving_delete(snapshot: Snapshot, model_id: str, bundle: Bundle | None) -> None:
        pinned_default = snapshot.aliases.default == model_id
        if pinned_default or (snapshot.default is not None and snapshot.default.id == model_id):
            raise Conflict(
                f"model {model_id!r} is the default model; promote another one first "
                "(POST /models/{id}/promote) or delete it with ?force=true"
            )
        # Models aligned to it compare with it on its reference rows (GET .../compare).
        aligned = sorted(
            b.id
            for b in snapshot.by_id.values()
            if (b.manifest.get("alignment") or {}).get("reference_model") == model_id
        )
        if aligned:
            raise Conflict(
                f"models {', '.join(repr(i) for i in aligned[:5])} are aligned to model "
                f"{model_id!r} (compared with it); delete them first or delete it with ?force=true"
            )
        if bundle is None or snapshot.by_name.get(bundle.name) is not bundle:
            return
        if any(b.name == bundle.name and b is not bundle for b in snapshot.by_id.values()):
            raise Conflict(
                f"model {model_id!r} is the version the name {bundle.name!r} resolves to; "
                "promote another version first or delete it with ?force=true"
            )

    # --- helpers -----------------------------------------------------------------------------
    def _swap(self, bundles: Iterable[Bundle]) -> None:
        bundles = list(bundles)
        aliases = self._record_first_choices(bundles)
        before = self._snapshot.by_id
        self._snapshot = Snapshot.build(bundles, aliases, self.default_ref, self._damaged)
        after = self._snapshot.by_id
        for model_id, bundle in before.items():
            if after.get(model_id) is not bundle:  # deleted, damaged, or a new version of it
                for listener in self._on_removed:
                    listener(bundle)

    def on_removed(self, listener: Callable[[Bundle], None]) -> None:
        """Call ``listener(bundle)`` (under the registry's lock: it must be quick and never
        call back) whenever a bundle leaves the snapshot: deleted here or by another
        replica, found damaged, or replaced by new files under its id."""
        self._on_removed.append(listener)

    def _record_first_choices(self, bundles: list[Bundle]) -> Aliases:
        """The choices on file, after recording the ones nobody made yet: each name means
        its oldest version, and (without MBN_DEFAULT_MODEL) the oldest model is the default.
        Recorded, so that later models, deletions or damage never move them."""
        aliases = self._alias_file.read()
        oldest_first = sorted(bundles, key=_newest_first_key)
        missing_names = {b.name for b in oldest_first} - aliases.names.keys()
        needs_default = aliases.default is None and self.default_ref is None and oldest_first
        if not missing_names and not needs_default:
            return aliases

        def record(current: Aliases) -> Aliases:
            names = dict(current.names)
            for bundle in oldest_first:
                names.setdefault(bundle.name, bundle.id)
            if current.default is None and self.default_ref is None and oldest_first:
                return Aliases(oldest_first[0].id, "auto", names)
            return dataclasses.replace(current, names=names)

        try:
            return self._alias_file.update(record)
        except OSError as exc:
            log.error("cannot record model choices in %s: %s", self._alias_file.path, exc)
            return aliases

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
        """Load and verify the bundle at ``path``; a failure records it as damaged."""
        before = signature(path)
        if before is None:
            return None
        self._signatures[path.name] = before
        try:
            bundle = load_bundle(path, threads=self.onnx_threads)
            if bundle.id != path.name:
                raise BundleError(f"{path / MANIFEST}: its manifest says id {bundle.id!r}")
        except (BundleError, OSError, ValueError) as exc:
            self._record_damaged(path, exc)
            return None
        self._damaged.pop(path.name, None)
        log.info("model %s (%s) loaded", bundle.id, bundle.name)
        return bundle

    def _record_damaged(self, path: Path, error: Exception) -> None:
        problem = self._describe(path, error)
        name = created = None
        with contextlib.suppress(BundleError, OSError, ValueError):
            manifest = read_manifest(path)
            name, created = manifest["name"], manifest["created"]
        self._damaged[path.name] = Damaged(path.name, problem, name, created)
        log.error("model directory %s failed verification and is not served: %s", path, problem)

    def _describe(self, path: Path, error: Exception) -> str:
        """The error without server paths: files are named relative to the bundle."""
        message = str(error)
        for prefix, name in ((f"{path}/", ""), (str(path), path.name)):
            message = message.replace(prefix, name)
        return message.replace(str(self.model_dir), "<model dir>")

    def _inside(self, model_id: str) -> Path:
        root = self.model_dir.resolve()
        path = (root / model_id).resolve()
        if path.parent != root:
            raise InvalidInput(f"model id {shortened(model_id)!r} does not name a model directory")
        return path


@contextlib.contextmanager
def _storage_errors(what: str) -> Iterator[None]:
    """What the disk refused while writing the choices file, as the client's error: 507 on
    a full disk (or quota), 503 otherwise; the file itself is replaced atomically, so it
    holds the old choices or the new, never half."""
    try:
        yield
    except OSError as exc:
        log.error("could not %s: %s", what, exc)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientStorage(
                f"no space left to {what}; nothing was changed; free disk space and retry"
            ) from None
        raise Unavailable(
            f"could not {what} ({os.strerror(exc.errno or 0)}); nothing was changed; retry",
            retry_after=5,
        ) from None
