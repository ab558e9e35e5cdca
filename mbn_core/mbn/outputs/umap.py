"""The UMAP output of an MBN: UMAP's layout of the network's own similarity.

The similarity is the co-association (``mbn_core.mbn.coassociation``): the share of bottom
clusterings that put two rows in one cell times the share of top clusterings that do. PCA of
the top codes keeps the coarse layers' merges (two moons in one cluster); UMAP's fuzzy
simplicial set and layout keep local neighbourhoods and separate clusters. So the network
supplies the similarity and umap-learn only the layout (its per-row scaling is what makes
the layout work: the raw affinities laid out directly fall apart in sparse regions).

``UmapOutput(layers="bottom")`` (``output="umap-bottom"``) lays out the bottom share alone,
from a network of that one layer.
On thin manifolds the coarse layers' clusters straddle the branches (turns of a swiss roll),
so the top share pulls rows of different branches together: there the bottom share alone
scores higher.

Fitting: each training row's ``GRAPH_NEIGHBORS`` most similar other rows, at distance
1 - affinity, become UMAP's fuzzy simplicial set, laid out into ``n_components`` dimensions
(spectral start, seeded): the *anchors*. Every row, training row or new, is then embedded the
same way: at the affinity-weighted mean of the anchors of its ``N_NEIGHBORS`` most similar
training rows (a training row is among its own). That is deterministic and looks at one row
at a time, so ``transform`` is batch independent and reproduces ``fit_transform``.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from mbn_core.distribution import install_hint
from mbn_core.exceptions import MissingDependency
from mbn_core.mbn.coassociation import CodesTop, cell_index, coassociation_blocks
from mbn_core.mbn.outputs.base import (
    FittedOutput,
    Output,
    OutputProgress,
    StoredArrays,
    expect_index,
    expect_shape,
)

# Neighbours per row in the placement and in the fuzzy simplicial set (UMAP's default). A
# 30-neighbour graph helped the data sets it was tuned on but not others, so the graph keeps
# UMAP's 15.
N_NEIGHBORS = 15
GRAPH_NEIGHBORS = 15
# UMAP's defaults for the layout's curve (spread, min_dist), its repulsion and its epochs.
SPREAD = 1.0
MIN_DIST = 0.1
NEGATIVE_SAMPLE_RATE = 5
# UMAP's epochs: 500 for graphs of up to 10,000 rows, 200 above (each epoch costs more).
SMALL_GRAPH_EPOCHS, LARGE_GRAPH_EPOCHS, LARGE_GRAPH_ROWS = 500, 200, 10_000
# The fit's two stages, as ``OutputProgress`` hears them: "neighbours" (each row's most
# similar rows, a block of rows at a time) then "layout" (UMAP's epochs).
STAGES = ("neighbours", "layout")
# Which layers' co-association the layout reads: "bottom+top" (the product of both shares)
# or "bottom" (the bottom share alone, from a network of that one layer).
LAYERS = ("bottom+top", "bottom")

INSTALL_HINT = (
    "MBN's UMAP output needs umap-learn, a dependency of this library that is missing from "
    f"this environment: reinstall the library ({install_hint()}) or pip install umap-learn"
)


class UmapNotInstalled(MissingDependency):
    """umap-learn is missing: a setup to fix, told as such by ``mbn train``."""


# umap-learn's numba functions that a fit runs and that it compiles in every process without
# caching them on disk (no cache=True): seconds of each process's first UMAP-output fit, more
# than a small fit itself, and every service job is a new process. (module, name) pairs. The
# layout epoch's parallel twin wraps the same Python function, and numba's cache index does not
# record ``parallel``: cached too, each would load the other's code, so it is not listed.
_UNCACHED_KERNELS = (
    ("umap.umap_", "smooth_knn_dist"),
    ("umap.umap_", "compute_membership_strengths"),
    ("umap.layouts", "_nb_optimize_layout_euclidean_single_epoch"),
)
# The progress function of the layout running in this context (``_layout``), for
# ``_hear_layout_epochs``; None outside it, and in other threads.
_LAYOUT_PROGRESS: ContextVar[OutputProgress | None] = ContextVar("layout_progress", default=None)


def _umap_internals():
    """umap-learn's module of the fuzzy simplicial set and the layout. Its package warns on
    import that TensorFlow (for ParametricUMAP, unused here) is missing: not ours to show."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ImportWarning)
        try:
            import umap.umap_ as umap_internals
        except ImportError as error:
            raise UmapNotInstalled(INSTALL_HINT) from error
    _cache_compiled_kernels()
    _hear_layout_epochs()
    return umap_internals


