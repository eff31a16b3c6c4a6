"""ampgan: reproducible, logged mixed-precision experiments in MindSpore."""

import difflib as _difflib
import gc as _gc
import os as _os
import re as _re
import sys as _sys
from contextlib import contextmanager as _contextmanager

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

# the tags of a run that should be diagnosed: the trainer's loop and a user's script's callback set them
WARNING_TAG = "ampgan.warning"        # why the run should be diagnosed, and the command that does it
NEXT_COMMAND_TAG = "ampgan.next_command"   # that command alone


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
MAX_ERROR_LINE = 400  # characters of an `ampgan: error: ...` line at most; a longer one is cut, its whole text logged
ERROR_PREFIX = "ampgan: error: "
_LONG_WORD = _re.compile(r"\S{81,}")


def outputs_dir():
    """Absolute folder for runs, error logs and the embedded MLflow store; `AMPGAN_OUTPUTS` overrides."""
    from pathlib import Path

    default = Path(__file__).resolve().parent.parent / "outputs"
    return Path(_os.environ.get("AMPGAN_OUTPUTS", default)).resolve()


def _joined(message: str) -> str:
    return " ".join(message.replace("\r", "\n").split("\n"))


def _printable(text: str) -> str:
    encoding = getattr(_sys.stderr, "encoding", None) or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def one_line(message: str) -> str:
    """The message on one line, every very long word cut short, printable on this terminal."""
    text = _LONG_WORD.sub(lambda m: f"{m.group(0)[:40]}...({len(m.group(0))} characters)", _joined(message))
    return _printable(text)


def save_error(message: str, cause: BaseException | None = None):
    """Write `message` whole (and the traceback of its `cause`, if any) to a new file
    `<outputs>/errors/<time>-<pid>.log`; its path, or None if no folder takes it. A path so long
    that it would crowd the line out goes to the temporary folder instead."""
    import tempfile
    import time
    import traceback
    from pathlib import Path

    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    body = [f"# {time.strftime('%Y-%m-%d %H:%M:%S')}, pid {_os.getpid()}, command line: {' '.join(_sys.argv)}", "",
            f"{ERROR_PREFIX}{message}", ""]
    if cause is not None:
        body += ["caused by:", "".join(traceback.format_exception(cause)).rstrip(), ""]
    for folder in (outputs_dir() / "errors", Path(tempfile.gettempdir()) / "ampgan-errors"):
        if len(str(folder)) > MAX_ERROR_LINE // 2:
            continue
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for n in range(100):
                path = folder / f"{stamp}-{_os.getpid()}{f'-{n}' if n else ''}.log"
                try:
                    with open(path, "x", encoding="utf-8", errors="backslashreplace") as f:
                        f.write("\n".join(body))
                    return path
                except FileExistsError:
                    continue
        except OSError:
            continue
    return None


def error_line(err: BaseException | str, limit: int = MAX_ERROR_LINE) -> str:
    """`ampgan: error: <err>` on one line of at most `limit` characters.

    When anything is cut (a word of more than 80 characters shortened, or the line past `limit`),
    the whole message is saved by `save_error` and the line ends by naming that file; a line
    printed whole writes no file."""
    message = str(err)
    text = one_line(message)
    if len(ERROR_PREFIX) + len(text) <= limit and not _LONG_WORD.search(_joined(message)):
        return ERROR_PREFIX + text
    cause = err.__cause__ if isinstance(err, BaseException) else None
    path = save_error(message, cause)
    tail = f" [cut; the whole message is in {_printable(str(path))}]" if path else " [cut]"
    room = limit - len(ERROR_PREFIX) - len(tail)
    if len(text) > room:
        text = text[: max(room - 3, 0)].rstrip() + "..."
    return ERROR_PREFIX + text + tail


def report_error(err: BaseException | str, code: int = EXIT_BAD_INPUT) -> int:
    """Print `ampgan: error: <err>` as one line of at most MAX_ERROR_LINE characters on stderr
    (a longer message is cut, and saved whole to the log file the line names) and return `code`:
    every command's way to refuse."""
    print(error_line(err), file=_sys.stderr)
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


@_contextmanager
def frozen_imports(own_process: bool = True):
    """Import-heavy work with Python's cyclic collector paused, and what it imported frozen after.

    A command's imports make objects that live as long as its process: ~150k from MindSpore in a
    run's check (through the nets it resolves), ~150k from MLflow in the tracking helper. While they
    are young, each full collection walks them all again, and frees nothing: 3 full collections,
    0.2 s, before the default run's first step; 0.18 s of the helper's 1.1 s `import mlflow`
    (measured with gc.callbacks). Here the garbage made so far is collected first (the heap is
    still small), the collector is paused through the block, and then every object alive moves
    into the permanent generation (gc.freeze): never walked again, and never freed, as modules are
    not. Garbage the block itself made is frozen with it (a run's check: 1,300 objects, 0.16 MB).
    The collector runs as usual after it.

    Only where the process is the command's own (`own_process`), and once: a caller's collector
    is left alone, a paused one stays paused, and a process frozen once is not frozen again.
    """
    if not own_process or not _gc.isenabled() or _gc.get_freeze_count():
        yield
        return
    _gc.collect()
    _gc.disable()
    try:
        yield
    finally:
        _gc.freeze()
        _gc.enable()
