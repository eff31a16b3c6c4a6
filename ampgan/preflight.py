"""Check the command line before Hydra runs anything: bad input -> one line, exit code 2.

Hydra reports a missing group option or an unknown key as a multi-line message and exit
code 1, and a bad value only surfaces inside the job. Here every combination a command
line asks for (sweeps included) is composed and validated up front, so
`amp=o9`, `scaler.init_scale=-1` or `data=nope` fail with one line before any run exists.
"""

from __future__ import annotations

import itertools
import re
import sys

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ampgan import AmpganError
from ampgan.config import CONF_DIR, validate
from ampgan.hardware import check_device

MAX_COMBINATIONS = 256


def _group_options(group: str) -> list[str]:
    folder = CONF_DIR / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    cause = err.__cause__
    extra = [ln.strip() for ln in str(cause).splitlines() if ln.strip()][:1] if cause else []
    return ": ".join((lines[:1] or [type(err).__name__]) + extra)


def check(argv: list[str]) -> None:
    """Raise AmpganError for the first bad override or combination in `argv` (Hydra's CLI words)."""
    args = get_args_parser().parse_args(argv)
    if args.help or args.hydra_help or args.info or args.shell_completion or args.cfg:
        return
    parsed = OverridesParser.create().parse_overrides(args.overrides)
    choices: list[list[str]] = []
    for ov in parsed:
        key = ov.key_or_group
        if key.startswith("hydra") or ov.is_delete():
            continue
        values = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
        if "/" not in key and "." not in key and _group_options(key.lstrip("+")):
            options = _group_options(key.lstrip("+"))
            for v in values:
                if v not in options:
                    raise AmpganError(f"{key}={v}: no such option (choose from: {', '.join(options)})")
        prefix = "+" if ov.is_add() else ("++" if ov.is_force_add() else "")
        choices.append([f"{prefix}{key}={v}" for v in values])
    combos = list(itertools.islice(itertools.product(*choices), MAX_COMBINATIONS))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for combo in combos:
            try:
                cfg = compose(config_name=args.config_name or "train", overrides=list(combo))
            except (HydraException, OmegaConfBaseException) as err:
                raise AmpganError(_explain(err, args.config_name or "train", list(combo))) from None
            settings = validate(cfg)
            check_device(settings.hardware.device)
            if args.multirun or cfg.get("hydra", {}).get("mode") == "MULTIRUN":
                _create_store(settings.tracking)


def _create_store(tracking) -> None:
    """Parallel sweep jobs racing to create a fresh sqlite store fail: create it here, once."""
    if tracking.backend == "mlflow" and tracking.uri.startswith("sqlite:///"):
        from ampgan.tracking import MlflowTracker

        MlflowTracker(tracking.uri, tracking.experiment)


def _explain(err: BaseException, config_name: str, combo: list[str]) -> str:
    """Name the keys that exist where an override asked for one that does not."""
    match = re.match(r"Could not override '([^']+)'", str(err))
    if not match:
        return _first_line(err)
    key = match.group(1)
    parent, _, leaf = key.rpartition(".")
    rest = [o for o in combo if not o.lstrip("+").startswith(key + "=")]
    try:
        node = compose(config_name=config_name, overrides=rest)
        node = OmegaConf.select(node, parent) if parent else node
        known = ", ".join(sorted(node.keys())) if isinstance(node, DictConfig) else ""
    except (HydraException, OmegaConfBaseException):
        known = ""
    where = f" in {parent}" if parent else ""
    return f"{key}: no key '{leaf}'{where}" + (f" (keys: {known})" if known else "")


def run_checked(main) -> None:
    """Pre-check sys.argv, then hand over to the `@hydra.main` function `main`."""
    try:
        check(sys.argv[1:])
    except AmpganError as err:
        print(f"ampgan: error: {err}", file=sys.stderr)
        sys.exit(2)
    main()
