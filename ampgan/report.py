"""`python -m ampgan.report`: a sweep read back from the store as tables and charts (ampgan.reporting.sweep_report)."""

import sys

from ampgan.reporting.sweep_report import main

if __name__ == "__main__":
    sys.exit(main())
