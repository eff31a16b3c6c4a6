"""`python -m ampgan.search`: Optuna search over ampgan's settings (ampgan.sweeps.search)."""

import sys

from ampgan.sweeps.search import main

if __name__ == "__main__":
    sys.exit(main())
