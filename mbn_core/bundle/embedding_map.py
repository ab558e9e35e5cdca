"""A 2-D map of a model's training embedding, stored in its bundle for people to look at.

Training keeps a t-SNE projection of a random sample of at most ``MAX_MAP_POINTS`` training
rows, with each point's row number, cluster (the clustering head's) and label (when the
training data had labels). New rows are placed on the map by their nearest sample points in
embedding space (``EmbeddingMap.locate``): t-SNE has no transform of its own, and a
neighbour average keeps a new point beside the training points that the model embeds like it.

Everything is plain arrays (``to_bytes`` / ``from_bytes``: an ``.npz`` read with
``allow_pickle=False``), hashed in the bundle's manifest like its other files.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Any

import numpy as np
from sklearn.manifold import TSNE
from sklearn.utils import check_random_state

from mbn_core.params import Interval, Param
from mbn_core.utils.npz import arrays_from_npz, npz_bytes
from mbn_core.utils.pca import fit_pca

MAP_FILE = "map.npz"
MAX_MAP_POINTS = 20_000
METHOD = "tsne"
# Neighbours a located point is averaged over: enough to smooth over one odd neighbour, few
# enough to stay inside a small cluster.
LOCATE_NEIGHBOURS = 5
# Rows of new embeddings compared with the sample at a time (bounds the distance matrix).
_LOCATE_CHUNK = 1024
TSNE_ITERATIONS = 500
_ARRAYS = ("xy", "embedding", "row", "cluster", "label")
# The training option that sizes the map (declared once: the CLI, POST /train and the docs
# take it from here, like the estimators' options).
MAP_POINTS = Param(
    name="map_points",
    default=MAX_MAP_POINTS,
    constraints=[Interval(Integral, 0, MAX_MAP_POINTS, closed="both")],
    help=(
        "Training rows in the 2-D map stored with the model (a t-SNE of a random sample), "
        "0 for no map."
    ),
    owner="the map",
)


@dataclass(frozen=True)
class EmbeddingMap:
    """A 2-D projection of a sample of the training embedding.

    Attributes
    ----------
    xy : ndarray of shape (n_points, 2), float32
        Map coordinates.
    embedding : ndarray of shape (n_points, n_components), float32
        The sample's (exact) embedding, which ``locate`` compares new embeddings with.
    row : ndarray of shape (n_points,), int64
        Each point's row number in the training data.
    cluster : ndarray of shape (n_points,), int64, or None
        The clustering head's cluster of each point; None without a head.
    label : ndarray of shape (n_points,), str, or None
        The training label of each point; None when training had no labels.
    """

    xy: np.ndarray
    embedding: np.ndarray
    row: np.ndarray
    cluster: np.ndarray | None = None
    label: np.ndarray | None = None

    @property
    def n_points(self) -> int:
        return len(self.xy)

    @property
    def color_by(self) -> str | None:
        """What colours the map: ``"label"`` when there are labels, else ``"cluster"``."""
        if self.label is not None:
            return "label"
        return "cluster" if self.cluster is not None else None

    def summary(self) -> dict[str, Any]:
        """JSON-able facts for the bundle's manifest."""
        return {
            "method": METHOD,
            "n_points": self.n_points,
            "color_by": self.color_by,
            "has_clusters": self.cluster is not None,
            "has_labels": self.label is not None,
        }

    def locate(self, embeddings: np.ndarray) -> np.ndarray:
        """Map coordinates of new embeddings: the inverse-distance weighted mean of the map
        positions of their ``LOCATE_NEIGHBOURS`` nearest sample points.

        Parameters
        ----------
        embeddings : array-like of shape (n, n_components)
            Finite embeddings from the same model.

        Returns
        -------
        ndarray of shape (n, 2), float32
        """
        with np.errstate(over="ignore"):  # beyond float32's range: refused just below
            queries = np.asarray(embeddings, dtype=np.float32)
        dim = self.embedding.shape[1]
        if queries.ndim != 2 or queries.shape[1] != dim or len(queries) == 0:
            raise ValueError(
                f"embeddings must have shape (n >= 1, {dim}), got {tuple(queries.shape)}"
            )
        if not np.isfinite(queries).all():
            raise ValueError("embeddings contain NaN, infinity or a value beyond the float32 range")
        k = min(LOCATE_NEIGHBOURS, self.n_points)
        sample = self.embedding.astype(np.float64)
        sample_norms = np.einsum("ij,ij->i", sample, sample)
        out = np.empty((len(queries), 2), dtype=np.float32)
        for start in range(0, len(queries), _LOCATE_CHUNK):
            chunk = queries[start : start + _LOCATE_CHUNK].astype(np.float64)
            distances = sample_norms - 2.0 * chunk @ sample.T
            distances += np.einsum("ij,ij->i", chunk, chunk)[:, None]
            nearest = np.argpartition(distances, k - 1, axis=1)[:, :k]
            near = np.sqrt(np.maximum(np.take_along_axis(distances, nearest, axis=1), 0.0))
            weights = 1.0 / (near + 1e-6 * (1.0 + near.max(axis=1, keepdims=True)))
            weights /= weights.sum(axis=1, keepdims=True)
            out[start : start + len(chunk)] = np.einsum("ij,ijk->ik", weights, self.xy[nearest])
        return out

    def to_bytes(self) -> bytes:
        """The map as ``.npz`` bytes (no pickled objects)."""
        arrays = {"xy": self.xy, "embedding": self.embedding, "row": self.row}
        if self.cluster is not None:
            arrays["cluster"] = self.cluster
        if self.label is not None:
            arrays["label"] = self.label
        return npz_bytes(arrays)

    @classmethod
    def from_bytes(cls, data: bytes, source: str = MAP_FILE) -> EmbeddingMap:
        """Read ``to_bytes``'s output; ValueError naming ``source`` when it is malformed."""
        arrays = arrays_from_npz(data, source, "array archive")
        arrays = {key: array for key, array in arrays.items() if key in _ARRAYS}
        try:
            xy, embedding, row = arrays["xy"], arrays["embedding"], arrays["row"]
        except KeyError as error:
            raise ValueError(f"{source}: array {error} is missing") from None
        n = len(xy)
        cluster, label = arrays.get("cluster"), arrays.get("label")
        shapes_ok = (
            xy.shape == (n, 2)
            and embedding.ndim == 2
            and len(embedding) == n
            and row.shape == (n,)
            and (cluster is None or cluster.shape == (n,))
            and (label is None or label.shape == (n,))
        )
        if not shapes_ok or n == 0:
            raise ValueError(f"{source}: arrays of inconsistent shapes")
        return cls(
            xy=xy.astype(np.float32, copy=False),
            embedding=embedding.astype(np.float32, copy=False),
            row=row.astype(np.int64, copy=False),
            cluster=None if cluster is None else cluster.astype(np.int64, copy=False),
            label=None if label is None else label.astype(str),
        )


