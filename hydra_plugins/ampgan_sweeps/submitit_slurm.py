"""`hydra/launcher=slurm`: Hydra's submitit SLURM launcher, whose jobs report a job that exits.

ampgan's one-line errors end the process with `sys.exit(2)`; in a SLURM job submitit then records
no result, and without SLURM accounting the submitting process would wait for it for ever. Here
such a job is a failed job (`JobExited`, with its `ampgan: error: ...` line), reported by the
submitting process like any other failure.
"""

from __future__ import annotations

from typing import Any

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher


class JobExited(RuntimeError):
    """A job's task function ended its process (`sys.exit`) instead of returning or raising."""


class _StderrTail:
    """sys.stderr that also keeps its last lines (the job's error line)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.lines = stream, []

    def write(self, text: str) -> int:
        self.lines = (self.lines + [ln for ln in text.splitlines() if ln.strip()])[-20:]
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _reporting_exits(task_function: Any) -> Any:
    def task(cfg: Any) -> Any:
        import sys

        tail, saved = _StderrTail(sys.stderr), sys.stderr
        sys.stderr = tail
        try:
            return task_function(cfg)
        except SystemExit as err:
            if err.code in (0, None):
                raise
            said = [ln for ln in tail.lines if ln.startswith("ampgan:")] or tail.lines or ["(nothing on stderr)"]
            raise JobExited(f"exit code {err.code}: {said[-1]}") from None
        finally:
            sys.stderr = saved

    return task


class SlurmLauncher(SubmititSlurmLauncher):
    """Hydra's submitit SLURM launcher; a job that exits is a failed job with its error line."""

    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:  # runs in the SLURM job
        self.task_function = _reporting_exits(self.task_function)
        return super().__call__(*args, **kwargs)
