"""Exceptions shared by every method, importable without loading any of them."""


class TrainingStopped(RuntimeError):
    """Raised by a method's ``fit`` when its callback asked to stop; the estimator is left
    unfitted."""
