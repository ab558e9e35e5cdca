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


def layer_costs(mbn: MBN, shape: tuple[int, int]) -> list[float]:
    """Expected multiply-adds of each layer of ``mbn`` fitted on ``shape`` rows."""
    n, d = shape
    ks = mbn.layer_sizes(n)
    V = mbn.n_clusterings
    bottom = float(n) * max(1.0, float(mbn._expected_bottom_features(d))) * ks[0]
    return [V * bottom] + [V * _UPPER_COST * n * (V + k) for k in ks[1:]]


def _cost(mbn: MBN, shape: tuple[int, int]) -> float:
    return sum(layer_costs(mbn, shape))


def _track(mbn: MBN, shape: tuple[int, int], report: Reporter) -> None:
    costs = layer_costs(mbn, shape)
    total = sum(costs)
    ks = mbn.layer_sizes(shape[0])

    def clustering_done(layer: int, clustering: int, n_clusterings: int) -> bool:
        if layer >= len(costs):
            # delta="auto" chose to shrink slower than the planned 0.5: extra layers.
            return report(
                1.0, f"layer {layer + 1} (extra): clustering {clustering}/{n_clusterings}"
            )
        done = sum(costs[:layer]) + costs[layer] * clustering / n_clusterings
        message = (
            f"layer {layer + 1}/{len(ks)} (k={ks[layer]}): clustering {clustering}/{n_clusterings}"
        )
        return report(done / total, message)

    mbn.set_params(callback=clustering_done)


def _check_rows(mbn: MBN, n_samples: int) -> None:
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