@functools.cache  # once a process: before the first compile is what counts
def _cache_compiled_kernels() -> None:
    """Turn on numba's on-disk cache (what cache=True does) for ``_UNCACHED_KERNELS``, before
    their first compile: a later process loads them in a fraction of a second. The cache goes
    where numba puts ours (``NUMBA_CACHE_DIR`` in the image). A kernel a later umap-learn
    renamed, or one with nowhere to cache, stays as it is: slower, never wrong."""
    for module_name, name in _UNCACHED_KERNELS:
        kernel = getattr(importlib.import_module(module_name), name, None)
        enable_caching = getattr(kernel, "enable_caching", None)
        if enable_caching is None:
            continue
        try:
            enable_caching()
        except RuntimeError:  # numba: "no locator available" (no writable cache directory)
            continue


@functools.cache  # once a process
def _hear_layout_epochs() -> None:
    """Let ``_layout`` hear umap-learn's layout epochs, and stop between them.

    umap-learn's layout takes no callback; it loops over its epochs through the ``tqdm`` its
    module imported (``for n in tqdm(range(n_epochs), ...)``). That name is replaced by one
    that is the original tqdm unless a ``_layout`` in this context has a progress function.
    Raising between epochs leaves the loop cleanly, where an exception from inside a tqdm
    bar's drawing would leave tqdm's process-wide lock held. A later umap-learn without that
    name keeps its own: the layout is then neither heard nor stoppable, and fits the same.
    """
    layouts = importlib.import_module("umap.layouts")
    original = getattr(layouts, "tqdm", None)
    if original is None:
        return

    def epochs_heard(iterable, *args, **keywords):
        progress = _LAYOUT_PROGRESS.get()
        if progress is None:
            return original(iterable, *args, **keywords)
        return _reported_epochs(iterable, progress)

    vars(layouts)["tqdm"] = epochs_heard  # the name its loop looks up at each call


def _reported_epochs(epochs: Sequence[int], progress: OutputProgress) -> Iterator[int]:
    """The epochs, telling ``progress`` how many are done before the first and after each."""
    total = len(epochs)
    progress("layout", 0, total)
    for done, epoch in enumerate(epochs, start=1):
        yield epoch  # the loop's body runs the epoch before asking for the next one
        progress("layout", done, total)


def layout_epochs(n_rows: int) -> int:
    """The layout's epochs for a graph of ``n_rows`` rows."""
    return SMALL_GRAPH_EPOCHS if n_rows <= LARGE_GRAPH_ROWS else LARGE_GRAPH_EPOCHS


def require_umap() -> None:
    """Raise ``UmapNotInstalled`` with the install command when umap-learn is missing."""
    _umap_internals()


class UmapOutput(Output):
    """UMAP's layout of the co-association of the network's codes (the module docstring).

    Parameters
    ----------
    layers : {"bottom+top", "bottom"}, default="bottom+top"
        The co-association of the bottom and the top layer's codes (``output="umap"``), or of
        the bottom layer's alone, from a network of that one layer (``output="umap-bottom"``).
    """

    stages = STAGES
    array_prefix = "umap."

    def __init__(self, layers: str = "bottom+top") -> None:
        if layers not in LAYERS:
            raise ValueError(f"layers={layers!r} must be one of {LAYERS}")
        self.layers = layers
        self.bottom_only = layers == "bottom"
        # The names users and saved models know them by.
        self.name = "umap-bottom" if self.bottom_only else "umap"

    def check_available(self) -> None:
        require_umap()

    def check_layers(self, upper_layers_given: bool) -> None:
        if self.bottom_only and upper_layers_given:
            raise ValueError(
                f'output="{self.name}" is a network of the bottom layer alone: give at most one '
                'layer in ks (ks=[k1]) and leave delta at "auto", or use output="umap"'
            )

    def fit(
        self,
        bottom_codes: np.ndarray,
        top_codes: np.ndarray,
        ks: list[int],
        n_components: int,
        rng: np.random.RandomState,
        progress: OutputProgress | None = None,
    ) -> tuple[UmapTop, np.ndarray]:
        seed = rng.randint(np.iinfo(np.int32).max)
        kept_top = None if self.bottom_only else top_codes
        return fit_umap(bottom_codes, kept_top, ks[0], n_components, seed, progress)

    def saved_these(self, stored: StoredArrays, ks: list[int]) -> bool:
        """Whether these arrays are this output's (a network of one layer without top codes
        is the bottom layer's)."""
        bottom_only = len(ks) == 1 and "umap.top_codes" not in stored
        return stored.has_prefix(self.array_prefix) and bottom_only == self.bottom_only

    def from_arrays(self, stored: StoredArrays, ks: list[int], n_clusterings: int) -> UmapTop:
        top_codes: np.ndarray | None
        if self.bottom_only:
            if len(ks) != 1:
                raise ValueError(f'output="{self.name}" is a network of one layer, not {len(ks)}')
            if "umap.top_codes" in stored:
                raise ValueError(
                    f"model array 'umap.top_codes' is not part of output '{self.name}'"
                )
            bottom_codes, top_codes = _training_bottom_codes(stored, ks, n_clusterings), None
        else:
            bottom_codes = _training_bottom_codes(stored, ks, n_clusterings)
            top_codes = stored.get("umap.top_codes")
            expect_shape("umap.top_codes", top_codes, bottom_codes.shape)
            expect_index("umap.top_codes", top_codes, ks[-1])
        anchors = np.ascontiguousarray(stored.get("umap.anchors"), dtype=np.float64)
        if anchors.ndim != 2 or anchors.shape[0] != len(bottom_codes) or anchors.shape[1] < 1:
            raise ValueError(f"model array 'umap.anchors' has shape {anchors.shape}")
        if not np.isfinite(anchors).all():
            raise ValueError("model array 'umap.anchors' must be finite")
        return UmapTop.restore(bottom_codes, top_codes, ks[0], anchors=anchors)


