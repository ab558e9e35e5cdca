"""``python -m mbn_core.cli``: the ``mbn`` command."""

import sys

from mbn_core.cli import main

sys.exit(main())
