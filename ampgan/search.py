"""`python -m ampgan.search`: Optuna search over ampgan's settings (ampgan.sweeps.optuna_search)."""

import sys

from ampgan.sweeps.optuna_search import main

if __name__ == "__main__":
    sys.exit(main())
