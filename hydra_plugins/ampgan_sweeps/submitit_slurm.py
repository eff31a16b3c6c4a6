"""`hydra/launcher=slurm`: Hydra's submitit SLURM launcher, whose jobs report a job that exits, and
whose submitting process watches the queue for jobs that will not start.

- ampgan's one-line errors end the process with `sys.exit(2)`; in a SLURM job submitit then
  records no result, and without SLURM accounting the submitting process would wait for it for
  ever. Here such a job is a failed job (`JobExited`, with its `ampgan: error: ...` line),
  reported by the submitting process like any other failure.
- A job that SLURM could not launch (its node's slurmd failed to start it: a bad spool folder,
  a failing prolog, a Unix socket path over 108 bytes) is requeued held ("launch failed requeued
  held") and would keep submitit waiting for ever too. `QueueWatch` reads the queue (`squeue`)
  every few seconds while the sweep runs: such a job ends the sweep with one line, after the
  sweep's jobs that have not started are cancelled (running jobs go on and log their runs). A
  job held on purpose (`scontrol hold`, `sbatch --hold`) gets one line saying what it waits for.
- submitit follows its jobs' states with `sacct`, which needs SLURM's accounting storage. Where
  SLURM keeps none (`AccountingStorageType=accounting_storage/none`), every poll fails and prints
  two lines of noise, one of them from the `sacct` child itself, possibly after the sweep's own
  error line. There `sacct` is not called (`job_states`): the jobs are followed by their result
  files and the queue watch, which is all a failing `sacct` left submitit anyway.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher


SUBMITIT_POLL_DELAY_S = 600  # submitit's own longest delay between two polls of its SLURM jobs' states


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


class QueueWatch:
    """A thread that reads the queue for the jobs submitted from `folder` (submitit's submission
    scripts are there, and squeue shows a job's script as its command) until `stop()`.

    A job that could not launch sets `failure` (one line) after cancelling the jobs from `folder`
    that have not started, and the watch ends.
    """

    LAUNCH_FAILED = "launch failed"  # squeue's reason, e.g. "launch failed requeued held"
    ON_HOLD = ("JobHeldUser", "JobHeldAdmin")

    def __init__(self, folder: Path, poll_seconds: float = 5.0) -> None:
        self.prefix = f"{Path(folder).absolute()}/"
        self.poll_seconds = poll_seconds
        self.failure: str | None = None
        self._told: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ampgan-slurm-queue", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            jobs = self.jobs()
            if jobs is not None and self.check(jobs):
                return

    def jobs(self) -> list[tuple[str, str, str]] | None:
        """(job id, state, reason) of this sweep's jobs in the queue; None if squeue cannot be read."""
        try:
            out = subprocess.run(["squeue", "-h", "--me", "-o", "%i|%T|%r|%o"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode != 0:
            return None
        rows = [line.split("|", 3) for line in out.stdout.splitlines()]
        return [(r[0], r[1], r[2]) for r in rows if len(r) == 4 and r[3].startswith(self.prefix)]

    def check(self, jobs: list[tuple[str, str, str]]) -> bool:
        """Say what a held job waits for (once); True if a job could not launch (the sweep ends)."""
        for job, state, reason in jobs:
            if reason.startswith(self.LAUNCH_FAILED):
                self._cancel_pending(jobs)
                self.failure = (f"SLURM could not launch job {job} of this sweep ({reason}): the slurmd log of the node it "
                                "was sent to says why; the sweep's jobs that had not started were cancelled")
                return True
            if reason in self.ON_HOLD and job not in self._told:
                self._told.add(job)
                which = job.split("_")[0] if "[" in job else job   # 12_[0-3%2]: the array's waiting tasks
                print(f"[sweep] SLURM job {job} is held ({reason}): it waits for `scontrol release {which}`", flush=True)
        return False

    @staticmethod
    def _cancel_pending(jobs: list[tuple[str, str, str]]) -> None:
        arrays = sorted({job.split("_")[0] for job, state, _ in jobs if state == "PENDING"})  # 12_3, 12_[4-7] -> 12
        if arrays:
            subprocess.run(["scancel", "--state=PENDING", *arrays], capture_output=True, timeout=60)


def slurm_keeps_accounting() -> bool:
    """Whether SLURM has an accounting storage that `sacct` can read (unknown: True)."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return True
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageType":
            return value.strip() not in ("", "(null)", "accounting_storage/none")
    return True


def job_states(asks_sacct: bool) -> Any:
    """submitit's poller of its SLURM jobs' states, to stand in SlurmJob.watcher (shared by the
    process's jobs): it asks `sacct` only if `asks_sacct`, and not at all once `stop()` is called.
    (submitit is imported here, not with the module: Hydra imports every launcher plugin.)"""
    from submitit.slurm.slurm import SlurmInfoWatcher

    class JobStates(SlurmInfoWatcher):
        def __init__(self) -> None:
            super().__init__(delay_s=SUBMITIT_POLL_DELAY_S)
            self.asks_sacct = asks_sacct

        def stop(self) -> None:
            self.asks_sacct = False

        def _make_command(self) -> list[str] | None:  # None: no call (submitit's own "nothing to ask")
            return super()._make_command() if self.asks_sacct else None

    return JobStates()


class SlurmLauncher(SubmititSlurmLauncher):
    """Hydra's submitit SLURM launcher; a job that exits is a failed job with its error line, and a
    job that cannot launch ends the sweep with one line."""

    def launch(self, job_overrides: Any, initial_job_idx: int) -> Any:  # runs where the sweep is submitted
        from submitit.core.utils import JobPaths
        from submitit.slurm.slurm import SlurmJob

        from ampgan import report_error

        # submitit submits, then waits on the jobs in a thread of its own here, so that this one can
        # end the sweep when the watch finds a job that cannot launch (a signal to this thread would
        # not do: a sweep started in the background of a script ignores SIGINT)
        watch = QueueWatch(JobPaths.get_first_id_independent_folder(self.params["submitit_folder"]))
        outcome: dict[str, Any] = {}

        def submit_and_wait() -> None:
            try:
                outcome["returns"] = SubmititSlurmLauncher.launch(self, job_overrides, initial_job_idx)
            except BaseException as err:  # noqa: BLE001 - raised again below, in the sweep's thread
                outcome["error"] = err

        waiter = threading.Thread(target=submit_and_wait, name="ampgan-slurm-wait", daemon=True)
        states = job_states(asks_sacct=slurm_keeps_accounting())
        saved, SlurmJob.watcher = SlurmJob.watcher, states
        watch.start()
        waiter.start()
        try:
            while waiter.is_alive() and watch.failure is None:
                waiter.join(timeout=0.5)
        finally:
            watch.stop()
            abandoned = waiter.is_alive()   # left to end with the process (the watch failed the sweep, or Ctrl-C)
            if abandoned:   # it asks nothing more, so it says nothing more
                states.stop()
            else:
                SlurmJob.watcher = saved
        if abandoned:   # the loop ended on the watch's failure
            sys.exit(report_error(watch.failure, code=1))
        if "error" in outcome:
            raise outcome["error"]
        return outcome["returns"]

    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:  # runs in the SLURM job
        self.task_function = _reporting_exits(self.task_function)
        return super().__call__(*args, **kwargs)
