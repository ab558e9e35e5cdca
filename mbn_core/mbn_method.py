"""Multilayer Bootstrap Networks as a registered method: the default one.

The fast path is distilled (``CompressiveMBN``); the exact state is ``model_to_arrays``.
"""

from __future__ import annotations

from typing import Any

from mbn_core.methods import Method, Reporter, register
from mbn_core.network import MBN, model_from_arrays, model_to_arrays

# Relative cost of the steps, in bottom-layer multiply-adds (measured on MNIST on two cores):
# an upper-layer clustering walks posting lists at about this many bottom-layer GEMM
# multiply-adds per (point, clustering + center).
_UPPER_COST = 40.0


def layer_costs(mbn: MBN, shape: tuple[int, int], ks: list[int] | None = None) -> list[float]:
    """Expected multiply-adds of each layer of ``mbn`` fitted on ``shape`` rows (of these
    layer sizes ``ks``; by default those planned before the fit)."""
    n, d = shape
    ks = mbn.layer_sizes(n) if ks is None else ks
    V = mbn.n_clusterings
    bottom = float(n) * max(1.0, float(mbn._expected_bottom_features(d))) * ks[0]
    return [V * bottom] + [V * _UPPER_COST * n * (V + k) for k in ks[1:]]


def _cost(mbn: MBN, shape: tuple[int, int]) -> float:
    return sum(layer_costs(mbn, shape))


class _Progress:
    """An MBN callback that reports the share of the fit's expected work done.

    The plan starts as ``layer_sizes`` and follows the fit's ``layer_plan``: ``delta="auto"``
    may add layers, and ``output="auto"`` may keep the bottom layer alone.
    """

    def __init__(self, mbn: MBN, shape: tuple[int, int], report: Reporter) -> None:
        self.mbn, self.shape, self.report = mbn, shape, report
        self.ks = mbn.layer_sizes(shape[0])
        self.costs = layer_costs(mbn, shape, self.ks)
        self.reported = 0.0  # a longer plan would move the share back: it never goes back

    def layer_plan(self, ks: list[int]) -> bool:
        """The fit's layers, settled after the bottom layer: report it done under them."""
        if list(ks) == self.ks:
            return False
        self.ks = list(ks)
        self.costs = layer_costs(self.mbn, self.shape, self.ks)
        V = self.mbn.n_clusterings
        return self(0, V, V)

    def __call__(self, layer: int, clustering: int, n_clusterings: int) -> bool:
        done = sum(self.costs[:layer]) + self.costs[layer] * clustering / n_clusterings
        message = (
            f"layer {layer + 1}/{len(self.ks)} (k={self.ks[layer]}): "
            f"clustering {clustering}/{n_clusterings}"
        )
        self.reported = max(self.reported, done / sum(self.costs))
        return self.report(self.reported, message)


def _track(mbn: MBN, shape: tuple[int, int], report: Reporter) -> None:
    mbn.set_params(callback=_Progress(mbn, shape, report))


def _check_rows(mbn: MBN, n_samples: int) -> None:
    mbn._check_output_layers()
    ks = mbn.layer_sizes(n_samples)
    n_components = mbn.n_classes if mbn.n_components is None else mbn.n_components
    top = min(n_samples, mbn.n_clusterings * ks[-1])
    if n_components > top:
        raise ValueError(
            f"n_components={n_components} (n_classes when unset) must be <= "
            f"min(rows, n_clusterings * ks[-1]) = {top}"
        )


def _facts(mbn: MBN) -> dict[str, Any]:
    # The output too: with output="auto" the data chose it, and a user reads here which.
    return {"ks": [int(k) for k in mbn.ks_], "metric": mbn.metric, "output": mbn.output_}


METHOD = register(
    Method(
        name="mbn",
        estimator=MBN,
        summary="Multilayer Bootstrap Network (Zhang 2018), distilled into an MLP",
        save=model_to_arrays,
        load=model_from_arrays,
        # A service trains on tens of thousands of rows: the bottom layer, linear in k1, is
        # the cost, and 2000 centers keep a 60,000-row job in minutes (README: training).
        defaults={"k_max": 2000},
        track=_track,
        cost=_cost,
        check_rows=_check_rows,
        facts=_facts,
        sparse=True,
    )
)
