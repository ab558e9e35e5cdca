"""Compressive MBN: distil an MBN (or any embedding) into a small MLP that embeds thousands of
times faster.

Appendix D of Zhang's "Multilayer bootstrap networks": train MBN, then train a neural
network from the raw input to MBN's embedding and predict with the network. Nothing here
depends on the teacher being an MBN: any fitted scikit-learn transformer can be distilled the
same way (``mbn_core.methods`` registers which ones the pipeline offers).

A service only ever embeds new data, so the fidelity report is measured on rows kept out of
the teacher's fit and of the network's training: new data to both, as a user's data will be.
On small data a held-out tenth is too few rows for k-means to compare the two embeddings
(NMI on 120 rows moves by about 0.02 with one point), so there the report is cross-fitted:
teacher and network are fitted again on K - 1 of K folds and measured on the fold left out,
every row once (``report_folds``); the model itself is fitted on every row.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.linalg import orthogonal_procrustes
from sklearn.base import BaseEstimator, TransformerMixin, clone
from sklearn.cluster import KMeans
from sklearn.metrics import normalized_mutual_info_score, r2_score
from sklearn.model_selection import KFold
from sklearn.neighbors import NearestNeighbors
from sklearn.neural_network import MLPRegressor
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, column_or_1d, validate_data
from threadpoolctl import threadpool_limits

from mbn_core.distill.input_map import InputMap
from mbn_core.distill.input_noise import auto_input_noise
from mbn_core.exceptions import TrainingStopped
from mbn_core.mbn.network import MBN
from mbn_core.params import CheckedParams, check_int_items
from mbn_core.pipeline.quality import quality_report

log = logging.getLogger(__name__)

EpochCallback = Callable[[int, int, float], object]
MODES = ("fast", "exact")
# What the MLP learns for a training row: the teacher's in-sample embedding. (Leave-self-out
# targets were measured and removed: bundles trained with them are refused on load.)
TARGETS = ("in-sample",)

# k-means restarts when fitting the clustering head ...
_KMEANS_INIT = 10
# ... and in the fidelity report, whose NMI gap between fast and exact should not be k-means
# noise: the lowest inertia of this many.
_REPORT_KMEANS_INIT = 20
# report_folds="auto" cross-fits with this many folds when a single holdout would have fewer
# than CROSS_FIT_BELOW rows (MNIST-5k's 500 held-out rows gave a gap within 0.003 of a
# 10,000-row test set; digits' 120 rows were 0.02 off).
AUTO_FOLDS = 5
CROSS_FIT_BELOW = 500
# Neighbours compared by the fidelity report's k-NN overlap.
_KNN = 10
# The MLP's last epoch steps at this share of learning_rate (see step_factor).
FINAL_STEP = 0.02
# sklearn's MLP swallows Ctrl-C inside an epoch and warns with this message instead.
_MLP_INTERRUPTED = "Training interrupted by user."


class CompressiveMBN(CheckedParams, TransformerMixin, BaseEstimator):
    """MBN distilled into an MLP regressor: a fast embedding plus an optional cluster head.

    ``fit`` keeps a random ``holdout_fraction`` of the rows aside, trains the teacher (an
    MBN unless told otherwise, or uses a fitted one) on the others, then a scikit-learn
    ``MLPRegressor`` from the input (standardised, or projected when it is wide: see
    ``input_components``) to the teacher's embedding of them (centred
    and scaled by its overall spread, so the loss is the squared error in embedding space,
    the geometry k-means sees). The rows kept aside were
    seen by neither: on them the fast path is compared with the exact teacher
    (``fidelity_``), as on a user's new data.

    Parameters
    ----------
    teacher : transformer, default=None
        The embedding to distil: an ``MBN`` or any scikit-learn transformer. None means
        ``MBN(random_state=...)`` seeded from ``random_state``. Unless ``prefit`` is True it
        is cloned and fitted.
    prefit : bool, default=False
        Use ``teacher`` as already fitted (its embedding of X is recomputed with
        ``transform``).
    hidden_layer_sizes : sequence of int, default=(256, 256)
        Hidden ReLU layers of the MLP. The paper used (2048, 2048). Prediction costs one
        multiply-add per weight, so the speed-up over exact MBN is about the ratio of MBN's
        bottom-layer work (V * k1 * a*d per point) to the weights: (256, 256) on MNIST's 784
        inputs projected onto 32 (``input_components``) has 101,000 weights, 25,000 of them
        the projection, against MBN's 630 million (k1=4000, V=400); without the projection
        it has 269,000, and (512, 512) would have 670,000. Measured before the projection
        on MNIST with small MBNs: trained on 20,000 images (k1=1000, V=100), R^2 0.91 and
        NMI 0.788 fast vs 0.782 exact, where (512, 512) gave 0.92 and 0.787.
    max_epochs : int, default=40
        Passes over the training points; early stopping (``n_iter_no_change``) may end
        sooner. The step size decays over them (``learning_rate``).
        An epoch of 48,600 MNIST images takes about 0.6 s projected, 1.3 s without (one
        BLAS thread).
    batch_size : int, default=256
        Minibatch size of Adam.
    learning_rate : float, default=1e-2
        Adam's first step size. It decays along a half cosine to ``FINAL_STEP`` (2%) of this
        by the last of ``max_epochs``: large steps early, small ones to settle. The MLP was
        short of steps, not of data or width: at a constant 1e-3 it was still learning when
        the epochs ran out. On rows new to the MBN (benchmarks/RESULTS.md, issue 12, fifth
        pass; 5 MLP seeds, with ``input_noise`` 0.3), R^2 at a constant 1e-3 / constant 3e-3
        / this schedule from 1e-2: MNIST-5k 0.904 / 0.924 / 0.931, digits 0.937 / 0.961 /
        0.965, breast_cancer 0.756 / 0.791 / 0.791, wine 0.745 / 0.796 / 0.821, at the same
        cost.
    alpha : float, default=1e-5
        L2 penalty of the MLP weights.
    n_iter_no_change : int or None, default=None
        Early stopping: stop after this many epochs without the validation loss improving by
        ``tol``. None trains all ``max_epochs``, the length the step-size schedule is made
        for (on 12 to 38 validation rows, breast_cancer and wine, stopping after 5 stale
        epochs cost 0.01 of R^2). Either way the weights of the epoch with the lowest
        validation loss are kept.
    input_noise : float >= 0 or "auto", default="auto"
        Standard deviation of Gaussian noise added to the MLP's input rows in each epoch (in
        the units the MLP sees: standardised or projected input; a fresh draw per epoch; the
        targets are unchanged; not for standardised sparse input, which stays sparse). 0
        trains on the rows as they are. "auto" is 0.3, capped so that the noise's length
        stays within 0.6 of the median distance from a training row to its 10th nearest
        (``mbn_core.distill.input_noise``): 0.3 on wide data, less on thin manifolds, where 0.3
        carried rows across the gaps between clusters (two moons' fast path 0.957 -> 0.995,
        benchmarks/RESULTS.md, issue 17); ``input_noise_`` says what was used. The exact
        embedding hardly moves under small input noise (R^2 0.9997 at 1% of the data's
        spread), so the noise asks the MLP for the same local invariance and keeps it from
        fitting its few training rows too closely. With a step size of 3e-3 it is neutral
        on narrow standardised input (breast_cancer R^2 0.792 without, 0.791 with; wine
        0.787, 0.796) and helps projected input (MNIST-5k 0.909 -> 0.924, digits 0.952 ->
        0.961). At 1e-3 it cost breast_cancer 0.06 of R^2 at 0.6 (benchmarks/RESULTS.md,
        issue 12).
    input_components : int or None, default=32
        Input with more features than this, dense or sparse, is projected onto this many
        principal directions of the training rows (PCA of the unscaled input, one scale for
        all of them; sparse rows are never made dense) before the MLP; narrower input, or
        None, is standardised feature by feature. The projection keeps the Euclidean
        geometry the teacher measures and gives the MLP far fewer first-layer weights to
        learn from few rows: on rows new to the MBN, (256, 256) hidden units, 5 MLP seeds,
        R^2 on MNIST-5k 0.846 -> 0.904 (16: 0.903, 24: 0.906, 48: 0.899) and on digits
        0.925 -> 0.937; on 2,000 x 30,000 sparse bag-of-words rows 0.34 -> 0.75
        (benchmarks/RESULTS.md, issue 12).
    tol : float, default=1e-4
        Smallest improvement of the validation loss (mean squared error on scaled targets)
        that counts.
    validation_fraction : float in [0, 0.5), default=0.1
        Fraction of the non-held-out points on which the best epoch is chosen (and early
        stopping decided). 0 keeps the last epoch's weights.
    holdout_fraction : float in (0, 0.5], default=0.1
        Fraction of the points kept out of the teacher's fit and of the MLP's training, on
        which ``fidelity_`` is measured. With ``prefit`` the teacher's own training rows are
        unknown: pass rows it never saw for an honest report. Not used when the report is
        cross-fitted (``report_folds``).
    report_folds : int >= 2, "auto" or None, default="auto"
        Rows new to the fit for the fidelity report: K-fold cross-fitting, "auto" (5 folds
        below 500 held-out rows) or none (``holdout_fraction``). None: one held-out set
        (``holdout_fraction``), kept out of the model too. K: cross-fitting; teacher and MLP
        are fitted K more times, each on all rows but one of K folds, and measured on that
        fold, so every row is new to the fit that measures it; the model itself is fitted
        on every row. The fold fits report no progress and cost about K * ((K - 1) / K)^2
        times the teacher's fit for an MBN (k1 grows with the rows). "auto": K = 5 when the
        held-out set would have fewer than 500 rows (``CROSS_FIT_BELOW``), else None. A
        prefit teacher always uses the held-out set.
    targets : {"in-sample"}, default="in-sample"
        What the MLP learns for a training row: the teacher's in-sample embedding
        (``fit_transform``; ``transform`` for a prefit teacher). The only choice left.
    n_clusters : int, default=None
        If set, k-means with this many clusters on the exact embedding of the training set; the
        model then answers a cluster id for any input (``predict_clusters``): the nearest
        k-means centroid of the embedding.
    random_state : int, RandomState instance or None, default=None
        Seeds the held-out split, the MLP, k-means and (when ``teacher`` is None) the MBN.
    n_jobs : int, default=None
        Threads to train with. For the MLP (BLAS threads) None means one: its matrix
        products are small (minibatch x hidden units), and on a busy machine extra BLAS
        threads spin instead of working (an epoch of 48,600 MNIST images: 2.0 s on one
        thread, 4.5 to 15 s on two of two shared cores).
    callback : callable, default=None
        Called as ``callback(epoch, max_epochs, validation_loss)`` after each MLP epoch
        (1-based; the loss is NaN without a validation split). Returning True stops
        training: ``fit`` raises ``TrainingStopped``. A callback with a
        ``fold_done(done, total)`` method is told each fold of a cross-fitted report, and
        can stop there the same way. The teacher reports through its own ``callback``.

    Attributes
    ----------
    teacher_ : transformer
        The fitted exact embedding (the MBN).
    input_map_ : InputMap
        From an input row to the MLP's input: standardised, or projected (``input_components``).
    mlp_ : MLPRegressor
        The network from the mapped input to the scaled embedding, float32.
    target_mean_, target_scale_ : ndarray of shape (n_components_,), float32
        Embedding = MLP output * target_scale_ + target_mean_.
    cluster_centers_ : ndarray of shape (n_clusters, n_components_), float32, or None
        k-means centroids of the clustering head.
    embedding_ : ndarray of shape (n_samples_ - len(holdout_), n_components_), float32
        The teacher's embedding of the rows it was fitted on (all but ``holdout_``, in row
        order); kept for the bundle's 2-D map, which would otherwise cost another transform.
    fidelity_ : dict
        Agreement between fast and exact embeddings on the held-out rows (new to the teacher
        and the MLP): see ``measure_fidelity``; plus ``holdout``, "outside the teacher's
        fit" (or "prefit teacher": new to the MLP only, or "cross-fitted": every row, each
        embedded by the fit that left its fold out, then ``folds`` is K).
    holdout_ : ndarray of int
        Rows of X kept out of the model (empty when the report is cross-fitted).
    quality_ : dict
        Label-free quality on (a sample of) the held-out points (the first fold when
        cross-fitted, by the fit that left it out): trustworthiness and
        continuity (k = 10) of the exact and fast embeddings against the input, and of PCA
        with as many components fitted on the training points. See
        ``mbn_core.pipeline.quality.quality_report``.
    n_epochs_ : int
        MLP epochs run.
    input_noise_ : float
        Standard deviation of the noise added to the MLP's input rows (0 for standardised
        sparse input).
    n_samples_ : int
        Training points (held-out ones included).
    input_sparse_ : bool
        Whether the training input was sparse (then narrow input is scaled, not centred).
    timings_ : dict
        Seconds spent in ``teacher``, ``compressor`` and ``evaluation``.
    n_features_in_ : int
    n_components_ : int

    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from mbn_core import MBN, CompressiveMBN
    >>> X, y = load_digits(return_X_y=True)
    >>> model = CompressiveMBN(MBN(n_clusterings=20, random_state=0), max_epochs=5,
    ...                        random_state=0).fit(X, y)
    >>> model.transform(X[:3]).shape
    (3, 10)
    >>> sorted(model.fidelity_)[:3]
    ['cluster_agreement', 'cosine', 'n_eval_clusters']
    """

    _parameter_constraints: dict[str, list] = {
        "teacher": [HasMethods(["fit", "transform"]), None],
        "prefit": ["boolean"],
        "hidden_layer_sizes": ["array-like"],
        "max_epochs": [Interval(Integral, 1, None, closed="left")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "learning_rate": [Interval(Real, 0, 1, closed="right")],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "n_iter_no_change": [Interval(Integral, 1, None, closed="left"), None],
        "input_noise": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
        "input_components": [Interval(Integral, 1, None, closed="left"), None],
        "tol": [Interval(Real, 0, None, closed="left")],
        "validation_fraction": [Interval(Real, 0, 0.5, closed="left")],
        "holdout_fraction": [Interval(Real, 0, 0.5, closed="right")],
        "report_folds": [Interval(Integral, 2, None, closed="left"), StrOptions({"auto"}), None],
        "targets": [StrOptions(set(TARGETS))],
        "n_clusters": [Interval(Integral, 1, None, closed="left"), None],
        "random_state": ["random_state"],
        "n_jobs": [Interval(Integral, 1, None, closed="left"), None],
        "callback": [callable, None],
    }

    def __init__(
        self,
        teacher: Any = None,
        *,
        prefit: bool = False,
        hidden_layer_sizes: Sequence[int] = (256, 256),
        max_epochs: int = 40,
        batch_size: int = 256,
        learning_rate: float = 1e-2,
        alpha: float = 1e-5,
        n_iter_no_change: int | None = None,
        input_noise: float | str = "auto",
        input_components: int | None = 32,
        tol: float = 1e-4,
        validation_fraction: float = 0.1,
        holdout_fraction: float = 0.1,
        report_folds: int | str | None = "auto",
        targets: str = "in-sample",
        n_clusters: int | None = None,
        random_state: int | np.random.RandomState | None = None,
        n_jobs: int | None = None,
        callback: EpochCallback | None = None,
    ) -> None:
        self.teacher = teacher
        self.prefit = prefit
        self.hidden_layer_sizes = hidden_layer_sizes
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.alpha = alpha
        self.n_iter_no_change = n_iter_no_change
        self.input_noise = input_noise
        self.input_components = input_components
        self.tol = tol
        self.validation_fraction = validation_fraction
        self.holdout_fraction = holdout_fraction
        self.report_folds = report_folds
        self.targets = targets
        self.n_clusters = n_clusters
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.callback = callback

    # ------------------------------------------------------------------ fitting

    def fit(self, X, y=None):
        """Fit the teacher (unless prefit), the MLP and the optional cluster head.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,), default=None
            Class labels, used only to report NMI against them in ``fidelity_``.

        Returns
        -------
        self : CompressiveMBN
        """
        # A stopped or failed fit leaves the estimator exactly as it was (as MBN does).
        previous_state = dict(self.__dict__)
        try:
            return self._fit(X, y)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(previous_state)
            raise

    def _fit(self, X, y) -> CompressiveMBN:
        self._validate_params()
        X = validate_data(
            self, X, accept_sparse="csr", dtype=np.float32, ensure_min_samples=4, reset=True
        )
        n_samples = X.shape[0]
        labels = None if y is None else column_or_1d(y, warn=True)
        if labels is not None and len(labels) != n_samples:
            raise ValueError(f"y has {len(labels)} labels but X has {n_samples} rows")
        rng = check_random_state(self.random_state)
        # A cross-fitted report (n_folds) holds no rows out of the model's own fit.
        n_folds = self._n_folds(n_samples)
        holdout_fraction = self.holdout_fraction if n_folds is None else None
        holdout, validation, train = _split(
            n_samples, holdout_fraction, self.validation_fraction, rng
        )
        # The teacher is fitted on the rows outside the holdout; its embedding of them comes
        # in the order of ``fitted``, which train and validation are turned into positions of.
        fitted = np.sort(np.concatenate([validation, train]))
        train = np.searchsorted(fitted, train)
        validation = np.searchsorted(fitted, validation)
        X_fitted = X[fitted]
        parts = self._fit_parts(X_fitted, validation, train, rng, self.callback)

        self.teacher_ = parts.teacher
        self.input_map_ = parts.input_map
        self.mlp_ = parts.mlp
        self.target_mean_ = parts.target_mean
        self.target_scale_ = parts.target_scale
        self.n_components_ = int(parts.embedding.shape[1])
        self.n_samples_ = n_samples
        self.input_sparse_ = parts.sparse
        self.n_epochs_ = parts.n_epochs
        self.input_noise_ = parts.input_noise
        self.holdout_ = holdout
        self.embedding_ = np.asarray(parts.embedding, dtype=np.float32)

        started = time.perf_counter()
        exact = _as_embedding(parts.teacher.transform(X[holdout])) if len(holdout) else None
        self.cluster_centers_ = None
        if self.n_clusters is not None:
            # Clusters of the embedding of the training rows and of the held-out rows.
            head = parts.embedding if exact is None else np.concatenate([parts.embedding, exact])
            centers = _kmeans(head, self.n_clusters, _seed(rng)).cluster_centers_
            self.cluster_centers_ = centers.astype(np.float32)
        if n_folds is None:
            assert exact is not None
            fast = self.transform(X[holdout])
            holdout_labels = None if labels is None else labels[holdout]
            self.fidelity_ = measure_fidelity(
                exact,
                fast,
                holdout_labels,
                n_clusters=_report_clusters(self.n_clusters, holdout_labels, parts.teacher),
                centers=self.cluster_centers_,
                seed=_seed(rng),
            )
            self.fidelity_["holdout"] = (
                "prefit teacher" if self.prefit else "outside the teacher's fit"
            )
            self.quality_ = quality_report(
                X_fitted[train],
                X[holdout],
                {"exact": exact, "fast": fast},
                n_components=self.n_components_,
                metric=getattr(parts.teacher, "metric", "euclidean"),
                random_state=rng,
            )
        else:
            self.fidelity_, self.quality_ = self._cross_fitted_report(X, labels, n_folds, rng)
        self.timings_ = {
            "teacher": parts.teacher_seconds,
            "compressor": parts.compressor_seconds,
            "evaluation": time.perf_counter() - started,
        }
        log.info("compressive MBN fitted: %s", fidelity_report(self.fidelity_))
        return self

    def _n_folds(self, n_samples: int) -> int | None:
        """Folds of the cross-fitted report, or None for a single held-out set."""
        if self.prefit or self.report_folds is None:
            return None
        if self.report_folds == "auto":
            small = _n_holdout(n_samples, self.holdout_fraction) < CROSS_FIT_BELOW
            return AUTO_FOLDS if small else None
        return int(self.report_folds)

    def _fit_parts(self, X_fitted, validation, train, rng, callback, model_teacher=None) -> _Parts:
        """Teacher on ``X_fitted``, then the MLP on its ``train`` rows (early stopping on
        ``validation``): everything a fit makes, for the model or for one fold of the
        report (``callback`` None: no progress reported; ``model_teacher``: the model's,
        given for a fold)."""
        started = time.perf_counter()
        teacher, embedding = self._fit_teacher(
            X_fitted, rng, quiet=callback is None, model_teacher=model_teacher
        )
        teacher_seconds = time.perf_counter() - started

        started = time.perf_counter()
        sparse = sp.issparse(X_fitted)
        with threadpool_limits(limits=self._blas_threads(), user_api="blas"):
            input_map = InputMap.fit(X_fitted[train], self.input_components)
        target_mean, target_scale = target_scaling(embedding[train])
        mlp, n_epochs, input_noise = self._fit_mlp(
            input_map.transform(X_fitted[train]),
            ((embedding[train] - target_mean) / target_scale).astype(np.float32),
            input_map.transform(X_fitted[validation]) if len(validation) else None,
            ((embedding[validation] - target_mean) / target_scale).astype(np.float32),
            rng,
            callback,
        )
        return _Parts(
            teacher=teacher,
            embedding=embedding,
            input_map=input_map,
            mlp=mlp,
            target_mean=target_mean.astype(np.float32),
            target_scale=target_scale.astype(np.float32),
            sparse=sparse,
            n_epochs=n_epochs,
            input_noise=input_noise,
            teacher_seconds=teacher_seconds,
            compressor_seconds=time.perf_counter() - started,
        )

    def _cross_fitted_report(
        self, X, labels, n_folds: int, rng
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``fidelity_`` and ``quality_`` by K-fold cross-fitting (see ``report_folds``).

        Each fold's rows are embedded, exactly and fast, by a teacher and an MLP fitted
        without them, with the output the model's teacher chose. Each fit has its own
        coordinates (its own PCA or layout, signs and order), so both embeddings of a fold
        are carried into the model's by the rotation and shift that best map the fold fit's
        embedding of its training rows onto the model's embedding of the same rows
        (orthogonal Procrustes; distances within the fold are unchanged). All rows are then
        measured together, as one test set of that size: k-means, neighbours and the
        clustering head over every row, not over small folds.
        """
        if X.shape[0] < n_folds:
            raise ValueError(f"report_folds={n_folds} is more than the {X.shape[0]} rows")
        reference = np.asarray(self.embedding_, dtype=np.float64)  # row i is X's row i
        exact_all = np.empty_like(reference)
        fast_all = np.empty_like(reference)
        splitter = KFold(n_splits=n_folds, shuffle=True, random_state=_seed(rng))
        quality: dict[str, Any] = {}
        for number, (rest, fold) in enumerate(splitter.split(X)):
            _, validation, train = _split(len(rest), None, self.validation_fraction, rng)
            parts = self._fit_parts(X[rest], validation, train, rng, None, self.teacher_)
            exact = _as_embedding(parts.teacher.transform(X[fold]))
            fast = parts.fast(X[fold]).astype(np.float64)
            if number == 0:
                quality = quality_report(
                    X[rest][train],
                    X[fold],
                    {"exact": exact, "fast": fast},
                    n_components=int(exact.shape[1]),
                    metric=getattr(parts.teacher, "metric", "euclidean"),
                    random_state=rng,
                )
            source_mean = parts.embedding.mean(axis=0)
            target_mean = reference[rest].mean(axis=0)
            rotation, _ = orthogonal_procrustes(
                parts.embedding - source_mean, reference[rest] - target_mean
            )
            exact_all[fold] = (exact - source_mean) @ rotation + target_mean
            fast_all[fold] = (fast - source_mean) @ rotation + target_mean
            # A fold refits teacher and MLP, so the report costs several fits: say so.
            fold_done = getattr(self.callback, "fold_done", None)
            if fold_done is not None and fold_done(number + 1, n_folds):
                raise TrainingStopped(
                    f"training stopped by the callback after fold {number + 1} of {n_folds} "
                    "of the fidelity report"
                )
        fidelity = measure_fidelity(
            exact_all,
            fast_all,
            labels,
            n_clusters=_report_clusters(self.n_clusters, labels, self.teacher_),
            centers=self.cluster_centers_,
            seed=_seed(rng),
        )
        fidelity.update(holdout="cross-fitted", folds=n_folds)
        return fidelity, quality

    def _fit_teacher(
        self, X, rng, quiet: bool = False, model_teacher=None
    ) -> tuple[Any, np.ndarray]:
        """The fitted teacher and its targets for X: ``fit_transform``; ``transform`` when
        prefit.
        ``quiet``: without the teacher's progress callback (a fold of the report).
        ``model_teacher``: a fold's teacher takes the output this fitted teacher chose."""
        if self.prefit:
            check_is_fitted(self.teacher)
            assert self.teacher is not None
            expected = getattr(self.teacher, "n_features_in_", X.shape[1])
            if expected != X.shape[1]:
                raise ValueError(
                    f"X has {X.shape[1]} features but the prefit teacher expects {expected}"
                )
            return self.teacher, _as_embedding(self.teacher.transform(X))
        if self.teacher is None:
            teacher = MBN(random_state=_seed(rng))
        else:
            teacher = _fresh_copy(self.teacher)
        if quiet and "callback" in teacher.get_params(deep=False):
            teacher.set_params(callback=None)
        if model_teacher is not None and teacher.get_params(deep=False).get("output") == "auto":
            # On its fewer rows a fold could choose the other output, whose coordinates no
            # rotation maps onto the model's.
            teacher.set_params(output=model_teacher.output_)
        return teacher, _as_embedding(teacher.fit_transform(X))

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
            random_state=_seed(rng),
        )
        best_loss, best_weights, stale = np.inf, None, 0
        input_noise = self._input_noise(X_train)
        # Drawn only when used, so that the other seeds stay those of a noiseless fit.
        noise = np.random.RandomState(_seed(rng)) if input_noise > 0 else None
        epoch = 0
        with threadpool_limits(limits=self._blas_threads(), user_api="blas"):
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
                    residual = _predict(mlp, X_val, Y_val.shape[1]) - Y_val
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
        with threadpool_limits(limits=self._blas_threads()):  # the neighbour search's too
            return auto_input_noise(X_train)

    # ------------------------------------------------------------------ inference

    def transform(self, X):
        """Fast embedding of X by the MLP.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)

        Returns
        -------
        embedding : ndarray of shape (n_samples, n_components_), float32
        """
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float32, reset=False)
        scaled = _predict(self.mlp_, self.input_map_.transform(X), self.n_components_)
        return scaled * self.target_scale_ + self.target_mean_

    def exact_transform(self, X) -> np.ndarray:
        """Embedding of X by the exact teacher (slow), float64."""
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float32, reset=False)
        return _as_embedding(self.teacher_.transform(X))

    def predict_clusters(self, X, mode: str = "fast") -> np.ndarray:
        """Cluster id of each row: the nearest k-means centroid of its embedding.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
        mode : {"fast", "exact"}, default="fast"
            Embed with the MLP or with the exact teacher.

        Returns
        -------
        clusters : ndarray of shape (n_samples,), int64
        """
        check_is_fitted(self)
        if self.cluster_centers_ is None:
            raise ValueError("this model has no clustering head (fit it with n_clusters set)")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        embedding = self.transform(X) if mode == "fast" else self.exact_transform(X)
        return _nearest(np.asarray(embedding, dtype=np.float32), self.cluster_centers_)

    # ------------------------------------------------------------------ helpers

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        # The fast path computes in float32 whatever the input (as its ONNX export does).
        tags.transformer_tags.preserves_dtype = ["float32"]
        return tags

    def _blas_threads(self) -> int:
        return 1 if self.n_jobs is None else int(self.n_jobs)

    def _check_params(self) -> None:
        check_int_items(type(self).__name__, "hidden_layer_sizes", self.hidden_layer_sizes, 1)
        if self.prefit and self.teacher is None:
            raise ValueError("prefit=True needs a fitted teacher")


