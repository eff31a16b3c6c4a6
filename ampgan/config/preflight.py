"""Check the command line before Hydra runs anything: bad input -> one line, exit code 2.

Hydra reports a missing group option or an unknown key as a multi-line message and exit
code 1, and a bad value only surfaces inside the job. Here every job a command line asks
for is composed and validated up front (`amp=o9`, `scaler.init_scale=-1`, `data=nope` fail
with one line before any run exists), sweeps included:

- the sweep is expanded the way Hydra's basic sweeper will expand it: the preset's
  `hydra.sweeper.params` (e.g. `+experiment=scaler_study`) first, the command line's sweeps
  after them and over them; `a,b`, `choice()`, `range()` and `glob()` are enumerated;
  `interval()` is refused unless a search sweeper (Optuna) is configured, which then gets
  its end points checked;
- a huge sweep is still checked whole, without composing every job: the jobs that differ
  only in keys that cannot interact need not all be built. Each config group is validated
  for every combination of the swept keys that can change it, and each cross-group check
  (`config.COMBINATIONS`, which name the fields they read) for every combination of the
  swept keys that can change those fields; the other swept keys stay at their first value.
  A preset, a key interpolated into another group or a value with `${...}` counts as
  touching everything;
- jobs of one process cannot use different `hardware.threads` (MindSpore fixes the count
  once), jobs may not resume the same run, and the MLflow store is created before a sweep's
  jobs start (parallel workers racing to create it fail).

`check(argv, config_name, extra)` serves any root config: `extra(cfg)` is called on every
composed job (e.g. to validate a tool's own config node) and may raise AmpganError.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException, MissingConfigException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from ampgan import AmpganError, frozen_imports, report_error
from ampgan.config.hydra_compat import apply_overrides, get_args_parser
from ampgan.config.schema import COMBINATIONS, CONF_DIR, GROUPS, Settings, closest, validate

MAX_JOBS = 100_000    # a sweep this large is refused (loudly): Hydra itself composes every job
MAX_CHECKS = 20_000   # ... and so is one whose interacting keys alone make this many jobs to compose
SEARCH_SWEEPERS = ("hydra_plugins.hydra_optuna_sweeper.", "hydra_plugins.hydra_nevergrad_sweeper.",
                   "hydra_plugins.hydra_ax_sweeper.")  # sweepers that sample interval() instead of listing jobs
EVERYTHING = "*"

Extra = Callable[[DictConfig], None]


def check_environment(environ=os.environ) -> None:
    """Refuse MindSpore settings that make runs silently wrong.

    MindSpore 2.10's compile cache (MS_COMPILER_CACHE_ENABLE=1) loads a warm run's graphs ~2x
    faster on CPU, but the loaded WGAN-GP steps compute garbage: NaN losses and a loss scale of
    -9.4e15 from the first step (measured; a cold run with the same cache path is right).
    """
    if environ.get("MS_COMPILER_CACHE_ENABLE", "").strip().lower() in ("1", "true", "on", "yes"):
        raise AmpganError("MS_COMPILER_CACHE_ENABLE is set: MindSpore 2.10's compile cache gives wrong "
                          "results on CPU (NaN losses from the first step of a warm run); unset it")


def check(argv: list[str], config_name: str = "train", extra: Extra | None = None,
          run: Callable[[DictConfig], object] | None = None, job_name: str | None = None) -> bool:
    """Raise AmpganError for the first bad override or job in `argv` (Hydra's CLI words).

    `run` (a `@hydra.main` function's own body, `job_name` its Hydra job name): a single run is
    run here, on the very config the check composed, as Hydra's run would run it: the config is
    composed once. Returns whether it ran; a sweep, `--cfg`, `--help`, `--config-dir` or
    `--config-path` is left to Hydra's own entry (False)."""
    check_environment()
    args = _parse_args(argv)
    if args.help or args.hydra_help or args.info or args.shell_completion or args.cfg:
        return False
    dirs, overrides = [CONF_DIR], list(args.overrides)
    if args.config_dir:  # `--config-dir DIR`: Hydra searches DIR too (a user's own options, e.g. model=mine)
        extra_dir = Path(args.config_dir).resolve()
        if not extra_dir.is_dir():
            raise AmpganError(f"--config-dir {args.config_dir}: no such folder")
        dirs.append(extra_dir)
        overrides.insert(0, f"hydra.searchpath=['file://{extra_dir}']")
        run = None   # Hydra adds the folder to its search path itself, not as an override
    if args.config_path or args.experimental_rerun:
        run = None
    name = args.config_name or config_name
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name=job_name or "app"):
        preflight = _Preflight(name, overrides, args.multirun, extra, dirs, runs_here=run is not None)
        preflight.run()
        if run is None or preflight.job is None:
            return False
        from ampgan.config.hydra_compat import run_composed

        run_composed(run, preflight.job, name)
        return True


def run_checked(main: Callable[[], object], config_name: str = "train", extra: Extra | None = None) -> None:
    """Pre-check sys.argv, then run the `@hydra.main` function `main`: a single run on the config
    the check composed, anything else through `main`'s own Hydra entry."""
    from ampgan.config.hydra_compat import task_name

    try:
        ran = check(sys.argv[1:], config_name, extra, run=main.__wrapped__, job_name=task_name(main))
    except AmpganError as err:
        sys.exit(report_error(err))
    if not ran:
        main()


def _parse_args(argv: list[str]):
    parser = get_args_parser()

    def refuse(message: str) -> None:  # argparse would print its usage and a second line
        raise AmpganError(f"command line: {message}")

    parser.error = refuse  # type: ignore[method-assign]
    return parser.parse_args(argv)


def _conf_options(group: str, dirs: list[Path]) -> list[str]:
    return sorted({p.stem for d in dirs if _is_dir(d / group) for p in (d / group).glob("*.yaml")})


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a key too long for a file name (ENAMETOOLONG) names no group folder
        return False


def _choose_from(group: str, options: list[str], most: int = 160) -> str:
    """'choose from: a, b, c', or for a long list its families: 'choose from the 38 files of
    conf/experiment/: case_* (11), classifier_digits, diag_* (16), ...' (options sharing the part
    before their first '_', three or more of them, are one family)."""
    listed = ", ".join(options)
    if len(listed) <= most:
        return f"choose from: {listed}"
    families: dict[str, list[str]] = {}
    for option in options:
        families.setdefault(option.split("_", 1)[0], []).append(option)
    parts = [f"{head}_* ({len(members)})" if len(members) >= 3 else ", ".join(members)
             for head, members in sorted(families.items())]
    return f"choose from the {len(options)} files of conf/{group}/: {', '.join(parts)}"


def _first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    cause = err.__cause__
    extra = [ln.strip() for ln in str(cause).splitlines() if ln.strip()][:1] if cause else []
    return ": ".join((lines[:1] or [type(err).__name__]) + extra)


@dataclass
class _Dim:
    """One key of the sweep, in Hydra's job order: `key` as Hydra spells it (`+experiment`)."""

    key: str
    values: list[str]

    @property
    def name(self) -> str:  # the key without its +, ++ or ~
        return self.key.lstrip("+~")

    def override(self, i: int) -> str:
        return f"{self.key}={self.values[i]}"


def _check_slurm_workers(launcher: DictConfig, settings: list[Settings]) -> None:
    """A SLURM job of a data-parallel run (`hardware.workers=N`) is one task whose msrun starts the
    N ranks inside its allocation: it needs one task and N CPUs (`cpus_per_task` follows
    `hardware.workers` in conf/hydra/launcher/slurm.yaml; a job array asks the same of every job)."""
    workers = max(s.hardware.workers for s in settings)
    if workers == 1:
        return
    tasks, cpus = launcher.get("tasks_per_node", 1), launcher.get("cpus_per_task")
    if tasks != 1:
        raise AmpganError(f"hydra.launcher.tasks_per_node={tasks}: a job of hardware.workers={workers} is one SLURM "
                          "task whose msrun starts the ranks; leave tasks_per_node at 1 "
                          "(hydra.launcher.cpus_per_task gives the ranks their CPUs)")
    if cpus is None or cpus < workers:
        raise AmpganError(f"hardware.workers={workers} needs {workers} CPUs in each SLURM job, but "
                          f"hydra.launcher.cpus_per_task={cpus}: add hydra.launcher.cpus_per_task={workers}")


class _Preflight:
    def __init__(self, config_name: str, overrides: list[str], multirun: bool, extra: Extra | None,
                 dirs: list[Path] | None = None, runs_here: bool = False):
        self.config_name, self.overrides, self.multirun, self.extra = config_name, overrides, multirun, extra
        self.runs_here = runs_here  # a command that runs a single run in this process, its own (frozen_imports)
        self.dirs = dirs or [CONF_DIR]   # the config folders Hydra searches: conf/, then a --config-dir
        self.hydra = GlobalHydra.instance().hydra
        self.parser = OverridesParser.create(config_loader=self.hydra.config_loader)
        self.bases: dict[tuple[str, ...], DictConfig] = {}
        self.parsed: dict[str, Override] = {}
        self.devices: set[str] = set()
        self.remote = False  # jobs run on other machines (submitit): their device is checked there (hardware.setup)
        self.built: dict = {}  # groups already validated, by content
        self.job: DictConfig | None = None  # a single run's config as Hydra's run composes it (with `hydra`)
        self._listing_keys = False  # _known_keys is composing a base (whose failure it must not explain again)

    # ------------------------------------------------------------ the whole check
    def run(self) -> None:
        primary = self.primary()
        if not self.multirun:
            if any(ov.is_sweep_override() for ov in self._parse(self.overrides)):
                self._compose(self.overrides, RunMode.RUN)  # raises Hydra's "needs --multirun", explained
            self.job = self._as_run(primary)
            with open_dict(primary):
                del primary["hydra"]
            with frozen_imports(self.runs_here):
                self._check_cfg(primary, [])
            return
        self.dims = self.sweep_dims(primary)
        self.jobs = self._product(list(range(len(self.dims))))
        if self.jobs > MAX_JOBS:
            raise AmpganError(f"this sweep has {self.jobs:,} jobs, more than {MAX_JOBS:,}: split it")
        settings = [self._validate_job(job) for job in self.jobs_to_check()]
        self._check_across_jobs(primary, settings)
        self._create_stores(settings)

    @staticmethod
    def _as_run(primary: DictConfig) -> DictConfig:
        """A single run's config as Hydra's run composes it, from the primary (composed as for a
        multirun, which for a command line without sweeps differs only in the mode): Hydra's entry
        adds `hydra.mode=RUN` to the overrides when the config sets no mode."""
        job = copy.deepcopy(primary)
        if job.hydra.mode is None:
            with open_dict(job):
                job.hydra.mode = RunMode.RUN
                job.hydra.overrides.hydra.append("hydra.mode=RUN")
        return job

    def primary(self) -> DictConfig:
        """The config as Hydra's multirun composes it (sweeps left out): says whether a preset asks for one."""
        parsed = self._parse(self.overrides)
        self.hydra_overrides = [ov.input_line for ov in parsed if ov.is_hydra_override()]
        for ov in parsed:
            self._check_group_choice(ov)
        primary = self._compose(self.overrides, RunMode.MULTIRUN)
        self.multirun = self.multirun or primary.hydra.mode == RunMode.MULTIRUN
        self.remote = self.multirun and "submitit" in str(primary.hydra.launcher.get("_target_", ""))
        return primary

    # ------------------------------------------------------------ command-line words
    def _parse(self, words: list[str]) -> list[Override]:
        out = []
        for word in words:
            try:
                out += self.parser.parse_overrides([word])
            except (HydraException, ValueError) as err:  # ValueError: an int of more than 4300 digits
                lines = [ln for ln in str(err).splitlines() if ln.strip() and not ln.startswith(("Error parsing", "See "))]
                detail = lines[0].split(" expecting ")[0] if lines else "syntax error"
                if "Exceeds the limit" in detail:
                    detail = "a number of more than 4300 digits"
                elif not word.isascii():
                    detail = "Hydra reads unquoted keys and values in ASCII only: quote a value, key='value'"
                raise AmpganError(f"{word}: not an override Hydra can read ({detail}); the form is key=value, "
                                  "see https://hydra.cc/docs/advanced/override_grammar/basic") from None
        return out

    def _check_group_choice(self, ov: Override) -> None:
        """`amp=o9`, `+experiment=nope`: name the options (and the closest) before composing."""
        group = ov.key_or_group
        if not group:
            raise AmpganError(f"{ov.input_line}: the override names no key (the form is key=value)")
        options = _conf_options(group, self.dirs)
        if ov.is_hydra_override() or ov.is_delete() or not options or ov.package is not None:
            return
        if ov.is_interval_sweep():
            raise AmpganError(f"{ov.input_line}: a config group takes option names, not an interval")
        values = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
        for value in values:
            if value not in options and value != "null":
                raise AmpganError(f"{ov.get_key_element()}={value}: no such option{closest(value, options)} "
                                  f"({_choose_from(group, options)})")

    # ------------------------------------------------------------ the sweep, as Hydra will run it
    def sweep_dims(self, primary: DictConfig) -> list[_Dim]:
        """Hydra's BasicSweeper: the sweeper's params first, then the command line; one key, one dimension."""
        sweeper = primary.hydra.sweeper
        params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
        words = params + list(primary.hydra.overrides.task)
        search = str(sweeper.get("_target_", "")).startswith(SEARCH_SWEEPERS)
        dims: OrderedDict[str, _Dim] = OrderedDict()
        for ov in self._parse(words):
            self._check_group_choice(ov)
            key = ov.get_key_element()
            if ov.is_interval_sweep():
                if not search:
                    raise AmpganError(f"{ov.input_line}: interval() needs a search sweeper such as Optuna "
                                      "(hydra/sweeper=optuna); the basic sweeper takes a,b lists, range() and glob()")
                value = ov.value()
                dims[key] = _Dim(key, [str(value.start), str(value.end)])  # its end points
            elif ov.is_sweep_override():
                values = list(itertools.islice(ov.sweep_string_iterator(), MAX_JOBS + 1))
                if not values:
                    raise AmpganError(f"{ov.input_line}: the sweep has no values")
                if len(values) > MAX_JOBS:
                    raise AmpganError(f"{ov.input_line}: more than {MAX_JOBS:,} values: narrow it")
                dims[key] = _Dim(key, values)
            else:
                dims[key] = _Dim(key, [ov.get_value_element_as_str()])
        return list(dims.values())

    def jobs_to_check(self) -> list[tuple[int, ...]]:
        """Every combination of the dimensions that can interact, for each group and each cross-group check."""
        scopes = [self._dims_touching(fields=None, group=g) for g in self.root_keys]
        scopes += [self._dims_touching(fields=c.reads) for c in COMBINATIONS]
        if self.extra is not None:  # what the caller's check reads is unknown: every job
            scopes.append(list(range(len(self.dims))))
        sizes = [self._product(scope) for scope in scopes]
        if sum(sizes) > MAX_CHECKS:
            worst = scopes[sizes.index(max(sizes))]
            raise AmpganError(f"checking this sweep means composing {sum(sizes):,} jobs (more than {MAX_CHECKS:,}) "
                              f"because {', '.join(self.dims[i].key for i in worst)} can interact: narrow it")
        seen: dict[tuple[int, ...], None] = {}
        for scope in scopes:
            for values in itertools.product(*(range(len(self.dims[i].values)) for i in scope)):
                job = [0] * len(self.dims)
                for i, v in zip(scope, values):
                    job[i] = v
                seen.setdefault(tuple(job))
        return list(seen)

    def _product(self, scope: list[int]) -> int:
        n = 1
        for i in scope:
            n *= len(self.dims[i].values)
        return n

    def _dims_touching(self, fields: tuple[str, ...] | None, group: str | None = None) -> list[int]:
        """Indices of the dimensions that can change `group`'s node, or any of `fields` ("data.name")."""
        wanted = [(group, None)] if fields is None else [tuple(f.split(".", 1)) for f in fields]
        out = []
        for i, dim in enumerate(self.dims):
            if len(dim.values) < 2:
                continue
            touched = self._touched(dim)
            for g, leaf in wanted:
                hit = EVERYTHING in touched or any(t in touched for t in self._sources(g))
                if hit and leaf is not None and touched == {g}:  # a key inside the group: this field?
                    name = dim.name
                    hit = (name == g or "/" in name or name == f"{g}.{leaf}"
                           or name.startswith((f"{g}.{leaf}.", f"{g}.{leaf}[")))
                if hit:
                    out.append(i)
                    break
        return out

    def _touched(self, dim: _Dim) -> set[str]:
        """The top-level nodes a dimension can change (EVERYTHING for presets and interpolations)."""
        if "@" in dim.name or any("${" in v for v in dim.values):
            return {EVERYTHING}
        top = re.split(r"[./]", dim.name, maxsplit=1)[0]
        return {top} if top in self.root_keys else {EVERYTHING}

    def _sources(self, group: str) -> set[str]:
        """`group` and every group interpolated into it (`run_name: ${amp.level}`), transitively."""
        out, todo = set(), [group]
        while todo:
            g = todo.pop()
            if g not in out:
                out.add(g)
                todo.extend(self.interpolated.get(g, ()))
        return out

    @cached_property
    def root_keys(self) -> list[str]:
        """The top-level nodes of the root config without any task override."""
        return [k for k in self._base(()).keys()]

    @cached_property
    def interpolated(self) -> dict[str, set[str]]:
        """group -> groups its values interpolate, read from every YAML file in conf/."""
        deps: dict[str, set[str]] = {}
        for path, rel in ((p, p.relative_to(d)) for d in self.dirs for p in d.rglob("*.yaml")):
            if rel.parts[0] == "hydra":
                continue
            text = path.read_text()
            if "${" not in text:
                continue
            is_global = "@package _global_" in text or len(rel.parts) == 1
            for dotted, value in _leaves(OmegaConf.to_container(OmegaConf.load(path), resolve=False)):
                if not isinstance(value, str):
                    continue
                owner = dotted.split(".")[0] if is_global else rel.parts[0]
                for ref in re.findall(r"\$\{([^}]*)\}", value):
                    if ":" in ref:  # a resolver such as ${ampgan_outputs:}
                        continue
                    target = owner if ref.startswith(".") else ref.split(".")[0].split("[")[0]
                    if target != owner:
                        deps.setdefault(owner, set()).add(target)
        return deps

    # ------------------------------------------------------------ one job
    def _validate_job(self, job: tuple[int, ...]) -> Settings:
        words = [dim.override(i) for dim, i in zip(self.dims, job)]
        structural = tuple(w for w, dim in zip(words, self.dims) if self._is_structural(dim))
        cfg = copy.deepcopy(self._base(structural))
        leaves = [self._parsed(w) for w, dim in zip(words, self.dims) if not self._is_structural(dim)]
        try:
            apply_overrides(leaves, cfg)
        except (HydraException, OmegaConfBaseException) as err:
            raise AmpganError(self._explain(err, list(structural) + [o.input_line for o in leaves])) from None
        return self._check_cfg(cfg, [dim.override(i) for dim, i in zip(self.dims, job) if len(dim.values) > 1])

    def _check_cfg(self, cfg: DictConfig, swept: list[str]) -> Settings:
        """Validate one composed job; `swept` (its sweep's values) goes into the message."""
        try:
            self._check_top_keys(cfg)
            settings = validate(cfg, self.built)
            if settings.hardware.device not in self.devices and not self.remote:
                if settings.hardware.device != "CPU":
                    from ampgan.training.hardware import check_device  # imports MindSpore: only for GPU / Ascend

                    check_device(settings.hardware.device)
                self.devices.add(settings.hardware.device)
            if self.extra is not None:
                self.extra(cfg)
        except AmpganError as err:
            where = f" (in the sweep's job {' '.join(swept)})" if swept else ""
            raise AmpganError(f"{err}{where}") from None
        return settings

    def _is_structural(self, dim: _Dim) -> bool:
        """A key that changes the defaults list (a config group): the job must be composed with it."""
        return dim.name.split("@")[0] in self._groups or "/" in dim.name

    @cached_property
    def _groups(self) -> set[str]:
        return {p.name for d in self.dirs for p in d.iterdir() if p.is_dir()}

    def _parsed(self, word: str) -> Override:
        if word not in self.parsed:
            self.parsed[word] = self._parse([word])[0]
        return self.parsed[word]

    def _base(self, structural: tuple[str, ...]) -> DictConfig:
        """The job composed from the group choices alone (cached); key overrides go on top of a copy."""
        if structural not in self.bases:
            cfg = self._compose(self.hydra_overrides + list(structural), RunMode.RUN)
            with open_dict(cfg):
                del cfg["hydra"]
            self.bases[structural] = cfg
        return self.bases[structural]

    def _compose(self, words: list[str], mode: RunMode) -> DictConfig:
        try:
            return self.hydra.compose_config(config_name=self.config_name, overrides=words, run_mode=mode,
                                             with_log_configuration=False)
        except (HydraException, OmegaConfBaseException, ValueError) as err:
            raise AmpganError(self._explain(err, words)) from None
        except OSError as err:  # Hydra looks a key up as a group folder: a key too long for a file name
            key = max(words, key=len).split("=")[0] if words else "config"
            raise AmpganError(f"{key}: no such key or group (Hydra cannot look it up: {err.strerror})") from None

    def _check_top_keys(self, cfg: DictConfig) -> None:
        """`+foo=1` adds a top-level key nothing reads: refuse it like any unknown key."""
        if set(cfg.keys()) <= set(GROUPS):
            return
        for key in cfg.keys():
            if key not in self.root_keys:
                raise AmpganError(f"{key}: no group or key '{key}' at the top level{closest(str(key), self.root_keys)} "
                                  f"(top level: {', '.join(self.root_keys)})")

    # ------------------------------------------------------------ what the jobs share
    def _check_across_jobs(self, primary: DictConfig, settings: list[Settings]) -> None:
        threads = sorted({s.hardware.threads for s in settings})
        launcher = str(primary.hydra.launcher.get("_target_", ""))
        if len(threads) > 1 and "submitit" not in launcher:
            raise AmpganError(
                f"hardware.threads takes {len(threads)} values ({', '.join(map(str, threads))}) in one sweep, but this "
                "launcher runs several jobs in one process and MindSpore fixes a process's CPU thread count at "
                "its first job: run one sweep per thread count")
        if "SlurmLauncher" in launcher and any(s.tracking.backend == "mlflow" and s.tracking.uri.startswith("sqlite:")
                                               for s in settings):
            raise AmpganError("hydra/launcher=slurm: cluster jobs log to a tracking server, not to a sqlite file "
                              "(unsafe with many writers on a shared file system): add tracking.uri=http://HOST:PORT "
                              "(`make server` starts one)")
        if "SlurmLauncher" in launcher:
            _check_slurm_workers(primary.hydra.launcher, settings)
        resumed = {s.trainer.resume for s in settings if s.trainer.resume}
        if resumed and self.jobs > len({s.trainer.resume for s in settings}):
            raise AmpganError(f"trainer.resume={sorted(resumed)[0]}: several jobs of this {self.jobs}-job sweep "
                              "would resume the same run; sweep trainer.resume alone (one run per job)")

    def _create_stores(self, settings: list[Settings]) -> None:
        """Parallel sweep jobs racing to create a fresh sqlite store fail: create each one here, once."""
        stores = {(s.tracking.uri, s.tracking.experiment) for s in settings
                  if s.tracking.backend == "mlflow" and s.tracking.uri.startswith("sqlite:///")}
        if stores:
            from ampgan.tracking.tracker import default_artifact_root, ensure_experiment, make_client

            for uri, experiment in sorted(stores):
                ensure_experiment(make_client(uri), experiment, default_artifact_root(uri))

    # ------------------------------------------------------------ Hydra's errors, in one line
    def _explain(self, err: BaseException, words: list[str]) -> str:
        text = str(err)
        if isinstance(err, MissingConfigException) and err.options is not None:
            missing = (err.missing_cfg_file or "").rsplit("/", 1)
            option = missing[-1]
            group = missing[0] if len(missing) > 1 else ""
            options = [o for o in err.options]
            return (f"{group}={option}: no such option{closest(option, options)} "
                    f"({_choose_from(group, options)})")
        if text.startswith("Ambiguous value for argument"):
            word = re.search(r"'([^']*)'", text).group(1)
            return (f"{word}: several values make a sweep, which needs --multirun (-m); "
                    "for a list write key=[a,b], for a string quote it: key='a,b'")
        match = re.match(r"Sweep parameters '([^']*)' requires --multirun", text)
        if match:
            return f"{match.group(1)}: a sweep needs --multirun (-m)"
        match = re.match(r"Could not override '([^']+)'\. No match in the defaults list", text)
        if match:
            key = match.group(1)
            return f"{key}: '{key}' is not in the defaults list: add it with +{key}=..."
        cause = err.__cause__
        missing_key = re.match(r"Key '([^']+)' (not in|is not in struct)", str(cause or ""))
        full_key = getattr(cause, "full_key", None)
        if missing_key and full_key:
            parent, _, leaf = str(full_key).rpartition(".")
            known = self._known_keys(parent, words)
            where = f" in {parent}" if parent else " at the top level"
            word = next((w for w in words if w.lstrip("+~").split("=")[0] == full_key), full_key)
            return f"{word}: no key '{leaf}'{where}{closest(leaf, known)}" + (
                f" (keys: {', '.join(known)})" if known and not closest(leaf, known) else "")
        match = re.match(r"Error merging override (.*)", text)
        if match and cause is not None:
            return f"{match.group(1)}: {str(cause).splitlines()[0]}"
        return _first_line(err)

    def _known_keys(self, parent: str, words: list[str]) -> list[str]:
        """The keys under `parent` in the composed job (groups included at the top level)."""
        structural = tuple(w for w in words if not w.lstrip("+~").startswith("hydra")
                           and self._is_structural(_Dim(w.split("=")[0], [])))
        if self._listing_keys:  # the base itself failed to compose (`hydra.nope=1` is in every base): no list
            return []
        self._listing_keys = True
        try:
            try:
                node = self._base(structural)
            except AmpganError:
                node = self._base(())
        except AmpganError:
            return []
        finally:
            self._listing_keys = False
        node = OmegaConf.select(node, parent) if parent else node
        keys = sorted(str(k) for k in node.keys()) if isinstance(node, DictConfig) else []
        if not parent:
            keys = sorted(set(keys) | set(self._groups) - {"hydra"})
        return keys


def _leaves(node, prefix: str = ""):
    """(dotted key, value) of every leaf of a plain dict / list tree."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else None
    if items is None:
        yield prefix, node
        return
    for key, child in items:
        yield from _leaves(child, f"{prefix}.{key}" if prefix else str(key))
