"""Multilayer Bootstrap Networks as a registered method: the default one.

The fast path is distilled (``CompressiveMBN``); the exact state is ``model_to_arrays``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mbn_core.mbn.backends.cuda import device_name
from mbn_core.mbn.estimator import MBN
from mbn_core.mbn.neighbour_scan import MAX_LIST_BYTES
from mbn_core.mbn.outputs import get_output
from mbn_core.mbn.outputs.umap import STAGES, layout_epochs
from mbn_core.mbn.persistence import model_from_arrays, model_to_arrays
from mbn_core.methods import Method, Reporter, register

# Relative cost of the steps, in multiply-adds of the bottom layer's GEMMs on MNIST (measured
# on two cores):
# - a bottom-layer (row, center) pair costs its chosen inputs' multiply-adds, and no less
#   than this on narrow input, where the nearest-center search and the bookkeeping dominate
#   (digits' 32 inputs and the swiss roll's 3 both measured about 100);
_PAIR_FLOOR = 100.0
# - an upper-layer clustering walks posting lists at about this much per (row, clustering +
#   center);
_UPPER_COST = 40.0
# - the UMAP outputs' neighbour search, per visit of a row's bottom cell-mate (a row meets
#   about n / k1 of them in each clustering), and their layout per (row, epoch).
_SEARCH_COST = 6e3
_LAYOUT_COST = 1.9e5


def layer_costs(mbn: MBN, shape: tuple[int, int], ks: list[int] | None = None) -> list[float]:
    """Expected cost of each layer of ``mbn`` fitted on ``shape`` rows (of these layer sizes
    ``ks``; by default those planned before the fit)."""
    n, d = shape
    ks = mbn.layer_sizes(n) if ks is None else ks
    V = mbn.n_clusterings
    features = mbn.network().expected_bottom_features(d)
    bottom = float(n) * max(_PAIR_FLOOR, float(features)) * ks[0]
    return [V * bottom] + [V * _UPPER_COST * n * (V + k) for k in ks[1:]]


def output_costs(mbn: MBN, n_samples: int, k1: int, output: str) -> dict[str, float]:
    """Expected cost of each stage of fitting ``output`` after the layers, in the units of
    ``layer_costs``. PCA of the top codes is small beside the layers: it has no stages."""
    if get_output(output).stages != STAGES:
        return {}
    visits = float(n_samples) * mbn.n_clusterings * n_samples / k1
    return {
        "neighbours": _SEARCH_COST * visits,
        "layout": _LAYOUT_COST * n_samples * layout_epochs(n_samples),
    }


def planned_output(mbn: MBN) -> str:
    """The output a fit is planned with before it starts: "auto" decides after the bottom
    layer (``mbn_core.mbn.auto``), and is planned as the PCA output it gives most data."""
    return "pca" if mbn.output == "auto" else mbn.output


def _cost(mbn: MBN, shape: tuple[int, int]) -> float:
    costs = layer_costs(mbn, shape)
    k1 = mbn.layer_sizes(shape[0])[0]
    return sum(costs) + sum(output_costs(mbn, shape[0], k1, planned_output(mbn)).values())


class _Progress:
    """An MBN callback that reports the share of the fit's expected work done.

    The plan starts as ``layer_sizes`` and ``planned_output`` and follows the fit's
    ``fit_plan``: ``delta="auto"`` may add layers, and ``output="auto"`` may keep the bottom
    layer alone under the UMAP output, whose stages ``output_progress`` then follows.
    """

    def __init__(self, mbn: MBN, shape: tuple[int, int], report: Reporter) -> None:
        self.mbn, self.shape, self.report = mbn, shape, report
        self.reported = 0.0  # a longer plan would move the share back: it never goes back
        self._plan(mbn.layer_sizes(shape[0]), planned_output(mbn))

    def _plan(self, ks: list[int], output: str) -> None:
        self.ks, self.output = list(ks), output
        self.costs = layer_costs(self.mbn, self.shape, self.ks)
        self.stage_costs = output_costs(self.mbn, self.shape[0], self.ks[0], output)
        self.total = sum(self.costs) + sum(self.stage_costs.values())

    def fit_plan(self, ks: list[int], output: str) -> bool:
        """The fit's layers and output, settled after the bottom layer: report it done under
        them."""
        if list(ks) == self.ks and output == self.output:
            return False
        self._plan(ks, output)
        V = self.mbn.n_clusterings
        return self(0, V, V)

    def __call__(self, layer: int, clustering: int, n_clusterings: int) -> bool:
        done = sum(self.costs[:layer]) + self.costs[layer] * clustering / n_clusterings
        message = (
            f"layer {layer + 1}/{len(self.ks)} (k={self.ks[layer]}): "
            f"clustering {clustering}/{n_clusterings}"
        )
        return self._report(done, message)

    def output_progress(self, stage: str, done: int, total: int) -> bool:
        """The UMAP output's stages, after the layers: "neighbours" then "layout"."""
        stages = list(self.stage_costs)
        before = sum(self.stage_costs[name] for name in stages[: stages.index(stage)])
        share = done / total if total > 0 else 1.0
        what = "epoch" if stage == "layout" else "rows searched"
        message = f"{self.output} output, {stage}: {what} {done}/{total}"
        return self._report(sum(self.costs) + before + self.stage_costs[stage] * share, message)

    def _report(self, done: float, message: str) -> bool:
        self.reported = max(self.reported, done / self.total)
        return self.report(self.reported, message)


