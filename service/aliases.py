"""The operator's choices of model: the default model and the version each name means.

Kept in ``<model_dir>/.aliases.json`` (a dot-file: scans skip it), beside the bundles, so
every replica and every worker sharing the model directory sees the same choices. Writes
replace the file atomically under an ``flock`` (read, change, write), so two replicas
promoting at once never lose an update; readers never need the lock.

A choice changes only by an explicit act: a promote (``POST /models/{id}/promote``, or a
training job that asked for it), a forced delete of the chosen model, or (once, for the
default) the first model the registry ever sees, recorded as ``"auto"``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

FILE_NAME = ".aliases.json"
LOCK_NAME = ".aliases.lock"
Source = Literal["promoted", "auto"]


@dataclass(frozen=True)
class Aliases:
    """The recorded choices.

    Attributes
    ----------
    default : str or None
        Model id of the default model.
    default_source : {"promoted", "auto"} or None
        Promoted by an operator (wins over ``MBN_DEFAULT_MODEL``), or recorded automatically
        as the first model seen (``MBN_DEFAULT_MODEL`` wins over it).
    names : dict
        Name -> the model id that name resolves to.
    """

    default: str | None = None
    default_source: Source | None = None
    names: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "default": self.default,
            "default_source": self.default_source,
            "names": dict(sorted(self.names.items())),
        }

    @classmethod
    def from_json(cls, data: object) -> Aliases:
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        default = data.get("default")
        source = data.get("default_source")
        names = data.get("names") or {}
        if default is not None and not isinstance(default, str):
            raise ValueError("default must be a model id")
        if source not in (None, "promoted", "auto"):
            raise ValueError(f"unknown default_source {source!r}")
        if not isinstance(names, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in names.items()
        ):
            raise ValueError("names must map names to model ids")
        return cls(default, source if default is not None else None, dict(names))

    def promoting(self, model_id: str, name: str, *, default: bool = True) -> Aliases:
        """These choices with ``model_id`` as the version ``name`` means and (``default``)
        as the promoted default model."""
        names = {**self.names, name: model_id}
        if default:
            return Aliases(model_id, "promoted", names)
        return Aliases(self.default, self.default_source, names)

    def without(self, model_id: str) -> Aliases:
        """These choices, forgetting every one that names ``model_id``."""
        keep_default = self.default != model_id
        return Aliases(
            self.default if keep_default else None,
            self.default_source if keep_default else None,
            {name: target for name, target in self.names.items() if target != model_id},
        )


class AliasFile:
    """Reads and atomically updates ``<model_dir>/.aliases.json``."""

    def __init__(self, model_dir: Path) -> None:
        self.path = model_dir / FILE_NAME
        self._lock_path = model_dir / LOCK_NAME

    def read(self) -> Aliases:
        """The recorded choices; none when the file is missing. A file that cannot be read
        is logged loudly and treated as no choices (never guessed at)."""
        try:
            return Aliases.from_json(json.loads(self.path.read_bytes()))
        except FileNotFoundError:
            return Aliases()
        except (OSError, ValueError) as exc:
            log.error("%s is unreadable (%s); no default or name choices apply", self.path, exc)
            return Aliases()

    def update(self, change: Callable[[Aliases], Aliases]) -> Aliases:
        """Apply ``change`` to the current choices under the lock; returns the result."""
        with self._locked():
            current = self.read()
            new = change(current)
            if new != current:
                self._write(new)
            return new

    def promote(self, model_id: str, name: str, *, default: bool = True) -> Aliases:
        """Record ``model_id`` as the version ``name`` means and (``default``) as the
        default model: what ``POST /models/{id}/promote`` and a training job that asked to
        promote its model both do. Every replica sees it at its next rescan."""
        return self.update(lambda aliases: aliases.promoting(model_id, name, default=default))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _write(self, aliases: Aliases) -> None:
        temporary = self.path.with_name(f"{FILE_NAME}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            with temporary.open("x") as handle:
                json.dump(aliases.to_json(), handle, indent=2)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        finally:
            temporary.unlink(missing_ok=True)
