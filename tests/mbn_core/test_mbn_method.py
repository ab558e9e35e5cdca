"""The MBN method's progress estimate: the layers, then the UMAP outputs' two stages."""

import pytest
from sklearn.datasets import make_circles

from mbn_core import MBN, TrainingStopped
from mbn_core.mbn.method import METHOD, layer_costs, output_costs


def test_the_plan_counts_the_umap_outputs_stages_and_auto_is_planned_as_pca():
    shape = (2000, 3)
    pca, umap, auto = (MBN(n_classes=4, output=o) for o in ("pca", "umap-bottom", "auto"))
    k1 = pca.layer_sizes(shape[0])[0]
    stages = output_costs(umap, shape[0], k1, "umap-bottom")
    assert list(stages) == ["neighbours", "layout"] and min(stages.values()) > 0
    assert output_costs(pca, shape[0], k1, "pca") == {}
    assert METHOD.cost(umap, shape) == pytest.approx(
        sum(layer_costs(umap, shape)) + sum(stages.values())
    )
    assert METHOD.cost(auto, shape) == METHOD.cost(pca, shape)


def fit_with_reports(model: MBN, X) -> list[tuple[float, str]]:
    reports: list[tuple[float, str]] = []

    def report(share: float, message: str) -> bool:
        reports.append((share, message))
        return False

    METHOD.track(model, X.shape, report)
    model.fit(X)
    return reports


@pytest.mark.slow
def test_the_share_moves_through_the_layers_then_the_search_then_every_epoch():
    X, _ = make_circles(300, factor=0.5, noise=0.04, random_state=7)
    reports = fit_with_reports(MBN(n_classes=2, random_state=0), X)  # "auto": umap-bottom
    shares = [share for share, _ in reports]
    assert shares == sorted(shares) and shares[-1] == 1.0
    kinds = [message.split(":")[0].split(" (")[0] for _, message in reports]
    first_search = kinds.index("umap-bottom output, neighbours")
    first_epoch = kinds.index("umap-bottom output, layout")
    planned = f"layer 1/{len(MBN(n_classes=2).layer_sizes(300))}"  # before "auto" decides
    assert set(kinds[:first_search]) == {planned, "layer 1/1"}  # then re-planned to one layer
    assert set(kinds[first_search:first_epoch]) == {"umap-bottom output, neighbours"}
    assert set(kinds[first_epoch:]) == {"umap-bottom output, layout"}
    # The layout is most of this fit's cost, so the bar is not near the end before it.
    assert shares[first_epoch] < 0.5
    assert reports[-1][1] == "umap-bottom output, layout: epoch 500/500"


@pytest.mark.slow  # over a second; the full suite runs it
def test_a_report_asking_to_stop_stops_the_layout():
    X, _ = make_circles(300, factor=0.5, noise=0.04, random_state=7)
    model = MBN(n_classes=2, output="umap-bottom", random_state=0)
    messages: list[str] = []

    def report(share: float, message: str) -> bool:
        messages.append(message)
        return message.endswith("epoch 3/500")

    METHOD.track(model, X.shape, report)
    with pytest.raises(TrainingStopped, match=r"layout \(3 of 500\)"):
        model.fit(X)
    assert messages[-1] == "umap-bottom output, layout: epoch 3/500"
