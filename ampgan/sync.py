"""`python -m ampgan.sync [run folder ...]`: deliver what a store is missing; end runs whose process died (ampgan.tracking.store_sync)."""

import sys

from ampgan.tracking.store_sync import main

if __name__ == "__main__":
    sys.exit(main())
