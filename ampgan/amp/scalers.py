"""Loss scalers: one small protocol, every strategy usable inside `@ms.jit`.

    scaled_loss = scaler.scale(loss)
    grads       = scaler.unscale(scaled_grads)
    grads, clipped = scaler.clip(grads, global_norm)      # identity except fixed_clip
    apply       = scaler.adjust(grads_finite, health)   # updates the scaler's state in place
    if apply: optimizer(grads)

State lives in Parameters (changed with `ops.assign`), so a compiled step keeps it across
calls. FP32 runs use `NoOpScaler` through the very same code path. Each optimised net
gets its own instance; `prefix` keeps Parameter names unique within one graph.

The settings a sweep varies (`init_scale`, `factor`, `window`, `clip_norm`) are Parameters
too, not constants folded into the graph: the next job of a serial sweep runs the compiled
step with its own values (`ampgan.graph_pool`). The other settings are graph constants.
A scaler's `hyperparameters` name those that are not state: checkpoints leave them out.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, ops

from ampgan.amp.float16 import FP16_MAX
from ampgan.amp.scaler_config import (DynamicScalerConfig, FixedClipScalerConfig, NoneScalerConfig,
                                      StaticScalerConfig, UnderflowAwareScalerConfig)


# ---------------------------------------------------------------- scalers
_times = ops.MultitypeFuncGraph("times")   # g * factor, in g's dtype: one graph for any number of gradients


@_times.register("Tensor", "Tensor")
def _times_tensor(factor, g):
    return g * factor.astype(g.dtype)


_map = ops.HyperMap()


def times(factor, grads):
    """Every gradient times `factor` (a scalar tensor), each in its own dtype."""
    return _map(ops.partial(_times, factor), grads)

def _setting(value, dtype, name: str) -> Parameter:
    """A setting the compiled step reads at run time (a sweep changes it without recompiling)."""
    return Parameter(Tensor(value, dtype), name=name, requires_grad=False)


@ms.jit_class
class NoOpScaler:
    """Scale 1, nothing to adjust. Non-finite steps are applied unless `skip_nonfinite`."""

    config = NoneScalerConfig
    needs_norm = False    # True: clip() reads the global gradient norm
    hyperparameters: tuple[str, ...] = ()  # attributes that hold settings in Parameters (not state)

    def __init__(self, cfg, prefix: str):
        self.scale_value = Parameter(Tensor(getattr(cfg, "init_scale", 1.0), ms.float32), name=f"{prefix}.scale", requires_grad=False)
        self.apply_nonfinite = Tensor(not getattr(cfg, "skip_nonfinite", True), ms.bool_)
        self.param_weights = Tensor([1.0], ms.float32)

    def watch(self, params) -> None:
        """Told once (outside jit) which parameters' health rows it will see: sizes weigh the rows."""
        sizes = [float(p.size) for p in params]
        self.param_weights = Tensor([n / sum(sizes) for n in sizes], ms.float32)

    def scale(self, loss):
        return loss * self.scale_value.astype(loss.dtype)

    def unscale(self, grads):
        return times(1.0 / self.scale_value, grads)

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
    hyperparameters = ("factor", "window")

    def __init__(self, cfg, prefix: str):
        super().__init__(cfg, prefix)
        self.counter = Parameter(Tensor(0, ms.int32), name=f"{prefix}.counter", requires_grad=False)
        self.factor = _setting(float(cfg.factor), ms.float32, f"{prefix}.factor")
        self.window = _setting(cfg.window, ms.int32, f"{prefix}.window")

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



