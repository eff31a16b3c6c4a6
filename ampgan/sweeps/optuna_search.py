"""`python -m ampgan.search`: Optuna search over ampgan's settings, trials run by parallel workers.

    python -m ampgan.search --trials 12 --workers 2 trainer=smoke \\
        'scaler=choice(dynamic,fixed_clip)' 'scaler.clip_norm=tag(log,interval(0.1,10))' 'amp=choice(o0,o2)'
    python -m ampgan.search worker --storage postgresql+psycopg://... --study <id>   # one more worker, anywhere

The search space is written in Hydra's sweep grammar: `choice(a,b)` (categorical), `interval(lo,hi)`
(float; `tag(log, interval(...))` on a log scale), `range(a,b)` (int); every other override is
fixed. A key of a group option that a trial did not choose (`scaler.clip_norm` under
`scaler=dynamic`) is not suggested in that trial. The objective is what `train()` returns, and
the direction comes from the task (minimise `eval/swd` for WGAN-GP, maximise `eval/accuracy`).

Every worker shares one Optuna study through its storage: by default a journal file in the
search folder (safe for several processes on one machine); `--storage` takes a database URL
(`postgresql+psycopg://...` on a cluster: the PostgreSQL of `make server`, see
`devtools.services.Server.database`). Each trial is one ampgan job of the search's sweep: its
MLflow run has the tags `sweep_id` (the search's id), `sweep_dir`, `job_num` (the trial number)
and `overrides`, its folder is `<search folder>/<trial number>`, and a line is printed as it
ends. A trial that fails (an error, a diverged run, a non-finite objective) is recorded as
FAILED with its reason (`error` user attribute), never as NaN.

Hydra's Optuna sweeper is not used: it pins optuna<3, whose database storages do not work with
SQLAlchemy 2 (which MLflow needs), so its studies live in one process's memory and cannot be
shared by workers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ampgan import AmpganError, report_error

JOURNAL = "optuna.journal"


class TrialFailed(Exception):
    """A trial whose run did not give a usable objective (diverged, non-finite)."""


# ---------------------------------------------------------------- the search space
@dataclass
class Param:
    key: str
    kind: str            # choice | float | int
    values: list | None = None
    low: float = 0.0
    high: float = 0.0
    log: bool = False

    def suggest(self, trial):
        if self.kind == "choice":
            return trial.suggest_categorical(self.key, self.values)
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.key, self.low, self.high, log=self.log)


def parse_space(words: list[str]) -> tuple[list[str], list[Param]]:
    """(fixed overrides, search parameters) from Hydra override words."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
    from hydra.errors import HydraException

    fixed, space = [], []
    for word in words:
        try:
            ov = OverridesParser.create().parse_overrides([word])[0]
        except HydraException as err:
            raise AmpganError(f"{word}: not an override Hydra can read ({str(err).splitlines()[0]})") from None
        if not ov.is_sweep_override():
            fixed.append(word)
            continue
        key, value = ov.get_key_element(), ov.value()
        log = "log" in (getattr(value, "tags", None) or set())
        if isinstance(value, ChoiceSweep):
            space.append(Param(key, "choice", [str(v) if not isinstance(v, (int, float)) else v for v in value.list]))
        elif isinstance(value, IntervalSweep):
            space.append(Param(key, "float", low=float(value.start), high=float(value.end), log=log))
        elif isinstance(value, RangeSweep):
            space.append(Param(key, "int", low=value.start, high=value.stop - 1, log=log))
        else:
            raise AmpganError(f"{word}: a search takes choice(), interval() or range() (a,b lists: choice(a,b))")
    return fixed, space


DEFAULT_SPACE = ["scaler=choice(dynamic,fixed_clip)", "scaler.clip_norm=tag(log,interval(0.1,10))", "amp=choice(o0,o2)"]