def measure_fidelity(
    exact,
    fast,
    labels=None,
    *,
    n_clusters: int,
    centers: np.ndarray | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """How faithfully a fast embedding reproduces the exact one on the same (held-out) rows.

    Parameters
    ----------
    exact, fast : array-like of shape (n_rows, n_components)
    labels : array-like of shape (n_rows,), default=None
        True classes, for NMI of k-means on each embedding against them.
    n_clusters : int
        Clusters of the k-means runs compared.
    centers : ndarray of shape (n_clusters, n_components), default=None
        The clustering head's centroids: ``cluster_agreement`` is the share of rows whose
        nearest centroid is the same in both embeddings.
    seed : int, default=0
        Seed of k-means.

    Returns
    -------
    dict
        ``n_holdout``, ``n_eval_clusters``, ``r2`` (variance weighted), ``cosine`` (mean
        row cosine), ``cosine_median``, ``knn_overlap`` (``knn_overlap`` with k = 10),
        ``nmi_fast_exact`` (between the k-means clusterings of both, lowest inertia of 20
        runs), ``nmi_labels_exact``, ``nmi_labels_fast``, ``cluster_agreement`` (None when
        not measured). See ``fidelity_report``.
    """
    exact = np.asarray(exact, dtype=np.float64)
    fast = np.asarray(fast, dtype=np.float64)
    n_clusters = max(1, min(n_clusters, len(exact)))
    exact_clusters = _kmeans(exact, n_clusters, seed, _REPORT_KMEANS_INIT).labels_
    fast_clusters = _kmeans(fast, n_clusters, seed, _REPORT_KMEANS_INIT).labels_
    norms = np.linalg.norm(exact, axis=1) * np.linalg.norm(fast, axis=1)
    cosine = np.sum(exact * fast, axis=1) / np.maximum(norms, np.finfo(np.float64).tiny)
    report: dict[str, Any] = {
        "n_holdout": len(exact),
        "n_eval_clusters": n_clusters,
        "r2": float(r2_score(exact, fast, multioutput="variance_weighted"))
        if len(exact) > 1
        else float("nan"),
        "cosine": float(np.mean(cosine)),
        "cosine_median": float(np.median(cosine)),
        "knn_overlap": knn_overlap(exact, fast, _KNN),
        "nmi_fast_exact": float(normalized_mutual_info_score(exact_clusters, fast_clusters)),
        "nmi_labels_exact": None,
        "nmi_labels_fast": None,
        "cluster_agreement": None,
    }
    if labels is not None:
        report["nmi_labels_exact"] = float(normalized_mutual_info_score(labels, exact_clusters))
        report["nmi_labels_fast"] = float(normalized_mutual_info_score(labels, fast_clusters))
    if centers is not None:
        agree = _nearest(exact.astype(np.float32), centers) == _nearest(
            fast.astype(np.float32), centers
        )
        report["cluster_agreement"] = float(np.mean(agree))
    return report


def fidelity_report(fidelity: dict[str, Any]) -> str:
    """One line summarising a ``fidelity_`` dict, for logs and the CLI."""
    parts = [f"R^2 {fidelity['r2']:.4f}", f"cosine {fidelity['cosine']:.4f}"]
    # Reports of older bundles lack the median cosine and the k-NN overlap.
    if fidelity.get("cosine_median") is not None:
        parts.append(f"median cosine {fidelity['cosine_median']:.4f}")
    if fidelity.get("knn_overlap") is not None:
        parts.append(f"{_KNN}-NN overlap {fidelity['knn_overlap']:.4f}")
    parts.append(f"NMI(fast, exact) {fidelity['nmi_fast_exact']:.4f}")
    if fidelity.get("nmi_labels_exact") is not None:
        exact, fast = fidelity["nmi_labels_exact"], fidelity["nmi_labels_fast"]
        parts.append(f"NMI vs labels exact {exact:.4f} fast {fast:.4f} (gap {fast - exact:+.4f})")
    if fidelity.get("cluster_agreement") is not None:
        parts.append(f"cluster agreement {fidelity['cluster_agreement']:.4f}")
    where = {
        "outside the teacher's fit": "held-out points new to the teacher and the MLP",
        "prefit teacher": "held-out points new to the MLP",
    }.get(fidelity.get("holdout", ""), "held-out points")
    if fidelity.get("holdout") == "cross-fitted":
        where = f"points, each new to the fit of {fidelity['folds']}-fold cross-fitting"
    return f"{', '.join(parts)} (on {fidelity['n_holdout']} {where})"


def knn_overlap(exact: np.ndarray, fast: np.ndarray, k: int = _KNN) -> float | None:
    """Mean share of each row's k nearest neighbours in ``exact`` that are also among its k
    nearest in ``fast`` (the row itself excluded); None with k or fewer rows."""
    n = len(exact)
    if n <= k:
        return None
    neighbours = []
    for embedding in (exact, fast):
        index = NearestNeighbors(n_neighbors=k + 1).fit(embedding)
        found = index.kneighbors(embedding, return_distance=False)
        # Drop the row itself (the first hit, or wherever a tie put it).
        neighbours.append([set(row[row != i][:k]) for i, row in enumerate(found)])
    shared = [len(a & b) for a, b in zip(*neighbours, strict=True)]
    return float(np.mean(shared) / k)


def teacher_fit_rows(
    n_samples: int, holdout_fraction: float, report_folds: int | str | None = None
) -> int:
    """Rows of ``n_samples`` that ``CompressiveMBN.fit`` fits its teacher on: all but the
    held-out ones, or all with a cross-fitted report (``report_folds``)."""
    if report_fold_count(n_samples, holdout_fraction, report_folds) is not None:
        return n_samples
    return n_samples - _n_holdout(n_samples, holdout_fraction)


def report_fold_count(
    n_samples: int, holdout_fraction: float, report_folds: int | str | None
) -> int | None:
    """Folds the report of a fit on ``n_samples`` rows refits, or None (one held-out set)."""
    folds = CompressiveMBN(holdout_fraction=holdout_fraction, report_folds=report_folds)
    return folds._n_folds(n_samples)


def fold_fit_rows(n_samples: int, holdout_fraction: float, report_folds: int | str | None) -> int:
    """The fewest rows a fit of the report is made on: the model's, or a fold fit's."""
    n_folds = report_fold_count(n_samples, holdout_fraction, report_folds)
    if n_folds is None:
        return teacher_fit_rows(n_samples, holdout_fraction, report_folds)
    return n_samples - -(-n_samples // n_folds)


def _n_holdout(n_samples: int, holdout_fraction: float) -> int:
    return max(1, round(holdout_fraction * n_samples))


def _split(
    n_samples: int, holdout_fraction: float | None, validation_fraction: float, rng
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random (holdout, validation, train) row indices, each sorted; no held-out rows when
    ``holdout_fraction`` is None (a cross-fitted report)."""
    order = rng.permutation(n_samples)
    n_holdout = 0 if holdout_fraction is None else _n_holdout(n_samples, holdout_fraction)
    rest = n_samples - n_holdout
    n_validation = round(validation_fraction * rest)
    if validation_fraction > 0:
        n_validation = max(1, n_validation)
    if rest - n_validation < 2:
        after = f"validation_fraction={validation_fraction}"
        if holdout_fraction is not None:
            after = f"holdout_fraction={holdout_fraction} and {after}"
        raise ValueError(f"{n_samples} samples leave fewer than 2 to train the MLP after {after}")
    holdout = np.sort(order[:n_holdout])
    validation = np.sort(order[n_holdout : n_holdout + n_validation])
    train = np.sort(order[n_holdout + n_validation :])
    return holdout, validation, train


@dataclass(frozen=True)
class _Parts:
    """What one fit of teacher and MLP makes (``CompressiveMBN._fit_parts``)."""

    teacher: Any
    embedding: np.ndarray
    input_map: InputMap
    mlp: MLPRegressor
    target_mean: np.ndarray
    target_scale: np.ndarray
    sparse: bool
    n_epochs: int
    input_noise: float
    teacher_seconds: float
    compressor_seconds: float

    def fast(self, X) -> np.ndarray:
        """The MLP's embedding of X, as ``CompressiveMBN.transform`` computes it."""
        scaled = _predict(self.mlp, self.input_map.transform(X), len(self.target_mean))
        return scaled * self.target_scale + self.target_mean


def target_scaling(targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and per-dimension scale the MLP's targets are standardised with.

    One spread for every dimension: the MLP's loss stays the squared error of the embedding
    itself, instead of inflating the PCA's weak trailing dimensions.
    """
    mean = targets.mean(axis=0)
    spread = float(np.sqrt(np.mean((targets - mean) ** 2)))
    return mean, np.full_like(mean, spread if spread > 0 else 1.0)


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


def _kmeans(
    embedding: np.ndarray, n_clusters: int, seed: int, n_init: int = _KMEANS_INIT
) -> KMeans:
    # Low-dimensional embeddings make small problems: one thread is as fast, and extra
    # OpenMP threads only spin against the other work of a busy machine.
    with threadpool_limits(limits=1):
        return KMeans(n_clusters, n_init=n_init, random_state=seed).fit(embedding)


def step_factor(epoch: int, n_epochs: int) -> float:
    """The share of ``learning_rate`` used in ``epoch`` (1-based) of ``n_epochs``: a half
    cosine from 1 in the first epoch down to ``FINAL_STEP`` in the last."""
    progress = (epoch - 1) / max(n_epochs - 1, 1)
    return FINAL_STEP + (1.0 - FINAL_STEP) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _set_step(mlp: MLPRegressor, step: float) -> None:
    # MLPRegressor has no schedule for Adam; its optimizer reads learning_rate_init at each
    # update (tests/mbn_core/test_compress.py checks that the step really changes).
    mlp._optimizer.learning_rate_init = step


def _predict(mlp: MLPRegressor, X, n_outputs: int) -> np.ndarray:
    # MLPRegressor returns a 1-D array for a single output.
    return np.asarray(mlp.predict(X), dtype=np.float32).reshape(-1, n_outputs)


def _nearest(embedding: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """Index of the nearest center of each row, computed as the ONNX graph does."""
    scores = embedding @ (-2.0 * centers.T) + np.sum(centers * centers, axis=1)
    return np.argmin(scores, axis=1).astype(np.int64)


def _fresh_copy(teacher: Any) -> Any:
    """An unfitted clone that shares the callback instead of deep-copying it.

    ``sklearn.base.clone`` deep-copies parameters; a bound-method callback (a progress bar's
    update) would be copied together with its object and report to nobody.
    """
    params = teacher.get_params(deep=False)
    if "callback" not in params:
        return clone(teacher)
    callback = params.pop("callback")
    fresh = clone(type(teacher)(**params))
    fresh.set_params(callback=callback)
    return fresh


def _as_embedding(values: Any) -> np.ndarray:
    """A teacher's output as a dense float64 matrix."""
    if sp.issparse(values):
        values = values.toarray()
    return np.asarray(values, dtype=np.float64)


def _eval_clusters(teacher: Any) -> int:
    """Clusters k-means uses to compare fast and exact when no head is asked for: the
    teacher's guessed number of classes when it has one (MBN's ``n_classes``), else 10."""
    n_classes = getattr(teacher, "n_classes", None)
    return int(n_classes) if isinstance(n_classes, Integral) else 10


def _report_clusters(n_clusters: int | None, labels, teacher: Any) -> int:
    """k of the report's k-means: the head's, else as many as the labels have classes, else
    the teacher's guess (``_eval_clusters``)."""
    if n_clusters is not None:
        return n_clusters
    if labels is not None:
        return len(np.unique(labels))
    return _eval_clusters(teacher)


def _seed(rng) -> int:
    return int(rng.randint(np.iinfo(np.int32).max))