def _track(mbn: MBN, shape: tuple[int, int], report: Reporter) -> None:
    mbn.set_params(callback=_Progress(mbn, shape, report))


def _check_rows(mbn: MBN, n_samples: int) -> None:
    network = mbn.network()
    network.check_output_layers()
    network.check_n_components(n_samples, network.layer_sizes(n_samples))


def _memory(mbn: MBN, shape: tuple[int, int]) -> float:
    """The fit's peak beyond its input rows, from above: two layers' codes of every row
    (int32 at most), every layer's centers (int64 row numbers at most), and an upper
    layer's neighbour lists where it scans them (``neighbour_scan.MAX_LIST_BYTES`` at most,
    6 bytes for each other row)."""
    n = shape[0]
    V = mbn.n_clusterings
    lists = min(float(MAX_LIST_BYTES), 6.0 * n * (n - 1))
    return 2.0 * n * V * 4 + V * float(sum(mbn.layer_sizes(n))) * 8 + lists


def _facts(mbn: MBN) -> dict[str, Any]:
    # The output too: with output="auto" the data chose it, and a user reads here which.
    facts: dict[str, Any] = {
        "ks": [int(k) for k in mbn.ks_],
        "metric": mbn.metric,
        "output": mbn.output_,
        # Where the layers were computed ("auto" chose it): a GPU gives the CPU's codes.
        "device": f"cuda ({device_name()})" if mbn.device_ == "cuda" else mbn.device_,
    }
    if mbn.fallbacks_:  # what ran elsewhere than that device: never quietly
        facts["fallbacks"] = list(mbn.fallbacks_)
    return facts


def _describe(training: Mapping[str, Any]) -> dict[str, list[str]]:
    """What ``mbn info`` says of an MBN's facts (``_facts``)."""
    dimensions = [f"metric {training['metric']}"] if "metric" in training else []
    if "output" in training:
        dimensions.append(f"{training['output']} output")
    fit = []
    if training.get("ks"):
        fit.append("layers " + "-".join(str(k) for k in training["ks"]))
    if "device" in training:  # where the layers ran ("auto" chose it)
        fit.append(f"on {training['device']}")
    fit.extend(training.get("fallbacks", []))  # what ran elsewhere, never quietly
    return {"dimensions": dimensions, "training": fit}


METHOD = register(
    Method(
        name="mbn",
        estimator=MBN,
        summary="Multilayer Bootstrap Network (Zhang 2018), distilled into an MLP",
        save=model_to_arrays,
        load=model_from_arrays,
        # A service trains on tens of thousands of rows: the bottom layer, linear in k1, is
        # the cost, and 2000 centers keep a 60,000-row job in minutes (docs/GUIDE.md, training;
        # decision 0001).
        defaults={"k_max": 2000},
        track=_track,
        cost=_cost,
        check_rows=_check_rows,
        memory=_memory,
        facts=_facts,
        describe=_describe,
        sparse=True,
    )
)