def build_map(
    embedding,
    *,
    clusters=None,
    labels=None,
    max_points: int = MAX_MAP_POINTS,
    random_state: int | np.random.RandomState | None = None,
    n_jobs: int | None = None,
) -> EmbeddingMap:
    """Project a random sample of a training embedding to 2-D with t-SNE.

    Parameters
    ----------
    embedding : array-like of shape (n_samples, n_components)
        The training embedding.
    clusters : array-like of shape (n_samples,), default=None
        Cluster id of each training row (the clustering head's).
    labels : array-like of shape (n_samples,), default=None
        Training labels (any type; stored as text).
    max_points : int, default=20000
        Most rows in the sample; fewer training rows means all of them.
    random_state : int, RandomState or None
        Seeds the sample and t-SNE.
    n_jobs : int or None
        Threads of t-SNE's neighbour search.

    Returns
    -------
    EmbeddingMap
    """
    embedding = np.asarray(embedding, dtype=np.float32)
    if embedding.ndim != 2 or len(embedding) < 2:
        raise ValueError(f"embedding must be 2-D with at least 2 rows, got {embedding.shape}")
    if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 2:
        raise ValueError(f"max_points must be an integer >= 2, got {max_points!r}")
    n = len(embedding)
    for name, values in (("clusters", clusters), ("labels", labels)):
        if values is not None and len(values) != n:
            raise ValueError(f"{name} has {len(values)} entries but embedding has {n} rows")
    rng = check_random_state(random_state)
    rows = np.arange(n) if n <= max_points else np.sort(rng.choice(n, max_points, replace=False))
    sample = embedding[rows]
    return EmbeddingMap(
        xy=_tsne(sample, rng, n_jobs),
        embedding=sample,
        row=rows.astype(np.int64),
        cluster=None if clusters is None else np.asarray(clusters)[rows].astype(np.int64),
        label=None if labels is None else np.asarray(labels)[rows].astype(str),
    )


def _tsne(sample: np.ndarray, rng: np.random.RandomState, n_jobs: int | None) -> np.ndarray:
    n = len(sample)
    if n < 4:  # too few points for t-SNE's neighbourhoods: spread them on a line
        return np.column_stack([np.arange(n), np.zeros(n)]).astype(np.float32)
    # t-SNE's Barnes-Hut code crashes the process (a segmentation fault, not an error) on
    # points a few float32 steps apart or closer, so it sees them centred and of unit spread:
    # the same geometry, since its neighbourhoods and its start are scale-free.
    centred = sample.astype(np.float64) - sample.mean(axis=0, dtype=np.float64)
    spread = np.sqrt(np.mean(centred**2))
    if spread == 0:  # one point, n times (a constant embedding): nothing to lay out
        return np.zeros((n, 2), np.float32)
    sample = centred / spread
    tsne = TSNE(
        n_components=2,
        # sklearn needs perplexity < n; 30 (its default) for anything but tiny samples.
        perplexity=float(min(30.0, (n - 1) / 3)),
        init=_initial_layout(sample, rng),
        learning_rate="auto",
        # Half sklearn's default: with PCA initialisation the layout has settled by then,
        # and t-SNE of 20,000 points is the dominant cost of the map.
        max_iter=TSNE_ITERATIONS,
        random_state=rng.randint(2**31 - 1),
        n_jobs=n_jobs,
    )
    return tsne.fit_transform(sample).astype(np.float32)


def _initial_layout(sample: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
    """t-SNE's "pca" start, computed here: through ``fit_pca`` (a LAPACK fault must not fail
    a training), and for a one-component embedding too, which sklearn's PCA of two components
    refuses: its one coordinate, beside a tiny random second one that t-SNE can grow."""
    seed = rng.randint(2**31 - 1)
    n_axes = min(2, sample.shape[1])
    layout = fit_pca(sample, n_axes, random_state=seed).transform(sample)
    if n_axes == 1:
        spread = np.random.RandomState(seed).standard_normal(len(sample)) * layout.std()
        layout = np.column_stack([layout[:, 0], 1e-2 * spread])
    # sklearn's scale for its own PCA start: the first axis has standard deviation 1e-4.
    return (layout / layout[:, 0].std() * 1e-4).astype(np.float32)
