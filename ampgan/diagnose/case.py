"""The pipeline's first stage, the Case: what is diagnosed, validated once.

A Case is the run's checked settings and data, the `diagnose` node (replay length, tolerances,
stages on/off; checked like every group), and where the replay starts: step 0 with the run's
seed, a logged run's newest checkpoint before its first failure (`diagnose.run`), or a flight
recording's state on its recorded batches (`diagnose.start`). Nothing after this stage reads
the raw config except to apply a fix's overrides to it (verify, search, seeds).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ampgan import AmpganError, require
from ampgan.config.schema import Settings, validate
from ampgan.data import Dataset
from ampgan.tasks import load_data
from ampgan.training import checkpoint

MODES = ("synced", "free", "both")
FRAMEWORK_CHECKS = ("auto", "never")


@dataclass
class DiagnoseConfig:
    steps: int = 12               # iterations replayed (GAN: n_critic critic steps + 1 generator step each)
    mode: str = "both"            # synced (per-step error) | free (trajectory divergence) | both
    run: str = ""                 # an MLflow run id: diagnose that run from its recorded config
    start: str = ""               # a flight recording (api.callback's): replay from its state on its batches
    rel_tol: float = 0.05         # median relative gradient error (synced) under which AMP tracks FP32
    lost_tol: float = 0.05        # share of a net's FP32 gradient norm flushed to zero that is underflow
    skip_tol: float = 0.25        # share of skipped AMP updates that is a scaler problem
    underflow_fraction: float = 0.01  # u: share of a layer's gradient elements allowed below 2^-14
    framework_check: str = "auto"     # the FP32 twin's GP weight gradient vs finite differences: auto = whenever
                                      # the task has a second-order term (in the run's mode and compiled); never
    horizon: Optional[int] = None  # training steps the run and its FP32 twin each train first: does the run fail,
                                  # does FP32. null: the run's own length (trainer.max_steps; a logged run: up to
                                  # its failure); 0: off (no `healthy` for a run)
    horizon_seconds: float = 300.0  # time bound of each of the two horizon runs: a horizon it cuts short gives
                                  # `not_reproduced` with the step reached, never `healthy`
    min_progress: float = 0.02    # share of the gap between the objective at step 0 and its best value that a run
                                  # must close over the horizon to count as learning
    diverge_tol: float = 0.5      # share of that gap the objective may worsen by before it is divergence
    trail_tol: float = 0.5        # a run that closes less than 1 - trail_tol of the share FP32 closes trails it:
                                  # its evaluation is checked in float16 (the inference stage)
    locate: bool = True           # instrument the first non-finite step (forward, GP inner gradient, backward)
    verify: bool = True           # replay the interventions and decide the verdict by them (interventions.py);
                                  # false: the rules' hypothesis alone, marked so, with no fix printed
    max_fixes: int = 5            # the hypothesis's own fixes replayed, at most (the probes of the mode and of each cause besides)
    seeds: int = 0                # K > 0: re-check the best fix on K seeds against FP32 on the objective
    seed_steps: int = 150         # training steps per seed in that check
    margin: float = 0.05          # equivalence margin on the objective (accuracy: absolute; swd: relative)
    search: bool = False          # ddmin over cell paths for a minimal FP32 keep-list
    search_steps: int = 4         # replay length of each search probe
    experiment: str = "ampgan-diagnose"  # MLflow experiment of the diagnose run
    progress: bool = True         # progress lines while replays run

    def __post_init__(self) -> None:
        require(self.steps >= 1, f"diagnose.steps must be >= 1, got {self.steps}")
        require(self.mode in MODES, f"diagnose.mode must be one of {', '.join(MODES)}, got '{self.mode}'")
        require(self.framework_check in FRAMEWORK_CHECKS,
                f"diagnose.framework_check must be one of {', '.join(FRAMEWORK_CHECKS)}, got '{self.framework_check}'")
        require(self.horizon is None or self.horizon >= 0, f"diagnose.horizon must be >= 0 or null, got {self.horizon}")
        require(self.horizon_seconds > 0, f"diagnose.horizon_seconds must be > 0, got {self.horizon_seconds}")
        for key in ("rel_tol", "lost_tol", "skip_tol", "underflow_fraction", "margin", "min_progress", "diverge_tol", "trail_tol"):
            require(0 < getattr(self, key) < 1, f"diagnose.{key} must lie in (0, 1), got {getattr(self, key)}")
        require(self.max_fixes >= 1, f"diagnose.max_fixes must be >= 1, got {self.max_fixes}")
        require(self.seeds >= 0, f"diagnose.seeds must be >= 0, got {self.seeds}")
        require(self.seeds != 1, "diagnose.seeds must be 0 (off) or >= 2: one seed proves nothing")
        require(self.seed_steps >= 1, f"diagnose.seed_steps must be >= 1, got {self.seed_steps}")
        require(self.search_steps >= 1, f"diagnose.search_steps must be >= 1, got {self.search_steps}")
        require(self.run == "" or self.run.replace("-", "").isalnum(),
                f"diagnose.run must be an MLflow run id, got '{self.run}'")
        require(not (self.run and self.start), "diagnose.run and diagnose.start name two starts: give one")


def diagnose_settings(cfg: DictConfig) -> DiagnoseConfig:
    """The checked `diagnose` node of a composed config, or AmpganError (one line)."""
    if "diagnose" not in cfg:
        raise AmpganError("config has no 'diagnose' group (use the diagnose_main root config)")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(DiagnoseConfig), cfg.diagnose)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None)
        raise AmpganError(f"diagnose{'.' + key if key else ''}: {str(err).splitlines()[0]}") from None


def register_schema() -> None:
    """DiagnoseConfig in Hydra's ConfigStore as `schema/diagnose/default`, the schema that
    conf/diagnose/default.yaml extends (done when ampgan.diagnose is imported; idempotent)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group="schema/diagnose", name="default", node=DiagnoseConfig)