@ms.jit_class
class UnderflowAwareScaler(DynamicScaler):
    """Dynamic loss scaling that also raises the scale early when gradients underflow.

    The signal is the fraction of *nonzero* gradient elements that sit in float16's subnormal
    range (below 2**-14): exact zeros are structural (dead ReLUs, cancelling terms; 20-40%
    of a WGAN critic's gradient in FP32 too) and say nothing about underflow. Headroom comes
    from a short history of max|g| (as FP8 delayed scaling keeps an amax history), with a
    margin, because intermediate tensors can overflow before parameter gradients show it.

        each step, given finite and per-parameter health (zero, underflow, max_abs rows):
            sub   = sum(w * underflow) / sum(w * (1 - zero))      # w: parameter sizes
            # since_early_raise: steps since the last early raise (1 on the step right after it)
            blamed = not finite and since_early_raise <= probation
            if not finite:                                         # dynamic's rule
                scale = max(1, scale / factor); counter = 0; skip the update
            else:
                amax_hist.push(max_abs / scale)                    # unscaled, so it survives rescaling
                counter += 1
                if counter == window:                              # dynamic's rule
                    scale *= factor (if finite); counter = 0
                elif (sub > threshold and cooldown == 0 and since_early_raise >= min_interval
                      and max(amax_hist) * scale * factor * margin < 65504
                      and scale * factor <= max_scale):
                    scale *= factor; counter = 0; since_early_raise = 0
            # blamed: exactly the next cooldown_steps steps make no early raise
            cooldown = cooldown_steps if blamed else max(0, cooldown - 1)
            since_early_raise += 1

    It reads the health rows, so it is fed by every step: with it every train step runs the
    measuring variant (its config's `needs_health`), gradient health on, whatever the logging cadence.
    """

    config = UnderflowAwareScalerConfig

    def __init__(self, cfg, prefix: str):
        super().__init__(cfg, prefix)
        self.amax_hist = Parameter(Tensor(np.zeros(cfg.history, np.float32)), name=f"{prefix}.amax_hist", requires_grad=False)
        self.hist_pos = Parameter(Tensor(0, ms.int32), name=f"{prefix}.hist_pos", requires_grad=False)
        self.since_raise = Parameter(Tensor(cfg.probation + cfg.min_interval, ms.int32), name=f"{prefix}.since_raise", requires_grad=False)
        self.cooldown_left = Parameter(Tensor(0, ms.int32), name=f"{prefix}.cooldown", requires_grad=False)
        self.history = cfg.history
        self.threshold = cfg.underflow_threshold
        self.margin = cfg.headroom_margin
        self.min_interval = cfg.min_interval
        self.probation = cfg.probation
        self.cooldown_steps = cfg.cooldown
        self.max_scale = cfg.max_scale

    def adjust(self, finite, health):
        w = self.param_weights
        zero, underflow, max_abs = health[:, 0], health[:, 1], health[:, 2]
        nonzero = (w * (1.0 - zero)).sum()
        sub = (w * underflow).sum() / ops.maximum(nonzero, 1e-12)
        scale = self.scale_value * 1.0
        grown = scale * self.factor

        # headroom from the history, including this step when it is finite
        slot = ops.arange(self.history, dtype=ms.int32) == self.hist_pos
        amax_now = ops.select(finite, max_abs.max() / scale, ops.zeros((), ms.float32))
        hist = ops.select(ops.logical_and(slot, finite), ops.broadcast_to(amax_now, (self.history,)), self.amax_hist)
        headroom = hist.max() * grown * self.margin < FP16_MAX

        at_window = self.counter == (self.window - 1)
        window_raise = ops.logical_and(finite, ops.logical_and(at_window, ops.isfinite(grown)))
        early = ops.logical_and(ops.logical_and(finite, ops.logical_not(at_window)), sub > self.threshold)
        early = ops.logical_and(early, ops.logical_and(self.cooldown_left == 0, self.since_raise >= self.min_interval))
        early = ops.logical_and(early, ops.logical_and(headroom, grown <= self.max_scale))
        raised = ops.logical_or(window_raise, early)

        shrunk = ops.maximum(ops.ones((), ms.float32), scale / self.factor)
        new_scale = ops.select(finite, ops.select(raised, grown, scale), shrunk)
        blamed = ops.logical_and(ops.logical_not(finite), self.since_raise <= self.probation)
        cooldown = ops.select(blamed, ops.ones((), ms.int32) * self.cooldown_steps,
                              ops.maximum(self.cooldown_left - 1, ops.zeros((), ms.int32)))
        counter = ops.select(ops.logical_or(raised, at_window), ops.zeros((), ms.int32),
                             (self.counter + 1) * finite.astype(ms.int32))

        ops.assign(self.scale_value, new_scale)
        ops.assign(self.counter, counter)
        ops.assign(self.amax_hist, hist)
        ops.assign(self.hist_pos, (self.hist_pos + finite.astype(ms.int32)) % self.history)
        ops.assign(self.since_raise, ops.select(early, ops.ones((), ms.int32), ops.minimum(self.since_raise + 1, 1 << 30)))
        ops.assign(self.cooldown_left, cooldown)
        return finite


@ms.jit_class
class FixedClipScaler(NoOpScaler):
    """A fixed loss scale plus global-norm clipping of the unscaled gradients.

        g = unscale(scaled_grads)
        if not skip_nonfinite: g = where(isfinite(g), g, 0)    # keep the step, drop the bad elements
        norm = ||g||_2 over all parameters
        if norm > clip_norm: g *= clip_norm / norm
        clipped = norm > clip_norm and norm is finite           # reported for the step (clip_rate)
        apply the update if finite or not skip_nonfinite
    A skipped step (non-finite gradients, `skip_nonfinite`) has an inf/nan norm and is not
    counted as clipped: nothing was clipped, nothing was applied.
    A good threshold clips only now and then: watch `*/clip_rate`.
    """

    config = FixedClipScalerConfig
    needs_norm = True
    hyperparameters = ("clip_norm",)

    def __init__(self, cfg, prefix: str):
        super().__init__(cfg, prefix)
        self.clip_norm = _setting(cfg.clip_norm, ms.float32, f"{prefix}.clip_norm")
        self.zero_nonfinite = not cfg.skip_nonfinite

    def clip(self, grads, grad_norm):
        if self.zero_nonfinite:
            grads = tuple(ops.select(ops.isfinite(g), g, ops.zeros_like(g)) for g in grads)
            grad_norm = ops.sqrt(ops.addn([ops.square(g).sum() for g in grads]))
        # clip_norm x 1/norm, not clip_norm / norm: MindSpore computes a constant over a tensor that way,
        # so the Parameter gives the very bits the constant clip norm gave (tests/test_graph_pool.py)
        ratio = self.clip_norm * ops.reciprocal(ops.maximum(grad_norm, 1e-12))
        factor = ops.minimum(ratio, ops.ones((), ms.float32))
        clipped = ops.logical_and(ratio < 1.0, ops.isfinite(grad_norm))
        return times(factor, grads), clipped.astype(ms.float32)


SCALERS = {
    "none": NoOpScaler,
    "static": StaticScaler,
    "dynamic": DynamicScaler,
    "underflow_aware": UnderflowAwareScaler,
    "fixed_clip": FixedClipScaler,
}


def build_scaler(cfg, prefix: str):
    """One scaler instance for one optimised net; `cfg` is a validated scaler config."""
    return SCALERS[cfg.name](cfg, prefix)
