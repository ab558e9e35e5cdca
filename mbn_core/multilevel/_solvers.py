"""The three phases of multilevel manifold learning: coarsen, embed the coarsest level, refine.

Private helpers of ``mbn_core.multilevel.embedding``; prior validation is assumed.
docs/MULTILEVEL.md gives the algorithm with the paper's printed formulas corrected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.sparse.csgraph import laplacian, shortest_path
from scipy.sparse.linalg import LinearOperator, cg, eigsh, splu
from sklearn.manifold import spectral_embedding
from sklearn.preprocessing import KernelCenterer
from sklearn.utils import check_random_state
from sklearn.utils.extmath import svd_flip

from mbn_core.multilevel import _coarsen
from mbn_core.utils.eigen import eigh_by_index

# Up to this many unknowns the refinement system is factorised (exact, deterministic);
# above it, conjugate gradients with a Jacobi preconditioner keep memory at the graph's size.
DIRECT_SOLVE_MAX = 20_000
CG_RTOL = 1e-10
# Dense eigensolvers up to this size for the coarse LLE problem.
DENSE_EIGEN_MAX = 2_000
LLE_REG = 1e-3
# The least weight of an edge in the refinement system (a heat weight of an edge about 5.3
# sigma long). Edges of 30 to 40 sigma occur in 1-D or clumpy data, and their weights of
# 1e-200 and less underflowed to an exactly singular system; at 1e-12 such an edge still
# counts for a vertex that has no nearer one, and next to nothing beside a near edge.
# (New rows' interpolation weighs its neighbours relative to the nearest, so it needs none.)
REFINE_WEIGHT_FLOOR = 1e-12


@dataclass
class Level:
    """One level: its vertices (training-row indices, increasing) and graph over them.

    ``coarse`` holds the positions, within this level, of the next level's vertices
    (None at the coarsest level).
    """

    vertices: np.ndarray
    graph: sp.csr_matrix
    coarse: np.ndarray | None = None


def build_levels(
    graph: sp.csr_matrix,
    *,
    max_levels: int | None,
    max_coarse_size: int | None,
    min_size: int,
    order: str,
    rng: np.random.RandomState,
    progress: Callable[[int], None],
) -> list[Level]:
    """Coarsen ``graph`` level by level (Algorithm 1 + eq. 5 lengths).

    Stops at ``max_levels`` levels, once a level has at most ``max_coarse_size`` vertices,
    or when the next level would have fewer than ``min_size`` vertices or not shrink.
    ``progress(done)`` is called after each coarsening.
    """
    levels = [Level(vertices=np.arange(graph.shape[0]), graph=graph)]
    while max_levels is None or len(levels) < max_levels:
        current = levels[-1]
        n = len(current.vertices)
        if max_coarse_size is not None and n <= max_coarse_size:
            break
        state = independent_set(current.graph, order, rng)
        coarse = np.flatnonzero(state == _coarsen.COARSE)
        if len(coarse) < min_size or len(coarse) == n:
            break
        indptr, indices, lengths = _coarsen.coarse_graph(
            current.graph.indptr.astype(np.int64),
            current.graph.indices.astype(np.int64),
            current.graph.data.astype(np.float64),
            state,
        )
        coarse_graph = sp.csr_matrix((lengths, indices, indptr), shape=(len(coarse),) * 2)
        current.coarse = coarse
        levels.append(Level(vertices=current.vertices[coarse], graph=coarse_graph))
        progress(len(levels) - 1)
    return levels


def independent_set(graph: sp.csr_matrix, order: str, rng: np.random.RandomState) -> np.ndarray:
    """Algorithm 1's vertex states (``_coarsen.COARSE`` or ``FINE``) for one level."""
    indptr = graph.indptr.astype(np.int64)
    indices = graph.indices.astype(np.int64)
    if order == "fixed":
        return _coarsen.independent_set_fixed(indptr, indices)
    return _coarsen.independent_set_random(indptr, indices, rng.random_sample(2 * len(indptr) - 2))


def edge_weights(graph: sp.csr_matrix, kind: str) -> tuple[sp.csr_matrix, float]:
    """Symmetric weights on the graph's edges and the kernel width used.

    ``"heat"``: exp(-d^2 / sigma^2) with sigma the median edge length of this level (the
    paper leaves sigma open; lengths roughly double per level, so one global sigma would
    drive coarse weights towards zero). ``"simple"``: 1 on every edge, sigma = inf.
    """
    weights = graph.copy()
    if kind == "simple":
        weights.data = np.ones_like(weights.data)
        return weights, float("inf")
    sigma = float(np.median(graph.data))
    weights.data = np.exp(-((graph.data / sigma) ** 2))
    return weights, sigma