@dataclass
class Case:
    """What is diagnosed. `cfg`: the composed config (a logged run's recorded one, with this
    command's diagnose and tracking nodes), the base of every fix's overrides; `settings`: it,
    validated; `start`: the checkpoint set the replay starts from (None: step 0); `failed_at`,
    `failure`: the run's first failure as it was logged or recorded (None, "": not known);
    `run_id`: the diagnosed MLflow run; `workers`: its data-parallel ranks (replayed in one process);
    `stalled`: the logged run failed by never learning (`run_stalled`), so it is judged from step 0."""

    cfg: DictConfig
    dcfg: DiagnoseConfig
    settings: Settings
    data: Dataset
    start: Path | None = None
    failed_at: int | None = None
    failure: str = ""
    run_id: str | None = None
    workers: int = 1
    recording: object | None = None   # tracking.recorder.Recording: a flight recording
    stalled: bool = False

    def describe(self) -> list[str]:
        """The progress lines that say where the replay starts and why."""
        r, s = self.recording, self.settings
        out = []
        if r is not None:
            out.append(f"flight recording {r.folder}: {self.failure}; starting from the state after step {r.step}, "
                       f"on its {r.steps_recorded} recorded batches")
        if self.run_id:
            out.append(f"run {self.run_id}: " + (f"data parallel on {self.workers} workers, replayed in one process on "
                                                 f"its global batch of {s.trainer.batch_size}; " if self.workers > 1 else "")
                       + (f"failed at step {self.failed_at} ({self.failure}); " if self.failed_at else "")
                       + "starting from " + (f"checkpoint {self.start}" if self.start else
                                             "step 0 (a run that never learned is judged from its start)"
                                             if self.stalled else "step 0 (no checkpoint before it)"))
        return out


def open_case(cfg: DictConfig, run_dir: Path) -> Case:
    """The Case `cfg` names: the run it describes, or `diagnose.run`'s recorded run, or a run from
    `diagnose.start`'s flight recording (its state converted once into a checkpoint set of this
    task, under `run_dir`/start). Bad input is one AmpganError line."""
    dcfg = diagnose_settings(cfg)
    run_id, start, failed_at, failure, workers, recording = dcfg.run or None, None, None, "", 1, None
    if run_id:
        cfg = recorded_config(cfg, run_id)
        workers = one_process(cfg)
        failed_at, failure = run_failure(run_id, cfg.tracking.uri)
    s = validate(cfg)
    data = load_data(s)
    stalled = False
    if run_id and failed_at is None:
        failed_at, failure = run_stalled(run_id, cfg.tracking.uri, s, data, dcfg)
        stalled = failed_at is not None
    if run_id and not stalled:   # a run that never learned fails over its whole history: from step 0
        start = checkpoint_start(run_id, cfg, failed_at)
    if dcfg.start:
        from ampgan.diagnose.replay import recorded_start
        from ampgan.tracking.recorder import read

        recording = read(dcfg.start)
        failed_at, failure = recording.first_bad_step, recording.failure
        start = recorded_start(s, data, recording, Path(run_dir) / "start")
    return Case(cfg, dcfg, s, data, start, failed_at, failure, run_id, workers, recording, stalled)


