"""The student: an MLP regressor from input rows to a teacher's embedding of them.

Appendix D of Zhang's "Multilayer bootstrap networks": train a neural network from the raw
input to the exact embedding, then predict with the network. Nothing here knows the teacher:
``Distiller.distil`` takes rows and their target embedding and returns a ``Student``.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from sklearn.neural_network import MLPRegressor
from threadpoolctl import threadpool_limits

from mbn_core.distill.input_map import InputMap
from mbn_core.distill.input_noise import auto_input_noise
from mbn_core.exceptions import TrainingStopped
from mbn_core.utils.seeds import draw_seed

log = logging.getLogger(__name__)

EpochCallback = Callable[[int, int, float], object]
# The MLP's last epoch steps at this share of learning_rate (see step_factor).
FINAL_STEP = 0.02
# sklearn's MLP swallows Ctrl-C inside an epoch and warns with this message instead.
_MLP_INTERRUPTED = "Training interrupted by user."


@dataclass(frozen=True)
class Student:
    """A trained student: embedding = MLP(input_map(X)) * target_scale + target_mean.

    Attributes
    ----------
    input_map : InputMap
        From an input row to the MLP's input: standardised, or projected.
    mlp : MLPRegressor
        The network from the mapped input to the scaled embedding.
    target_mean, target_scale : ndarray of shape (n_components,), float32
    n_epochs : int
        Epochs run.
    input_noise : float
        Standard deviation of the noise added to the MLP's input rows.
    sparse : bool
        Whether the training input was sparse.
    seconds : float
        Seconds of training, input map included.
    """

    input_map: InputMap
    mlp: MLPRegressor
    target_mean: np.ndarray
    target_scale: np.ndarray
    n_epochs: int
    input_noise: float
    sparse: bool
    seconds: float

    def embed(self, X) -> np.ndarray:
        """The MLP's embedding of checked rows X, float32."""
        scaled = predict(self.mlp, self.input_map.transform(X), len(self.target_mean))
        return scaled * self.target_scale + self.target_mean


