"""Loss-scaler settings: one dataclass per strategy, checked on construction.

They live apart from the scalers (`ampgan.amp.scalers`) so that validating a command line
does not import MindSpore. `needs_health`: the strategy reads in-graph gradient health; `adjusts`: its scale changes with the
steps' outcomes; `skip_nonfinite`: an overflowing step is dropped (a setting, or always for a
strategy that adjusts). What diagnose's rules read, instead of the strategies' names.
`fp32_twin()`: the scaler of the run's FP32 twin in diagnose: no loss scale, but whatever the
strategy does that is not about precision (fixed_clip's clipping) stays, so the twin follows
the run's own path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ampgan import require


class _UnscaledTwin:
    def fp32_twin(self) -> NoneScalerConfig:
        return NoneScalerConfig()


@dataclass
class NoneScalerConfig(_UnscaledTwin):
    needs_health: ClassVar[bool] = False
    adjusts: ClassVar[bool] = False
    name: str = "none"
    skip_nonfinite: bool = False  # FP32 baseline: let a NaN show, as plain training would


@dataclass
class StaticScalerConfig(_UnscaledTwin):
    needs_health: ClassVar[bool] = False
    adjusts: ClassVar[bool] = False
    name: str = "static"
    init_scale: float = 1024.0
    skip_nonfinite: bool = True

    def __post_init__(self) -> None:
        require(0 < self.init_scale < float("inf"), f"scaler.init_scale must be a finite number > 0, got {self.init_scale}")


@dataclass
class DynamicScalerConfig(_UnscaledTwin):
    needs_health: ClassVar[bool] = False
    adjusts: ClassVar[bool] = True         # the scale changes with the steps' outcomes (the others' is fixed)
    skip_nonfinite: ClassVar[bool] = True  # an overflowing step is always skipped
    name: str = "dynamic"
    init_scale: float = 2.0**16
    factor: int = 2
    window: int = 1000

    def __post_init__(self) -> None:
        require(1 <= self.init_scale < float("inf"), f"scaler.init_scale must be a finite number >= 1, got {self.init_scale}")
        require(self.factor >= 2, f"scaler.factor must be an integer >= 2, got {self.factor}")
        require(self.window >= 1, f"scaler.window must be >= 1, got {self.window}")


@dataclass
class UnderflowAwareScalerConfig(DynamicScalerConfig):
    needs_health: ClassVar[bool] = True
    name: str = "underflow_aware"
    underflow_threshold: float = 0.01  # raise early above this fraction of nonzero grads in fp16's subnormal range
    headroom_margin: float = 8.0       # keep max|scaled g| * factor * margin below float16's max (65504)
    history: int = 16                  # steps of max|g| history for the headroom estimate
    min_interval: int = 2              # steps between two early raises
    probation: int = 5                 # an overflow within this many steps after an early raise counts against it
    cooldown: int = 200                # ...and pauses early raises for exactly this many steps
    max_scale: float = 2.0**24         # ceiling for early raises (window growth keeps dynamic's rule)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0 < self.underflow_threshold < 1,
                 f"scaler.underflow_threshold must lie in (0, 1), got {self.underflow_threshold}")
        require(self.headroom_margin >= 1, f"scaler.headroom_margin must be >= 1, got {self.headroom_margin}")
        for key in ("history", "min_interval", "probation"):
            require(getattr(self, key) >= 1, f"scaler.{key} must be >= 1, got {getattr(self, key)}")
        require(self.cooldown >= 0, f"scaler.cooldown must be >= 0, got {self.cooldown}")
        require(self.max_scale >= self.init_scale,
                 f"scaler.max_scale ({self.max_scale}) must be >= scaler.init_scale ({self.init_scale})")


@dataclass
class FixedClipScalerConfig:
    needs_health: ClassVar[bool] = False
    adjusts: ClassVar[bool] = False
    name: str = "fixed_clip"
    init_scale: float = 1024.0
    clip_norm: float = 1.0          # clip the unscaled gradients to this global L2 norm
    skip_nonfinite: bool = True     # false: apply the step with non-finite elements zeroed

    def __post_init__(self) -> None:
        require(0 < self.init_scale < float("inf"), f"scaler.init_scale must be a finite number > 0, got {self.init_scale}")
        require(0 < self.clip_norm < float("inf"), f"scaler.clip_norm must be a finite number > 0, got {self.clip_norm}")

    def fp32_twin(self) -> FixedClipScalerConfig:
        """The same clipping at scale 1; a non-finite step is applied (zeroed), as plain training would go on."""
        return FixedClipScalerConfig(init_scale=1.0, clip_norm=self.clip_norm, skip_nonfinite=False)


SCALER_CONFIGS = {c.name: c for c in (NoneScalerConfig, StaticScalerConfig, DynamicScalerConfig,
                                       UnderflowAwareScalerConfig, FixedClipScalerConfig)}
