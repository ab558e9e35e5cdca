"""The options of training a method: its own, its distiller's, the pipeline's, the input's and
the map's, each declared once by the estimator or module it configures.

The registry (``mbn_core.methods``) knows a method's own options; what a training of it takes
besides is the pipeline's business, assembled here: the CLI's flags, ``TrainingParams``, the
service's forms and the documentation's tables all read ``option_groups``.
"""

from __future__ import annotations

from mbn_core.bundle.embedding_map import MAP_POINTS
from mbn_core.data.scaling import INPUT_SCALING
from mbn_core.methods import NOT_OPTIONS, PIPELINE_DEFAULTS, PIPELINE_PARAMS, SHARED_PARAMS, Method
from mbn_core.params import Param, estimator_params
from mbn_core.pipeline.distilled import DistilledEmbedding


def fast_path_params(method: Method) -> list[Param]:
    """Options of the distiller that makes ``method``'s fast path (none when it exports its
    own)."""
    if method.export is not None:
        return []
    return [
        param
        for param in estimator_params(DistilledEmbedding, exclude=NOT_OPTIONS)
        if param.name not in PIPELINE_PARAMS
    ]


def pipeline_params() -> list[Param]:
    """The options every method shares (``PIPELINE_PARAMS``), as ``DistilledEmbedding``
    declares them, with the training's defaults."""
    by_name = {
        param.name: param
        for param in estimator_params(
            DistilledEmbedding, exclude=NOT_OPTIONS, defaults=PIPELINE_DEFAULTS
        )
    }
    return [by_name[name] for name in PIPELINE_PARAMS]


def option_groups(method: Method) -> dict[str, list[Param]]:
    """Every training option of ``method``, by group: the method's, the compressor's, the
    pipeline's, the input's and the map's.

    Raises ValueError when one of the method's own options has the name of a distiller's
    (a plug-in must rename it).
    """
    own = method.params()
    compressor = fast_path_params(method)
    clash = {param.name for param in own} & {param.name for param in compressor}
    clash -= set(SHARED_PARAMS)
    if clash:
        raise ValueError(
            f"method {method.name!r}: parameters {sorted(clash)} clash with the compressor's "
            "options; rename them"
        )
    groups = {method.name: own, "compressor": compressor, "pipeline": pipeline_params()}
    groups["input"] = [INPUT_SCALING]
    groups["map"] = [MAP_POINTS]
    return {group: params for group, params in groups.items() if params}


def options(method: Method) -> list[Param]:
    """Every training option of ``method``, flat."""
    return [param for params in option_groups(method).values() for param in params]
