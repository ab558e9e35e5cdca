"""What ``MBN.fit`` will do with a data set: its "auto" choices, settled before the network.

``settle`` is the one place the choices are made: ``MBN.fit`` calls it and goes on from its
result, and ``MBN.plan`` calls it and returns only the ``Plan``. The feature fraction is
measured on a sample of the rows; ``delta="auto"`` and ``output="auto"`` are measured on the
bottom layer's codes, so settling them fits the bottom layer (which ``fit`` then keeps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mbn_core.mbn.auto import choose_delta, choose_output, thin_manifold_is_measurable
from mbn_core.mbn.layer_draws import fit_bottom_layer
from mbn_core.mbn.network import PAPER_DELTA, Network
from mbn_core.mbn.outputs import AUTO, get_output
from mbn_core.mbn.phases import phase
from mbn_core.utils.blas import one_blas_thread

if TYPE_CHECKING:
    from mbn_core.mbn.backends.base import LayerBackend
    from mbn_core.mbn.bottom import BottomLayer


@dataclass(frozen=True)
class Plan:
    """The network ``MBN.fit`` builds for a data set, every "auto" choice settled.

    Attributes
    ----------
    n_samples, n_features : int
        The training data's shape.
    ks : tuple of int
        Centers per layer, bottom first (``ks_`` after the fit).
    delta : float or None
        The shrink factor between layers (``delta_``); None with explicit ``ks`` and for a
        network of the bottom layer alone.
    output : str
        The output (``output_``).
    n_components : int
        Dimension of the embedding (``n_components_``).
    bottom_features : int
        Input dimensions each bottom-layer clustering chooses.
    upper_feature_fraction : float
        Probability that an upper-layer clustering chooses each one-hot dimension.
    measured : tuple of str
        The choices measured on the data (of "feature_fraction", "delta", "output"); the
        others were given or are defaults.
    """

    n_samples: int
    n_features: int
    ks: tuple[int, ...]
    delta: float | None
    output: str
    n_components: int
    bottom_features: int
    upper_feature_fraction: float
    measured: tuple[str, ...]

    @property
    def feature_fraction(self) -> float:
        """The share of the input dimensions each bottom-layer clustering chooses."""
        return self.bottom_features / self.n_features

    def __str__(self) -> str:
        def how(choice: str) -> str:
            return "measured on the data" if choice in self.measured else "given or default"

        delta = "none (explicit ks or one layer)" if self.delta is None else f"{self.delta:g}"
        lines = [
            f"MBN plan for {self.n_samples} rows x {self.n_features} features",
            f"  layers:            {len(self.ks)}, centers per layer {list(self.ks)}",
            f"  delta:             {delta} ({how('delta')})",
            f"  output:            {self.output} ({how('output')})",
            f"  bottom features:   {self.bottom_features} of {self.n_features} per clustering "
            f"(fraction {self.feature_fraction:.3g}, {how('feature_fraction')})",
            f"  upper features:    fraction {self.upper_feature_fraction:g} per clustering",
            f"  embedding:         {self.n_components} dimensions",
        ]
        return "\n".join(lines)


@dataclass(frozen=True)
class Settled:
    """``settle``'s result: the plan, and the bottom layer with the training rows' codes
    when settling fitted it (or was asked to)."""

    plan: Plan
    bottom: BottomLayer | None
    bottom_codes: np.ndarray | None


def settle(
    network: Network, X, rng: np.random.RandomState, backend: LayerBackend, *, keep_bottom: bool
) -> Settled:
    """Settle ``network``'s choices for the validated training data X.

    Draws from ``rng`` in the order ``fit`` does: the feature sample (at the caller's BLAS
    threads), then the bottom layer's choices, then the delta measurement (at one). Fits the
    bottom layer on ``backend`` when a choice is measured on its codes, or when
    ``keep_bottom`` (``fit`` needs it anyway).
    """
    n_samples, n_features = X.shape
    ks = network.layer_sizes(n_samples)
    n_components = network.check_n_components(n_samples, ks)
    requested = network.requested_output()
    if requested is not None:
        requested.check_available()
    with phase("auto"):
        n_chosen = network.bottom_features(X, rng)
    delta_is_measured = (
        network.delta == "auto"
        and network.ks is None
        and not (requested is not None and requested.bottom_only)
    )
    output_is_measured = network.output == AUTO and thin_manifold_is_measurable(
        n_samples, network.n_clusterings, ks[0]
    )
    bottom = codes = None
    delta = measured_delta = None
    # One BLAS thread for the layers (``fit`` keeps it for the rest of the network).
    with one_blas_thread():
        if keep_bottom or delta_is_measured or output_is_measured:
            bottom, codes = fit_bottom_layer(network, X, ks[0], n_chosen, rng, backend)
        if delta_is_measured or output_is_measured:
            assert codes is not None
            with phase("auto"):
                measured_delta = choose_delta(
                    codes, ks[0], network.upper_feature_fraction, network.min_centers, rng
                )
    output = network.output
    if output == AUTO:
        output = "pca"
        if output_is_measured and measured_delta is not None:
            output = choose_output(measured_delta, network.upper_layers_given)
    chosen = get_output(output)
    if chosen.bottom_only:
        ks, delta_is_measured = chosen.network_sizes(ks), False
    if delta_is_measured:
        delta = measured_delta
        measured_ks = network.layer_sizes(n_samples, delta)
        # A larger delta may end on a smaller top layer: keep the one that was checked
        # against n_components when it no longer fits.
        if n_components <= min(n_samples, network.n_clusterings * measured_ks[-1]):
            ks = measured_ks
        else:
            delta = PAPER_DELTA
    if delta is None and network.ks is None and not chosen.bottom_only:
        delta = PAPER_DELTA if network.delta == "auto" else float(network.delta)
    measured = tuple(
        name
        for name, was_measured in (
            ("feature_fraction", network.feature_fraction == "auto"),
            ("delta", delta_is_measured),
            ("output", output_is_measured),
        )
        if was_measured
    )
    plan = Plan(
        n_samples=n_samples,
        n_features=n_features,
        ks=tuple(int(k) for k in ks),
        delta=delta,
        output=output,
        n_components=n_components,
        bottom_features=n_chosen,
        upper_feature_fraction=network.upper_feature_fraction,
        measured=measured,
    )
    return Settled(plan=plan, bottom=bottom, bottom_codes=codes)
