"""The one module that touches Hydra's private internals (`hydra._internal`), with the reason for each.

Hydra 1.3 has no public API for these jobs, and ampgan must do each exactly as Hydra does,
or a pre-checked command line and the run Hydra then starts could disagree. Everything else
goes through Hydra's public API (`initialize_config_dir`, `compose_config`, `OverridesParser`).
The lock pins hydra-core, so a change here shows up as a failing test, not as a silent drift.
"""

from __future__ import annotations

from collections.abc import Callable

from hydra._internal.callbacks import Callbacks
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import (detect_calling_file_or_module_from_task_function, detect_task_name,
                                   get_args_parser, run_and_report)
from omegaconf import DictConfig

__all__ = ["Callbacks", "apply_overrides", "basic_sweeper", "get_args_parser", "run_composed", "task_name"]
# get_args_parser: Hydra's own command-line parser, so that preflight reads sys.argv as @hydra.main will.
# BasicSweeper: Hydra's expansion of a sweep into jobs (sweeps.jobs lists them; the resume sweeper
#   in hydra_plugins subclasses it to run only what is missing).
# Callbacks: a search trial runs as a Hydra job, so the configured callbacks fire as in a sweep.
# detect_*, run_and_report: a single run that preflight composed runs as `Hydra.run` runs it (run_composed).


def basic_sweeper() -> type:
    """Hydra's BasicSweeper class, as Hydra's plugin scan last loaded it.

    The scan re-executes every plugin module (`loader.load_module`), so a BasicSweeper imported
    before it is a stale class: a subclass of it (the resume sweeper) then fails in the base's own
    `super()` calls. Hence no module-level import: ask for the class where it is used."""
    from hydra._internal.core_plugins import basic_sweeper as module

    return module.BasicSweeper


def apply_overrides(overrides: list, cfg) -> None:
    """Apply parsed `overrides` to `cfg` in place, by Hydra's own rules (+key, ~key, key=value).

    preflight checks each job of a sweep this way without composing the whole config again."""
    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


def task_name(main: Callable) -> str:
    """The job name `@hydra.main` gives `main`'s runs (`train` for ampgan/train.py)."""
    return detect_task_name(*detect_calling_file_or_module_from_task_function(main))


def run_composed(task_function: Callable, cfg: DictConfig, config_name: str) -> object:
    """Run one job on `cfg`, a config composed for it (with its `hydra` node), as `Hydra.run` does
    after composing (hydra/_internal/hydra.py): Hydra's logging, the callbacks, `run_job` (output
    folder, .hydra/, job logging, chdir), then the job's own error, reported as Hydra reports it.
    Needs the GlobalHydra that composed `cfg`."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log, run_job
    from hydra.types import HydraContext

    configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)   # compose_config(with_log_configuration=True)
    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name=config_name)
    ret = run_job(hydra_context=HydraContext(config_loader=GlobalHydra.instance().config_loader(), callbacks=callbacks),
                  task_function=task_function, config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None,
                  configure_logging=True)
    callbacks.on_run_end(config=cfg, config_name=config_name, job_return=ret)
    return run_and_report(lambda: ret.return_value)