# ---------------------------------------------------------------- one trial: an ampgan job of the search's sweep
class Worker:
    """Runs trials of a study in this process, each as a Hydra job in the search folder."""

    def __init__(self, storage: str, study_name: str):
        import optuna

        self.study = optuna.load_study(study_name=study_name, storage=open_storage(storage))
        spec = self.study.user_attrs["spec"]
        self.fixed, self.space = spec["fixed"], [Param(**p) for p in spec["space"]]
        self.folder, self.trials = Path(spec["folder"]), spec["trials"]

    def run(self) -> None:
        import optuna
        from optuna.study import MaxTrialsCallback

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if self._count() >= self.trials:
            return
        self.study.optimize(self.objective, callbacks=[MaxTrialsCallback(self.trials, states=None)],
                            catch=(Exception,), gc_after_trial=False)

    def _count(self) -> int:
        return len(self.study.get_trials(deepcopy=False))

    def objective(self, trial) -> float:
        words = list(self.fixed)
        for param in self.space:  # group choices first: they decide which keys exist
            if "." not in param.key:
                words.append(f"{param.key}={param.suggest(trial)}")
        present = self._compose(words)
        for param in self.space:
            if "." in param.key and _has(present, param.key):
                words.append(f"{param.key}={param.suggest(trial)}")
        try:
            value, run_id = self._run_job(words, trial.number)
        except Exception as err:  # FAILED with its reason (Optuna records the trial as FAIL, never NaN)
            trial.set_user_attr("error", " ".join(f"{type(err).__name__}: {err}".split())[:1000])
            raise
        if run_id:
            trial.set_user_attr("run_id", run_id)
        return value

    def _compose(self, words: list[str]):
        from hydra.types import RunMode

        return _hydra().compose_config("train", overrides=words, run_mode=RunMode.RUN, with_log_configuration=False)

    def _run_job(self, words: list[str], num: int) -> tuple[float, str]:
        from hydra.core.hydra_config import HydraConfig
        from hydra.core.utils import JobStatus, run_job
        from hydra.types import HydraContext, RunMode
        from omegaconf import open_dict

        from ampgan.config.hydra_compat import Callbacks
        from ampgan.training.entry import train

        hydra = _hydra()
        cfg = hydra.compose_config("train", overrides=[*words, f"hydra.sweep.dir={self.folder}"],
                                   run_mode=RunMode.MULTIRUN, with_log_configuration=False)
        with open_dict(cfg):
            cfg.hydra.job.name, cfg.hydra.job.num, cfg.hydra.job.id = "train", num, f"train_{num}"
            cfg.hydra.mode = RunMode.MULTIRUN  # a job of the search's sweep (its run gets the sweep's tags)
        HydraConfig.instance().set_config(cfg)
        cwd = os.getcwd()
        try:
            ret = run_job(hydra_context=HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(cfg)),
                          task_function=train, config=cfg, job_dir_key="hydra.sweep.dir",
                          job_subdir_key="hydra.sweep.subdir")
        finally:
            os.chdir(cwd)
        folder = Path(str(ret.working_dir or self.folder / str(num)))
        run_id = _run_id(folder)
        if ret.status != JobStatus.COMPLETED:
            raise ret._return_value
        value = float(ret.return_value)
        outcome = _outcome(folder, run_id)
        if outcome == "diverged":
            raise TrialFailed(f"trial {num} diverged (run {run_id})")
        if not math.isfinite(value):
            raise TrialFailed(f"trial {num}: objective {value} (run {run_id})")
        return value, run_id


def _has(cfg, dotted: str) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, dotted, default="__absent__") != "__absent__"


def _run_id(folder: Path) -> str:
    try:
        return json.loads((folder / "tracking.json").read_text())["run_id"]
    except (OSError, ValueError, KeyError):
        return ""


def _outcome(folder: Path, run_id: str) -> str:
    if not run_id:
        return ""
    from ampgan.tracking.tracker import make_client

    record = json.loads((folder / "tracking.json").read_text())
    return make_client(record["uri"]).get_run(run_id).data.tags.get("outcome", "")


_HYDRA = None


def _hydra():
    """This process's Hydra (config search path = conf/), initialised once."""
    global _HYDRA
    if _HYDRA is None:
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        from ampgan.config.schema import CONF_DIR

        if not GlobalHydra.instance().is_initialized():
            initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3")
        _HYDRA = GlobalHydra.instance().hydra
    return _HYDRA


