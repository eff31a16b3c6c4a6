"""ampgan: reproducible, logged mixed-precision experiments in MindSpore."""

import difflib as _difflib
import os as _os
import re as _re
import sys as _sys

# MindSpore prints a wall of C++ warnings at import unless told otherwise.
_os.environ.setdefault("GLOG_v", "3")

# MLflow's usage telemetry is on by default (its client and its server fetch a remote config and
# post usage events). Nothing ampgan starts sends it unless the user opts in with
# AMPGAN_TELEMETRY=true: set here, before MLflow is imported, and inherited by every process ampgan
# starts (the tracking helper, sweep and search workers, SLURM jobs, `make ui`, `make server`).
# A value the user set for either variable is left as it is.
TELEMETRY_OPT_IN = "AMPGAN_TELEMETRY"
if _os.environ.get(TELEMETRY_OPT_IN, "").strip().lower() not in ("1", "true", "yes", "on"):
    _os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    _os.environ.setdefault("DO_NOT_TRACK", "true")

__version__ = "0.1.0"


class AmpganError(Exception):
    """A user-facing error: bad config, missing hardware. Printed as one line, exit code 2."""


def closest(word: str, choices) -> str:
    """' (did you mean X?)' for the choice closest to a mistyped `word`, or ''."""
    match = _difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if not match:
        folded = {c.lower(): c for c in choices}
        match = [folded[word.lower()]] if word.lower() in folded else []
    return f" (did you mean {match[0]}?)" if match else ""


def require(ok: bool, message: str) -> None:
    """Raise AmpganError(message) unless `ok`: the one way config schemas reject a value."""
    if not ok:
        raise AmpganError(message)


EXIT_BAD_INPUT = 2  # the exit code of every command refusing its input


def one_line(message: str) -> str:
    """The message on one line, every very long word cut short, printable on this terminal."""
    text = " ".join(message.replace("\r", "\n").split("\n"))
    text = _re.sub(r"\S{81,}", lambda m: f"{m.group(0)[:40]}...({len(m.group(0))} characters)", text)
    encoding = getattr(_sys.stderr, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def report_error(err: BaseException | str, code: int = EXIT_BAD_INPUT) -> int:
    """Print `ampgan: error: <err>` as one line on stderr and return `code`: every command's way to refuse."""
    print(f"ampgan: error: {one_line(str(err))}", file=_sys.stderr)
    return code


def process_age() -> float:
    """Seconds since this process started (interpreter start-up and imports included).

    From the kernel's own clocks: the process's start in ticks since boot (/proc/self/stat)
    against CLOCK_BOOTTIME, to a tick (10 ms). psutil's create_time() adds the boot time as
    whole seconds (/proc/stat's btime), which put start-up figures up to 1 s too high (0.35 s
    on this machine). Elsewhere: psutil's figure.
    """
    import time

    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / _os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, ValueError, IndexError):
        import psutil

        return time.time() - psutil.Process().create_time()
