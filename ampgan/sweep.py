"""`python -m ampgan.sweep status|resume <sweep>`: a sweep's jobs, and finishing them (ampgan.sweeps.jobs)."""

import sys

from ampgan.sweeps.jobs import main

if __name__ == "__main__":
    sys.exit(main())
