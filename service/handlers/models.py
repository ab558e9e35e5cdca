"""The models handler: lists, reads, promotes and deletes models (``/models``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mbn_core.bundle import Bundle
from service.registry import Damaged, ModelRegistry, Snapshot


@dataclass(frozen=True)
class ModelEntry:
    """What a listing says of one model.

    Attributes
    ----------
    id : str
    name : str or None
        None only for a damaged model whose manifest is unreadable.
    created : str or None
    input_dim, output_dim, n_clusters : int or None
        None for a damaged model (and ``n_clusters`` for one without a clustering head).
    default : bool
        Whether requests naming no model get this one.
    current : bool
        Whether requests naming its name get this version.
    state : {"ready", "damaged"}
    problem : str or None
        What failed, for a damaged model (no server paths).
    """

    id: str
    name: str | None
    created: str | None
    input_dim: int | None
    output_dim: int | None
    n_clusters: int | None
    default: bool
    current: bool = False
    state: str = "ready"
    problem: str | None = None

    @classmethod
    def of(cls, bundle: Bundle, snapshot: Snapshot) -> ModelEntry:
        """A loaded model, with the choices of ``snapshot``."""
        return cls(
            id=bundle.id,
            name=bundle.name,
            created=bundle.created,
            input_dim=bundle.input_dim,
            output_dim=bundle.output_dim,
            n_clusters=bundle.n_clusters,
            default=snapshot.default is bundle,
            current=snapshot.by_name.get(bundle.name) is bundle,
        )

    @classmethod
    def of_damaged(cls, damaged: Damaged) -> ModelEntry:
        """A model directory that failed verification (never served, never a choice)."""
        return cls(
            id=damaged.id,
            name=damaged.name,
            created=damaged.created,
            input_dim=None,
            output_dim=None,
            n_clusters=None,
            default=False,
            state="damaged",
            problem=damaged.problem,
        )


@dataclass(frozen=True)
class ModelListing:
    """Every model, newest first, and which one is the default.

    Attributes
    ----------
    models : list of ModelEntry
        Loaded and damaged models, newest first.
    default : str or None
        Id of the default model.
    default_source : {"promoted", "configured", "auto"} or None
    default_problem : str or None
        Why there is no default although one was chosen.
    """

    models: list[ModelEntry]
    default: str | None
    default_source: str | None
    default_problem: str | None


class ModelsHandler:
    """Lists, reads, promotes and deletes the registry's models.

    Parameters
    ----------
    registry : ModelRegistry
        Raises ``NotFound``, ``Conflict`` (damaged; deleting a chosen model without force),
        ``InvalidInput`` and ``Unavailable``.
    """

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    def list_models(self) -> ModelListing:
        """Every model, after a rate-limited rescan (so models other replicas wrote show)."""
        self.registry.rescan(force=False)
        snapshot = self.registry.snapshot  # one snapshot: models and choices agree
        models = [ModelEntry.of(b, snapshot) for b in snapshot.by_id.values()]
        models += [ModelEntry.of_damaged(d) for d in snapshot.damaged.values()]
        models.sort(key=lambda m: (m.created or "", m.id), reverse=True)
        return ModelListing(
            models=models,
            default=None if snapshot.default is None else snapshot.default.id,
            default_source=snapshot.default_source,
            default_problem=snapshot.default_problem,
        )

    def manifest(self, ref: str) -> dict[str, Any]:
        """The manifest of the model ``ref`` (an id, or a name: the version it resolves to)."""
        return self.registry.get(ref).manifest

    def promote(self, model_id: str, *, default: bool = True) -> ModelEntry:
        """Make ``model_id`` its name's version and (``default``) the default model."""
        bundle = self.registry.promote(model_id, default=default)
        return ModelEntry.of(bundle, self.registry.snapshot)

    def delete(self, model_id: str, *, force: bool = False) -> None:
        """Delete the model ``model_id``; the default model, or the version its name
        resolves to while the name has others, only with ``force`` (else ``Conflict``)."""
        self.registry.delete(model_id, force=force)
