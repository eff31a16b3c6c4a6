"""`python -m ampgan.train [overrides]`: one trainer for every model x data x AMP x scaler x hardware.

    python -m ampgan.train                                  # WGAN-GP on 8 Gaussians, FP32
    python -m ampgan.train amp=o2 scaler=dynamic            # the same under AMP O2
    python -m ampgan.train -m scaler=static,dynamic         # a sweep, one MLflow run per job
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from ampgan import AmpganError
from ampgan.config import CONF_DIR, PACKAGE_DIR, Settings, validate

log = logging.getLogger("ampgan")


def _process_start() -> float:
    """perf_counter() value of this process's start (imports included), from the OS's own record."""
    try:
        import psutil

        return time.perf_counter() - (time.time() - psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - start-up figures are informative only
        return time.perf_counter()


_PROCESS_START = _process_start()


def train(cfg: DictConfig, run_dir: Path | None = None) -> float:
    """Validate, build, train, evaluate and track one run; return the task's objective metric."""
    from ampgan import hardware
    from ampgan.data import build_dataset
    from ampgan.tasks import build_task
    from ampgan.tracking import build_tracker, flatten
    from ampgan.trainer import fit, tracked_run

    startup = {"startup/imports_s": time.perf_counter() - _PROCESS_START}
    clock = time.perf_counter()
    settings = validate(cfg)
    hardware.setup(settings.hardware, settings.trainer.seed)
    data = build_dataset(settings.data)
    task = build_task(settings, data)
    run_dir = Path(run_dir or _hydra_output_dir() or Path.cwd())
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    startup["startup/build_s"], clock = time.perf_counter() - clock, time.perf_counter()

    tracker = build_tracker(settings.tracking)
    params = flatten(OmegaConf.to_container(cfg, resolve=True))
    with tracked_run(tracker, _run_name(settings), params, _tags(settings, run_dir)):
        log.info(f"run {tracker.run_id or '(not tracked)'}: {_run_name(settings)} -> {run_dir}")
        tracker.log_artifact(run_dir / "config.yaml")
        if (run_dir / ".hydra").is_dir():
            tracker.log_artifact(run_dir / ".hydra", ".hydra")
        startup["startup/store_s"] = time.perf_counter() - clock
        tracker.log_metrics(startup, 0)
        log.info("start-up: " + ", ".join(f"{k.split('/')[1][:-2]} {v:.2f}s" for k, v in startup.items()))
        final = fit(task, tracker, settings.trainer, run_dir)
    return final[task.objective]


def _run_name(s: Settings) -> str:
    return s.tracking.run_name or f"{s.model.name}-{s.data.name}-{s.amp.level.lower()}-{s.scaler.name}"


def _hydra_output_dir() -> Path | None:
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None


def _tags(s: Settings, run_dir: Path) -> dict[str, str]:
    tags = {"model": s.model.name, "data": s.data.name, "amp": s.amp.level, "scaler": s.scaler.name,
            "hardware": s.hardware.device, "git_commit": _git_commit(), "output_dir": str(run_dir)}
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        hc = HydraConfig.get()
        if hc.mode is not None and hc.mode.name == "MULTIRUN":
            tags["sweep_id"] = Path(hc.sweep.dir).name
            tags["sweep_dir"] = str(hc.sweep.dir)
            tags["job_num"] = str(hc.job.num)
            tags["overrides"] = ",".join(hc.overrides.task)
    return tags


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE_DIR), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


@hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    try:
        return train(cfg)
    except AmpganError as err:
        print(f"ampgan: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    from ampgan.preflight import run_checked

    run_checked(main)
