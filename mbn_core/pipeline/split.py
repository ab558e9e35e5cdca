"""Which rows of the training data fit the model and which measure it.

Every method's training keeps some rows new to the fit, because a service only ever embeds
new rows: either one held-out share (``holdout_fraction``), kept out of the model too, or,
when that share would be too few rows to compare two embeddings, K-fold cross-fitting
(``report_folds``), where the model is fitted on every row and K more fits each leave one
fold out to measure it. A fast path that trains on the fitted rows (a distilled MLP) also
keeps a validation share of them to choose its best epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# report_folds="auto" cross-fits with this many folds when a single holdout would have fewer
# than CROSS_FIT_BELOW rows: on fewer, the k-means of the fidelity report moves with single
# rows (docs/decisions records the measurement).
AUTO_FOLDS = 5
CROSS_FIT_BELOW = 500


@dataclass(frozen=True)
class Split:
    """Row indices of one split, each sorted.

    Attributes
    ----------
    holdout : ndarray of int
        Rows kept out of the fit (empty when the report is cross-fitted).
    validation : ndarray of int
        Rows of the fit on which a trained fast path chooses its best epoch.
    train : ndarray of int
        The other rows of the fit.
    """

    holdout: np.ndarray
    validation: np.ndarray
    train: np.ndarray

    @property
    def fitted(self) -> np.ndarray:
        """Every row of the fit (validation and train), sorted."""
        return np.sort(np.concatenate([self.validation, self.train]))


def split_rows(
    n_samples: int, holdout_fraction: float | None, validation_fraction: float, rng
) -> Split:
    """A random split of ``n_samples`` rows; no held-out rows when ``holdout_fraction`` is
    None (a cross-fitted report). Draws one permutation from ``rng``."""
    order = rng.permutation(n_samples)
    held = 0 if holdout_fraction is None else n_holdout(n_samples, holdout_fraction)
    rest = n_samples - held
    n_validation = round(validation_fraction * rest)
    if validation_fraction > 0:
        n_validation = max(1, n_validation)
    if rest - n_validation < 2:
        after = f"validation_fraction={validation_fraction}"
        if holdout_fraction is not None:
            after = f"holdout_fraction={holdout_fraction} and {after}"
        raise ValueError(f"{n_samples} samples leave fewer than 2 to train the MLP after {after}")
    return Split(
        holdout=np.sort(order[:held]),
        validation=np.sort(order[held : held + n_validation]),
        train=np.sort(order[held + n_validation :]),
    )


def n_holdout(n_samples: int, holdout_fraction: float) -> int:
    """Rows a held-out share of ``n_samples`` keeps (at least one)."""
    return max(1, round(holdout_fraction * n_samples))


def report_fold_count(
    n_samples: int, holdout_fraction: float, report_folds: int | str | None
) -> int | None:
    """Folds the report of a fit on ``n_samples`` rows refits, or None (one held-out set).

    ``report_folds`` is K (always cross-fit), None (never) or "auto": ``AUTO_FOLDS`` when
    the held-out share would have fewer than ``CROSS_FIT_BELOW`` rows.
    """
    if report_folds is None:
        return None
    if report_folds == "auto":
        small = n_holdout(n_samples, holdout_fraction) < CROSS_FIT_BELOW
        return AUTO_FOLDS if small else None
    return int(report_folds)


def teacher_fit_rows(
    n_samples: int, holdout_fraction: float, report_folds: int | str | None = None
) -> int:
    """Rows of ``n_samples`` that the model is fitted on: all but the held-out ones, or all
    with a cross-fitted report (``report_folds``)."""
    if report_fold_count(n_samples, holdout_fraction, report_folds) is not None:
        return n_samples
    return n_samples - n_holdout(n_samples, holdout_fraction)


def fold_fit_rows(n_samples: int, holdout_fraction: float, report_folds: int | str | None) -> int:
    """The fewest rows a fit of the report is made on: the model's, or a fold fit's."""
    n_folds = report_fold_count(n_samples, holdout_fraction, report_folds)
    if n_folds is None:
        return teacher_fit_rows(n_samples, holdout_fraction, report_folds)
    return n_samples - -(-n_samples // n_folds)
