"""Estimator parameters, defined once: in each estimator's ``_parameter_constraints``.

scikit-learn's constraint objects (``Interval``, ``StrOptions``, ``None``, ``"array-like"``,
...) say what values a parameter takes; the estimator's ``__init__`` gives its default and its
numpydoc docstring its meaning. Everything else is derived from those three: validation
(``CheckedParams``), the training parameters of a method
(``mbn_core.pipeline.training``), the flags of
``mbn train`` (``parse_flag``) and the documented table (``markdown_table``).
"""

from __future__ import annotations

import argparse
import inspect
import math
import numbers
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

# scikit-learn's parameter validation is private API (sklearn.utils._param_validation,
# sklearn.base._fit_context), which every estimator here declares its parameters with: this
# module is its one importer, re-exporting what the others use. pyproject.toml bounds
# scikit-learn below its next release; tests/mbn_core/test_dependency_apis.py checks them.
from sklearn.base import _fit_context as fit_context
from sklearn.utils._param_validation import (
    HasMethods,
    Interval,
    InvalidParameterError,
    RealNotInt,
    StrOptions,
    validate_parameter_constraints,
)

__all__ = [
    "CheckedParams",
    "HasMethods",
    "Interval",
    "InvalidParameterError",
    "Param",
    "RealNotInt",
    "StrOptions",
    "describe_constraints",
    "estimator_params",
    "fit_context",
    "markdown_table",
    "parse_flag",
    "validate_parameter_constraints",
]


class CheckedParams:
    """Mixin for estimators: ``check_params`` checks ``_parameter_constraints`` and what
    they cannot say (``fit`` calls it first, through scikit-learn's ``_validate_params``).

    scikit-learn's ``Interval(Integral, ...)`` accepts ``True`` (a bool is an integer to
    Python); here a bool is only accepted where the constraints list ``"boolean"``.
    Estimators override ``_check_params`` for checks across parameters or on the items of a
    sequence. Errors are ``InvalidParameterError`` (a ``ValueError``) naming the parameter.
    """

    _parameter_constraints: dict[str, list[Any]]

    def check_params(self) -> None:
        """Validate the parameters as ``fit`` does; ``InvalidParameterError`` (a
        ``ValueError``) naming the first bad one."""
        params = self.get_params(deep=False)  # type: ignore[attr-defined]
        caller = type(self).__name__
        validate_parameter_constraints(self._parameter_constraints, params, caller_name=caller)
        for name, value in params.items():
            constraints = self._parameter_constraints.get(name, [])
            if isinstance(value, bool | np.bool_) and "boolean" not in constraints:
                raise InvalidParameterError(
                    f"The {name!r} parameter of {caller} must be "
                    f"{describe_constraints(constraints)}. Got {value!r} instead."
                )
        self._check_params()

    def _validate_params(self) -> None:
        self.check_params()

    def _check_params(self) -> None:
        """Checks the constraints cannot express; raise ``InvalidParameterError``."""


def check_estimator_params(estimator: Any) -> None:
    """Validate any estimator's parameters as its ``fit`` would: ``check_params`` for ours,
    its ``_parameter_constraints`` (scikit-learn's rules) for another's."""
    if isinstance(estimator, CheckedParams):
        estimator.check_params()
        return
    validate_parameter_constraints(
        estimator._parameter_constraints,
        estimator.get_params(deep=False),
        caller_name=type(estimator).__name__,
    )


def check_int_items(owner: str, name: str, values: Any, minimum: int, max_length: int) -> None:
    """``InvalidParameterError`` unless ``values`` is a sequence of 1 to ``max_length``
    integers >= ``minimum`` (for list parameters such as layer sizes). The message quotes a
    long sequence by its length, not in full."""
    items = list(values)
    if not 0 < len(items) <= max_length or any(
        not isinstance(item, numbers.Integral) or isinstance(item, bool) or item < minimum
        for item in items
    ):
        shown = repr(values) if len(items) <= 20 else f"a sequence of {len(items)} items"
        raise InvalidParameterError(
            f"The {name!r} parameter of {owner} must be a sequence of 1 to {max_length} "
            f"integers >= {minimum}. Got {shown[:200]} instead."
        )


@dataclass(frozen=True)
class Param:
    """One parameter of an estimator, as ``estimator_params`` derives it.

    Attributes
    ----------
    name : str
    default : object
        The estimator's default, or the override given to ``estimator_params``.
    constraints : list
        The estimator's ``_parameter_constraints`` entry.
    help : str
        First sentence of the parameter's description in the estimator's docstring.
    owner : str
        The estimator class's name.
    """

    name: str
    default: Any
    constraints: list[Any]
    help: str
    owner: str

    @property
    def is_list(self) -> bool:
        """Whether the value is a sequence (``"array-like"``), e.g. layer sizes."""
        return "array-like" in self.constraints

    def json_default(self) -> Any:
        """The default as plain JSON (tuples as lists)."""
        return list(self.default) if isinstance(self.default, tuple) else self.default


def estimator_params(
    cls: type,
    *,
    exclude: Iterable[str] = (),
    defaults: dict[str, Any] | None = None,
) -> list[Param]:
    """The parameters of estimator class ``cls`` in signature order.

    Parameters
    ----------
    cls : type
        An estimator with ``_parameter_constraints`` and a numpydoc docstring.
    exclude : iterable of str
        Parameters left out (e.g. callbacks, which no file or form can carry).
    defaults : dict, default=None
        Defaults that replace the estimator's (e.g. training defaults suited to a service).

    Raises
    ------
    TypeError
        When a parameter has no constraints: every one must be declared.
    """
    excluded = set(exclude)
    overrides = dict(defaults or {})
    helps = docstring_params(cls)
    constraints = cls._parameter_constraints  # type: ignore[attr-defined]
    params = []
    for name, parameter in inspect.signature(cls).parameters.items():
        if name in excluded:
            continue
        if name not in constraints:
            raise TypeError(f"{cls.__name__}.{name} has no entry in _parameter_constraints")
        default = overrides.pop(name, parameter.default)
        if isinstance(default, list):
            default = tuple(default)
        params.append(Param(name, default, constraints[name], helps.get(name, ""), cls.__name__))
    if overrides:
        raise TypeError(f"defaults for unknown parameters of {cls.__name__}: {sorted(overrides)}")
    return params


