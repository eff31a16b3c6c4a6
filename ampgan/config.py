"""Config schema: one dataclass per config-group option, checked before anything runs.

Hydra composes `conf/train.yaml` (struct mode rejects unknown keys); `validate()` then
merges every group into its dataclass (type errors) and builds the objects, whose
`__post_init__` checks the values (range errors). Either way the user gets an
`AmpganError` with one line naming the key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ampgan import AmpganError, require

PACKAGE_DIR = Path(__file__).resolve().parent
CONF_DIR = PACKAGE_DIR.parent / "conf"


def outputs_dir() -> Path:
    """Absolute folder for runs and the embedded MLflow store; `AMPGAN_OUTPUTS` overrides."""
    return Path(os.environ.get("AMPGAN_OUTPUTS", PACKAGE_DIR.parent / "outputs")).resolve()


if not OmegaConf.has_resolver("ampgan_outputs"):
    OmegaConf.register_new_resolver("ampgan_outputs", lambda: str(outputs_dir()))


# ---------------------------------------------------------------- model
@dataclass
class WganGpConfig:
    """WGAN-GP (Gulrajani et al. 2017): MLPs for 2-D data, small conv nets for images."""

    name: str = "wgan_gp"
    z_dim: int = 2
    hidden: int = 128          # MLP width, or conv channels of the first layer
    depth: int = 3             # hidden layers of the MLPs
    gp_lambda: float = 0.1     # paper: 0.1 on the toy sets, 10 on images
    n_critic: int = 5
    lr_g: float = 3e-4
    lr_d: float = 3e-4
    betas: tuple[float, float] = (0.5, 0.9)

    def __post_init__(self) -> None:
        require(self.z_dim >= 1, f"model.z_dim must be >= 1, got {self.z_dim}")
        require(self.hidden >= 1, f"model.hidden must be >= 1, got {self.hidden}")
        require(self.depth >= 1, f"model.depth must be >= 1, got {self.depth}")
        require(self.gp_lambda >= 0, f"model.gp_lambda must be >= 0, got {self.gp_lambda}")
        require(self.n_critic >= 1, f"model.n_critic must be >= 1, got {self.n_critic}")
        _check_adam("model", min(self.lr_g, self.lr_d), self.betas)


@dataclass
class ClassifierConfig:
    """A backbone (small CNN with BatchNorm, or an MLP for 2-D data) plus a Dense head."""

    name: str = "classifier"
    width: int = 32
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)

    def __post_init__(self) -> None:
        require(self.width >= 1, f"model.width must be >= 1, got {self.width}")
        _check_adam("model", self.lr, self.betas)


def _check_adam(group: str, lr: float, betas: tuple[float, float]) -> None:
    require(lr > 0, f"{group}: learning rates must be > 0, got {lr}")
    require(all(0.0 <= b < 1.0 for b in betas), f"{group}.betas must lie in [0, 1), got {list(betas)}")


# ---------------------------------------------------------------- data
@dataclass
class DataConfig:
    """A data set: 2-D toy sets are generated, digits come inside scikit-learn. No downloads."""

    name: str = "gaussians8"
    n_train: int = 20000       # toy sets only; digits has 1797 images in all
    test_fraction: float = 0.2
    noise: float = 0.02        # std of each Gaussian mode / Swiss-roll noise
    image_size: int = 8        # digits: 8 (native) or 16 (resized)
    seed: int = 1234           # fixes the generated points and the train/test split

    def __post_init__(self) -> None:
        from ampgan.data import DATASETS

        require(self.name in DATASETS, f"unknown data set '{self.name}' (known: {', '.join(sorted(DATASETS))})")
        require(self.n_train >= 16, f"data.n_train must be >= 16, got {self.n_train}")
        require(0 < self.test_fraction < 1, f"data.test_fraction must lie in (0, 1), got {self.test_fraction}")
        require(self.noise >= 0, f"data.noise must be >= 0, got {self.noise}")
        require(self.image_size in (8, 16), f"data.image_size must be 8 or 16, got {self.image_size}")


# ---------------------------------------------------------------- amp
AMP_LEVELS = ("O0", "O1", "O2", "O3")


@dataclass
class AmpConfig:
    """How the nets run: MindSpore's AMP level plus FP32 keep-lists."""

    level: str = "O0"
    keep_fp32: list[str] = field(default_factory=list)  # mindspore.nn cell class names
    fp32_loss: bool = True                # loss / softmax-CE computed in FP32
    fp32_gradient_penalty: bool = False   # the GP term through an FP32 twin of the critic

    def __post_init__(self) -> None:
        self.level = self.level.upper()
        require(self.level in AMP_LEVELS, f"amp.level must be one of {', '.join(AMP_LEVELS)}, got '{self.level}'")
        from ampgan.amp.policy import resolve_cell_types

        resolve_cell_types(self.keep_fp32)  # raises on unknown names


# ---------------------------------------------------------------- hardware
DEVICES = ("CPU", "GPU", "Ascend")


