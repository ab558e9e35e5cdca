"""The module-by-module (MBM) optimiser of the modular inner-product loss (compressed problem).

Pure functions ("prior validation of data is assumed"). The problem lives in ρ dimensions
after Prop. 5: module m is a factor F_m (H x ρ), its Gram matrix A_m = F_m^T F_m, and the
target Gram matrix is Q = diag(q). The loss, times N^2 (docs/MODULAR_KPCA.md, §1), is

    ℒ = (1 - λ) (1/M) Σ_m |A_m - Q|^2 + λ |Ā - Q|^2,      Ā = (1/M) Σ_m A_m.

One block update replaces F_m by the exact minimiser of ℒ + (ε/M)|A_m - A_m,old|^2 over
F_m with the other modules fixed: the rank-H root of
T = c (Q - (λ/M) S_m + ε A_m,old), c = 1 / ((1 - λ) + λ/M + ε), S_m = Σ_{q≠m} A_q.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.sparse.linalg import LinearOperator, eigsh

from mbn_core.utils.blas import one_blas_thread
from mbn_core.utils.eigen import eigh_by_index

# Above this rank the block step uses Lanczos on T as "diagonal minus low rank" (O(ρ HM) per
# product) instead of a dense eigendecomposition (O(ρ^3)); both are exact to rounding.
LANCZOS_MIN_RANK = 400

# Called after every block update as on_update(epoch, module, factors); True stops.
UpdateHook = Callable[[int, int, np.ndarray], object]


def rank_truncated_root(T: np.ndarray, rank: int) -> np.ndarray:
    """RT_r(T) = argmin over F (rank x ρ) of |F^T F - T|_F, for symmetric (maybe indefinite) T.

    The rows are sqrt(max(γ_i, 0)) u_i^T for the ``rank`` algebraically largest eigenpairs
    (Dax); negative eigenvalues give zero rows, and rows beyond ρ stay zero.
    """
    size = T.shape[0]
    factor = np.zeros((rank, size))
    k = min(rank, size)
    if k == 0:
        return factor
    # Algebraically largest, not largest in magnitude: T can be indefinite.
    values, vectors = eigh_by_index(T, size - k, size - 1)
    values, vectors = values[::-1], vectors[:, ::-1]
    factor[:k] = np.sqrt(np.maximum(values, 0.0))[:, None] * vectors.T
    return factor


def lanczos_block_root(
    q: np.ndarray,
    others: np.ndarray,
    old: np.ndarray,
    n_modules: int,
    diversity: float,
    epsilon: float,
) -> np.ndarray:
    """``rank_truncated_root(block_target(...), H)`` without forming T.

    ``others`` stacks the other modules' factors ((M-1) H x ρ) and ``old`` is F_m,old
    (H x ρ), so T v = c (q v - (λ/M) G^T G v + ε F^T F v) costs O(ρ M H). ARPACK's implicitly
    restarted Lanczos converges to machine precision (tol=0), started from F_m,old's rows.
    """
    rank, size = old.shape
    if rank >= size - 1:  # ARPACK needs k < n - 1; such tiny problems are cheap densely
        target = block_target(q, others.T @ others, old.T @ old, n_modules, diversity, epsilon)
        return rank_truncated_root(target, rank)
    c = 1.0 / ((1.0 - diversity) + diversity / n_modules + epsilon)
    coupling = diversity / n_modules

    def product(v: np.ndarray) -> np.ndarray:
        return c * (q * v - coupling * (others.T @ (others @ v)) + epsilon * (old.T @ (old @ v)))

    def block_product(V: np.ndarray) -> np.ndarray:
        return c * (
            q[:, None] * V - coupling * (others.T @ (others @ V)) + epsilon * (old.T @ (old @ V))
        )

    operator = LinearOperator((size, size), matvec=product, matmat=block_product, dtype=np.float64)
    start = old.sum(axis=0)
    if not np.any(start):
        start = np.sqrt(q)
    values, vectors = eigsh(operator, k=rank, which="LA", v0=start, tol=0)
    order = np.argsort(values)[::-1]
    values, vectors = values[order], vectors[:, order]
    return np.sqrt(np.maximum(values, 0.0))[:, None] * vectors.T


def block_target(
    q: np.ndarray,
    others: np.ndarray,
    old: np.ndarray,
    n_modules: int,
    diversity: float,
    epsilon: float,
) -> np.ndarray:
    """T of the block update, from S_m (``others``) and A_m,old (``old``), both ρ x ρ."""
    c = 1.0 / ((1.0 - diversity) + diversity / n_modules + epsilon)
    T = (-diversity / n_modules) * others + epsilon * old
    T[np.diag_indices_from(T)] += q
    T *= c
    return 0.5 * (T + T.T)


def modular_loss(factors: np.ndarray, q: np.ndarray, diversity: float) -> float:
    """ℒ for factors (M, H, ρ) and Q = diag(q), without forming any ρ x ρ matrix.

    With Q diagonal, |F^T F - Q|^2 = |F F^T|^2 - 2 Σ_j q_j |F[:, j]|^2 + |q|^2.
    """
    n_modules = factors.shape[0]
    q_sq = float(q @ q)
    per_module = 0.0
    for F in factors:
        gram = F @ F.T
        per_module += float(np.sum(gram * gram)) - 2.0 * float(np.sum(F * F, axis=0) @ q) + q_sq
    stacked = factors.reshape(-1, factors.shape[-1])
    gram = stacked @ stacked.T
    composite = (
        float(np.sum(gram * gram)) / n_modules**2
        - 2.0 * float(np.sum(stacked * stacked, axis=0) @ q) / n_modules
        + q_sq
    )
    return (1.0 - diversity) * per_module / n_modules + diversity * composite


def modular_gradient(factors: np.ndarray, q: np.ndarray, diversity: float) -> np.ndarray:
    """∂ℒ/∂F_m = (4/M) F_m [(1 - λ)(A_m - Q) + λ(Ā - Q)], for every m at once, (M, H, ρ).

    Computed through H x H and H x HM products, O(M H (H M) ρ), never ρ x ρ.
    """
    n_modules = factors.shape[0]
    stacked = factors.reshape(-1, factors.shape[-1])
    # F_m A_m = (F_m F_m^T) F_m and F_m Ā = (1/M) (F_m G^T) G, with G the stacked factors:
    # batched matrix products, never a ρ x ρ matrix.
    own = (factors @ factors.transpose(0, 2, 1)) @ factors
    mean = (factors @ stacked.T) @ stacked / n_modules
    fq = factors * q
    return (4.0 / n_modules) * ((1.0 - diversity) * (own - fq) + diversity * (mean - fq))


def initial_factors(q: np.ndarray, n_modules: int, module_dim: int, rng) -> np.ndarray:
    """Random start: F_m = Z_m diag(sqrt(q)) / sqrt(ρ), Z_m standard normal.

    This is the paper's "Random" baseline in compressed coordinates (random unit-norm rows
    applied to the features), so the optimiser starts from a sensible scale and every
    direction's weight is proportional to its singular value (nothing amplified later by
    W = F Σ^{-1}).
    """
    rank = q.shape[0]
    noise = rng.standard_normal((n_modules, module_dim, rank))
    return noise * np.sqrt(q) / np.sqrt(max(rank, 1))


def optimise(
    q: np.ndarray,
    factors: np.ndarray,
    diversity: float,
    epsilon: float,
    max_epochs: int,
    tol: float,
    on_update: UpdateHook | None = None,
) -> tuple[np.ndarray, list[float], bool]:
    """Run MBM epochs from ``factors`` (M, H, ρ), updated in place.

    Returns the factors, the loss ℒ at the start and after every epoch, and whether the
    hook asked to stop. Stops when an epoch lowers ℒ by at most ``tol * ℒ``.
    """
    losses = [modular_loss(factors, q, diversity)]
    if factors.shape[-1] == 0:
        return factors, losses, False
    # One BLAS thread: these eigenproblems are small (ρ <= R), and a second thread spinning
    # on a busy machine made each one many times slower
    # (docs/decisions/0018-modular-kpca-optimiser-and-lambda.md).
    with one_blas_thread():
        if q.shape[0] >= LANCZOS_MIN_RANK:
            return _lanczos_epochs(
                q, factors, diversity, epsilon, max_epochs, tol, losses, on_update
            )
        return _dense_epochs(q, factors, diversity, epsilon, max_epochs, tol, losses, on_update)


def _lanczos_epochs(q, factors, diversity, epsilon, max_epochs, tol, losses, on_update):
    n_modules = factors.shape[0]
    for epoch in range(max_epochs):
        for m in range(n_modules):
            others = np.delete(factors, m, axis=0).reshape(-1, factors.shape[-1])
            factors[m] = lanczos_block_root(q, others, factors[m], n_modules, diversity, epsilon)
            if on_update is not None and on_update(epoch, m, factors):
                return factors, losses, True
        losses.append(modular_loss(factors, q, diversity))
        if losses[-2] - losses[-1] <= tol * abs(losses[-1]):
            break
    return factors, losses, False


def _dense_epochs(q, factors, diversity, epsilon, max_epochs, tol, losses, on_update):
    n_modules = factors.shape[0]
    grams = np.einsum("mhi,mhj->mij", factors, factors)
    for epoch in range(max_epochs):
        # Summed afresh each epoch so rounding in the running update cannot drift.
        total = grams.sum(axis=0)
        for m in range(n_modules):
            others = total - grams[m]
            T = block_target(q, others, grams[m], n_modules, diversity, epsilon)
            factors[m] = rank_truncated_root(T, factors.shape[1])
            grams[m] = factors[m].T @ factors[m]
            total = others + grams[m]
            if on_update is not None and on_update(epoch, m, factors):
                return factors, losses, True
        losses.append(modular_loss(factors, q, diversity))
        if losses[-2] - losses[-1] <= tol * abs(losses[-1]):
            break
    return factors, losses, False
