"""``python -m service``: the ``mbn`` command line with the service's commands."""

import sys

from mbn_core.cli import main
from service.cli import COMMANDS

if __name__ == "__main__":
    sys.exit(main(commands=COMMANDS))
