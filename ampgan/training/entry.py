"""The composition root of a training run: config -> build -> loop -> tracking; `train(cfg)` returns the objective.

`python -m ampgan.train` (ampgan/train.py) is its command.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ampgan import AmpganError, process_age
from ampgan.config.schema import PACKAGE_DIR, Settings, validate

log = logging.getLogger("ampgan")


_PROCESS_START = time.perf_counter() - process_age()  # perf_counter() at the process's start
_IMPORTS_DONE = False  # an earlier job of this process paid for the imports


def train(cfg: DictConfig, run_dir: Path | None = None) -> float:
    """Validate, build, train, evaluate and track one run; return the task's objective metric.

    With `trainer.resume` (or `trainer.requeue` and a requeued run of the same job), the run
    continues from its last full-state checkpoint, in its own folder and MLflow run.
    """
    from ampgan.training import checkpoint, graph_pool, hardware, parallel
    from ampgan.tasks import build_task, load_data
    from ampgan.tracking.tracker import flatten

    _pin_sources()
    global _IMPORTS_DONE
    # imports count once per process: a sweep's later jobs start with everything imported
    startup = {"startup/imports_s": 0.0 if _IMPORTS_DONE else time.perf_counter() - _PROCESS_START}
    _IMPORTS_DONE = True
    clock = time.perf_counter()
    settings = validate(cfg)
    resume = _resume_point(settings)
    if resume is not None:
        cfg = _resumed_config(cfg, checkpoint.run_folder_of(resume))
        settings = validate(cfg)
        run_dir = checkpoint.run_folder_of(resume)
    if parallel.launches(settings.hardware.workers):   # hardware.workers > 1: this process runs the ranks
        return parallel.launch(cfg, settings, Path(run_dir or _hydra_output_dir() or Path.cwd()), resume)
    hardware.setup(settings.hardware, settings.trainer.seed)
    data = load_data(settings)
    built = build_task(settings, data)
    host = checkpoint.load(built, resume) if resume is not None else {}
    reused = graph_pool.lend_graphs(built, settings)  # a sweep's next job: no compile
    task = parallel.shard(built, settings.trainer.batch_size)   # a rank: its slice of each batch
    run_dir = parallel.own_folder(Path(run_dir or _hydra_output_dir() or Path.cwd()))   # rank r > 0: ranks/rank-r
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    startup["startup/build_s"], clock = time.perf_counter() - clock, time.perf_counter()

    tracker, background = build_run_tracker(settings, run_dir, resume)
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    try:
        objective = _tracked_fit(task, tracker, settings, run_dir, params, startup, clock, resume, host, reused,
                                 background)
        graph_pool.give_back(built, settings)
        return objective
    except KeyboardInterrupt:
        if settings.trainer.requeue and tracker.run_id:  # the scheduler will start this job again
            tracker.set_tags({"ampgan.requeue": "pending"})
        raise
    except Exception as err:
        if isinstance(err, AmpganError) or any(st.pending or st.steps for st in task.states()):
            raise
        # the first step did not compile or run: most often a user's net, loss or optimizer that
        # MindSpore's graph mode cannot take (the run is FAILED, its error tag holds the whole message)
        from ampgan.config.targets import first_line

        raise AmpganError(f"the first training step failed ({type(err).__name__}: {first_line(err)}); "
                          "check model.net, model.loss and model.optimizer") from err


def _pin_sources() -> None:
    """Keep ampgan's source as imported for MindSpore's jit parser, whatever happens on disk later.

    ms.jit reads a function's source file (inspect -> linecache) each time it compiles. A process
    that runs several jobs (a sweep's loky worker, a search worker) would otherwise parse a file
    edited since it was imported at the old line numbers, i.e. the wrong lines ("Miss argument
    input for parameter: n_classes"). linecache never re-reads an entry whose mtime is None.
    """
    import linecache

    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.split(".")[0] != "ampgan" or not path or not path.endswith(".py"):
            continue
        entry = linecache.cache.get(path)
        if entry is not None and len(entry) == 4 and entry[1] is None:
            continue  # pinned by an earlier job of this process
        lines = linecache.getlines(path)
        if lines:
            linecache.cache[path] = (sum(map(len, lines)), None, lines, path)


def build_run_tracker(s: Settings, run_dir: Path, resume: Path | None = None):
    """(the run's tracker, whether a helper process runs it).

    With `tracking.background` the store is opened in a helper process once this one's first step
    is done (ampgan/tracking/helper.py: it overlaps the steps, not the compile); the helper ends
    the experiment's lost runs first. In process, that happens here, and a resumed run's journal
    reaches the store before it goes on.
    """
    from ampgan.tracking.store_sync import end_lost_runs, sync_folder
    from ampgan.tracking.tracker import build_tracker, store_failure
    from ampgan.tracking.helper import BackgroundTracker
    from ampgan.tracking.tracker import NullTracker
    from ampgan.training import parallel

    if not parallel.tracks():   # rank r > 0 of a data-parallel run: rank 0 tracks the run
        return NullTracker(), False
    t = s.tracking
    if tracks_in_background(s, resume):
        return BackgroundTracker(t.uri, t.experiment, t.flush_every, run_dir, t.heartbeat_seconds), True
    try:
        tracker = build_tracker(t, run_dir)
    except Exception as err:  # noqa: BLE001 - the store cannot be opened: one line, as from the helper
        raise AmpganError(store_failure(t.uri, err)) from err
    if t.backend == "mlflow":
        end_lost_runs(tracker.client, tracker.experiment_id)
        if resume is not None:
            sync_folder(run_dir, end=False)  # what a hard kill left in the journal reaches the store first
    return tracker, False


def tracks_in_background(s: Settings, resume: Path | None) -> bool:
    """`tracking.background`: a new, non-requeueable MLflow run, and (auto) MLflow not loaded yet here,
    i.e. its import and the store's opening would otherwise come before the compile."""
    if s.tracking.backend != "mlflow" or resume is not None or s.trainer.requeue or s.tracking.background == "never":
        return False
    return s.tracking.background == "always" or "mlflow" not in sys.modules


def _tracked_fit(task, tracker, settings: Settings, run_dir: Path, params: dict, startup: dict, clock: float,
                 resume: Path | None, host: dict, reused: bool, background: bool = False) -> float:
    from ampgan.tracking.tracker import DIRECTION_TAG, OBJECTIVE_TAG
    from ampgan.training.loop import fit, tracked_run

    tags = {**_tags(settings, run_dir), "ampgan.graphs": "reused" if reused else "compiled",
            "ampgan.tracking": "helper" if background else "process",
            OBJECTIVE_TAG: task.objective, DIRECTION_TAG: task.direction}
    with tracked_run(tracker, _run_name(settings), params, tags, host.get("run_id")):
        if resume is not None:
            log.info(f"resuming run {tracker.run_id} from step {host['step']} ({resume})")
            tracker.set_tags({"ampgan.resumed_from_step": str(host["step"])})
        else:
            run_id = "(its id: from the tracking helper)" if background else tracker.run_id or "(not tracked)"
            log.info(f"run {run_id}: {_run_name(settings)} -> {run_dir}"
                     + (" (compiled steps of an earlier job reused)" if reused else ""))
            tracker.log_artifact(run_dir / "config.yaml")
            if (run_dir / ".hydra").is_dir():
                tracker.log_artifact(run_dir / ".hydra", ".hydra")
        startup["startup/store_s"] = time.perf_counter() - clock
        tracker.log_metrics(startup, 0)
        log.info("start-up: " + ", ".join(f"{k.split('/')[1][:-2]} {v:.2f}s" for k, v in startup.items()))
        final = fit(task, tracker, settings.trainer, run_dir, host.get("step", 0), compiled=not reused)
        tracker.log_metrics(_job_cost(final, host.get("step", 0), startup["startup/build_s"] + time.perf_counter() - clock),
                            int(final["train/steps"]))
    return final[task.objective]


def _job_cost(final: dict[str, float], start_step: int, wall_s: float) -> dict[str, float]:
    """`job/wall_s`: this job from validation to its final checkpoint (the process's imports excluded);
    `job/overhead_s`: that minus its steps at the loop's speed: what ampgan adds to a job of a sweep."""
    steps = final["train/steps"] - start_step
    out = {"job/wall_s": wall_s}
    if "perf/step_s" in final:  # measured: the loop ran steps after its first
        out["job/overhead_s"] = wall_s - steps * final["perf/step_s"]
    return out


# settings a resumed run may change; every other one must be the run's own
RESUME_MAY_CHANGE = ("trainer.resume", "trainer.requeue", "trainer.max_steps", "trainer.print_every",
                     "trainer.print_seconds", "trainer.reuse_compiled", "hardware.threads", "hardware.workers")


def _resume_point(s: Settings) -> Path | None:
    """The checkpoint set to continue from: `trainer.resume`, or a requeued run of the same job."""
    from ampgan.training import checkpoint

    if s.trainer.resume:
        if s.tracking.backend != "mlflow":
            return checkpoint.find_checkpoint(s.trainer.resume)
        from ampgan.tracking.tracker import run_folder_in_store

        return checkpoint.find_checkpoint(s.trainer.resume, lambda run_id: run_folder_in_store(run_id, s.tracking.uri))
    if not (s.trainer.requeue and s.tracking.backend == "mlflow"):
        return None
    from ampgan.tracking.tracker import make_client

    client = make_client(s.tracking.uri)
    exp = client.get_experiment_by_name(s.tracking.experiment)
    if exp is None:
        return None
    runs = client.search_runs([exp.experiment_id], f"tags.`ampgan.job_key` = '{_job_key()}' and "
                              "tags.`ampgan.requeue` = 'pending'", order_by=["attributes.start_time DESC"], max_results=1)
    if not runs or runs[0].info.status == "RUNNING":
        return None
    folder = Path(runs[0].data.tags.get("output_dir", ""))
    found = checkpoint.latest(folder / "checkpoints") if folder.is_dir() else None
    if found is not None:
        log.info(f"trainer.requeue: continuing requeued run {runs[0].info.run_id}")
    return found


def _resumed_config(cfg: DictConfig, run_folder: Path) -> DictConfig:
    """The run's own config; only the settings in RESUME_MAY_CHANGE may come from this command.

    From the command line, only the overrides typed are compared with the run's settings (a
    differing one is refused); a caller of `train()` composes the run's config plus the resume.
    """
    from ampgan import AmpganError
    from ampgan.tracking.tracker import flatten

    saved_path = run_folder / "config.yaml"
    if not saved_path.exists():
        raise AmpganError(f"trainer.resume: {run_folder} has no config.yaml (not an ampgan run folder)")
    saved = OmegaConf.load(saved_path)
    before = flatten(OmegaConf.to_container(saved, resolve=True))
    now = flatten(OmegaConf.to_container(cfg, resolve=True))
    typed = _typed_overrides()
    if typed is None:
        typed = {k: v for k, v in now.items() if k in before}
    for key, value in typed.items():
        if key in RESUME_MAY_CHANGE or key not in before or before[key] == value:
            continue
        raise AmpganError(f"trainer.resume: {key}={value} differs from the run's own {key}={before[key]}; "
                          f"a resumed run keeps its settings (only {', '.join(RESUME_MAY_CHANGE[2:])} may change)")
    merged = OmegaConf.merge(OmegaConf.to_container(cfg, resolve=True), saved)  # settings added since keep defaults
    for key in RESUME_MAY_CHANGE:
        if key in typed or key == "trainer.resume":
            OmegaConf.update(merged, key, OmegaConf.select(cfg, key), force_add=True)
    return merged


def _typed_overrides() -> dict[str, object] | None:
    """The command line's overrides as flat keys (a group choice as `<group>.name`); None outside Hydra."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not HydraConfig.initialized():
        return None
    out: dict[str, object] = {}
    for ov in OverridesParser.create().parse_overrides(list(HydraConfig.get().overrides.task)):
        key = ov.key_or_group.lstrip("+~")
        if key.startswith("hydra") or key.startswith("experiment"):
            continue
        value = ov.value()
        out[key if "." in key else f"{key}.name"] = value
    return out


def _run_name(s: Settings) -> str:
    from ampgan.sweeps.runs import job_run_name  # a sweep's job: what varies, e.g. o2-fixed_clip-clip_norm=2-seed0

    return (s.tracking.run_name or job_run_name(s.amp.level, s.scaler.name, s.trainer.seed)
            or f"{s.model.name}-{s.data_name}-{s.amp.level.lower()}-{s.scaler.name}")


def _hydra_output_dir() -> Path | None:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None


def _tags(s: Settings, run_dir: Path) -> dict[str, str]:
    from ampgan.training.hardware import TESTED, device_in_use

    device = device_in_use()
    tags = {"model": s.model.name, "data": s.data_name, "amp": s.amp.level, "scaler": s.scaler.name,
            "hardware": s.hardware.device, "device": device, "device_tested": str(device in TESTED).lower(),
            "git_commit": _git_commit(), "output_dir": str(run_dir)}
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        hc = HydraConfig.get()
        if hc.mode is not None and hc.mode.name == "MULTIRUN":
            tags["sweep_id"] = Path(hc.sweep.dir).name
            tags["sweep_dir"] = str(hc.sweep.dir)
            tags["job_num"] = str(hc.job.num)
            tags["overrides"] = ",".join(hc.overrides.task)
            if s.tracking.backend == "mlflow":
                from ampgan.sweeps.runs import parent_tags  # the sweep's parent run: a nested run in the UI

                tags.update(parent_tags(s.tracking.uri))
    tags["ampgan.job_key"] = _job_key()
    if s.trainer.requeue:
        tags["ampgan.requeue"] = "armed"
    return tags


def _job_key() -> str:
    """A job's stable identity: its overrides, its sweep and (on SLURM) its job and array index."""
    import hashlib
    import json
    import os

    from hydra.core.hydra_config import HydraConfig

    ident = {"slurm": os.environ.get("SLURM_JOB_ID", ""), "array": os.environ.get("SLURM_ARRAY_TASK_ID", "")}
    if HydraConfig.initialized():
        hc = HydraConfig.get()
        ident["overrides"] = sorted(hc.overrides.task)
        if hc.mode is not None and hc.mode.name == "MULTIRUN":
            ident["sweep"] = str(hc.sweep.dir)
    return hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE_DIR), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