@dataclass(frozen=True)
class Distiller:
    """The student's training options (``DistilledEmbedding``'s parameters of the same names)."""

    hidden_layer_sizes: Sequence[int]
    max_epochs: int
    batch_size: int
    learning_rate: float
    alpha: float
    n_iter_no_change: int | None
    input_noise: float | str
    input_components: int | None
    tol: float
    threads: int

    def distil(
        self,
        X,
        embedding: np.ndarray,
        validation: np.ndarray,
        train: np.ndarray,
        rng,
        callback: EpochCallback | None,
    ) -> Student:
        """Train a student on rows ``X[train]`` to their ``embedding`` (choosing the best
        epoch on ``X[validation]``); ``callback(epoch, max_epochs, loss)`` after each epoch,
        True stops with ``TrainingStopped``."""
        started = time.perf_counter()
        with threadpool_limits(limits=self.threads, user_api="blas"):
            input_map = InputMap.fit(X[train], self.input_components)
        target_mean, target_scale = target_scaling(embedding[train])
        mlp, n_epochs, input_noise = self._fit_mlp(
            input_map.transform(X[train]),
            ((embedding[train] - target_mean) / target_scale).astype(np.float32),
            input_map.transform(X[validation]) if len(validation) else None,
            ((embedding[validation] - target_mean) / target_scale).astype(np.float32),
            rng,
            callback,
        )
        return Student(
            input_map=input_map,
            mlp=mlp,
            target_mean=target_mean.astype(np.float32),
            target_scale=target_scale.astype(np.float32),
            n_epochs=n_epochs,
            input_noise=input_noise,
            sparse=sp.issparse(X),
            seconds=time.perf_counter() - started,
        )

    def _fit_mlp(
        self, X_train, Y_train, X_val, Y_val, rng, callback: EpochCallback | None
    ) -> tuple[MLPRegressor, int, float]:
        mlp = MLPRegressor(
            hidden_layer_sizes=tuple(int(h) for h in self.hidden_layer_sizes),
            activation="relu",
            solver="adam",
            alpha=self.alpha,
            batch_size=min(self.batch_size, X_train.shape[0]),
            learning_rate_init=self.learning_rate,
            shuffle=True,
            random_state=draw_seed(rng),
        )
        best_loss, best_weights, stale = np.inf, None, 0
        input_noise = self._input_noise(X_train)
        # Drawn only when used, so that the other seeds stay those of a noiseless fit.
        noise = np.random.RandomState(draw_seed(rng)) if input_noise > 0 else None
        epoch = 0
        with threadpool_limits(limits=self.threads, user_api="blas"):
            for epoch in range(1, self.max_epochs + 1):
                if epoch > 1:  # the first epoch creates the optimizer at learning_rate
                    _set_step(mlp, self.learning_rate * step_factor(epoch, self.max_epochs))
                X_epoch = X_train
                if noise is not None:
                    X_epoch = X_train + noise.normal(0.0, input_noise, X_train.shape).astype(
                        X_train.dtype
                    )
                _partial_fit(mlp, X_epoch, Y_train)
                loss = np.nan
                if X_val is not None:
                    residual = predict(mlp, X_val, Y_val.shape[1]) - Y_val
                    loss = float(np.mean(residual.astype(np.float64) ** 2))
                    if loss < best_loss - self.tol:
                        stale = 0
                    else:
                        stale += 1
                    if loss < best_loss:
                        best_loss = loss
                        best_weights = (
                            [w.copy() for w in mlp.coefs_],
                            [b.copy() for b in mlp.intercepts_],
                        )
                log.debug("MLP epoch %d/%d: validation loss %.6g", epoch, self.max_epochs, loss)
                if callback is not None and callback(epoch, self.max_epochs, loss):
                    raise TrainingStopped(
                        f"training stopped by the callback after MLP epoch {epoch}"
                    )
                if self.n_iter_no_change is not None and stale >= self.n_iter_no_change:
                    log.info("MLP early stopping after epoch %d", epoch)
                    break
        if best_weights is not None:
            mlp.coefs_, mlp.intercepts_ = best_weights
        return mlp, epoch, input_noise

    def _input_noise(self, X_train) -> float:
        """The noise's standard deviation for these MLP input rows (none for sparse rows)."""
        if sp.issparse(X_train):
            return 0.0
        if self.input_noise != "auto":
            return float(self.input_noise)
        with threadpool_limits(limits=self.threads):  # the neighbour search's too
            return auto_input_noise(X_train)


def target_scaling(targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and per-dimension scale the MLP's targets are standardised with.

    One spread for every dimension: the MLP's loss stays the squared error of the embedding
    itself, instead of inflating the PCA's weak trailing dimensions.
    """
    mean = targets.mean(axis=0)
    spread = float(np.sqrt(np.mean((targets - mean) ** 2)))
    return mean, np.full_like(mean, spread if spread > 0 else 1.0)


def step_factor(epoch: int, n_epochs: int) -> float:
    """The share of ``learning_rate`` used in ``epoch`` (1-based) of ``n_epochs``: a half
    cosine from 1 in the first epoch down to ``FINAL_STEP`` in the last."""
    progress = (epoch - 1) / max(n_epochs - 1, 1)
    return FINAL_STEP + (1.0 - FINAL_STEP) * 0.5 * (1.0 + math.cos(math.pi * progress))


def predict(mlp: MLPRegressor, X, n_outputs: int) -> np.ndarray:
    """The MLP's output as float32 rows (MLPRegressor returns 1-D for a single output)."""
    return np.asarray(mlp.predict(X), dtype=np.float32).reshape(-1, n_outputs)


def _partial_fit(mlp: MLPRegressor, X, Y) -> None:
    """One epoch of Adam; a Ctrl-C inside it is raised, not swallowed as sklearn does."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # A single output goes in 1-D: sklearn warns about a column vector otherwise.
        mlp.partial_fit(X, Y.ravel() if Y.shape[1] == 1 else Y)
    for warning in caught:
        if str(warning.message) == _MLP_INTERRUPTED:
            raise KeyboardInterrupt
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def _set_step(mlp: MLPRegressor, step: float) -> None:
    # MLPRegressor has no schedule for Adam; its optimizer reads learning_rate_init at each
    # update (tests/mbn_core/test_compress.py checks that the step really changes).
    mlp._optimizer.learning_rate_init = step
