"""``python -m mbn_core.cli``: the ``mbn`` command."""

import sys

from mbn_core.cli import main

# Guarded: a process that multiprocessing spawns from this one imports this module again.
if __name__ == "__main__":
    sys.exit(main())
