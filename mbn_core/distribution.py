"""This project as an installed distribution: its name, version and install lines.

The distribution is ``mbn-embeddings`` (the ``mbn`` name on the package index belongs to
another project); the import packages are ``mbn_core`` and ``service`` and the command is
``mbn``. Every message that tells a user what to install builds its line here, so that none
names a package this project does not own (``tests/test_install_hints.py`` checks the
messages and the docs against pyproject.toml).
"""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "mbn-embeddings"


def install_hint(*extras: str) -> str:
    """The install line of this project with ``extras``: by its name, or from a checkout."""
    wanted = f"[{','.join(extras)}]" if extras else ""
    return f"pip install '{DISTRIBUTION}{wanted}' (from a checkout: pip install '.{wanted}')"


def version() -> str | None:
    """The installed version; None when the project is not installed (run from a copy)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
