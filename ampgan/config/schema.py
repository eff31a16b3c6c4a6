"""Config schema: the dataclasses below are the one source of truth for every default.

Each dataclass is registered with Hydra's ConfigStore as a structured-config schema
(`register_schemas`: `schema/model/wgan_gp`, `schema/trainer`, `schema/scaler/dynamic`, ...);
every YAML option in `conf/<group>/` extends its schema
(`defaults: [/schema/trainer@_here_, _self_]`) and holds only what differs from it, plus
comments. Hydra composes `conf/train.yaml` with those types (a wrong type or an unknown key
fails at composition); `validate()` then builds the dataclasses, whose `__post_init__` checks
the values (range errors), and checks the combinations of groups (`COMBINATIONS`: each check
names the fields it reads, so the preflight can validate a huge sweep one interacting set of
keys at a time). Either way the user gets an `AmpganError` with one line naming the key.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ampgan import AmpganError, closest, outputs_dir, require  # outputs_dir: here for its importers
from ampgan.amp.scaler_config import SCALER_CONFIGS

log = logging.getLogger("ampgan")

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the ampgan package (this file is ampgan/config/schema.py)
CONF_DIR = PACKAGE_DIR.parent / "conf"


if not OmegaConf.has_resolver("ampgan_outputs"):
    OmegaConf.register_new_resolver("ampgan_outputs", lambda: str(outputs_dir()))


# ---------------------------------------------------------------- model
@dataclass
class WganGpConfig:
    """WGAN-GP (Gulrajani et al. 2017): MLPs for 2-D data, small conv nets for images."""

    name: str = "wgan_gp"
    task: str = "ampgan.tasks.gan.GanTask"
    z_dim: int = 2
    hidden: int = 128          # MLP width, or conv channels of the critic's first layer
    depth: int = 3             # hidden layers of the MLPs
    gp_lambda: float = 0.1     # paper: 0.1 on the toy sets, 10 on images
    n_critic: int = 5          # critic steps per generator step
    lr_g: float = 1e-4         # the paper's; with 3000 steps (trainer.max_steps) it covers 8 of 8 modes at each of
    lr_d: float = 1e-4         # the last 3 evaluations on seeds 0-4; 3e-4 over 1000 did on 1 of 5 (docs/case-studies.md)
    betas: tuple[float, float] = (0.5, 0.9)  # Adam; beta1 = 0 works too (mint.optim.Adam)
    # the two nets, as Hydra `_target_` nodes: each gets z_dim, hidden, depth, sample_shape (and the
    # other data shape arguments) by name if its constructor names them (ampgan.tasks.targets)
    generator: Any = field(default_factory=lambda: {"_target_": "ampgan.models.Generator"})  # z -> sample
    critic: Any = field(default_factory=lambda: {"_target_": "ampgan.models.Critic"})        # sample -> (batch,) score
    # the optimizer, a partial: ampgan calls it with the net's parameters, and passes lr_g or lr_d and betas
    # (above) if it names them and sets none of its own (e.g. mindspore.mint.optim.SGD +model.optimizer.momentum=0.9)
    optimizer: Any = field(default_factory=lambda: {"_target_": "mindspore.mint.optim.Adam", "_partial_": True})

    def __post_init__(self) -> None:
        from ampgan.config.targets import resolve_target

        for key in ("generator", "critic", "optimizer"):
            resolve_target(getattr(self, key), f"model.{key}")  # imports it: a sweep's preflight stops a bad one
        _check_size("model.z_dim", self.z_dim, MAX_WIDTH)
        _check_size("model.hidden", self.hidden, MAX_WIDTH)
        _check_size("model.depth", self.depth, MAX_DEPTH)
        require(self.gp_lambda >= 0, f"model.gp_lambda must be >= 0, got {self.gp_lambda}")
        require(self.n_critic >= 1, f"model.n_critic must be >= 1, got {self.n_critic}")
        _check_adam("model", min(self.lr_g, self.lr_d), self.betas)


@dataclass
class ClassifierConfig:
    """A net mapping samples to logits, a loss on (logits, labels), Adam. `net` and `loss` are
    Hydra `_target_` nodes built by `instantiate`; a user's net takes the data's shape by name
    (ampgan.tasks.targets)."""

    name: str = "classifier"
    task: str = "ampgan.tasks.classifier.ClassifierTask"  # the TaskBase subclass that trains it
    # a mindspore.nn.Cell mapping samples to (batch, classes) logits; ampgan's own: a small CNN with
    # BatchNorm (images) or an MLP (points), then a Dense head (+model.net.width=64 widens it)
    net: Any = field(default_factory=lambda: {"_target_": "ampgan.models.Classifier"})
    # a Cell or function (logits, int32 labels) -> scalar loss that graph mode compiles
    loss: Any = field(default_factory=lambda: {"_target_": "mindspore.nn.CrossEntropyLoss"})
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.999)
    # the optimizer, a partial: ampgan calls it with the net's parameters, and passes lr and betas
    # (above) if it names them and sets none of its own (e.g. mindspore.mint.optim.SGD +model.optimizer.momentum=0.9)
    optimizer: Any = field(default_factory=lambda: {"_target_": "mindspore.mint.optim.Adam", "_partial_": True})

    def __post_init__(self) -> None:
        from ampgan.config.targets import resolve_target

        for key in ("net", "loss", "optimizer"):
            resolve_target(getattr(self, key), f"model.{key}")  # imports it: a sweep's preflight stops a bad one
        _check_adam("model", self.lr, self.betas)


MAX_WIDTH = 2**14  # a wider layer's weights alone (x4 with Adam's moments and the gradient) outgrow host memory
MAX_DEPTH = 256


def _check_size(key: str, value: int, most: int) -> None:
    require(1 <= value <= most, f"{key} must lie in 1 .. {most}, got {value}")


def _check_adam(group: str, lr: float, betas: tuple[float, float]) -> None:
    require(lr > 0, f"{group}: learning rates must be > 0, got {lr}")
    require(len(betas) == 2, f"{group}.betas must be two numbers [beta1, beta2], got {list(betas)}")
    require(all(0.0 <= b < 1.0 for b in betas), f"{group}.betas must lie in [0, 1), got {list(betas)}")


def _check_seed(key: str, seed: int) -> None:
    require(0 <= seed < 2**32, f"{key} must lie in 0 .. 2**32-1 (NumPy's and MindSpore's seed range), got {seed}")


_BYTES_PER_POINT = 64  # peak host memory per generated 2-D point (float64 draws, labels, the split's copies)
_BYTES_PER_SAMPLE = 8   # the least a sample of any data set takes in memory: one float32 value and an int32 label


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no limit known
        return 2**62


# the URI schemes MLflow 3 opens a tracking store for (mlflow.tracking._tracking_service.utils), without
# importing MLflow here; a plugin's own schemes are read from its entry points
_DB_SCHEMES = ("postgresql", "mysql", "sqlite", "mssql")  # with a driver too: postgresql+psycopg2://
_STORE_SCHEMES = ("file", "databricks", "databricks-uc", "uc", "http", "https")


def _plugin_store_schemes() -> set[str]:
    from importlib.metadata import entry_points

    return {ep.name for ep in entry_points(group="mlflow.tracking_store")}


def _short(text: str, most: int = 60) -> str:
    return text if len(text) <= most else f"{text[:most]}...({len(text)} characters)"


def _check_tracking_uri(uri: str) -> None:
    """A tracking URI MLflow can open from any run folder (Hydra starts each job in its own)."""
    if not uri:
        return
    require(re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", uri) is not None,
            f"tracking.uri must be a URI such as sqlite:////abs/path/mlflow.db or http://host:5000, got '{uri}'")
    scheme = uri.split(":", 1)[0].lower()
    require(scheme.startswith(_DB_SCHEMES) or scheme in _STORE_SCHEMES or scheme in _plugin_store_schemes(),
            f"tracking.uri={_short(uri)}: MLflow has no tracking store for '{_short(scheme)}:' URIs; use "
            "sqlite:////abs/path/mlflow.db, http(s)://host:port (a tracking server) or a database URI "
            "(postgresql://, mysql://, mssql://)")
    if uri.startswith("sqlite:"):
        path = uri[len("sqlite:"):]
        require(path.startswith("////"),
                f"tracking.uri: use an absolute sqlite path (sqlite:////abs/path/mlflow.db), got '{uri}': "
                "a relative one would land in each job's own folder")
    require(not uri.startswith("file:") or os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() == "true",
            f"tracking.uri={uri}: MLflow 3 refuses file stores unless MLFLOW_ALLOW_FILE_STORE=true; "
            "use sqlite:////abs/path/mlflow.db")


# ---------------------------------------------------------------- data
@dataclass
class DataConfig:
    """A data set: 2-D toy sets are generated, digits come inside scikit-learn. No downloads."""

    name: str = "gaussians8"
    n_train: int = 20000       # training points of the toy sets; digits has 1797 images in all
    test_fraction: float = 0.2
    noise: float = 0.02        # std of each Gaussian mode / Swiss-roll noise (paper: 0.02, 0.05, 0.25)
    image_size: int = 8        # digits: 8 (native) or 16 (resized)
    seed: int = 1234           # fixes the generated points and the train/test split
    # a user's data: {_target_: mypkg.load, ...} returning (x, y) or (x_train, y_train, x_test, y_test)
    # arrays (ampgan.data.custom); `name` is then only its label (data=custom)
    source: Any = None

    def __post_init__(self) -> None:
        from ampgan.data import DATASETS

        if self.source is not None:
            from ampgan.config.targets import resolve_target

            resolve_target(self.source, "data.source")
            require(0 < self.test_fraction < 1, f"data.test_fraction must lie in (0, 1), got {self.test_fraction}")
            _check_seed("data.seed", self.seed)
            return
        require(self.name in DATASETS, f"unknown data set '{self.name}' (known: {', '.join(sorted(DATASETS))})")
        require(self.n_train >= 16, f"data.n_train must be >= 16, got {self.n_train}")
        require(0 < self.test_fraction < 1, f"data.test_fraction must lie in (0, 1), got {self.test_fraction}")
        _check_seed("data.seed", self.seed)
        need = self.n_train / (1 - self.test_fraction) * _BYTES_PER_POINT
        require(self.name == "digits" or need <= _memory_bytes(),
                f"data.n_train={self.n_train}: generating the set needs ~{need / 2**30:.0f} GiB, "
                f"more than this machine's {_memory_bytes() / 2**30:.0f} GiB")
        require(self.noise >= 0, f"data.noise must be >= 0, got {self.noise}")
        require(self.image_size in (8, 16), f"data.image_size must be 8 or 16, got {self.image_size}")


# ---------------------------------------------------------------- amp
AMP_LEVELS = ("O0", "O1", "O2", "O3")


@dataclass
class AmpConfig:
    """How the nets run: MindSpore's AMP level plus FP32 keep-lists."""

    level: str = "O0"
    keep_fp32: list[str] = field(default_factory=list)  # cells kept in FP32: nn class names or cell paths
    fp32_loss: bool = True                # classifier: softmax-CE in FP32 (false: float16)
    fp32_gradient_penalty: bool = False   # WGAN-GP: the GP through an FP32 twin of the critic sharing its weights

    def __post_init__(self) -> None:
        self.level = self.level.upper()
        require(self.level in AMP_LEVELS, f"amp.level must be one of {', '.join(AMP_LEVELS)}, got '{self.level}'")
        if self.keep_fp32:  # MindSpore is imported only when there is a keep-list to check
            from ampgan.amp.policy import resolve_cell_types

            resolve_cell_types(self.keep_fp32)  # raises on unknown names


