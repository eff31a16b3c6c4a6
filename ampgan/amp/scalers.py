"""Loss scalers: one small protocol, every strategy usable inside `@ms.jit`.

    scaled_loss = scaler.scale(loss)
    grads       = scaler.unscale(scaled_grads)
    grads, clipped = scaler.clip(grads, global_norm)      # identity except fixed_clip
    apply       = scaler.adjust(grads_finite, health)   # updates the scaler's state in place
    if apply: optimizer(grads)

State lives in Parameters (changed with `ops.assign`), so a compiled step keeps it across
calls. FP32 runs use `NoOpScaler` through the very same code path. Each optimised net
gets its own instance; `prefix` keeps Parameter names unique within one graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
from mindspore import Parameter, Tensor, ops

from ampgan import AmpganError


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise AmpganError(message)


# ---------------------------------------------------------------- configs
@dataclass
class NoneScalerConfig:
    name: str = "none"
    skip_nonfinite: bool = False  # FP32 baseline: let a NaN show, as plain training would


@dataclass
class StaticScalerConfig:
    name: str = "static"
    init_scale: float = 1024.0
    skip_nonfinite: bool = True

    def __post_init__(self) -> None:
        _require(0 < self.init_scale < float("inf"), f"scaler.init_scale must be a finite number > 0, got {self.init_scale}")


@dataclass
class DynamicScalerConfig:
    name: str = "dynamic"
    init_scale: float = 2.0**16
    factor: int = 2
    window: int = 1000

    def __post_init__(self) -> None:
        _require(1 <= self.init_scale < float("inf"), f"scaler.init_scale must be a finite number >= 1, got {self.init_scale}")
        _require(self.factor >= 2, f"scaler.factor must be an integer >= 2, got {self.factor}")
        _require(self.window >= 1, f"scaler.window must be >= 1, got {self.window}")


# ---------------------------------------------------------------- scalers
@ms.jit_class
class NoOpScaler:
    """Scale 1, nothing to adjust. Non-finite steps are applied unless `skip_nonfinite`."""

    config = NoneScalerConfig
    needs_health = False

    def __init__(self, cfg, prefix: str):
        self.scale_value = Parameter(Tensor(getattr(cfg, "init_scale", 1.0), ms.float32), name=f"{prefix}.scale", requires_grad=False)
        self.apply_nonfinite = Tensor(not cfg.skip_nonfinite, ms.bool_)

    def scale(self, loss):
        return loss * self.scale_value.astype(loss.dtype)

    def unscale(self, grads):
        inv = 1.0 / self.scale_value
        return tuple(g * inv.astype(g.dtype) for g in grads)

    def clip(self, grads, grad_norm):
        return grads, ops.zeros((), ms.float32)

    def adjust(self, finite, health):
        return ops.logical_or(finite, self.apply_nonfinite)


@ms.jit_class
class StaticScaler(NoOpScaler):
    """A fixed scale `init_scale`; with `skip_nonfinite` an overflowing step is dropped."""

    config = StaticScalerConfig


@ms.jit_class
class DynamicScaler(NoOpScaler):
    """MindSpore's `amp.DynamicLossScaler`, step for step. Overflow steps are always skipped.

        if finite:
            counter += 1
            if counter == window: scale *= factor (if that stays finite); counter = 0
        else:
            scale = max(1, scale / factor); counter = 0
    It never reacts to underflow: gradients flushed to zero are "finite".
    """

    config = DynamicScalerConfig

    def __init__(self, cfg, prefix: str):
        self.scale_value = Parameter(Tensor(cfg.init_scale, ms.float32), name=f"{prefix}.scale", requires_grad=False)
        self.counter = Parameter(Tensor(0, ms.int32), name=f"{prefix}.counter", requires_grad=False)
        self.factor = cfg.factor
        self.window = cfg.window

    def adjust(self, finite, health):
        one = ops.ones((), ms.float32)
        grown = self.scale_value * self.factor
        at_window = self.counter == (self.window - 1)
        grow = ops.logical_and(at_window, ops.isfinite(grown))
        new_scale = ops.select(finite, ops.select(grow, grown, self.scale_value),
                               ops.maximum(one, self.scale_value / self.factor))
        ops.assign(self.scale_value, new_scale)
        ops.assign(self.counter, ((self.counter + 1) % self.window) * finite.astype(ms.int32))
        return finite


SCALERS = {"none": NoOpScaler, "static": StaticScaler, "dynamic": DynamicScaler}


def build_scaler(cfg, prefix: str):
    """One scaler instance for one optimised net; `cfg` is a validated scaler config."""
    return SCALERS[cfg.name](cfg, prefix)
