"""The layout methods as registered methods: ``tsne``, ``umap``, ``densmap``, ``pacmap`` and
``trimap``.

Each is distilled: the pipeline fits it once on every row, trains the student on its layout
and reports students cross-fitted against that layout (``Method.layout``). Exact mode runs the
library's own procedure for new rows where it has one (t-SNE, UMAP, PaCMAP) and is refused,
saying why, where it has none (densMAP, TriMap). Each library is optional: without it the
method is listed, and a training asking for it is refused with the install line.
"""

from __future__ import annotations

from typing import Any

from mbn_core.layouts.base import LayoutMethod
from mbn_core.layouts.densmap import DensMAP
from mbn_core.layouts.pacmap import PaCMAP
from mbn_core.layouts.trimap import TriMap
from mbn_core.layouts.tsne import TSNE
from mbn_core.layouts.umap import UMAP
from mbn_core.methods import Method, Reporter, register


def _missing(cls: type[LayoutMethod]):
    def missing() -> str | None:
        return None if cls.available() else cls.unavailable_reason()

    return missing


def _check_rows(model: LayoutMethod, n_samples: int) -> None:
    model.check_rows(n_samples)


def _check_features(model: LayoutMethod, n_features: int) -> None:
    model.check_features(n_features)


def _track_tsne(model: TSNE, shape: tuple[int, int], report: Reporter) -> None:
    def progress(done: int, total: int) -> bool:
        return report(done / total, f"t-SNE iteration {done}/{total}")

    model.set_params(callback=progress)


def _facts(model: LayoutMethod) -> dict[str, Any]:
    return {"exact_map": model.exact_map is None}


def _register(
    name: str, cls: type[LayoutMethod], summary: str, *, batch_independent: bool, **extra: Any
) -> Method:
    """``batch_independent``: whether the library's own map for new rows (exact mode) places
    each row alone, so that a server may merge requests into one call; measured, each by a
    test (tests/mbn_core/test_layouts.py). A method without a map declares False."""
    return register(
        Method(
            name=name,
            estimator=cls,
            summary=summary,
            save=lambda model: model.to_arrays(),
            load=cls.from_arrays,
            check_rows=_check_rows,
            check_features=_check_features,
            facts=_facts,
            layout=True,
            no_exact_map=cls.exact_map,
            missing=_missing(cls),
            batch_independent_exact=batch_independent,
            **extra,
        )
    )


TSNE_METHOD = _register(
    "tsne",
    TSNE,
    "t-SNE by openTSNE (extra: methods), distilled into an MLP; exact: openTSNE's transform",
    batch_independent=True,  # openTSNE with exact neighbours optimises each row alone
    track=_track_tsne,
)
UMAP_METHOD = _register(
    "umap",
    UMAP,
    "UMAP by umap-learn, distilled into an MLP; exact: umap-learn's transform",
    # umap-learn prunes the new rows' edges and samples negatives over the whole call.
    batch_independent=False,
)
DENSMAP_METHOD = _register(
    "densmap",
    DensMAP,
    "densMAP by umap-learn, distilled into an MLP; no exact map",
    batch_independent=False,
)
PACMAP_METHOD = _register(
    "pacmap",
    PaCMAP,
    "PaCMAP (extra: methods), distilled into an MLP; exact: PaCMAP's transform on the "
    "training rows",
    batch_independent=True,  # each new row placed against the fixed training rows alone
)
TRIMAP_METHOD = _register(
    "trimap",
    TriMap,
    "TriMap (extra: methods), distilled into an MLP; no exact map",
    batch_independent=False,
)
