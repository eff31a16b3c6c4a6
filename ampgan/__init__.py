"""ampgan: reproducible, logged mixed-precision experiments in MindSpore."""

import os as _os

# MindSpore prints a wall of C++ warnings at import unless told otherwise.
_os.environ.setdefault("GLOG_v", "3")

__version__ = "0.1.0"


class AmpganError(Exception):
    """A user-facing error: bad config, missing hardware. Printed as one line, exit code 2."""


def require(ok: bool, message: str) -> None:
    """Raise AmpganError(message) unless `ok`: the one way config schemas reject a value."""
    if not ok:
        raise AmpganError(message)