def docstring_params(cls: type) -> dict[str, str]:
    """First sentence of each entry of the numpydoc "Parameters" section of ``cls`` (or of
    the nearest base class that documents the parameter)."""
    helps: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        helps.update(_own_docstring_params(klass.__doc__ or ""))
    return helps


def _own_docstring_params(doc: str) -> dict[str, str]:
    doc = inspect.cleandoc(doc)
    match = re.search(r"^Parameters\n-+\n(.*?)(?:^\w[^\n]*\n-+\n|\Z)", doc, re.M | re.S)
    if not match:
        return {}
    helps: dict[str, str] = {}
    name = None
    lines: list[str] = []
    for line in match.group(1).splitlines():
        header = re.match(r"^(\w+)\s*:", line)
        if header:
            if name is not None:
                helps[name] = _first_sentence(lines)
            name, lines = header.group(1), []
        elif name is not None and line.strip():
            lines.append(line.strip())
    if name is not None:
        helps[name] = _first_sentence(lines)
    return helps


def _first_sentence(lines: list[str]) -> str:
    text = " ".join(lines)
    # The sentence ends at ". " followed by a capital (not at "e.g. " or "0.5 ").
    match = re.match(r"(.*?[^.]\.)(?:\s+[A-Z(`\"0-9]|$)", text)
    return (match.group(1) if match else text).replace("``", "`")


def describe_constraints(constraints: list[Any]) -> str:
    """The values a parameter takes, in words (for help texts and the documented table)."""
    parts = []
    for constraint in constraints:
        if constraint is None:
            parts.append("none")
        elif isinstance(constraint, StrOptions):
            parts.append(" or ".join(repr(option) for option in sorted(constraint.options)))
        elif constraint == "array-like":
            parts.append("a list of integers")
        elif constraint == "random_state":
            parts.append("an integer seed")
        elif constraint == "boolean":
            parts.append("true or false")
        elif isinstance(constraint, str):
            parts.append(constraint)
        elif hasattr(constraint, "type") and hasattr(constraint, "left"):
            parts.append(_describe_interval(constraint))
        else:
            parts.append(str(constraint))
    return " or ".join(parts)


def _describe_interval(interval: Any) -> str:
    kind = "an integer" if interval.type is numbers.Integral else "a number"
    left_closed = interval.closed in ("left", "both")
    right_closed = interval.closed in ("right", "both")
    if interval.left is not None and interval.right is not None:
        return (
            f"{kind} in {'[' if left_closed else '('}{interval.left:g}, {interval.right:g}"
            f"{']' if right_closed else ')'}"
        )
    if interval.left is not None:
        return f"{kind} {'>=' if left_closed else '>'} {interval.left:g}"
    if interval.right is not None:
        return f"{kind} {'<=' if right_closed else '<'} {interval.right:g}"
    return kind


# ---------------------------------------------------------------------- command-line flags


def parse_flag(param: Param) -> Callable[[str], Any]:
    """A function turning a command-line string into a value of ``param``.

    Validation is the estimator's; this only picks the type: ``none`` where None is allowed,
    the string options, integers before numbers, comma-separated integers for lists,
    true/false for booleans. Other text comes back as a string, for the estimator to refuse
    by name.
    """
    constraints = param.constraints

    def parse(text: str) -> Any:
        if None in constraints and text.lower() == "none":
            return None
        if param.is_list:
            try:
                return tuple(int(part) for part in text.replace(" ", "").split(",") if part)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"expected comma-separated integers, got {text!r}"
                ) from None
        if "boolean" in constraints and text.lower() in ("true", "false"):
            return text.lower() == "true"
        for converter in (int, float):
            try:
                value = converter(text)
            except ValueError:
                continue
            if isinstance(value, float) and not math.isfinite(value):
                return value  # refused by the estimator, by name
            return value
        return text

    parse.__name__ = param.name  # argparse names the parameter in its error messages
    return parse


def metavar(param: Param) -> str:
    """The placeholder shown by ``--help``."""
    if param.is_list:
        return "N,N,..."
    words = []
    for constraint in param.constraints:
        if constraint is None:
            words.append("none")
        elif isinstance(constraint, StrOptions):
            words.extend(sorted(constraint.options))
        elif constraint == "boolean":
            words.append("true|false")
        elif hasattr(constraint, "type"):
            words.append("N" if constraint.type is numbers.Integral else "X")
        elif constraint == "random_state":
            words.append("N")
    return "|".join(dict.fromkeys(words)) or "VALUE"


# ---------------------------------------------------------------------- documentation


def markdown_table(params: Iterable[Param]) -> str:
    """A Markdown table of ``params``: name, default, accepted values, meaning."""
    rows = ["| parameter | default | values | meaning |", "|---|---|---|---|"]
    for param in params:
        default = param.json_default()
        shown = "none" if default is None else default
        if isinstance(shown, list):
            shown = ",".join(str(item) for item in shown)
        rows.append(
            f"| `{param.name}` | `{shown}` | {describe_constraints(param.constraints)} | "
            f"{param.help} |"
        )
    return "\n".join(rows)
