"""`python -m ampgan.sweep status|resume <sweep_id | sweep folder>`: a sweep's jobs, and finishing them.

    python -m ampgan.sweep status 14-03-22-123456     # each job: state, objective, what resume would do
    python -m ampgan.sweep resume 14-03-22-123456     # run only what is missing, FAILED or KILLED
    python -m ampgan.sweep resume 14-03-22-123456 hydra/launcher=parallel   # ... with another launcher

A job's identity is its sweep plus a hash of its overrides (`job_key`; `trainer.resume` and
`hardware.threads` left out, since a resumed job adds or changes them). The sweep's full job
list comes from its folder's `multirun.yaml` (expanded as Hydra's basic sweeper does), each
job's runs from the store (tags `sweep_id`, `sweep_dir`, `overrides`). `resume`:

- a job with a FINISHED run is left alone, one whose run is RUNNING (its process alive) too;
- a KILLED or FAILED run (a hard-killed run is first ended FAILED "process lost") with a
  checkpoint continues from it, in the same MLflow run (`trainer.resume=<run id>`);
- a FAILED or KILLED run without a checkpoint has nothing to continue: it is deleted (MLflow's
  trash; `mlflow gc` or the UI can bring it back) and the job runs afresh, so that each job
  has one run; a job that never started runs afresh.

The jobs run through the sweep's own launcher (or the one given), in their own folders
(`<sweep dir>/<job number>`), by Hydra's sweeper `hydra/sweeper=resume`
(`hydra_plugins.ampgan_sweeps.ResumeSweeper`), which `resume` starts for you.

`SweepProgress` (a Hydra callback, conf/hydra/default.yaml) prints a line per finished job as
a sweep goes (overrides, outcome, objective, time; failures with their error), whatever the
launcher: jobs append to `<sweep dir>/progress.jsonl`, the launching process prints it.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import logging
import math
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from ampgan import AmpganError, report_error

log = logging.getLogger("ampgan")

PROGRESS = "progress.jsonl"
IDENTITY_IGNORES = ("trainer.resume", "hardware.threads", "trainer.print_every", "trainer.print_seconds")
HYDRA_OVERRIDES_DROPPED = ("hydra.sweep.dir", "hydra/sweeper", "hydra.sweeper", "hydra.mode")
_WORD = re.compile(r",(?=[+~]*[A-Za-z_][\w./@-]*=)")  # splits "a=1,b=[x,y]" between overrides only


# ---------------------------------------------------------------- identity
def split_overrides(tag: str) -> list[str]:
    """The `overrides` tag (",".join of a job's overrides) back into its words."""
    return [w for w in _WORD.split(tag) if w] if tag else []


def job_key(overrides: list[str]) -> str:
    """A job's stable identity within its sweep: a hash of its overrides (resume settings left out)."""
    words = sorted(w for w in overrides if _key(w) not in IDENTITY_IGNORES and not _key(w).startswith("hydra"))
    return hashlib.sha1("\n".join(words).encode()).hexdigest()[:12]


def _key(word: str) -> str:
    return word.lstrip("+~").split("=", 1)[0]


# ---------------------------------------------------------------- a sweep's jobs
@dataclass
class Job:
    num: int
    overrides: list[str]
    key: str
    runs: list = field(default_factory=list)  # this job's MLflow runs, newest first

    @property
    def run(self):
        return self.runs[0] if self.runs else None

    @property
    def state(self) -> str:
        if any(r.info.status == "FINISHED" for r in self.runs):
            return "FINISHED"
        return self.run.info.status if self.run else "MISSING"

    @property
    def checkpoint(self) -> Path | None:
        from ampgan.training import checkpoint

        folder = Path(self.run.data.tags.get("output_dir", "")) / "checkpoints" if self.run else None
        return checkpoint.latest(folder) if folder and folder.is_dir() else None

    @property
    def action(self) -> str:
        """What `resume` does: done, running, continue (from a checkpoint), rerun (replaces a run) or run."""
        state = self.state
        if state in ("FINISHED", "RUNNING"):
            return {"FINISHED": "done", "RUNNING": "running"}[state]
        if state == "MISSING":
            return "run"
        return "continue" if self.checkpoint is not None else "rerun"

    @property
    def objective(self) -> float | None:
        for run in self.runs:
            from ampgan.reporting.sweep_report import objective_of

            if run.info.status == "FINISHED" and (key := objective_of(run)):
                return run.data.metrics[key]
        return None


@dataclass
class Sweep:
    folder: Path
    config: DictConfig      # multirun.yaml: the sweep's primary config and its command line
    uri: str
    experiment: str
    jobs: list[Job]

    @property
    def id(self) -> str:
        return self.folder.name

    def client(self):
        from ampgan.tracking.tracker import make_client

        return make_client(self.uri)

    @property
    def command(self) -> list[str]:
        """The sweep's overrides (task and hydra), without those that choose its folder, sweeper or mode."""
        hydra_words = [w for w in self.config.hydra.overrides.hydra if not _key(w).startswith(HYDRA_OVERRIDES_DROPPED)]
        return [*self.config.hydra.overrides.task, *hydra_words]


def find_sweep_dir(spec: str, uri: str | None = None) -> Path:
    """A sweep folder from its id (the folder's name), its path, or a store that has runs of it."""
    from ampgan.config.schema import TrackingConfig, outputs_dir

    path = Path(spec).expanduser()
    if (path / "multirun.yaml").exists():
        return path.resolve()
    found = sorted(outputs_dir().glob(f"multirun/*/{spec}/multirun.yaml"))
    if len(found) == 1:
        return found[0].parent
    if len(found) > 1:
        raise AmpganError(f"sweep {spec}: several folders have that id ({', '.join(str(p.parent) for p in found)}); "
                          "give the folder instead")
    from ampgan.tracking.tracker import make_client

    uri = uri or TrackingConfig().uri
    client = make_client(uri)
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id], f"tags.sweep_id = '{spec}'", max_results=5):
            folder = Path(run.data.tags.get("sweep_dir", ""))
            if (folder / "multirun.yaml").exists():
                return folder
    raise AmpganError(f"sweep {spec}: no such sweep folder under {outputs_dir() / 'multirun'} and no run of it in {uri}")


