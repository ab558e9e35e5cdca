"""The MBM optimiser against the paper's propositions (spec A6.1-A6.8), on small exact problems."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mbn_core.modular import _mbm


@pytest.fixture
def spectrum():
    # Distinct, decaying eigenvalues: the truncations below are unique.
    return np.sort(np.random.default_rng(0).uniform(0.1, 10.0, 14))[::-1] ** 2


def _converge(q, n_modules, module_dim, diversity, epsilon=1e-9, epochs=400, seed=0):
    factors = _mbm.initial_factors(q, n_modules, module_dim, np.random.RandomState(seed))
    factors, losses, stopped = _mbm.optimise(q, factors, diversity, epsilon, epochs, 1e-13)
    assert not stopped
    return factors, losses


def _naive_loss(factors, q, diversity):
    """ℒ straight from its definition with dense ρ x ρ Gram matrices."""
    Q = np.diag(q)
    grams = [F.T @ F for F in factors]
    mean = sum(grams) / len(grams)
    per_module = np.mean([np.sum((A - Q) ** 2) for A in grams])
    return (1 - diversity) * per_module + diversity * np.sum((mean - Q) ** 2)


def test_rank_truncated_root_takes_algebraically_largest_eigenvalues():
    rng = np.random.default_rng(1)
    basis, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    values = np.array([5.0, -9.0, 3.0, -1.0, 0.5, -20.0])  # indefinite, big negative ones
    T = basis @ np.diag(values) @ basis.T
    F = _mbm.rank_truncated_root(T, 2)
    expected = basis[:, [0, 2]] @ np.diag([5.0, 3.0]) @ basis[:, [0, 2]].T
    np.testing.assert_allclose(F.T @ F, expected, atol=1e-12)
    # Rank above the positive part: the extra rows are zero, not square roots of negatives.
    F = _mbm.rank_truncated_root(T, 4)
    assert np.count_nonzero(np.linalg.norm(F, axis=1) > 1e-9) == 3
    assert _mbm.rank_truncated_root(T, 8).shape == (8, 6)


def test_diversity_zero_gives_every_module_the_top_kpca(spectrum):
    # A6.1: each F_m^T F_m is the rank-H truncation of Q; the loss is the KPCA-H loss.
    module_dim = 3
    factors, losses = _converge(spectrum, 4, module_dim, diversity=0.0)
    truncated = np.diag(np.where(np.arange(spectrum.size) < module_dim, spectrum, 0.0))
    for F in factors:
        np.testing.assert_allclose(F.T @ F, truncated, atol=1e-6 * spectrum[0])
    np.testing.assert_allclose(losses[-1], np.sum(spectrum[module_dim:] ** 2), rtol=1e-7)


def test_diversity_one_splits_the_top_components_among_modules(spectrum):
    # A6.2: S/M is the best rank-HM approximation of Q; the composite loss is the KPCA-HM loss.
    n_modules, module_dim = 3, 2
    width = n_modules * module_dim
    factors, losses = _converge(spectrum, n_modules, module_dim, diversity=1.0)
    mean = sum(F.T @ F for F in factors) / n_modules
    truncated = np.diag(np.where(np.arange(spectrum.size) < width, spectrum, 0.0))
    np.testing.assert_allclose(mean, truncated, atol=1e-5 * spectrum[0])
    np.testing.assert_allclose(losses[-1], np.sum(spectrum[width:] ** 2), rtol=1e-6)


def test_prop2_identity_and_prop5_compression_hold_in_sample_space():
    # A6.3 and A6.4: the loss computed in sample space from the definition (mean over
    # modules minus λ times the variance of inner products) equals (1 - λ) avg + λ L(Φ̄)
    # and the compressed loss of F_m = W_m U Σ against Q = Σ^2, divided by N^2.
    rng = np.random.default_rng(2)
    n_samples, n_features, n_modules, module_dim, diversity = 200, 50, 4, 3, 0.7
    Psi = rng.standard_normal((n_features, n_samples))
    K = Psi.T @ Psi
    W = rng.standard_normal((n_modules, module_dim, n_features)) * 0.1
    inner = np.stack([(Wm @ Psi).T @ (Wm @ Psi) for Wm in W])  # (M, N, N)
    per_module = np.mean([np.mean((P - K) ** 2) for P in inner])
    variance = np.mean(np.var(inner, axis=0))  # 1/M variance over modules, mean over pairs
    definition = per_module - diversity * variance
    composite = np.mean((inner.mean(axis=0) - K) ** 2)
    np.testing.assert_allclose(
        definition, (1 - diversity) * per_module + diversity * composite, rtol=1e-10
    )
    U, sigma, _ = np.linalg.svd(Psi, full_matrices=False)
    compressed = W @ (U * sigma)
    np.testing.assert_allclose(
        _mbm.modular_loss(compressed, sigma**2, diversity) / n_samples**2, definition, rtol=1e-9
    )


def test_loss_matches_its_dense_definition(spectrum):
    factors = np.random.default_rng(3).standard_normal((3, 2, spectrum.size))
    for diversity in (0.0, 0.4, 1.0):
        np.testing.assert_allclose(
            _mbm.modular_loss(factors, spectrum, diversity),
            _naive_loss(factors, spectrum, diversity),
            rtol=1e-12,
        )


def test_loss_never_increases_after_any_module_update(spectrum):
    # A6.5 (Theorem 1): non-increasing after every block update, strictly per epoch.
    recorded = []

    def on_update(epoch, module, factors):
        recorded.append(_mbm.modular_loss(factors, spectrum, 0.9))

    factors = _mbm.initial_factors(spectrum, 4, 2, np.random.RandomState(4))
    start = _mbm.modular_loss(factors, spectrum, 0.9)
    _, losses, _ = _mbm.optimise(spectrum, factors, 0.9, 1e-6, 30, 0.0, on_update)
    steps = np.diff([start, *recorded])
    assert np.all(steps <= 1e-12 * start), steps.max()
    epoch_steps = np.diff(losses)
    assert np.all(epoch_steps[:10] < 0)
    assert len(losses) > 10


def test_stops_when_the_decrease_is_below_tol(spectrum):
    factors = _mbm.initial_factors(spectrum, 3, 2, np.random.RandomState(5))
    _, losses, _ = _mbm.optimise(spectrum, factors, 0.5, 1e-6, 500, 1e-3)
    assert len(losses) - 1 < 500
    assert losses[-2] - losses[-1] <= 1e-3 * losses[-1]
    assert all(a - b > 1e-3 * b for a, b in itertools.pairwise(losses[:-1]))


def test_block_update_is_the_exact_block_minimiser(spectrum):
    # A6.6: no perturbation of F_m lowers ℒ + (ε/M)|A_m - A_m,old|^2.
    rng = np.random.default_rng(6)
    n_modules, diversity, epsilon = 3, 0.8, 0.05
    factors = rng.standard_normal((n_modules, 2, spectrum.size))
    old = factors[1].T @ factors[1]
    others = sum(F.T @ F for i, F in enumerate(factors) if i != 1)
    T = _mbm.block_target(spectrum, others, old, n_modules, diversity, epsilon)
    best = _mbm.rank_truncated_root(T, 2)

    def block_objective(F):
        trial = factors.copy()
        trial[1] = F
        return _mbm.modular_loss(trial, spectrum, diversity) + epsilon / n_modules * np.sum(
            (F.T @ F - old) ** 2
        )

    optimum = block_objective(best)
    for scale in (1e-4, 1e-2, 1.0):
        for _ in range(20):
            assert block_objective(best + scale * rng.standard_normal(best.shape)) >= optimum


def test_gradient_matches_finite_differences(spectrum):
    # A6.7
    rng = np.random.default_rng(7)
    factors = rng.standard_normal((3, 2, spectrum.size))
    gradient = _mbm.modular_gradient(factors, spectrum, 0.6)
    step = 1e-6
    for index in [(0, 0, 0), (1, 1, 5), (2, 0, 13), (2, 1, 3)]:
        plus, minus = factors.copy(), factors.copy()
        plus[index] += step
        minus[index] -= step
        numeric = (
            _mbm.modular_loss(plus, spectrum, 0.6) - _mbm.modular_loss(minus, spectrum, 0.6)
        ) / (2 * step)
        np.testing.assert_allclose(gradient[index], numeric, rtol=1e-5)


def test_drop_module_gradient_is_the_scaled_modular_gradient(spectrum):
    # A6.8 (Theorem 2): E_η of the composite loss with modules kept with probability p has
    # gradient (p/s) ∇ℒ^λ(sF), λ = Mp/(1 + p(M-1)), s^2 = p/λ. The expectation is exact here:
    # every keep pattern of the M = 4 modules, weighted by its probability.
    rng = np.random.default_rng(8)
    n_modules, p = 4, 0.6
    factors = rng.standard_normal((n_modules, 2, spectrum.size))
    expected = np.zeros_like(factors)
    for mask in itertools.product((0.0, 1.0), repeat=n_modules):
        kept = np.array(mask)
        weight = p ** kept.sum() * (1 - p) ** (n_modules - kept.sum())
        masked = factors * kept[:, None, None]
        # Composite loss only (λ = 1) of the masked modules, chain rule through the mask.
        expected += weight * kept[:, None, None] * _mbm.modular_gradient(masked, spectrum, 1.0)
    diversity = n_modules * p / (1 + p * (n_modules - 1))
    scale = np.sqrt(p / diversity)
    predicted = p / scale * _mbm.modular_gradient(scale * factors, spectrum, diversity)
    np.testing.assert_allclose(
        expected, predicted, rtol=1e-10, atol=1e-10 * np.abs(predicted).max()
    )


def test_lanczos_block_step_equals_the_dense_one():
    rng = np.random.default_rng(9)
    q = np.sort(rng.uniform(0.01, 5.0, 60))[::-1] ** 2
    factors = rng.standard_normal((4, 3, 60)) * np.sqrt(q) / 8
    others = factors[1:].reshape(-1, 60)
    dense = _mbm.rank_truncated_root(
        _mbm.block_target(q, others.T @ others, factors[0].T @ factors[0], 4, 0.9, 1e-3), 3
    )
    lanczos = _mbm.lanczos_block_root(q, others, factors[0], 4, 0.9, 1e-3)
    np.testing.assert_allclose(lanczos.T @ lanczos, dense.T @ dense, atol=1e-9 * q[0])


def test_both_epoch_paths_give_the_same_descent(monkeypatch):
    rng = np.random.default_rng(10)
    q = np.sort(rng.uniform(0.01, 5.0, 40))[::-1] ** 2
    start = _mbm.initial_factors(q, 3, 2, np.random.RandomState(0))
    _, dense, _ = _mbm.optimise(q, start.copy(), 0.9, 1e-6, 15, 0.0)
    monkeypatch.setattr(_mbm, "LANCZOS_MIN_RANK", 10)
    _, lanczos, _ = _mbm.optimise(q, start.copy(), 0.9, 1e-6, 15, 0.0)
    np.testing.assert_allclose(lanczos, dense, rtol=1e-8)