def embed_isomap(graph: sp.csr_matrix, n_components: int, seed: int) -> np.ndarray:
    """Classical MDS of the graph's shortest-path distances (what sklearn's Isomap does).

    sklearn's ``KernelPCA(kernel="precomputed")``, written out so that its dense eigensolver
    is ``eigh_by_index``: on tied eigenvalues (equidistant points) the one it calls returned
    nothing. The same solver choice, ARPACK start, sign convention and scaling as KernelPCA;
    where KernelPCA refused significantly negative eigenvalues, their axes are zero here.
    """
    distances = shortest_path(graph, method="D", directed=False)
    gram = KernelCenterer().fit_transform(-0.5 * distances**2)
    size = gram.shape[0]
    k = min(n_components, size)
    if size > 200 and k < 10:  # KernelPCA's "auto" choice of ARPACK
        v0 = check_random_state(seed).uniform(-1, 1, size)
        values, vectors = eigsh(gram, k, which="LA", v0=v0)
    else:
        values, vectors = eigh_by_index(gram, size - k, size - 1)
    values = np.maximum(values, 0.0)  # rounding makes null directions slightly negative
    vectors, _ = svd_flip(u=vectors, v=None)
    order = values.argsort()[::-1]
    return vectors[:, order] * np.sqrt(values[order])


def embed_lle(
    graph: sp.csr_matrix, X: np.ndarray, n_components: int, rng: np.random.RandomState
) -> np.ndarray:
    """LLE whose neighbourhoods are the graph's (variable-size) neighbour lists.

    Barycentre weights: G = (X_N - x_i)(X_N - x_i)^T + reg * tr(G) I, w = G^-1 1 / 1^T G^-1 1;
    then the bottom eigenvectors 2..d+1 of M = (I - W)^T (I - W).
    """
    n = graph.shape[0]
    data = np.empty(graph.nnz, dtype=np.float64)
    for i in range(n):
        start, stop = graph.indptr[i], graph.indptr[i + 1]
        local = X[graph.indices[start:stop]] - X[i]
        gram = local @ local.T
        trace = float(np.trace(gram))
        gram.flat[:: stop - start + 1] += LLE_REG * trace if trace > 0 else LLE_REG
        w = scipy.linalg.solve(gram, np.ones(stop - start), assume_a="pos")
        data[start:stop] = w / w.sum()
    weights = sp.csr_matrix((data, graph.indices, graph.indptr), shape=(n, n))
    residual = sp.identity(n, format="csr") - weights
    m = (residual.T @ residual).tocsr()
    if n <= DENSE_EIGEN_MAX:
        _, vectors = eigh_by_index(m.toarray(), 1, n_components)
    else:
        v0 = rng.uniform(-1, 1, n)
        _, vectors = eigsh(m, k=n_components + 1, sigma=0.0, v0=v0)
        vectors = vectors[:, 1:]
    return _sign_flip(vectors)


def embed_eigenmaps(weights: sp.csr_matrix, n_components: int, seed: int) -> np.ndarray:
    """Laplacian eigenmaps: (D - W) z = lambda D z, eigenvectors 2..d+1, with Y^T D Y = I."""
    return spectral_embedding(
        weights, n_components=n_components, norm_laplacian=True, drop_first=True, random_state=seed
    )


def refine(weights: sp.csr_matrix, coarse: np.ndarray, coarse_embedding: np.ndarray) -> np.ndarray:
    """Embed a level given its coarse vertices' embedding: solve L_UU Y_U = W_UV Y_V.

    This is eq. (12) with D12 the row sums of W12: harmonic interpolation, each fine vertex
    ends at the weighted mean of its neighbours. L_UU is SPD because every fine vertex has a
    coarse neighbour (the independent set is maximal).
    """
    n = weights.shape[0]
    weights = weights.copy()
    weights.data = np.maximum(weights.data, REFINE_WEIGHT_FLOOR)
    is_fine = np.ones(n, dtype=bool)
    is_fine[coarse] = False
    fine = np.flatnonzero(is_fine)
    lap = laplacian(weights).tocsr()
    lap_ff = lap[fine][:, fine].tocsc()
    rhs = -(lap[fine][:, coarse] @ coarse_embedding)
    embedding = np.empty((n, coarse_embedding.shape[1]), dtype=np.float64)
    embedding[coarse] = coarse_embedding
    embedding[fine] = _solve_spd(lap_ff, rhs)
    return embedding


def _solve_spd(matrix: sp.csc_matrix, rhs: np.ndarray) -> np.ndarray:
    if matrix.shape[0] <= DIRECT_SOLVE_MAX:
        return splu(matrix).solve(rhs)
    inverse_diagonal = 1.0 / matrix.diagonal()
    jacobi = LinearOperator(matrix.shape, matvec=lambda v: inverse_diagonal * v.ravel())
    out = np.empty_like(rhs)
    for column in range(rhs.shape[1]):
        # Start from the Jacobi step: the answer is a weighted mean, usually close to it.
        x0 = inverse_diagonal * rhs[:, column]
        solution, info = cg(matrix, rhs[:, column], x0=x0, rtol=CG_RTOL, atol=0.0, M=jacobi)
        if info != 0:
            raise RuntimeError(f"refinement solve did not converge (cg info={info})")
        out[:, column] = solution
    return out


def _sign_flip(vectors: np.ndarray) -> np.ndarray:
    """Make each column's largest-magnitude entry positive, so the output is deterministic."""
    rows = np.argmax(np.abs(vectors), axis=0)
    signs = np.sign(vectors[rows, np.arange(vectors.shape[1])])
    signs[signs == 0] = 1.0
    return vectors * signs
