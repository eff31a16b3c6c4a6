"""`python -m ampgan.tracking ui [--port P] [--host H]`: the MLflow dashboard (ampgan.tracking.ui)."""

import sys

from ampgan.tracking.ui import main

if len(sys.argv) < 2 or sys.argv[1] != "ui":
    print("usage: python -m ampgan.tracking ui [--port P] [--host H]", file=sys.stderr)
    sys.exit(2)
sys.exit(main(sys.argv[2:]))
