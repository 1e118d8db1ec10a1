"""``python -m svdmlp``: the ``svdmlp`` command, where the console script is not on PATH."""

import sys

from svdmlp.cli import main

sys.exit(main())
