"""The options of training a method: its own, its distiller's, the pipeline's, the input's and
the map's, each declared once by the estimator or module it configures, and a training's
values of them (``TrainingParams``).

The registry (``mbn_core.methods``) knows a method's own options; what a training of it takes
besides is the pipeline's business, assembled here: the CLI's flags, ``TrainingParams``, the
service's forms and the documentation's tables all read ``option_groups``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mbn_core.bundle.embedding_map import MAP_POINTS
from mbn_core.data.scaling import INPUT_SCALING
from mbn_core.methods import (
    DEFAULT_METHOD,
    NOT_OPTIONS,
    PIPELINE_DEFAULTS,
    PIPELINE_PARAMS,
    SHARED_PARAMS,
    Method,
    get_method,
)
from mbn_core.params import (
    InvalidParameterError,
    Param,
    check_estimator_params,
    estimator_params,
    validate_parameter_constraints,
)
from mbn_core.pipeline.distilled import DistilledEmbedding

_MAX_SEED = 2**32


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


@dataclass(frozen=True)
class TrainingParams:
    """Every option of a training job: the method, its parameters, the fast path's and the
    pipeline's (held-out share, clustering head, seed, threads).

    The options are those the method's estimators declare (``Method.options``); nothing is
    listed here. Build from JSON with ``TrainingParams.from_dict`` (unknown keys and bad values
    raise ``ValueError`` naming the key); ``to_dict`` gives the JSON-able form back, with the
    defaults filled in and ``method`` first.

    Attributes
    ----------
    method : str
        A registered method's name.
    values : mapping
        Every option's value (lists as tuples).
    """

    method: str
    values: Mapping[str, Any]

    @classmethod
    def from_dict(
        cls,
        values: Mapping[str, Any] | None = None,
        *,
        set_elsewhere: Mapping[str, str] | None = None,
    ) -> TrainingParams:
        """Parameters from a JSON object (``method`` optional, ``"mbn"`` by default).

        ``set_elsewhere`` maps options the caller sets itself (a server's threads and
        device) to where they are set: they are refused by name, and left out of the known
        options an unknown one is told about."""
        elsewhere = dict(set_elsewhere or {})
        if values is None:
            values = {}
        if not isinstance(values, Mapping):
            raise ValueError(f"training parameters must be an object, got {type(values).__name__}")
        values = dict(values)
        name = values.pop("method", DEFAULT_METHOD)
        if not isinstance(name, str):
            raise ValueError(f"method must be a string, got {name!r}")
        method = get_method(name)
        unavailable = method.unavailable
        if unavailable is not None:
            raise ValueError(f"method {name!r} is not available on this install: {unavailable}")
        known = {param.name: param for param in options(method)}
        for key in values:
            if key in elsewhere:
                raise ValueError(f"training parameter {key!r} is set by {elsewhere[key]}")
            if key not in known:
                raise ValueError(unknown_parameter(key, name, sorted(known), elsewhere))
        full = {}
        for key, param in known.items():
            value = values.get(key, param.default)
            if param.is_list and isinstance(value, list):
                value = tuple(value)
            full[key] = value
        params = cls(method=name, values=full)
        params.validate()
        return params

    def validate(self) -> None:
        """ValueError naming the first bad option (the estimators' own checks)."""
        seed = self.values["random_state"]
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _MAX_SEED
        ):
            raise ValueError(f"random_state must be an integer in [0, 2**32) or None, got {seed!r}")
        try:
            # The pipeline's first: for options both check (n_jobs), its rule is the one
            # that holds (the estimator's can allow more, e.g. MBN's negative n_jobs).
            try:
                DistilledEmbedding(**self.compressor_kwargs()).check_params()
            except InvalidParameterError as error:
                # Every method has these options (the pipeline's), so they are the training's.
                message = str(error).replace("of DistilledEmbedding", "of training")
                raise ValueError(message) from None
            check_estimator_params(self.estimator())
            own = (MAP_POINTS, INPUT_SCALING)  # the training's own options, no estimator's
            validate_parameter_constraints(
                {param.name: param.constraints for param in own},
                {param.name: self.values[param.name] for param in own},
                caller_name="training",
            )
        except InvalidParameterError as error:
            raise ValueError(str(error)) from None

    @property
    def spec(self) -> Method:
        """The registered method."""
        return get_method(self.method)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able parameters (tuples as lists), ``method`` first."""
        return {
            "method": self.method,
            **{
                key: list(value) if isinstance(value, tuple) else value
                for key, value in self.values.items()
            },
        }

    def estimator_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the method's estimator (shared ones such as the seed too)."""
        method = self.spec
        accepted = method.constraints
        kwargs = {param.name: self.values[param.name] for param in method.params()}
        for key in SHARED_PARAMS:
            if key in accepted:
                kwargs[key] = self.values[key]
        return {key: list(v) if isinstance(v, tuple) else v for key, v in kwargs.items()}

    def estimator(self) -> Any:
        """An unfitted estimator of the method with these parameters."""
        return self.spec.estimator(**self.estimator_kwargs())

    def compressor_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``DistilledEmbedding`` (without the teacher): the compressor's
        options (their defaults for an exported method) and the pipeline's."""
        names = [param.name for param in fast_path_params(self.spec)] + list(PIPELINE_PARAMS)
        return {name: self.values[name] for name in names}

    def pipeline(self) -> dict[str, Any]:
        """The pipeline's options (``PIPELINE_PARAMS``)."""
        return {name: self.values[name] for name in PIPELINE_PARAMS}


def unknown_parameter(
    key: str, method: str, known: list[str], elsewhere: Mapping[str, str] | None = None
) -> str:
    """Words for an unknown training option: the nearest known one, and the known ones
    (without those set elsewhere, which are said apart)."""
    elsewhere = elsewhere or {}
    offered = [name for name in known if name not in elsewhere]
    shown = key if len(key) <= 80 else f"{key[:80]}..."
    message = f"unknown training parameter {shown!r} for method {method!r}"
    close = difflib.get_close_matches(key, offered, n=1)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    message += f"; known: {', '.join(offered)}"
    if elsewhere:
        said = ", ".join(f"{name} by {where}" for name, where in sorted(elsewhere.items()))
        message += f" (set elsewhere: {said})"
    return message
