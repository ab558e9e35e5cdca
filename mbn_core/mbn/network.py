"""The network an MBN's parameters describe, before any data: the rules that size it.

``MBN.network()`` gives the ``Network`` of its current parameters. The planner
(``mbn_core.mbn.plan``), the fit, the registered method's cost and row checks
(``mbn_core.mbn.method``) and loading a saved model all read the network's shape from it, so
each rule (layer sizes, features per clustering, the embedding's dimension) is written once.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from mbn_core.mbn.auto import DELTAS, bottom_feature_count, least_bottom_features
from mbn_core.mbn.outputs import AUTO, Output, get_output

# The shrink factor of ``delta="auto"`` where no second layer is measured.
PAPER_DELTA = 0.5
# Most layers a network may have (explicit ks, or the layers delta gives): far more than a
# million rows need at delta 0.9, and each upper layer costs a pass of every clustering.
MAX_LAYERS = 256
# The upper layers' feature fraction under ``feature_fraction="auto"`` (the paper's).
PAPER_FRACTION = 0.5


@dataclass(frozen=True)
class Network:
    """The shape-deciding parameters of an ``MBN`` (see its docstring for each one).

    Built by ``MBN.network()``; the values are the parameters as given, "auto" included.
    """

    n_clusterings: int
    feature_fraction: float | str
    k1: int | float | str
    delta: float | str
    n_classes: int
    ks: Sequence[int] | None
    k_max: int | None
    output: str
    n_components: int | None
    metric: str
    shift_fraction: float

    # ------------------------------------------------------------------ layer sizes

    def layer_sizes(self, n_samples: int, delta: float | None = None) -> list[int]:
        """Centers per layer for ``n_samples`` training points (``MBN.layer_sizes``): the
        sizes the shrink factor gives, cut to the bottom layer for an output that reads it
        alone."""
        ks = self.network_sizes(n_samples, delta)
        requested = self.requested_output()
        return ks if requested is None else requested.network_sizes(ks)

    def network_sizes(self, n_samples: int, delta: float | None = None) -> list[int]:
        """Centers per layer from ``ks``, or from ``k1`` shrunk by ``delta`` (the given one,
        else the parameter, "auto" read as the paper's 0.5) until a layer would have fewer
        than 1.5 ``n_classes`` centers."""
        if self.ks is not None:
            ks = [int(k) for k in self.ks]
            too_many = [k for k in ks if k > n_samples]
            if too_many:
                raise ValueError(
                    f"ks={list(self.ks)} asks for {too_many[0]} centers but there are only "
                    f"{n_samples} samples"
                )
            return ks
        if self.k1 == "auto":
            k1 = round(0.5 * n_samples)
        elif isinstance(self.k1, numbers.Integral):
            k1 = int(self.k1)
            if k1 > n_samples:
                raise ValueError(f"k1={k1} centers is more than the {n_samples} samples")
        else:
            k1 = round(float(self.k1) * n_samples)
        if self.k_max is not None:
            k1 = min(k1, int(self.k_max))
        k1 = max(2, min(k1, n_samples))
        if delta is None:
            delta = PAPER_DELTA if self.delta == "auto" else float(self.delta)
        return _shrunk(k1, delta, self.min_centers)

    @property
    def min_centers(self) -> float:
        """Layers stop before they would have fewer centers than this (1.5 ``n_classes``)."""
        return 1.5 * self.n_classes

    @property
    def upper_layers_given(self) -> bool:
        """Whether the caller fixed the upper layers (several ``ks``, or a number for delta)."""
        return self.delta != "auto" or (self.ks is not None and len(self.ks) > 1)

    # ------------------------------------------------------------------ the output

    def requested_output(self) -> Output | None:
        """The output asked for, None for "auto" (which the data decides during the fit)."""
        return None if self.output == AUTO else get_output(self.output)

    def check_output_layers(self) -> None:
        """ValueError when the output asked for cannot have the layers asked for."""
        requested = self.requested_output()
        if requested is not None:
            requested.check_layers(self.upper_layers_given)

    def check_n_components(self, n_samples: int, ks: Sequence[int]) -> int:
        """The embedding's dimension (``n_components``, else ``n_classes``) for a network of
        layers ``ks`` on ``n_samples`` rows; ValueError when the top layer's codes cannot
        give that many."""
        n_components = self.n_classes if self.n_components is None else self.n_components
        top = min(n_samples, self.n_clusterings * ks[-1])
        if n_components > top:
            raise ValueError(
                f"n_components={n_components} (n_classes when unset) must be <= "
                f"min(rows, n_clusterings * ks[-1]) = {top}"
            )
        return n_components

    # ------------------------------------------------------------------ features

    def bottom_features(self, X, rng) -> int:
        """Input dimensions each bottom clustering chooses for the training data X ("auto"
        measures them on a sample, without advancing ``rng``)."""
        if self.feature_fraction == "auto":
            return bottom_feature_count(X, rng)
        return max(1, round(float(self.feature_fraction) * X.shape[1]))

    def expected_bottom_features(self, n_features: int) -> int:
        """Bottom dimensions per clustering before seeing the data ("auto": at least half, the
        most common choice, and at least min(2, d)), for cost estimates."""
        if self.feature_fraction == "auto":
            return least_bottom_features(n_features)
        return max(1, round(float(self.feature_fraction) * n_features))

    @property
    def upper_feature_fraction(self) -> float:
        """Probability that an upper clustering chooses each one-hot dimension."""
        return PAPER_FRACTION if self.feature_fraction == "auto" else float(self.feature_fraction)

    # ------------------------------------------------------------------ a fitted network

    def fitted_delta(self, ks: Sequence[int], output: str) -> float | None:
        """The shrink factor a fit of these parameters used to reach layers ``ks`` with
        ``output`` (``MBN.delta_``): None with explicit ``ks`` or a bottom-only output, the
        parameter when it is a number, and under "auto" the measured candidate whose layers
        are ``ks`` (0.5 for a network of one layer, where no second layer was measured).

        A model saved without it is thereby loaded whole: the measured candidates give
        different second layers wherever there is one.
        """
        if self.ks is not None or get_output(output).bottom_only:
            return None
        if self.delta != "auto":
            return float(self.delta)
        ks = [int(k) for k in ks]
        for delta in DELTAS:
            if _shrunk(ks[0], delta, self.min_centers) == ks:
                return delta
        raise ValueError(
            f"layer sizes {ks} are not those of delta 'auto' from k1={ks[0]} (candidates "
            f"{', '.join(map(str, DELTAS))})"
        )


def _shrunk(k1: int, delta: float, min_centers: float) -> list[int]:
    """``k1`` and each layer ``floor(delta * k)`` of the one below, while it keeps at least
    ``min_centers``."""
    ks = [k1]
    while (k := int(delta * ks[-1])) >= min_centers:
        ks.append(k)
        if len(ks) > MAX_LAYERS:
            raise ValueError(
                f"delta={delta:g} shrinks k1={k1} centers so slowly that the network "
                f"would have more than {MAX_LAYERS} layers; use a smaller delta or k_max"
            )
    return ks