def _training_bottom_codes(stored: StoredArrays, ks: list[int], n_clusterings: int) -> np.ndarray:
    bottom_codes = stored.get("umap.bottom_codes")
    if (
        bottom_codes.ndim != 2
        or bottom_codes.shape[1] != n_clusterings
        or bottom_codes.shape[0] < 2
    ):
        raise ValueError(f"model array 'umap.bottom_codes' has shape {bottom_codes.shape}")
    expect_index("umap.bottom_codes", bottom_codes, ks[0])
    return bottom_codes


@dataclass(frozen=True)
class UmapTop(CodesTop, FittedOutput):
    """What the UMAP output needs to embed any row: the training rows' codes and anchors."""

    anchors: np.ndarray  # (n, n_components) float64: the training rows' layout

    @property
    def n_components(self) -> int:
        return int(self.anchors.shape[1])

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.anchors.nbytes

    def embed_affinities(self, affinity: sp.csr_matrix) -> np.ndarray:
        return place(affinity, self.anchors)

    def to_arrays(self) -> dict[str, np.ndarray]:
        # The bottom layer's output keeps no top codes.
        arrays = {"umap.bottom_codes": self.bottom_codes}
        if self.top_codes is not None:
            arrays["umap.top_codes"] = self.top_codes
        arrays["umap.anchors"] = self.anchors
        return arrays


def fit_umap(
    bottom_codes: np.ndarray,
    top_codes: np.ndarray | None,
    n_bottom_values: int,
    n_components: int,
    seed: int,
    progress: OutputProgress | None = None,
) -> tuple[UmapTop, np.ndarray]:
    """The UMAP output of the training rows' codes, and their embedding (``top_codes`` None:
    of the bottom layer's co-association alone). ``progress`` hears each block of rows
    searched and each epoch laid out, and may raise to stop.

    The co-association is visited a block of rows at a time and only each row's strongest
    pairs are kept, so memory grows with the rows, not with the pairs.
    """
    require_umap()
    cells = cell_index(bottom_codes, n_bottom_values)
    n_rows = bottom_codes.shape[0]
    n_neighbors = min(GRAPH_NEIGHBORS, n_rows)
    # UMAP's (knn_indices, knn_dists): each row itself first at distance 0, then its most
    # similar other rows at 1 - affinity; rows with too few padded with themselves at 1.
    indices = np.repeat(np.arange(n_rows)[:, None], n_neighbors, axis=1)
    distances = np.ones((n_rows, n_neighbors))
    distances[:, 0] = 0.0
    nearest = []  # each row's placement: (columns, weights), the row itself among them
    blocks = coassociation_blocks(bottom_codes, top_codes, cells, top_codes)
    for start, affinity in blocks:
        for local in range(affinity.shape[0]):
            row = start + local
            columns, values = ranked(affinity, local)
            nearest.append((columns[:N_NEIGHBORS], values[:N_NEIGHBORS]))
            columns, values = other_rows(columns, values, row, n_neighbors - 1)
            indices[row, 1 : 1 + columns.size] = columns
            distances[row, 1 : 1 + columns.size] = 1.0 - values
        if progress is not None:
            progress("neighbours", start + affinity.shape[0], n_rows)
    if (indices[:, 1:] == np.arange(n_rows)[:, None]).all():
        raise ValueError(
            "the UMAP output found no two training rows that share a bottom cell, so there is "
            "nothing to lay out; use fewer bottom centers (k1) or more rows"
        )
    anchors = _layout(indices, distances, n_components, seed, progress)
    top = UmapTop(
        bottom_codes=bottom_codes,
        top_codes=top_codes,
        n_bottom_values=n_bottom_values,
        cells=cells,
        anchors=anchors,
    )
    placed = np.array([weighted_anchor(columns, weights, anchors) for columns, weights in nearest])
    return top, placed