# ---------------------------------------------------------------- hardware
DEVICES = ("CPU", "GPU", "Ascend")


@dataclass
class HardwareConfig:
    device: str = "CPU"
    jit: bool = True     # compile train steps with ms.jit (PYNATIVE otherwise); WGAN-GP needs it
    threads: int = 0     # CPU op threads; 0 leaves MindSpore's default
    unsafe_pynative_gp: bool = False  # study only: allow jit=false for WGAN-GP (its GP gradient is then wrong)
    # processes training one run data-parallel through MindSpore's msrun (docs/data-parallel.md): each
    # takes trainer.batch_size / workers of every global batch; gradients and the scaler's decisions are all-reduced
    workers: int = 1

    def __post_init__(self) -> None:
        require(self.device in DEVICES, f"hardware.device must be one of {', '.join(DEVICES)}, got '{self.device}'")
        require(self.threads >= 0, f"hardware.threads must be >= 0, got {self.threads}")
        require(1 <= self.workers <= 1024, f"hardware.workers must lie in 1 .. 1024, got {self.workers}")


# ---------------------------------------------------------------- trainer
MAX_STEPS = 10**9  # more steps than a run finishes: 11.6 days even at a millisecond a step (a small net's step on a GPU)


@dataclass
class TrainerConfig:
    max_steps: int = 3000        # optimiser steps (GAN: generator steps, each after n_critic critic steps)
    batch_size: int = 256        # at most the training split's size
    seed: int = 0                # weights, batches and noise; 0 .. 2**32-1
    log_every: int = 10          # metrics to the tracker
    print_every: int = 200       # one status line on the console
    eval_every: int = 300        # 0: evaluate only at the end
    checkpoint_every: int = 0    # 0: checkpoint only at the end
    eval_samples: int = 2000     # generated samples for GAN metrics
    grad_health: bool = True     # in-graph gradient statistics on the logged steps (every step: underflow_aware)
    layer_health_every: int = 100  # per-parameter health metrics (grad/<param>/<field>); 0: never
    headroom: bool = True        # with grad_health: each leaf cell's max |output| (act/<cell>/max_abs), float16 headroom
    headroom_warn: float = 8.0   # warn (and tag the run) once float16 headroom, 65504 / max |activation|, falls below
    max_nonfinite_steps: int = 50  # stop as diverged after this many non-finite losses in a row
    resume: str = ""             # continue a run: its MLflow run id, run folder or checkpoint path
    requeue: bool = False        # on SIGTERM end the run so that a restarted job of the same key continues it
    keep_checkpoints: int = 2    # newest full-state checkpoint sets kept in the run folder
    print_seconds: float = 30.0  # a status line at least this often (0: only every print_every steps)
    reuse_compiled: bool = True  # a later job of this process with the same structure runs the compiled steps again

    def __post_init__(self) -> None:
        require(self.max_steps >= 1, f"trainer.max_steps must be >= 1, got {self.max_steps}")
        require(self.max_steps <= MAX_STEPS,
                f"trainer.max_steps must be at most 10**9, got {self.max_steps}: no run gets that far "
                "(10**9 steps take 11.6 days even at a millisecond a step)")
        require(self.batch_size >= 2, f"trainer.batch_size must be >= 2, got {self.batch_size}")
        _check_seed("trainer.seed", self.seed)
        for key in ("log_every", "print_every"):
            require(getattr(self, key) >= 1, f"trainer.{key} must be >= 1, got {getattr(self, key)}")
        for key in ("eval_every", "checkpoint_every", "layer_health_every"):
            require(getattr(self, key) >= 0, f"trainer.{key} must be >= 0, got {getattr(self, key)}")
        require(self.eval_samples >= 100, f"trainer.eval_samples must be >= 100, got {self.eval_samples}")
        require(self.keep_checkpoints >= 1, f"trainer.keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        require(self.print_seconds >= 0, f"trainer.print_seconds must be >= 0, got {self.print_seconds}")
        require(self.max_nonfinite_steps >= 1,
                 f"trainer.max_nonfinite_steps must be >= 1, got {self.max_nonfinite_steps}")
        require(self.headroom_warn > 1, f"trainer.headroom_warn must be > 1, got {self.headroom_warn}")


# ---------------------------------------------------------------- tracking
@dataclass
class TrackingConfig:
    backend: str = "mlflow"   # mlflow | none
    uri: str = ""             # tracking URI; the embedded sqlite store under outputs/ by default
    experiment: str = "ampgan"
    run_name: str = ""        # default: model-data-amp-scaler
    flush_every: int = 500    # buffered metrics sent in one batch
    heartbeat_seconds: float = 30.0  # how often a run tells the store it is alive
    # auto: a new run whose process has not loaded MLflow (a single run) is tracked by a helper
    # process, which opens the store while the steps compile (~2 s sooner to the first step);
    # always: every new run (a resumed or requeueable run is tracked in process); never
    background: str = "auto"

    def __post_init__(self) -> None:
        require(self.backend in ("mlflow", "none"), f"tracking.backend must be mlflow or none, got '{self.backend}'")
        require(0 < len(self.experiment) <= 500,
                f"tracking.experiment must be 1 to 500 characters (MLflow's limit), got {len(self.experiment)}")
        _check_tracking_uri(self.uri)
        require(self.flush_every >= 1, f"tracking.flush_every must be >= 1, got {self.flush_every}")
        require(self.heartbeat_seconds > 0, f"tracking.heartbeat_seconds must be > 0, got {self.heartbeat_seconds}")
        require(self.background in ("auto", "always", "never"),
                f"tracking.background must be auto, always or never, got '{self.background}'")
        if self.backend == "mlflow" and not self.uri:
            self.uri = f"sqlite:///{outputs_dir() / 'mlflow.db'}"


@dataclass
class Settings:
    """The validated run configuration: what every build function receives."""

    model: WganGpConfig | ClassifierConfig
    data: DataConfig
    amp: AmpConfig
    scaler: Any
    hardware: HardwareConfig
    trainer: TrainerConfig
    tracking: TrackingConfig

    @property
    def is_gan(self) -> bool:
        return isinstance(self.model, WganGpConfig)

    @property
    def own_data(self) -> bool:
        """The model reads its data itself (model=lm's text): the data group is not used."""
        return hasattr(self.model, "data_name")

    @property
    def data_name(self) -> str:
        return self.model.data_name if self.own_data else self.data.name


MODELS = {"wgan_gp": WganGpConfig, "classifier": ClassifierConfig}

# ConfigStore paths, per config group: {path: dataclass}. A YAML option extends its schema
# (`defaults: [/schema/model/wgan_gp@_here_, _self_]`) and holds only what differs from it.
# The schemas live under `schema/`, apart from the groups, so they are no option of a group
# (`model=glob(*)` sweeps the YAML options only).
SCHEMAS: dict[str, dict[str, type]] = {
    "model": {f"schema/model/{name}": schema for name, schema in MODELS.items()},
    "data": {"schema/data": DataConfig},
    "amp": {"schema/amp": AmpConfig},
    "scaler": {f"schema/scaler/{name}": schema for name, schema in SCALER_CONFIGS.items()},
    "hardware": {"schema/hardware": HardwareConfig},
    "trainer": {"schema/trainer": TrainerConfig},
    "tracking": {"schema/tracking": TrackingConfig},
}
GROUPS = tuple(SCHEMAS)


def register_schemas() -> None:
    """Store every schema in Hydra's ConfigStore (done on import; idempotent)."""
    store = ConfigStore.instance()
    for schemas in SCHEMAS.values():
        for path, schema in schemas.items():
            group, _, name = path.rpartition("/")
            store.store(group=group, name=name, node=schema)


register_schemas()


def schema_of(group: str, node: Any) -> type:
    """The dataclass a group's node is checked against (model and scaler: chosen by `name`)."""
    registry = {"model": MODELS, "scaler": SCALER_CONFIGS}.get(group)
    if registry is None:
        return next(iter(SCHEMAS[group].values()))
    name = node.get("name") if isinstance(node, (DictConfig, dict)) else None
    if name in registry:
        return registry[name]
    if group == "model" and isinstance(node, (DictConfig, dict)) and node.get("task"):
        schema = _task_class(node["task"]).Config
        _require_task_fits(node["task"], schema, schema not in MODELS.values(), name)
        return schema
    raise AmpganError(f"unknown {group} '{name}' (known: {', '.join(sorted(registry))}"
                      f"{'; or a model with its own task: model.task=mypkg.MyTask' if group == 'model' else ''})")


def _task_class(path: str) -> type:
    """The task class `model.task` names; it carries its config schema as `Config`."""
    from ampgan.config.targets import first_line, import_object

    try:
        cls = import_object(path)
    except Exception as err:  # noqa: BLE001 - a user's task module: one line with its reason
        raise AmpganError(f"model.task={path}: cannot import it ({type(err).__name__}: {first_line(err)})") from None
    if not isinstance(cls, type) or not hasattr(cls, "Config"):
        raise AmpganError(f"model.task: {path} is no task class (a TaskBase subclass with a Config dataclass)")
    return cls


def _check_task(model: Any) -> None:
    """A model config and the task it names belong together (model.task on another model's schema
    would build a task from settings it does not know)."""
    expected = _task_class(model.task).Config
    _require_task_fits(model.task, expected, type(model) is expected, model.name)


def _require_task_fits(path: str, schema: type, ok: bool, name: Any) -> None:
    require(ok, f"model.task={path} trains model configs of type {schema.__name__}, not model={name}: "
                "choose its model option instead")


def _nonfinite_field(obj: Any) -> str | None:
    """The first float field of a dataclass holding NaN or infinity, as 'name=value'."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, float) and not math.isfinite(v):
                return f"{f.name}={v}"
    return None


def build_group(group: str, schema: type, node: Any) -> Any:
    try:
        obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), node))
    except OmegaConfBaseException as err:
        msg = str(err).splitlines()[0]
        key = getattr(err, "full_key", None) or ""
        unknown = re.match(r"Key '([^']+)' not in '", msg)
        if unknown:
            leaf = unknown.group(1)
            known = [f.name for f in fields(schema)]
            raise AmpganError(f"{group}.{key or leaf}: no key '{leaf}' in {group}{closest(leaf, known)}") from None
        raise AmpganError(f"{group}{'.' + key if key else ''}: {msg}") from None
    bad = _nonfinite_field(obj)
    if bad:
        raise AmpganError(f"{group}.{bad}: must be a finite number")
    return obj


def _check_option_name(group: str, node: Any) -> None:
    """`model.name=classifier` on top of model=wgan_gp would mix two schemas: ask for the option."""
    if not isinstance(node, DictConfig):
        return
    typed = OmegaConf.get_type(node)
    registry = {"model": MODELS, "scaler": SCALER_CONFIGS}[group]
    if typed in registry.values():
        option = typed.__dataclass_fields__["name"].default
        require(node.name == option, f"{group}.name={node.name}: choose the option instead ({group}={node.name}); "
                                     f"the name of {group}={option} cannot change")


def validate(cfg: DictConfig, cache: dict | None = None) -> Settings:
    """Turn the composed Hydra config into checked dataclasses, or raise AmpganError.

    `cache` (a dict the caller keeps) reuses the groups already built from identical nodes:
    the preflight validates many jobs of a sweep that differ in one group only.
    """
    for group in GROUPS:
        if group not in cfg:
            raise AmpganError(f"config has no '{group}' group")
    try:  # interpolations such as ${amp.level} resolve against the whole config, so resolve first
        for group in ("model", "scaler"):
            _check_option_name(group, cfg[group])
        plain = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        raise AmpganError(f"{getattr(err, 'full_key', '') or 'config'}: {str(err).splitlines()[0]}") from None
    built = {}
    for group in GROUPS:
        node = plain[group]
        key = (group, repr(node))
        if cache is None or key not in cache:
            obj = build_group(group, schema_of(group, node), node)
            if cache is None:
                built[group] = obj
                continue
            cache[key] = obj
        built[group] = copy.deepcopy(cache[key])
    settings = Settings(**built)
    _check_task(settings.model)
    for combination in COMBINATIONS:
        combination.check(settings)
    return settings


# ---------------------------------------------------------------- combinations of groups
@dataclass(frozen=True)
class Combination:
    """A check across groups. `reads` lists every field it looks at ("model.name", ...): the
    preflight validates a sweep's combinations of exactly the keys that can change them."""

    reads: tuple[str, ...]
    check: Callable[[Settings], None]


COMBINATIONS: list[Combination] = []


def _combination(*reads: str) -> Callable:
    def register(check: Callable[[Settings], None]) -> Callable[[Settings], None]:
        COMBINATIONS.append(Combination(reads, check))
        return check
    return register


@_combination("model.name", "hardware.jit", "hardware.unsafe_pynative_gp")
def _gan_needs_jit(s: Settings) -> None:
    if not s.is_gan or s.hardware.jit:
        return
    require(s.hardware.unsafe_pynative_gp,
            "hardware.jit=false with model=wgan_gp: MindSpore 2.10 computes the gradient penalty's "
            "second-order gradient wrongly in PYNATIVE mode; keep jit on")
    log.warning("UNSAFE: hardware.jit=false with model=wgan_gp (hardware.unsafe_pynative_gp=true): MindSpore 2.10 "
                "computes the gradient penalty's second-order gradient silently WRONG in PYNATIVE mode, so this "
                "critic does not train as WGAN-GP; use it only to study that failure")


@_combination("scaler.name", "trainer.grad_health")
def _scaler_needs_health(s: Settings) -> None:
    require(not SCALER_CONFIGS[s.scaler.name].needs_health or s.trainer.grad_health,
            f"scaler={s.scaler.name} reads gradient health: set trainer.grad_health=true")


@_combination("model.name", "data.name")
def _classifier_needs_labels(s: Settings) -> None:
    require(s.is_gan or s.own_data or s.data.name != "swissroll", "data=swissroll has no class labels: use it with model=wgan_gp")


@_combination("model.name", "data.name", "data.n_train", "data.test_fraction", "data.seed", "data.source",
              "trainer.batch_size")
def _batch_fits_the_data(s: Settings) -> None:
    from ampgan.data import train_size

    n = None if s.own_data else train_size(s.data)
    require(n is None or s.trainer.batch_size <= n,
            f"trainer.batch_size={s.trainer.batch_size} is larger than the {n} training samples of data={s.data.name}")
    # data known only once loaded (a model's own text, data.source; checked again then): host memory bounds the batch
    most = _memory_bytes() // _BYTES_PER_SAMPLE
    require(s.trainer.batch_size <= most,
            f"trainer.batch_size={s.trainer.batch_size} is larger than any data set this machine holds: at "
            f"{_BYTES_PER_SAMPLE} bytes a sample or more, {most:,} samples fill its {_memory_bytes() / 2**30:.0f} GiB")


@_combination("trainer.batch_size", "hardware.workers")
def _batch_splits_over_workers(s: Settings) -> None:
    w = s.hardware.workers
    require(s.trainer.batch_size % w == 0 and s.trainer.batch_size // w >= 1,
            f"trainer.batch_size={s.trainer.batch_size} does not split over hardware.workers={w}: "
            f"each rank takes an equal share of the global batch (try trainer.batch_size="
            f"{max(w, s.trainer.batch_size // w * w)})")


@_combination("model.name", "hardware.workers", "hardware.jit")
def _workers_need_jit(s: Settings) -> None:
    require(s.hardware.workers == 1 or s.hardware.jit,
            f"hardware.workers={s.hardware.workers} needs hardware.jit=true (the data-parallel step is compiled)")


@_combination("model.name", "amp.fp32_loss")
def _fp32_loss_applies(s: Settings) -> None:
    require(not s.is_gan or s.amp.fp32_loss,
            "amp.fp32_loss=false with model=wgan_gp: WGAN-GP's losses are means of the critic's FP32 outputs, "
            "so the flag would change nothing; it applies to model=classifier")


@_combination("model.name", "amp.fp32_gradient_penalty")
def _fp32_gp_applies(s: Settings) -> None:
    require(s.is_gan or not s.amp.fp32_gradient_penalty,
            "amp.fp32_gradient_penalty=true with model=classifier: the classifier has no gradient penalty, "
            "so the flag would change nothing; it applies to model=wgan_gp")