def load_sweep(spec: str, uri: str | None = None) -> Sweep:
    """The sweep's every job (from its multirun.yaml) with the runs the store has of each."""
    from ampgan.config.schema import TrackingConfig

    folder = find_sweep_dir(spec, uri)
    config = OmegaConf.load(folder / "multirun.yaml")
    node = OmegaConf.to_container(config.get("tracking", {}), resolve=True) or {}
    tracking = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrackingConfig), node))
    if tracking.backend != "mlflow":
        raise AmpganError(f"sweep {folder.name}: ran with tracking=none, so no store knows its jobs")
    sweep = Sweep(folder, config, uri or tracking.uri, tracking.experiment, [])
    sweep.jobs = [Job(i, words, job_key(words)) for i, words in enumerate(expand(config))]
    by_key = {job.key: job for job in sweep.jobs}
    for run in sweep_runs(sweep):
        job = by_key.get(job_key(split_overrides(run.data.tags.get("overrides", ""))))
        if job is not None:
            job.runs.append(run)
    return sweep


def expand(config: DictConfig) -> list[list[str]]:
    """Every job's overrides, in Hydra's order: the sweeper's params first, then the command line."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ampgan.config.hydra_compat import basic_sweeper
    from ampgan.config.schema import CONF_DIR

    params = config.hydra.sweeper.get("params")
    words = [f"{k}={v}" for k, v in (OmegaConf.to_container(params, resolve=False) if params else {}).items()]
    words += list(config.hydra.overrides.task)
    fresh = not GlobalHydra.instance().is_initialized()
    if fresh:
        initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3")
    try:
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().hydra.config_loader)
        batches = basic_sweeper().split_arguments(parser.parse_overrides(words), None)
    finally:
        if fresh:
            GlobalHydra.instance().clear()
    return [list(job) for batch in batches for job in batch]


def sweep_runs(sweep: Sweep) -> list:
    """The sweep's job runs, newest first (lost ones ended first; a sweep's parent run left out)."""
    from ampgan.reporting.sweep_report import PARENT_TAG
    from ampgan.tracking.store_sync import end_lost_runs

    client = sweep.client()
    exp = client.get_experiment_by_name(sweep.experiment)
    if exp is None:
        return []
    end_lost_runs(client, exp.experiment_id)
    runs = client.search_runs([exp.experiment_id], f"tags.sweep_id = '{sweep.id}'",
                              order_by=["attributes.start_time DESC"], max_results=5000)
    return [r for r in runs if r.data.tags.get("sweep_dir") == str(sweep.folder) and PARENT_TAG not in r.data.tags]


def resume_jobs(sweep: Sweep) -> list[list[str]]:
    """The jobs `resume` launches, as override lists; runs that will be replaced are deleted here."""
    client = sweep.client()
    out = []
    for job in sweep.jobs:
        action = job.action
        if action in ("done", "running"):
            continue
        words = [*job.overrides, f"hydra.sweep.subdir={job.num}"]
        if action == "continue":
            words.append(f"trainer.resume={job.run.info.run_id}")
        elif action == "rerun":
            for run in job.runs:
                client.set_tag(run.info.run_id, "ampgan.replaced", "by a resumed sweep (no checkpoint to continue)")
                client.delete_run(run.info.run_id)
            folder = sweep.folder / str(job.num)
            if folder.is_dir():  # the new run starts a journal of its own
                folder.rename(folder.with_name(f"{job.num}.replaced-{int(time.time())}"))
        out.append(words)
    return out


def retag(sweep: Sweep) -> None:
    """Give each job's runs its number in the sweep (a resumed job ran at another launcher index)."""
    client = sweep.client()
    for job in sweep.jobs:
        for run in job.runs:
            if run.data.tags.get("job_num") != str(job.num):
                client.set_tag(run.info.run_id, "job_num", str(job.num))


