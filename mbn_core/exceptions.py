"""Exceptions shared by every method, importable without loading any of them."""


class TrainingStopped(RuntimeError):
    """Raised by a method's ``fit`` when its callback asked to stop; the estimator is left
    unfitted."""


class NoExactMap(ValueError):
    """Raised by ``transform`` of a method that has no map for new rows (its layout places
    only the rows it was fitted on); the message says why and what to use instead."""


class MissingDependency(ImportError):
    """An optional library a method needs is not installed: a setup to fix, told as such
    (``mbn train`` prints the message, which says what to install)."""


class MethodUnavailable(MissingDependency):
    """A registered method whose library is not installed; the message gives the install
    line."""


class MethodFailed(ValueError):
    """A method's own library raised inside its fit or transform: it could not lay out these
    rows with these parameters. The message names the method and the problem (never a
    traceback or a path)."""
