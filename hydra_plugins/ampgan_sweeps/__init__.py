"""ampgan's Hydra plugins (Hydra loads plugins only from the `hydra_plugins` package).

`ParallelLauncher` (`hydra/launcher=parallel`) is Hydra's joblib launcher plus a per-job CPU
thread count: MindSpore would otherwise give every one of `n_jobs` concurrent jobs all the
machine's cores. Each job gets `hardware.threads=<threads_per_job>` (0: CPUs // n_jobs) unless
the command line sets `hardware.threads` itself.

`submitit_slurm.SlurmLauncher` (`hydra/launcher=slurm`) is Hydra's submitit SLURM launcher whose jobs report a
job that exits (ampgan's one-line errors end the process with `sys.exit(2)`) as a failed job
with that line: submitit records no result for a process that exits, and without SLURM
accounting the submitting process would wait for it for ever. Its submitting process also reads
the queue: a job SLURM could not launch (requeued held) ends the sweep with one line.

`ResumeSweeper` (`hydra/sweeper=resume`) re-runs the jobs of a sweep that are missing, FAILED or
KILLED; `python -m ampgan.sweep resume <sweep>` starts it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

from ampgan.config.hydra_compat import basic_sweeper

BasicSweeper = basic_sweeper()  # loaded by Hydra's plugin scan right before this module

log = logging.getLogger("ampgan")

THREADS_KEY = "hardware.threads"


def threads_for(n_jobs: int, threads_per_job: int = 0) -> int:
    """The CPU threads each of `n_jobs` concurrent jobs gets (`threads_per_job`, or an even share)."""
    if threads_per_job > 0:
        return threads_per_job
    cpus = os.cpu_count() or 1
    jobs = cpus if n_jobs <= 0 else min(n_jobs, cpus)  # joblib: -1 = one job per CPU
    return max(1, cpus // max(jobs, 1))


class ParallelLauncher(JoblibLauncher):
    """Jobs in `n_jobs` worker processes (loky), each with its own CPU thread count."""

    def __init__(self, threads_per_job: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.threads_per_job = threads_per_job

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        threads = threads_for(int(self.joblib.get("n_jobs", -1)), self.threads_per_job)
        jobs = [list(job) if any(w.lstrip("+~").split("=")[0] == THREADS_KEY for w in job)
                else [*job, f"{THREADS_KEY}={threads}"] for job in job_overrides]
        return super().launch(jobs, initial_job_idx)


class ResumeSweeper(BasicSweeper):
    """`hydra/sweeper=resume`: runs only the jobs of `hydra.sweep.dir` that are not FINISHED (ampgan.sweep).

    Started by `python -m ampgan.sweep resume <sweep>` with the sweep's own command line. Each job
    runs in its own folder (`hydra.sweep.subdir=<its number>`); KILLED / FAILED runs with a
    checkpoint continue (`trainer.resume=<run id>`). The sweep's multirun.yaml is kept as it was.
    """

    def sweep(self, arguments: list[str]) -> Any:
        from ampgan.sweeps.jobs import load_sweep, resume_jobs, retag

        sweep = load_sweep(str(self.config.hydra.sweep.dir))
        jobs = resume_jobs(sweep)
        log.info(f"sweep {sweep.id}: resuming {len(jobs)} of {len(sweep.jobs)} jobs")
        results = self.launcher.launch(jobs, initial_job_idx=0) if jobs else []
        retag(load_sweep(str(sweep.folder)))
        for r in results:
            _ = r.return_value  # a failed job fails the command, as in Hydra's basic sweeper
        return [results]
