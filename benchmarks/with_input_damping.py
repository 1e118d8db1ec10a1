"""Run ``svdmlp`` with the input Gram's damping set for this run (issue 53's shrinkage candidate).

    python benchmarks/with_input_damping.py 0.05 compress --keep 0.8 --out DIR

The damping (:data:`svdmlp.compression.calibration.INPUT_DAMPING`) is a constant of the library: this
measures a value before it becomes the default.
"""

from __future__ import annotations

import sys

from svdmlp.cli import main
from svdmlp.compression import calibration

if __name__ == "__main__":
    calibration.INPUT_DAMPING = float(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
