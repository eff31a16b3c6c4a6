"""The one module that touches Hydra's private internals (`hydra._internal`), with the reason for each.

Hydra 1.3 has no public API for these four jobs, and ampgan must do each exactly as Hydra does,
or a pre-checked command line and the run Hydra then starts could disagree. Everything else
goes through Hydra's public API (`initialize_config_dir`, `compose_config`, `OverridesParser`).
The lock pins hydra-core, so a change here shows up as a failing test, not as a silent drift.
"""

from __future__ import annotations

from hydra._internal.callbacks import Callbacks
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import get_args_parser

__all__ = ["Callbacks", "apply_overrides", "basic_sweeper", "get_args_parser"]
# get_args_parser: Hydra's own command-line parser, so that preflight reads sys.argv as @hydra.main will.
# BasicSweeper: Hydra's expansion of a sweep into jobs (sweeps.jobs lists them; the resume sweeper
#   in hydra_plugins subclasses it to run only what is missing).
# Callbacks: a search trial runs as a Hydra job, so the configured callbacks fire as in a sweep.


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
