"""Modular kernel PCA as a registered method (docs/METHODS.md).

The fast path is exported, not distilled: the exact map is an RBF kernel against stored
landmarks and one linear map, which ONNX expresses directly (``modular_onnx``).
"""

from __future__ import annotations

from typing import Any

from mbn_core.methods import Method, Reporter, register
from mbn_core.modular.export import to_onnx
from mbn_core.modular.kpca import ModularKPCA, modular_from_arrays, modular_to_arrays

# Candidate fits of diversity="validate" (the grid) plus the final one.
_VALIDATE_FITS = 10


def _fits(model: ModularKPCA) -> int:
    return _VALIDATE_FITS if model.diversity == "validate" else 1


def _cost(model: ModularKPCA, shape: tuple[int, int]) -> float:
    """Multiply-adds: Nyström features and their covariance, then the block updates."""
    n, d = shape
    rank = min(model.n_landmarks, n)
    features = float(n) * rank * (d + rank)
    # One Lanczos block step costs about 50 products with T at 2 * rank * n_modules * module_dim.
    step = 100.0 * rank * model.n_modules * model.module_dim
    return _fits(model) * (features + model.max_epochs * model.n_modules * step)


def _track(model: ModularKPCA, shape: tuple[int, int], report: Reporter) -> None:
    # Early stopping usually ends a fit before max_epochs: the fraction is an upper bound on
    # the work left and jumps to the end when the fit converges.
    total = _fits(model) * model.max_epochs * model.n_modules
    done = 0

    def module_done(epoch: int, module: int, n_modules: int) -> bool:
        nonlocal done
        done += 1
        return bool(
            report(min(done / total, 1.0), f"epoch {epoch + 1}: module {module}/{n_modules}")
        )

    model.set_params(callback=module_done)


def _check_rows(model: ModularKPCA, n_samples: int) -> None:
    needed = 12 if model.diversity == "validate" else 2
    if n_samples < needed:
        raise ValueError(f"modular_kpca needs at least {needed} training rows, got {n_samples}")


def _facts(model: ModularKPCA) -> dict[str, Any]:
    return {
        "gamma": float(model.gamma_),
        "diversity": float(model.diversity_),
        "n_landmarks": int(model.map_.landmarks.shape[0]),
        "rank": int(model.rank_),
        "epochs": int(model.n_iter_),
        "final_loss": float(model.loss_curve_[-1]),
        "validation_scores": None
        if model.validation_scores_ is None
        else {str(k): float(v) for k, v in model.validation_scores_.items()},
    }


METHOD = register(
    Method(
        name="modular_kpca",
        estimator=ModularKPCA,
        summary="Modular kernel PCA (Reeve, Mu & Brown 2018), exact map exported to ONNX",
        save=modular_to_arrays,
        load=modular_from_arrays,
        export=to_onnx,
        # A service job should end in minutes: an epoch of 15 modules takes seconds, and 1e-4
        # relative progress per epoch is where the benchmark's retrieval precision stopped
        # moving (docs/decisions/0018-modular-kpca-optimiser-and-lambda.md).
        defaults={"max_epochs": 100, "tol": 1e-4},
        track=_track,
        cost=_cost,
        check_rows=_check_rows,
        facts=_facts,
    )
)