@dataclass
class HardwareConfig:
    device: str = "CPU"
    jit: bool = True     # compile train steps with ms.jit (PYNATIVE otherwise)
    threads: int = 0     # CPU op threads; 0 leaves MindSpore's default

    def __post_init__(self) -> None:
        require(self.device in DEVICES, f"hardware.device must be one of {', '.join(DEVICES)}, got '{self.device}'")
        require(self.threads >= 0, f"hardware.threads must be >= 0, got {self.threads}")


# ---------------------------------------------------------------- trainer
@dataclass
class TrainerConfig:
    max_steps: int = 1000        # optimiser steps (GAN: generator steps, each after n_critic critic steps)
    batch_size: int = 256
    seed: int = 0
    log_every: int = 10          # metrics to the tracker
    print_every: int = 200       # one status line on the console
    eval_every: int = 0          # 0: evaluate only at the end
    checkpoint_every: int = 0    # 0: checkpoint only at the end
    eval_samples: int = 2000     # generated samples for GAN metrics
    grad_health: bool = True     # in-graph gradient statistics in every step
    layer_health_every: int = 100  # per-parameter health metrics (grad/<param>/<field>); 0: never
    max_nonfinite_steps: int = 50  # stop as diverged after this many non-finite losses in a row

    def __post_init__(self) -> None:
        require(self.max_steps >= 1, f"trainer.max_steps must be >= 1, got {self.max_steps}")
        require(self.batch_size >= 2, f"trainer.batch_size must be >= 2, got {self.batch_size}")
        for key in ("log_every", "print_every"):
            require(getattr(self, key) >= 1, f"trainer.{key} must be >= 1, got {getattr(self, key)}")
        for key in ("eval_every", "checkpoint_every", "layer_health_every"):
            require(getattr(self, key) >= 0, f"trainer.{key} must be >= 0, got {getattr(self, key)}")
        require(self.eval_samples >= 100, f"trainer.eval_samples must be >= 100, got {self.eval_samples}")
        require(self.max_nonfinite_steps >= 1,
                 f"trainer.max_nonfinite_steps must be >= 1, got {self.max_nonfinite_steps}")


# ---------------------------------------------------------------- tracking
@dataclass
class TrackingConfig:
    backend: str = "mlflow"   # mlflow | none
    uri: str = ""             # tracking URI; the embedded sqlite store under outputs/ by default
    experiment: str = "ampgan"
    run_name: str = ""        # default: model-data-amp-scaler
    flush_every: int = 500    # buffered metrics sent in one batch

    def __post_init__(self) -> None:
        require(self.backend in ("mlflow", "none"), f"tracking.backend must be mlflow or none, got '{self.backend}'")
        require(self.flush_every >= 1, f"tracking.flush_every must be >= 1, got {self.flush_every}")
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


MODELS = {"wgan_gp": WganGpConfig, "classifier": ClassifierConfig}


def _build(group: str, schema: type, node: Any) -> Any:
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        msg = str(err).splitlines()[0]
        key = getattr(err, "full_key", None)
        raise AmpganError(f"{group}{'.' + key if key else ''}: {msg}") from None


def _schema(group: str, registry: dict[str, type], node: Any) -> type:
    name = node.get("name") if isinstance(node, DictConfig) else None
    if name not in registry:
        raise AmpganError(f"unknown {group} '{name}' (known: {', '.join(sorted(registry))})")
    return registry[name]


def validate(cfg: DictConfig) -> Settings:
    """Turn the composed Hydra config into checked dataclasses, or raise AmpganError."""
    from ampgan.amp.scalers import SCALERS

    for group in ("model", "data", "amp", "scaler", "hardware", "trainer", "tracking"):
        if group not in cfg:
            raise AmpganError(f"config has no '{group}' group")
    try:  # interpolations such as ${amp.level} resolve against the whole config, so resolve first
        cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    except OmegaConfBaseException as err:
        raise AmpganError(f"{getattr(err, 'full_key', '') or 'config'}: {str(err).splitlines()[0]}") from None
    settings = Settings(
        model=_build("model", _schema("model", MODELS, cfg.model), cfg.model),
        data=_build("data", DataConfig, cfg.data),
        amp=_build("amp", AmpConfig, cfg.amp),
        scaler=_build("scaler", _schema("scaler", {k: v.config for k, v in SCALERS.items()}, cfg.scaler), cfg.scaler),
        hardware=_build("hardware", HardwareConfig, cfg.hardware),
        trainer=_build("trainer", TrainerConfig, cfg.trainer),
        tracking=_build("tracking", TrackingConfig, cfg.tracking),
    )
    _check_combination(settings)
    return settings


def _check_combination(s: Settings) -> None:
    if s.is_gan and not s.hardware.jit:
        raise AmpganError(
            "hardware.jit=false with model=wgan_gp: MindSpore 2.10 computes the gradient penalty's "
            "second-order gradient wrongly in PYNATIVE mode; keep jit on"
        )
    from ampgan.amp.scalers import SCALERS

    if SCALERS[s.scaler.name].needs_health and not s.trainer.grad_health:
        raise AmpganError(f"scaler={s.scaler.name} reads gradient health: set trainer.grad_health=true")
    if s.data.name == "swissroll" and not s.is_gan:
        raise AmpganError("data=swissroll has no class labels: use it with model=wgan_gp")
