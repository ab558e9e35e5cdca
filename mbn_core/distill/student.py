"""The student: an MLP from input rows to a teacher's embedding of them.

Appendix D of Zhang's "Multilayer bootstrap networks": train a neural network from the raw
input to the exact embedding, then predict with the network. Nothing here knows the teacher:
``Distiller.distil`` takes rows and their target embedding and returns a ``Student``.

Two heads end the MLP (``HEADS``):

- ``"regression"``: the MLP regresses the embedding (squared error), as the paper's does. Right
  for an embedding that varies smoothly over the input (MBN's PCA output).
- ``"atoms"``: k-means finds atoms in the training rows' embedding; the MLP classifies which
  atoms a row belongs to (cross-entropy against soft targets: its ``ATOM_TARGETS`` nearest
  atoms, weighted by their distance), and its embedding is the mean of the atoms weighted
  by the sharpened probabilities (``ATOM_TEMPERATURE``). Right for a layout (t-SNE, UMAP, ...),
  made of tight clusters and wide gaps: a regressor unsure between two clusters puts a row
  in the gap between them, where the layout puts no row, while the classifier commits to
  one cluster's atoms.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import scipy.sparse as sp
from sklearn.cluster import KMeans
from sklearn.neighbors import NearestNeighbors
from sklearn.neural_network import MLPClassifier, MLPRegressor

from mbn_core.distill.input_map import InputMap
from mbn_core.distill.input_noise import auto_input_noise
from mbn_core.exceptions import TrainingStopped
from mbn_core.utils.blas import limited_threads
from mbn_core.utils.seeds import draw_seed

log = logging.getLogger(__name__)

EpochCallback = Callable[[int, int, float], object]
# The MLP's last epoch steps at this share of learning_rate (see step_factor).
FINAL_STEP = 0.02
# sklearn's MLP swallows Ctrl-C inside an epoch and warns with this message instead.
_MLP_INTERRUPTED = "Training interrupted by user."
# The student's heads (``DistilledEmbedding.student_head``; see the module's docstring).
HEADS = ("regression", "atoms")
# The atom head sharpens the classifier's probabilities p into p^(1/T) / sum(p^(1/T)), folded
# into the last layer (its weights divided by T): a row the MLP is fairly sure of lands on
# its atoms instead of between them. 0.5 with hard labels (decision 0034); the soft targets
# (ATOM_TARGETS) leave the probabilities flatter, and 0.25 restores the commitment to one
# cluster at no cost to MNIST's unseen rows (decision 0036).
ATOM_TEMPERATURE = 0.25
# Training rows per atom at least: fewer rows get fewer atoms, and under
# ``MIN_ATOMS`` atoms the head is a regression (a two-class MLP has one logistic output).
ROWS_PER_ATOM = 5
MIN_ATOMS = 3
# k-means restarts of the atoms (the lowest inertia is kept).
_ATOM_RESTARTS = 3
# The atom head's soft targets: each training row is taught its ATOM_TARGETS nearest atoms
# (the MLP sees it once per atom, in the same epoch), weighted by exp(-(d^2 - d_1^2) / 2s^2),
# d_1 the distance to its nearest atom and s^2 the median of d_1^2 over the training rows. A
# row near the border of two atoms is taught both, instead of one side of a border k-means
# drew through a cluster; new rows are placed better (docs/decisions/0036-soft-atom-targets.md).
ATOM_TARGETS = 3
# Most rows (repeated rows counted) in one partial_fit call of the atom head: scikit-learn
# one-hot encodes a call's labels (rows x atoms, 8 bytes each), so a large epoch goes in
# chunks of the rows, in an order drawn per epoch.
ATOM_CHUNK_ROWS = 65_536

Network: TypeAlias = MLPRegressor | MLPClassifier


@dataclass(frozen=True)
class Student:
    """A trained student: embedding = head(MLP(input_map(X))) * target_scale + target_mean.

    Attributes
    ----------
    input_map : InputMap
        From an input row to the MLP's input: standardised, or projected.
    mlp : MLPRegressor or MLPClassifier
        The network from the mapped input to the scaled embedding (a regressor), or to the
        probabilities of the atoms (a classifier, the temperature folded into its last
        layer).
    atoms : ndarray of shape (n_atoms, n_components), float32, or None
        The atom head's atoms in scaled units (None: the regression head).
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
    mlp: Network
    atoms: np.ndarray | None
    target_mean: np.ndarray
    target_scale: np.ndarray
    n_epochs: int
    input_noise: float
    sparse: bool
    seconds: float

    def embed(self, X) -> np.ndarray:
        """The MLP's embedding of checked rows X, float32."""
        scaled = scaled_output(self.mlp, self.atoms, self.input_map.transform(X))
        return scaled * self.target_scale + self.target_mean

    @property
    def head(self) -> str:
        """The head trained (``HEADS``)."""
        return "regression" if self.atoms is None else "atoms"


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
    head: str = "regression"
    n_atoms: int = 100

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
        with limited_threads(self.threads, "blas"):
            input_map = InputMap.fit(X[train], self.input_components)
        target_mean, target_scale = target_scaling(embedding[train])
        Y_train = ((embedding[train] - target_mean) / target_scale).astype(np.float32)
        atoms = targets = None
        if self.head == "atoms":
            atoms, targets = self._atoms(Y_train, rng)
        mlp, n_epochs, input_noise = self._fit_mlp(
            input_map.transform(X[train]),
            Y_train,
            input_map.transform(X[validation]) if len(validation) else None,
            ((embedding[validation] - target_mean) / target_scale).astype(np.float32),
            rng,
            callback,
            atoms,
            targets,
        )
        return Student(
            input_map=input_map,
            mlp=mlp,
            atoms=atoms,
            target_mean=target_mean.astype(np.float32),
            target_scale=target_scale.astype(np.float32),
            n_epochs=n_epochs,
            input_noise=input_noise,
            sparse=sp.issparse(X),
            seconds=time.perf_counter() - started,
        )

    def _atoms(self, Y_train: np.ndarray, rng) -> tuple[np.ndarray | None, AtomTargets | None]:
        """The atom head's atoms (k-means centroids of the scaled targets, float32) and the
        training rows' soft targets; (None, None) when the rows are too few for
        ``MIN_ATOMS``."""
        n_atoms = min(int(self.n_atoms), len(Y_train) // ROWS_PER_ATOM)
        if n_atoms < MIN_ATOMS:
            log.info("%d training rows: too few for atoms, the student regresses", len(Y_train))
            return None, None
        with limited_threads(self.threads):
            kmeans = KMeans(n_atoms, n_init=_ATOM_RESTARTS, random_state=draw_seed(rng))
            kmeans.fit(Y_train)
            atoms = kmeans.cluster_centers_.astype(np.float32)
            return atoms, atom_targets(Y_train, atoms)

    def _fit_mlp(
        self,
        X_train,
        Y_train,
        X_val,
        Y_val,
        rng,
        callback: EpochCallback | None,
        atoms: np.ndarray | None = None,
        targets: AtomTargets | None = None,
    ) -> tuple[Network, int, float]:
        network = MLPRegressor if atoms is None else MLPClassifier
        mlp = network(
            hidden_layer_sizes=tuple(int(h) for h in self.hidden_layer_sizes),
            activation="relu",
            solver="adam",
            alpha=self.alpha,
            batch_size=min(self.batch_size, X_train.shape[0]),
            learning_rate_init=self.learning_rate,
            shuffle=True,
            random_state=draw_seed(rng),
        )
        # The regressor learns the targets; the classifier each row's atoms.
        classes = None if atoms is None else np.arange(len(atoms))
        best_loss, best_weights, stale = np.inf, None, 0
        input_noise = self._input_noise(X_train)
        # Drawn only when used, so that the other seeds stay those of a noiseless fit (and
        # of a regression).
        noise = np.random.RandomState(draw_seed(rng)) if input_noise > 0 else None
        chunks = np.random.RandomState(draw_seed(rng)) if targets is not None else None
        epoch = 0
        with limited_threads(self.threads, "blas"):
            for epoch in range(1, self.max_epochs + 1):
                if epoch > 1:  # the first epoch creates the optimizer at learning_rate
                    _set_step(mlp, self.learning_rate * step_factor(epoch, self.max_epochs))
                X_epoch = X_train
                if noise is not None:
                    X_epoch = X_train + noise.normal(0.0, input_noise, X_train.shape).astype(
                        X_train.dtype
                    )
                if targets is None:
                    _partial_fit(mlp, X_epoch, Y_train)
                else:
                    assert classes is not None and chunks is not None
                    _soft_epoch(mlp, X_epoch, targets, classes, chunks)
                loss = np.nan
                if X_val is not None:
                    residual = _output(mlp, atoms, X_val, ATOM_TEMPERATURE) - Y_val
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
        if atoms is not None:
            sharpen(mlp, ATOM_TEMPERATURE)
        return mlp, epoch, input_noise

    def _input_noise(self, X_train) -> float:
        """The noise's standard deviation for these MLP input rows (none for sparse rows)."""
        if sp.issparse(X_train):
            return 0.0
        if self.input_noise != "auto":
            return float(self.input_noise)
        with limited_threads(self.threads):  # the neighbour search's too
            return auto_input_noise(X_train)


@dataclass(frozen=True)
class AtomTargets:
    """The atom head's soft targets of n training rows (``ATOM_TARGETS``).

    Attributes
    ----------
    atoms : ndarray of shape (n, k), int64
        Each row's k nearest atoms, nearest first.
    weights : ndarray of shape (n, k), float64
        Their weights: a Gaussian of the distance, each row's summing to k (so that a row
        weighs as much as k rows of hard labels would, the L2 penalty's balance unchanged).
    """

    atoms: np.ndarray
    weights: np.ndarray


def atom_targets(Y: np.ndarray, atoms: np.ndarray) -> AtomTargets:
    """Soft targets of rows ``Y`` (scaled embedding) over ``atoms`` (``ATOM_TARGETS``)."""
    k = min(ATOM_TARGETS, len(atoms))
    distances, nearest = NearestNeighbors(n_neighbors=k).fit(atoms).kneighbors(Y)
    squared = distances.astype(np.float64) ** 2
    bandwidth = float(np.median(squared[:, 0]))
    if bandwidth > 0:
        weights = np.exp(-(squared - squared[:, :1]) / (2 * bandwidth))
    else:  # most rows on an atom: each is taught its own
        weights = (np.arange(k) == 0).astype(np.float64)[None, :].repeat(len(Y), axis=0)
    weights *= k / weights.sum(axis=1, keepdims=True)
    return AtomTargets(atoms=nearest.astype(np.int64), weights=weights)


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


def scaled_output(mlp: Network, atoms: np.ndarray | None, X) -> np.ndarray:
    """The student's scaled embedding of mapped rows ``X``, float32: the regressor's output,
    or the atoms weighted by the classifier's probabilities (its temperature folded in)."""
    return _output(mlp, atoms, X, 1.0)


def _output(mlp: Network, atoms: np.ndarray | None, X, temperature: float) -> np.ndarray:
    if atoms is None:
        assert isinstance(mlp, MLPRegressor)
        return predict(mlp, X, mlp.n_outputs_)
    assert isinstance(mlp, MLPClassifier)
    probabilities = np.asarray(mlp.predict_proba(X), dtype=np.float64)
    if temperature != 1.0:
        probabilities = probabilities ** (1.0 / temperature)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
    return (probabilities @ atoms).astype(np.float32)


def sharpen(classifier: MLPClassifier, temperature: float) -> None:
    """Fold the temperature into the classifier's last layer: softmax(z / T) is p^(1/T)
    renormalised."""
    for layers in (classifier.coefs_, classifier.intercepts_):
        layers[-1] = (layers[-1] / temperature).astype(layers[-1].dtype)


def _soft_epoch(mlp: MLPClassifier, X, targets: AtomTargets, classes: np.ndarray, order) -> None:
    """One epoch of the atom classifier on rows ``X``: each row once per target atom, with
    its weight; in chunks of at most ``ATOM_CHUNK_ROWS`` repeated rows, of equal size (none
    smaller than a minibatch), the rows in an order drawn from ``order`` when there is more
    than one chunk."""
    k = targets.atoms.shape[1]
    n_chunks = math.ceil(X.shape[0] * k / ATOM_CHUNK_ROWS)
    rows = np.arange(X.shape[0]) if n_chunks == 1 else order.permutation(X.shape[0])
    for chunk in np.array_split(rows, n_chunks):
        _partial_fit(
            mlp,
            X[np.repeat(chunk, k)],  # sparse rows too
            targets.atoms[chunk].reshape(-1),
            classes,
            targets.weights[chunk].reshape(-1),
        )


def _partial_fit(mlp: Network, X, Y, classes: np.ndarray | None = None, sample_weight=None) -> None:
    """One epoch of Adam; a Ctrl-C inside it is raised, not swallowed as sklearn does."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if classes is not None:  # the classifier: every atom a class from the first epoch
            mlp.partial_fit(X, Y, classes=classes, sample_weight=sample_weight)
        else:
            # A single output goes in 1-D: sklearn warns about a column vector otherwise.
            mlp.partial_fit(X, Y.ravel() if Y.shape[1] == 1 else Y)
    for warning in caught:
        if str(warning.message) == _MLP_INTERRUPTED:
            raise KeyboardInterrupt
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)


def _set_step(mlp: Network, step: float) -> None:
    # MLPRegressor has no schedule for Adam; its optimizer reads learning_rate_init at each
    # update (tests/mbn_core/test_compress.py checks that the step really changes).
    mlp._optimizer.learning_rate_init = step
