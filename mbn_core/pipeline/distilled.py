"""Any embedding method distilled into a small MLP that embeds thousands of times faster.

Appendix D of Zhang's "Multilayer bootstrap networks" (compressive MBN): train MBN, then train
a neural network from the raw input to MBN's embedding and predict with the network. Nothing
here depends on the teacher being an MBN: any fitted scikit-learn transformer is distilled
the same way (``mbn_core.methods`` registers which ones the pipeline offers), and the default
teacher is the registry's default method.

``DistilledEmbedding`` is the distiller as a scikit-learn estimator: its one method-specific
step fits the teacher and trains the student (``mbn_core.distill.student``); the rest of
``fit`` is the training pipeline every method shares (``mbn_core.pipeline.run``): the held-out
split or cross-fitting, the clustering head and the fidelity and quality report.
``CompressiveMBN`` is its name from the paper, kept: the same class.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, column_or_1d, validate_data

from mbn_core.bundle.trained import TrainedModel, estimator_hyperparameters
from mbn_core.distill.student import HEADS, Distiller, EpochCallback, Student, scaled_output
from mbn_core.methods import (
    DEFAULT_METHOD,
    MODES,
    NOT_OPTIONS,
    PIPELINE_PARAMS,
    get_method,
    method_of,
)
from mbn_core.params import CheckedParams, HasMethods, Interval, StrOptions, check_int_items
from mbn_core.pipeline.distillation import Distillation, fresh_copy, lays_out
from mbn_core.pipeline.fidelity import fidelity_report
from mbn_core.pipeline.head import nearest
from mbn_core.pipeline.layouts import run_layout_pipeline
from mbn_core.pipeline.report import as_embedding
from mbn_core.pipeline.run import PipelineResult, run_pipeline
from mbn_core.pipeline.split import Split, measured_fold_count, report_fold_count
from mbn_core.utils.seeds import draw_seed

log = logging.getLogger(__name__)

# Most hidden layers of the student MLP: the paper's has two, and depth beyond a few only
# adds training time.
MAX_HIDDEN_LAYERS = 16
# What the MLP learns for a training row: the teacher's in-sample embedding. (Leave-self-out
# targets were measured and removed: bundles trained with them are refused on load.)
TARGETS = ("in-sample",)
# ``student_head``: a head of ``HEADS``, or "auto": atoms for a layout method's layout
# (``Method.layout``), a regression for every other teacher.
STUDENT_HEADS = ("auto", *HEADS)


class DistilledEmbedding(CheckedParams, TransformerMixin, BaseEstimator):
    """Any embedding method distilled into an MLP: a fast embedding plus an optional cluster
    head (``CompressiveMBN`` is the same class, named after the paper).

    ``fit`` keeps a random ``holdout_fraction`` of the rows aside, trains the teacher (the
    default method, an MBN, unless told otherwise, or uses a fitted one) on the others, then a
    scikit-learn
    ``MLPRegressor`` from the input (standardised, or projected when it is wide: see
    ``input_components``) to the teacher's embedding of them (centred and scaled by its
    overall spread, so the loss is the squared error in embedding space, the geometry k-means
    sees). The rows kept aside were seen by neither: on them the fast path is compared with
    the exact teacher (``fidelity_``), as on a user's new data. On small data the report is
    cross-fitted instead (``report_folds``).

    Parameters
    ----------
    teacher : transformer, default=None
        The embedding to distil: an ``MBN`` or any scikit-learn transformer. None means the
        default method's estimator (``MBN(random_state=...)``) seeded from ``random_state``.
        Unless ``prefit`` is True it is cloned and fitted.
    prefit : bool, default=False
        Use ``teacher`` as already fitted (its embedding of X is recomputed with
        ``transform``).
    hidden_layer_sizes : sequence of int, default=(256, 256)
        Hidden ReLU layers of the MLP. The paper used (2048, 2048). Prediction costs one
        multiply-add per weight, so the speed-up over exact MBN is about the ratio of MBN's
        bottom-layer work (V * k1 * a*d per point) to the weights; wider layers track the
        teacher a little more closely at a proportional cost.
    max_epochs : int, default=40
        Passes over the training points; early stopping (``n_iter_no_change``) may end
        sooner. The step size decays over them (``learning_rate``).
    batch_size : int, default=256
        Minibatch size of Adam.
    learning_rate : float, default=1e-2
        Adam's first step size. It decays along a half cosine to ``FINAL_STEP`` (2%) of this
        by the last of ``max_epochs``: large steps early, small ones to settle. The MLP was
        short of steps, not of data or width: at a constant small step it was still learning
        when the epochs ran out.
    alpha : float, default=1e-5
        L2 penalty of the MLP weights.
    n_iter_no_change : int or None, default=None
        Early stopping: stop after this many epochs without the validation loss improving by
        ``tol``. None trains all ``max_epochs``, the length the step-size schedule is made
        for (on a few dozen validation rows, stopping early cost accuracy). Either way the
        weights of the epoch with the lowest validation loss are kept.
    input_noise : float >= 0 or "auto", default="auto"
        Standard deviation of Gaussian noise added to the MLP's input rows in each epoch (in
        the units the MLP sees: standardised or projected input; a fresh draw per epoch; the
        targets are unchanged; not for standardised sparse input, which stays sparse). 0
        trains on the rows as they are. "auto" is 0.3, capped so that the noise's length
        stays within 0.6 of the median distance from a training row to its 10th nearest
        (``mbn_core.distill.input_noise``): 0.3 on wide data, less on thin manifolds, where 0.3
        carried rows across the gaps between clusters; ``input_noise_`` says what was used.
        The exact embedding hardly moves under small input noise, so the noise asks the MLP
        for the same local invariance and keeps it from fitting its few training rows too
        closely.
    input_components : int or None, default=32
        Input with more features than this, dense or sparse, is projected onto this many
        principal directions of the training rows (PCA of the unscaled input, one scale for
        all of them; sparse rows are never made dense) before the MLP; narrower input, or
        None, is standardised feature by feature. The projection keeps the Euclidean
        geometry the teacher measures and gives the MLP far fewer first-layer weights to
        learn from few rows.
    tol : float, default=1e-4
        Smallest improvement of the validation loss (mean squared error on scaled targets)
        that counts.
    student_head : {"auto", "regression", "atoms"}, default="auto"
        The student's head: a regression of the embedding, or a classifier over atoms of it
        ("auto": atoms for a layout method, a regression for any other teacher).
        "regression": the MLP regresses the embedding (squared error). "atoms":
        k-means finds ``n_atoms`` atoms in the training rows' embedding, the MLP classifies
        each row's atoms (cross-entropy against soft targets: its 3 nearest atoms, weighted
        by their distance), and a row's embedding is the mean of the atoms
        weighted by the MLP's sharpened probabilities; a layout's tight clusters and wide
        gaps call for it, since a regressor unsure between two clusters puts a row in the
        gap between them. "auto": "atoms" for a layout method (t-SNE, UMAP, densMAP,
        PaCMAP, TriMap), "regression" for every other teacher (MBN's smooth PCA output).
    n_atoms : int >= 3, default=100
        Atoms of the "atoms" head (fewer on small data: at most one per 5 training rows;
        under 3 the student regresses).
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
        held-out set would have fewer than 500 rows (``CROSS_FIT_BELOW``), else None; of
        those 5 folds only as many are fitted and measured as make 500 rows (at least 2,
        whose spread gives the figures' standard errors): 2 folds for 1,250 to 4,994 rows.
        A prefit teacher always uses the held-out set.
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
        threads spin instead of working.
    callback : callable, default=None
        Called as ``callback(epoch, max_epochs, validation_loss)`` after each MLP epoch
        (1-based; the loss is NaN without a validation split). Returning True stops
        training: ``fit`` raises ``TrainingStopped``. A callback with a
        ``fold_done(done, total)`` method is told each fold of a cross-fitted report, and
        can stop there the same way; one with a ``teacher_fitted(embedding)`` method is
        given the model's teacher embedding of the rows it was fitted on as soon as it is
        known. The teacher reports through its own ``callback``.

    Attributes
    ----------
    teacher_ : transformer
        The fitted exact embedding (the MBN).
    input_map_ : InputMap
        From an input row to the MLP's input: standardised, or projected (``input_components``).
    mlp_ : MLPRegressor or MLPClassifier
        The network from the mapped input to the scaled embedding, float32; with the atom
        head, to the atoms' probabilities.
    atoms_ : ndarray of shape (n_atoms, n_components_), float32, or None
        The atom head's atoms in scaled units (embedding = probabilities @ atoms_ *
        target_scale_ + target_mean_); None with the regression head.
    student_head_ : str
        The head trained: "regression" or "atoms".
    target_mean_, target_scale_ : ndarray of shape (n_components_,), float32
        Embedding = MLP output * target_scale_ + target_mean_.
    cluster_centers_ : ndarray of shape (n_clusters, n_components_), float32, or None
        k-means centroids of the clustering head.
    embedding_ : ndarray of shape (n_samples_ - len(holdout_), n_components_), float32
        The teacher's embedding of the rows it was fitted on (all but ``holdout_``, in row
        order); kept for the bundle's 2-D map, which would otherwise cost another transform.
    fidelity_ : dict
        Agreement between fast and exact embeddings on the held-out rows (new to the teacher
        and the MLP): see ``mbn_core.pipeline.fidelity.measure_fidelity``; plus ``holdout``,
        "outside the teacher's fit" (or "prefit teacher": new to the MLP only, or
        "cross-fitted": the rows of the measured folds, each embedded by the fit that left
        its fold out; then ``folds`` is K, ``folds_measured`` how many were measured and
        ``standard_error`` each figure's standard error over those folds).
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
    >>> from mbn_core import MBN, DistilledEmbedding
    >>> X, y = load_digits(return_X_y=True)
    >>> model = DistilledEmbedding(MBN(n_clusterings=20, random_state=0), max_epochs=5,
    ...                            random_state=0).fit(X, y)
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
        "student_head": [StrOptions(set(STUDENT_HEADS))],
        "n_atoms": [Interval(Integral, 3, None, closed="left")],
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
        student_head: str = "auto",
        n_atoms: int = 100,
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
        self.student_head = student_head
        self.n_atoms = n_atoms
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
        self : DistilledEmbedding
        """
        # A stopped or failed fit leaves the estimator exactly as it was (as MBN does).
        previous_state = dict(self.__dict__)
        try:
            return self._fit(X, y)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(previous_state)
            raise

    def _fit(self, X, y) -> DistilledEmbedding:
        self._validate_params()
        X = validate_data(
            self, X, accept_sparse="csr", dtype=np.float32, ensure_min_samples=4, reset=True
        )
        n_samples = X.shape[0]
        labels = None if y is None else column_or_1d(y, warn=True)
        if labels is not None and len(labels) != n_samples:
            raise ValueError(f"y has {len(labels)} labels but X has {n_samples} rows")
        fold_done = getattr(self.callback, "fold_done", None)
        if lays_out(self.teacher):
            result = self._fit_layout(X, labels, fold_done)
        else:
            n_folds = self._n_folds(n_samples)
            result = run_pipeline(
                X,
                labels,
                Distillation(
                    fit_teacher=self._fit_teacher,
                    distiller=self._distiller,
                    validation_fraction=float(self.validation_fraction),
                    prefit=bool(self.prefit),
                    callback=self.callback,
                ),
                holdout_fraction=self.holdout_fraction,
                n_folds=n_folds,
                n_clusters=self.n_clusters,
                rng=check_random_state(self.random_state),
                fold_done=fold_done,
                n_measured=None
                if n_folds is None
                else measured_fold_count(n_samples, n_folds, self.report_folds),
            )
        fitted = result.fitted
        student: Student = fitted.parts
        self.teacher_ = fitted.estimator
        self.input_map_ = student.input_map
        self.mlp_ = student.mlp
        self.atoms_ = student.atoms
        self.student_head_ = student.head
        self.target_mean_ = student.target_mean
        self.target_scale_ = student.target_scale
        self.n_components_ = int(fitted.embedding.shape[1])
        self.n_samples_ = n_samples
        self.input_sparse_ = student.sparse
        self.n_epochs_ = student.n_epochs
        self.input_noise_ = student.input_noise
        self.holdout_ = result.holdout
        self.embedding_ = np.asarray(fitted.embedding, dtype=np.float32)
        self.cluster_centers_ = result.centers
        self.fidelity_ = result.fidelity
        self.quality_ = result.quality
        self.timings_ = {**fitted.seconds, "evaluation": result.evaluation_seconds}
        log.info("distilled embedding fitted: %s", fidelity_report(self.fidelity_))
        return self

    def _fit_layout(self, X, labels, fold_done) -> PipelineResult:
        """A layout method's pipeline: the teacher fitted once on every row, students
        cross-fitted against its layout (``mbn_core.pipeline.layouts``)."""
        if self.prefit:
            raise ValueError(
                f"{type(self.teacher).__name__} lays out only the rows it is fitted on, so a "
                "prefit one has no targets for these rows: give it unfitted (prefit=False)"
            )
        distiller = self._distiller()

        def fit_student(rows, layout, split: Split, rng, own: bool):
            student = distiller.distil(
                rows, layout, split.validation, split.train, rng, self.callback if own else None
            )
            return student.embed, student

        return run_layout_pipeline(
            X,
            labels,
            fresh_copy(self.teacher),
            fit_student,
            holdout_fraction=self.holdout_fraction,
            n_folds=self._n_folds(X.shape[0]),
            validation_fraction=self.validation_fraction,
            n_clusters=self.n_clusters,
            rng=check_random_state(self.random_state),
            fold_done=fold_done,
        )

    def _n_folds(self, n_samples: int) -> int | None:
        """Folds of the cross-fitted report, or None for a single held-out set."""
        if self.prefit:
            return None
        return report_fold_count(n_samples, self.holdout_fraction, self.report_folds)

    def _distiller(self) -> Distiller:
        return Distiller(
            hidden_layer_sizes=self.hidden_layer_sizes,
            max_epochs=self.max_epochs,
            batch_size=self.batch_size,
            learning_rate=self.learning_rate,
            alpha=self.alpha,
            n_iter_no_change=self.n_iter_no_change,
            input_noise=self.input_noise,
            input_components=self.input_components,
            tol=self.tol,
            threads=self._blas_threads(),
            head=self._resolved_head(),
            n_atoms=self.n_atoms,
        )

    def _resolved_head(self) -> str:
        """The head ``student_head`` asks for: "auto" resolved by the teacher."""
        if self.student_head != "auto":
            return str(self.student_head)
        return "atoms" if lays_out(self.teacher) else "regression"

    def _fit_teacher(self, X, rng, quiet: bool, model_teacher=None) -> tuple[Any, np.ndarray]:
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
            return self.teacher, as_embedding(self.teacher.transform(X))
        if self.teacher is None:
            teacher = get_method(DEFAULT_METHOD).estimator(random_state=draw_seed(rng))
        else:
            teacher = fresh_copy(self.teacher)
        if quiet and "callback" in teacher.get_params(deep=False):
            teacher.set_params(callback=None)
        if model_teacher is not None and teacher.get_params(deep=False).get("output") == "auto":
            # On its fewer rows a fold could choose the other output, whose coordinates no
            # rotation maps onto the model's.
            teacher.set_params(output=model_teacher.output_)
        return teacher, as_embedding(teacher.fit_transform(X))

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
        scaled = scaled_output(self.mlp_, self.atoms_, self.input_map_.transform(X))
        return scaled * self.target_scale_ + self.target_mean_

    def exact_transform(self, X) -> np.ndarray:
        """Embedding of X by the exact teacher (slow), float64."""
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float32, reset=False)
        return as_embedding(self.teacher_.transform(X))

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
        return nearest(np.asarray(embedding, dtype=np.float32), self.cluster_centers_)

    def as_trained_model(self) -> TrainedModel:
        """The fitted model as a bundle stores it (``save_bundle`` takes either): its teacher
        must be a registered method's estimator."""
        # Its ONNX graph: the export loads onnx and onnxruntime, which a fit does not need.
        from mbn_core.distill.onnx import to_onnx

        check_is_fitted(self)
        method = method_of(self.teacher_)
        compressor = self.get_params(deep=False)
        for key in NOT_OPTIONS:
            compressor.pop(key, None)
        pipeline = {key: compressor.pop(key) for key in PIPELINE_PARAMS}
        if isinstance(pipeline["random_state"], np.random.RandomState):
            pipeline["random_state"] = None  # a generator's state is not a hyperparameter
        facts = {
            "n_samples": int(self.n_samples_),
            "n_fit_samples": int(self.n_samples_ - len(self.holdout_)),
            "input_sparse": bool(self.input_sparse_),
            "n_epochs": int(self.n_epochs_),
            "input_noise": round(float(self.input_noise_), 6),
            "student_head": self.student_head_,
            **({} if self.atoms_ is None else {"n_atoms": len(self.atoms_)}),
            "seconds": {key: round(float(value), 3) for key, value in self.timings_.items()},
        }
        if method.facts is not None:
            facts.update(method.facts(self.teacher_))
        return TrainedModel(
            method=method,
            estimator=self.teacher_,
            fast_path=to_onnx(self),
            cluster_centers=self.cluster_centers_,
            fidelity=dict(self.fidelity_),
            quality=dict(self.quality_),
            hyperparameters={
                method.name: estimator_hyperparameters(self.teacher_),
                "compressor": compressor,
                "pipeline": pipeline,
            },
            facts=facts,
            n_features_in=int(self.n_features_in_),
            n_components=int(self.n_components_),
        )

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
        check_int_items(
            type(self).__name__,
            "hidden_layer_sizes",
            self.hidden_layer_sizes,
            1,
            MAX_HIDDEN_LAYERS,
        )
        if self.prefit and self.teacher is None:
            raise ValueError("prefit=True needs a fitted teacher")


# The paper's name for a distilled MBN, kept for the code and the documentation that use it.
CompressiveMBN = DistilledEmbedding