def recorded_config(cfg: DictConfig, run_id: str) -> DictConfig:
    """The diagnosed run's recorded config (its `config.yaml` artifact) with this command's diagnose
    and tracking nodes. Raises AmpganError for an unknown run or a run without a config."""
    from ampgan.tracking.tracker import make_client, store_errors

    client = make_client(cfg.tracking.uri)
    with tempfile.TemporaryDirectory(prefix="ampgan-diagnose-") as scratch:
        try:
            client.get_run(run_id)
            path = client.download_artifacts(run_id, "config.yaml", scratch)
        except store_errors() as err:
            raise AmpganError(f"diagnose.run={run_id}: no such run with a config.yaml in {cfg.tracking.uri} "
                              f"({str(err).splitlines()[0][:120]})") from None
        recorded = OmegaConf.load(path)
    recorded.diagnose = cfg.diagnose
    recorded.tracking = cfg.tracking
    return recorded


def one_process(recorded: DictConfig) -> int:
    """Replay a data-parallel run (`hardware.workers=N`) in this one process, on the same global
    batch: `trainer.batch_size` is already the global batch, and rank 0's checkpoint holds the one
    global sampler and RNG state every rank shared. Sets `hardware.workers=1` (nothing here starts
    msrun: the replays build their steps in this process, outside any cluster); the run's own number."""
    workers = int(OmegaConf.select(recorded, "hardware.workers", default=1))
    if "hardware" in recorded:
        recorded.hardware.workers = 1
    return workers


def checkpoint_start(run_id: str, cfg: DictConfig, failed_at: int | None) -> Path | None:
    """Where a diagnosed run's replay starts: its newest full-state checkpoint set from before its
    first failing step (the newest set when it logged no failure); None (step 0 with the run's
    seed) when the run wrote none before it or its folder is not on this machine."""
    from ampgan.tracking.tracker import run_folder_in_store

    uri = cfg.tracking.uri
    try:
        newest = checkpoint.find_checkpoint(run_id, (lambda rid: run_folder_in_store(rid, uri)) if uri else None)
    except AmpganError:
        return None
    if failed_at is None:
        return newest
    return checkpoint.newest_before(newest.parent, failed_at)


STALLED = "did not learn"


def run_stalled(run_id: str, uri: str, s: Settings, data: Dataset, dcfg: DiagnoseConfig) -> tuple[int | None, str]:
    """A logged run that logged no failure but never learned: its objective at its last evaluation
    closed less than `min_progress` of the gap between its untrained nets' (the run's seed, step 0,
    evaluated here) and the objective's best value (`Course.progress`, as the horizon judges a
    course). Then (its last evaluated step, why), and its diagnosis starts from step 0, where the
    horizon judges the run and its FP32 twin on learning (from a checkpoint it could not: a run may
    have converged by then). (None, "") otherwise, or when the run logged no evaluation."""
    from ampgan.diagnose.horizon import Course
    from ampgan.diagnose.replay import build_seeded
    from ampgan.tracking.tracker import make_client

    task = build_seeded(s, data)
    history = make_client(uri).get_metric_history(run_id, task.objective)
    if not history:
        return None, ""
    last = max(history, key=lambda m: m.step)
    logged = Course("logged run", 0, last.step, task.objective, task.direction, task.objective_best,
                    float(task.evaluate()[task.objective]), after=last.value, done=last.step)
    if not math.isfinite(last.value) or logged.progress >= dcfg.min_progress:
        return None, ""
    return last.step, (f"{STALLED}: {task.objective} {logged.before:.4g} untrained (step 0, its seed) -> "
                       f"{last.value:.4g} at step {last.step} ({100 * logged.progress:+.1f}%, needs "
                       f"{100 * dcfg.min_progress:+.0f}%)")


def run_failure(run_id: str, uri: str) -> tuple[int | None, str]:
    """A logged run's first failure from its metric history: the first step with a non-finite
    `*/loss`, else the step at which it stopped as diverged (`train/diverged` 1); (None, "") when
    its history shows none."""
    from ampgan.tracking.tracker import make_client

    client = make_client(uri)
    run = client.get_run(run_id)
    keys = [k for k in run.data.metrics if k.endswith("/loss") and not k.startswith("eval/")]
    bad = sorted((m.step, k) for k in keys for m in client.get_metric_history(run_id, k) if not math.isfinite(m.value))
    if bad:
        return bad[0][0], f"{bad[0][1]} not finite"
    if run.data.metrics.get("train/diverged", 0.0) > 0:
        step = int(run.data.metrics.get("train/steps", 0))
        return step, "stopped as diverged"
    return None, ""


register_schema()
