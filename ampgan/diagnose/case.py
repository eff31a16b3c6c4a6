"""The `diagnose` config node: replay length, tolerances, stages on/off. Checked like every group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ampgan import AmpganError, require

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


register_schema()