# ---------------------------------------------------------------- progress lines
class SweepProgress(Callback):
    """One line per finished job, printed by the launching process as the sweep goes."""

    def __init__(self, poll_seconds: float = 0.5) -> None:
        self.poll_seconds = poll_seconds
        self._started = 0.0
        self._watch: ProgressWatcher | None = None

    def __getstate__(self) -> dict:  # launchers pickle the callbacks to their workers: the watcher stays here
        return {**self.__dict__, "_watch": None}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._watch = ProgressWatcher(Path(config.hydra.sweep.dir) / PROGRESS, self.poll_seconds)
        self._watch.start()
        atexit.register(self._watch.stop)  # a failed job ends the sweep without on_multirun_end

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._watch is not None:
            self._watch.stop()
            atexit.unregister(self._watch.stop)
            self._watch = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._started = time.time()

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus

        if config.hydra.mode is None or config.hydra.mode.name != "MULTIRUN":
            return
        record: dict[str, Any] = {"job": int(config.hydra.job.num), "overrides": list(config.hydra.overrides.task),
                                  "seconds": round(time.time() - self._started, 1),
                                  "folder": str(config.hydra.runtime.output_dir)}
        if job_return.status == JobStatus.COMPLETED:
            value = job_return.return_value
            record["outcome"] = "FINISHED"
            record["objective"] = float(value) if isinstance(value, (int, float)) else None
        else:
            err = job_return._return_value
            record["outcome"] = "KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED"
            record["error"] = " ".join(f"{type(err).__name__}: {err}".split())[:500]
        try:
            record["run_id"] = json.loads((Path(record["folder"]) / "tracking.json").read_text())["run_id"]
        except (OSError, ValueError, KeyError):
            pass
        line = json.dumps(record, allow_nan=True) + "\n"
        fd = os.open(Path(config.hydra.sweep.dir) / PROGRESS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write with O_APPEND: lines of parallel jobs do not mix
        finally:
            os.close(fd)


def progress_line(r: dict, done: int) -> str:
    objective = r.get("objective")
    shown = "-" if objective is None else f"{objective:.4g}" if math.isfinite(objective) else str(objective)
    words = " ".join(w for w in r.get("overrides", []) if _key(w) not in IDENTITY_IGNORES)
    text = f"[sweep] job {r['job']} {r['outcome']} in {r['seconds']:.1f}s ({done} done): {words or '(no overrides)'}" \
           f" | objective {shown}"
    return text + (f" | {r['error']}" if r.get("error") else "")


class ProgressWatcher:
    """Tails a sweep's progress file in a daemon thread and prints each new line once."""

    def __init__(self, path: Path, poll: float):
        self.path, self.poll = path, poll
        self.offset = path.stat().st_size if path.exists() else 0  # a resumed sweep: only new lines
        self.done = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sweep-progress", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._drain()

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            self._drain()

    def _drain(self) -> None:
        with self._lock:
            try:
                with self.path.open("rb") as f:
                    f.seek(self.offset)
                    data = f.read()
            except OSError:
                return
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
            self.offset += end
            for raw in data[:end].splitlines():
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                self.done += 1
                print(progress_line(record, self.done), file=sys.stderr if record["outcome"] != "FINISHED" else sys.stdout,
                      flush=True)


# ---------------------------------------------------------------- command line
def status_table(sweep: Sweep) -> str:
    rows = [("job", "state", "resume would", "objective", "run", "overrides")]
    for job in sweep.jobs:
        objective = job.objective
        rows.append((str(job.num), job.state + (f" x{len(job.runs)}" if len(job.runs) > 1 else ""), job.action,
                     "-" if objective is None else f"{objective:.4g}", job.run.info.run_id[:12] if job.run else "-",
                     " ".join(job.overrides)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def summary(sweep: Sweep) -> str:
    counts: dict[str, int] = {}
    for job in sweep.jobs:
        counts[job.state] = counts.get(job.state, 0) + 1
    return f"sweep {sweep.id} ({sweep.folder}): {len(sweep.jobs)} jobs, " + ", ".join(
        f"{n} {s}" for s, n in sorted(counts.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ampgan.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["status", "resume"])
    parser.add_argument("sweep", help="sweep id (its folder's name, the runs' sweep_id tag) or its folder")
    parser.add_argument("overrides", nargs="*", help="resume: Hydra overrides added to the sweep's own "
                        "(e.g. hydra/launcher=parallel); only hydra ones and those a resumed run may change")
    parser.add_argument("--uri", help="tracking store to look the sweep up in (default: the sweep's own)")
    args = parser.parse_args(argv)
    try:
        sweep = load_sweep(args.sweep, args.uri)
        if args.command == "status":
            print(summary(sweep))
            print(status_table(sweep))
            return 0
        todo = [j for j in sweep.jobs if j.action not in ("done", "running")]
        print(summary(sweep) + f"; resuming {len(todo)}: " + (", ".join(f"job {j.num} ({j.action})" for j in todo)
                                                              or "nothing to do"), flush=True)
        if not todo:
            return 0
        cmd = [sys.executable, "-m", "ampgan.train", "-m", *sweep.command, *args.overrides,
               f"hydra.sweep.dir={sweep.folder}", "hydra/sweeper=resume"]
        return subprocess.call(cmd)
    except AmpganError as err:
        return report_error(err)