def open_storage(spec: str):
    """A journal file (a path ending in .journal) or a database URL (sqlite:///, postgresql+psycopg://...)."""
    if spec.endswith(".journal"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        return JournalStorage(JournalFileBackend(spec))
    from optuna.storages import RDBStorage

    return RDBStorage(spec, heartbeat_interval=60, grace_period=300)


# ---------------------------------------------------------------- the search
def create(words: list[str], trials: int, storage: str | None, workers: int = 1) -> tuple[str, str, Path, str]:
    """Validate, make the search folder and the study; (storage, study name, folder, direction)."""
    import optuna
    from hydra.types import RunMode

    from ampgan.config.schema import outputs_dir, validate
    from ampgan.config.preflight import check

    fixed, space = parse_space(words if any("(" in w for w in words) else [*words, *DEFAULT_SPACE])
    if not any(w.lstrip("+~").startswith("hardware.threads=") for w in fixed):  # workers share the CPUs
        fixed.append(f"hardware.threads={max(1, (os.cpu_count() or 1) // workers)}")
    if not space:
        raise AmpganError("nothing to search: give at least one choice(), interval() or range() override")
    groups = [f"{p.key}={','.join(map(str, p.values))}" for p in space if p.kind == "choice" and "." not in p.key]
    check(["-m", *fixed, *groups])  # every fixed value and every group option, one line if wrong
    settings = validate(_strip(_hydra().compose_config("train", overrides=fixed, run_mode=RunMode.RUN,
                                                     with_log_configuration=False)))
    from ampgan.tasks import task_class

    direction = task_class(settings).direction
    if any(p.key in ("model", "model.name") for p in space):
        raise AmpganError("model: a search optimises one task's objective; search one model at a time")
    stamp = datetime.now().strftime("%Y-%m-%d/%H-%M-%S-%f")  # the layout of Hydra's sweep folders
    folder = outputs_dir() / "multirun" / stamp
    folder.mkdir(parents=True, exist_ok=True)
    storage = storage or str(folder / JOURNAL)
    name = folder.name
    study = optuna.create_study(study_name=name, storage=open_storage(storage), direction=direction)
    study.set_user_attr("spec", {"fixed": fixed, "space": [vars(p) for p in space], "folder": str(folder),
                                 "trials": trials})
    study.set_user_attr("objective", task_class(settings).objective)
    return storage, name, folder, direction


def _strip(cfg):
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.pop("hydra", None)
    return cfg


def run_search(words: list[str], trials: int, workers: int, storage: str | None) -> int:
    import optuna

    from ampgan.sweeps.jobs import PROGRESS, ProgressWatcher

    storage, name, folder, direction = create(words, trials, storage, workers)
    print(f"search {name}: {trials} trials, {workers} workers, {direction} "
          f"{optuna.load_study(study_name=name, storage=open_storage(storage)).user_attrs['objective']}; "
          f"folder {folder}; study storage {storage}", flush=True)
    watch = ProgressWatcher(folder / PROGRESS, 0.5)
    watch.start()
    started = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "ampgan.search", "worker", "--storage", storage, "--study", name])
             for _ in range(workers)]
    try:
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        for p in procs:
            p.terminate()
        codes = [p.wait() for p in procs]
    watch.stop()
    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    states = [t.state.name for t in study.trials]
    print(f"search {name}: {len(states)} trials in {time.time() - started:.0f}s: "
          + ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states))), flush=True)
    try:
        best = study.best_trial
    except ValueError:
        return report_error("no trial completed", code=1)
    print(f"best: trial {best.number} value {best.value:.6g} params {json.dumps(best.params)} "
          f"run {best.user_attrs.get('run_id', '-')}", flush=True)
    (folder / "best.json").write_text(json.dumps({"trial": best.number, "value": best.value, "params": best.params,
                                                   "run_id": best.user_attrs.get("run_id")}, indent=1))
    return 0 if all(c == 0 for c in codes) else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        parser = argparse.ArgumentParser(prog="python -m ampgan.search worker")
        parser.add_argument("--storage", required=True)
        parser.add_argument("--study", required=True)
        args = parser.parse_args(argv[1:])
        Worker(args.storage, args.study).run()
        return 0
    parser = argparse.ArgumentParser(prog="python -m ampgan.search", description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12, help="trials in all (every worker counts toward it)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes on this machine")
    parser.add_argument("--storage", help="study storage URL shared by the workers (default: a journal file)")
    parser.add_argument("overrides", nargs="*", help="fixed overrides and the space: choice(), interval(), range()")
    args = parser.parse_args(argv)
    try:
        if args.trials < 1 or args.workers < 1:
            raise AmpganError("--trials and --workers must be >= 1")
        return run_search(args.overrides, args.trials, args.workers, args.storage)
    except AmpganError as err:
        return report_error(err)