def ranked(affinity: sp.csr_matrix, row: int) -> tuple[np.ndarray, np.ndarray]:
    """(columns, values) of a row's stored affinities, largest first; ties go to the lower
    column, so the order does not depend on the order pairs were stored in."""
    start, end = affinity.indptr[row], affinity.indptr[row + 1]
    columns, values = affinity.indices[start:end], affinity.data[start:end]
    order = np.lexsort((columns, -values))
    return columns[order], values[order]


def other_rows(
    columns: np.ndarray, values: np.ndarray, row: int, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` of a training row's ``ranked`` affinities that make UMAP
    neighbours. Every row's own pair is stored (it shares its cells with itself), and a pair
    sharing no top cluster is stored at 0: neither is a neighbour."""
    kept = (columns != row) & (values > 0)
    return columns[kept][:count], values[kept][:count]


def weighted_anchor(columns: np.ndarray, weights: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """The weights' mean of these anchors; the mean anchor when no weight is positive."""
    total = weights.sum()
    return weights @ anchors[columns] / total if total > 0 else anchors.mean(axis=0)


def place(affinity: sp.csr_matrix, anchors: np.ndarray) -> np.ndarray:
    """Each row at the affinity-weighted mean of its ``N_NEIGHBORS`` nearest anchors.

    Every row has a positive affinity to some training row (it shares a bottom cell with
    that cell's center, and ``coassociation`` falls back to the bottom share when no top cluster
    is shared); a row without any would take the mean anchor.
    """
    placed = np.empty((affinity.shape[0], anchors.shape[1]))
    for row in range(affinity.shape[0]):
        columns, weights = ranked(affinity, row)
        placed[row] = weighted_anchor(columns[:N_NEIGHBORS], weights[:N_NEIGHBORS], anchors)
    return placed


def fuzzy_graph(indices: np.ndarray, distances: np.ndarray, seed: int) -> sp.coo_matrix:
    """UMAP's fuzzy simplicial set of these neighbours (UMAP's knn_indices, knn_dists)."""
    n_rows, n_neighbors = indices.shape
    graph, _, _ = _umap_internals().fuzzy_simplicial_set(
        np.zeros((n_rows, 1)),
        n_neighbors,
        np.random.RandomState(seed),
        "euclidean",
        knn_indices=indices,
        knn_dists=distances,
    )
    return graph


def _layout(
    indices: np.ndarray,
    distances: np.ndarray,
    n_components: int,
    seed: int,
    progress: OutputProgress | None = None,
) -> np.ndarray:
    """UMAP's fuzzy simplicial set of these neighbours, laid out (float64)."""
    umap_internals = _umap_internals()
    n_rows = indices.shape[0]
    graph = fuzzy_graph(indices, distances, seed)
    a, b = umap_internals.find_ab_params(SPREAD, MIN_DIST)
    # The spectral start asks for n_components + 1 eigenvectors, which scipy refuses (with a
    # TypeError) for graphs of no more rows; there the seeded random start serves.
    init = "spectral" if n_components + 1 < n_rows else "random"
    n_epochs = layout_epochs(n_rows)
    # umap-learn (0.5.12) places a graph's separate pieces with numpy's global generator when
    # it is given no data (multi_component_layout): seed that for the call, so one seed gives
    # one embedding, and give the caller's generator its state back.
    global_state = np.random.get_state()  # noqa: NPY002 - the generator umap-learn uses
    np.random.seed(seed)  # noqa: NPY002
    heard = _LAYOUT_PROGRESS.set(progress)
    try:
        embedding, _ = umap_internals.simplicial_set_embedding(
            None, graph, n_components, 1.0, a, b, 1.0, NEGATIVE_SAMPLE_RATE, n_epochs,
            init, np.random.RandomState(seed), "euclidean", {}, False, {}, False,
        )  # fmt: skip
    finally:
        _LAYOUT_PROGRESS.reset(heard)
        np.random.set_state(global_state)  # noqa: NPY002
    return np.asarray(embedding, dtype=np.float64)
