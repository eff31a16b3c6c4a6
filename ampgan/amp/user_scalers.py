"""ampgan's loss scalers for the user's own training script, in MindSpore's two shapes.

`ampgan.api.loss_scaler(...)`: `mindspore.amp.LossScaler`'s shape (`scale`, `unscale`, `adjust`),
usable inside `@ms.jit` in a functional `value_and_grad` loop, so that

    loss_scaler = amp.DynamicLossScaler(scale_value=2**16, scale_factor=2, scale_window=50)

becomes

    loss_scaler = api.loss_scaler("underflow_aware", init_scale=2**16, factor=2, window=50)

`ampgan.api.loss_scale_manager(...)`: `mindspore.amp.LossScaleManager`'s shape, for code that
passes `loss_scale_manager=` to `Model` or `amp.build_train_network` (on GPU and Ascend).

Both wrap the scalers of `ampgan.amp.scalers`; neither has a state machine of its own. The
names and settings are those of `conf/scaler/` (the dataclasses of `ampgan.amp.scaler_config`),
checked as a Hydra run checks them: a bad name, key or value raises `AmpganError`, one line.
"""

from __future__ import annotations

import itertools
from dataclasses import fields

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ampgan import AmpganError, closest
from ampgan.amp.health import HEALTH_FIELDS, global_norm, grad_health
from ampgan.amp.scaler_config import SCALER_CONFIGS
from ampgan.amp.scalers import build_scaler, times

TRAIN_STEP_HINT = "use ampgan.api.train_step(net_with_loss, optimizer, scaler=...) as Model's network instead"


# ---------------------------------------------------------------- settings
def scaler_config(scaler, settings: dict, who: str):
    """The validated config of scaler `scaler` with `settings` (its keys in conf/scaler/), or AmpganError."""
    from ampgan.config.schema import build_group  # the very check a Hydra run's `scaler` group goes through

    names = list(SCALER_CONFIGS)
    if not isinstance(scaler, str) or scaler not in SCALER_CONFIGS:
        hint = closest(scaler, names) if isinstance(scaler, str) else ""
        raise AmpganError(f"{who}: unknown scaler {scaler!r}{hint}; choose one of {', '.join(names)}")
    schema = SCALER_CONFIGS[scaler]
    keys = [f.name for f in fields(schema) if f.name != "name"]
    for key in settings:
        if key not in keys:
            raise AmpganError(f"{who}: scaler {scaler!r} has no setting {key!r}{closest(key, keys)}; "
                              f"its settings: {', '.join(keys)}")
    try:
        return build_group("scaler", schema, {"name": scaler, **settings})
    except AmpganError as err:
        raise AmpganError(f"{who}: {err}") from None


_prefixes = itertools.count()


def _prefix(prefix: str | None, kind: str) -> str:
    """Parameter names must be unique within one graph: each scaler gets its own prefix."""
    return prefix if prefix else f"ampgan_{kind}{next(_prefixes)}"


# ---------------------------------------------------------------- functional loop
def pooled_health(scaled_grads):
    """One health row for all the scaled gradients together (ampgan's steps measure the scaled ones).

    The rows of `ampgan.amp.health.grad_health` pooled, each weighted by its gradient's size: a
    scaler whose `watch` was never called reads this one row exactly as it reads per-parameter
    rows weighed by `watch(params)` (the underflow fraction among all nonzero elements).
    """
    rows = grad_health(scaled_grads)
    sizes = ops.stack([ops.ones((), ms.float32) * g.size for g in scaled_grads])
    w = sizes / sizes.sum()
    zero = (w * rows[:, 0]).sum()
    underflow = (w * rows[:, 1]).sum()
    return ops.stack([zero, underflow, rows[:, 2].max(), rows[:, 3].sum()]).reshape(1, len(HEALTH_FIELDS))


@ms.jit_class
class UserLossScaler:
    """ampgan's scaler `inner` in `mindspore.amp.LossScaler`'s shape; works inside `@ms.jit`.

        scaled_loss = s.scale(loss)                  # loss times the current scale
        grads = s.unscale(scaled_grads)              # fixed_clip: also clipped to scaler.clip_norm;
                                                     # underflow_aware: also measures their health
        finite = amp.all_finite(grads)
        apply = s.adjust(finite)                     # or s.adjust(finite, grads): health of these grads
        if apply: optimizer(grads)

    `adjust` returns whether to apply the update: `finite`, or True for a scaler that applies
    non-finite steps (`none`/`static`/`fixed_clip` with `skip_nonfinite=false`). MindSpore's own
    `adjust` returns True; a loop that tests `finite` itself works with either. `scale_value` is
    the current scale (a Parameter: `float(s.scale_value.asnumpy())` outside jit).
    """

    def __init__(self, inner):
        self.inner = inner
        self.scale_value = inner.scale_value

    def scale(self, inputs):
        return self.inner.scale(inputs)

    def unscale(self, inputs):
        return self.inner.unscale(inputs)

    def adjust(self, grads_finite, grads=None):
        return self.inner.adjust(grads_finite, ops.zeros((1, len(HEALTH_FIELDS)), ms.float32))


@ms.jit_class
class HealthLossScaler(UserLossScaler):
    """A scaler that reads gradient health (underflow_aware).

    `unscale(grads)` of a tuple of gradients measures their health (pooled, see `pooled_health`)
    before unscaling and keeps it in a Parameter; `adjust(grads_finite)` reads it. So MindSpore's
    loop (unscale the grads, then adjust) feeds it unchanged. `adjust(grads_finite, grads)` measures
    `grads` instead: the unscaled gradients of this step, as `unscale` returned them.
    """

    def __init__(self, inner, prefix: str):
        super().__init__(inner)
        self.health = Parameter(Tensor(np.zeros((1, len(HEALTH_FIELDS)), np.float32)), name=f"{prefix}.health",
                                requires_grad=False)

    def unscale(self, inputs):
        if isinstance(inputs, (tuple, list)):
            ops.assign(self.health, pooled_health(inputs))
        return self.inner.unscale(inputs)

    def adjust(self, grads_finite, grads=None):
        if grads is None:
            return self.inner.adjust(grads_finite, self.health * 1.0)
        return self.inner.adjust(grads_finite, pooled_health(times(self.scale_value, grads)))


@ms.jit_class
class ClippingLossScaler(UserLossScaler):
    """fixed_clip: `unscale` of a tuple of gradients also clips them to the global norm `clip_norm`
    (and with `skip_nonfinite=false` zeroes their non-finite elements); a single tensor (the loss)
    is only unscaled."""

    def unscale(self, inputs):
        grads = self.inner.unscale(inputs)
        if isinstance(grads, (tuple, list)):
            clipped, _ = self.inner.clip(grads, global_norm(grads))
            return clipped
        return grads


def loss_scaler(scaler, *, prefix: str | None = None, **settings) -> UserLossScaler:
    """ampgan's `scaler` (a name of conf/scaler/) with `settings` (its keys) for a functional loop.
    `prefix`: the names of its state Parameters (unique within one graph; default: a fresh one)."""
    cfg = scaler_config(scaler, settings, "api.loss_scaler")
    prefix = _prefix(prefix, "loss_scaler")
    inner = build_scaler(cfg, prefix)
    if cfg.needs_health:
        out = HealthLossScaler(inner, prefix)
    elif inner.needs_norm:
        out = ClippingLossScaler(inner)
    else:
        out = UserLossScaler(inner)
    out.settings = cfg   # its name and settings, as a recording names them (api.monitor)
    return out


# ---------------------------------------------------------------- LossScaleManager
class _UpdateCell(nn.Cell):
    """`get_update_cell()`'s cell: called by `nn.TrainOneStepWithLossScaleCell` in its graph as
    `cell(scale_sense, overflow)`, it steps ampgan's scaler and writes the new scale into
    `scale_sense`; it returns whether to skip the update (MindSpore's cells return `overflow`)."""

    def __init__(self, inner, init_scale: float):
        super().__init__()
        self.inner = inner
        self.init_scale = init_scale
        self.no_health = Tensor(np.zeros((1, len(HEALTH_FIELDS)), np.float32))

    def get_loss_scale(self):
        return self.init_scale

    def construct(self, loss_scale, overflow):
        apply = self.inner.adjust(ops.logical_not(overflow.reshape(())), self.no_health)
        ops.assign(loss_scale, self.inner.scale_value.reshape(loss_scale.shape))
        return ops.logical_not(apply)


def on_cpu() -> bool:
    """MindSpore's own test in `amp.build_train_network`: CPU without GE runs no loss-scale cell."""
    from mindspore import context

    try:
        ge = bool(context.get_context("enable_ge"))
    except (ValueError, RuntimeError):
        ge = False
    return not ge and ms.get_context("device_target") == "CPU"


class UserLossScaleManager(ms.amp.LossScaleManager):
    """ampgan's scaler as a `mindspore.amp.LossScaleManager`, for `Model(..., loss_scale_manager=m)`
    and `amp.build_train_network` on GPU and Ascend.

    Two instances of the same ampgan scaler keep its state: one on the host, stepped by
    `update_loss_scale(overflow)` (which `Model` calls in non-sink mode) and read by
    `get_loss_scale()`; one inside `get_update_cell()`'s cell, stepped in the compiled train step
    of `nn.TrainOneStepWithLossScaleCell`. Fed the same overflow flags, they agree.

    On CPU MindSpore runs no loss-scale cell (`build_train_network` refuses every manager with
    an update cell): `get_update_cell()` raises `AmpganError` there, naming the train-step cell to
    use instead. A manager that drops nothing (`none`, or `static` with `skip_nonfinite=false`) has
    no update cell and works on CPU as `FixedLossScaleManager(scale, False)` does.
    """

    def __init__(self, cfg, prefix: str):
        self.cfg = cfg
        self.prefix = prefix
        self.host = build_scaler(cfg, f"{prefix}.host")
        self._cells = itertools.count()
        self._no_health = Tensor(np.zeros((1, len(HEALTH_FIELDS)), np.float32))

    @property
    def scaler(self) -> str:
        return self.cfg.name

    def get_loss_scale(self) -> float:
        return float(self.host.scale_value.asnumpy())

    def get_drop_overflow_update(self) -> bool:
        """Whether an overflowing step's update is dropped: dynamic always, none/static as `skip_nonfinite` says."""
        return bool(getattr(self.cfg, "skip_nonfinite", True))

    def update_loss_scale(self, overflow) -> bool:
        """Step ampgan's scaler on the host with this step's overflow flag; returns whether the
        step's update is applied (MindSpore's managers return None)."""
        finite = not bool(np.all(overflow.asnumpy() if isinstance(overflow, Tensor) else overflow))
        return bool(self.host.adjust(Tensor(finite, ms.bool_), self._no_health).asnumpy())

    def get_update_cell(self):
        if not self.get_drop_overflow_update():
            return None
        if on_cpu():
            raise AmpganError(f"api.loss_scale_manager({self.cfg.name!r}): MindSpore runs no loss-scale cell on CPU "
                              f"(its TrainOneStepWithLossScaleCell is GPU/Ascend only): {TRAIN_STEP_HINT}")
        return self.update_cell()

    def update_cell(self) -> _UpdateCell:
        """A fresh update cell that starts where the host's scaler is now (no device check:
        `get_update_cell` does it)."""
        inner = build_scaler(self.cfg, f"{self.prefix}.cell{next(self._cells)}")
        for key, value in vars(self.host).items():
            if isinstance(value, Parameter):
                getattr(inner, key).set_data(value.value().copy())
        return _UpdateCell(inner, self.get_loss_scale())


# Scalers whose decisions need the gradients, which a LossScaleManager is never given.
_NEED_GRADIENTS = {
    "underflow_aware": "reads gradient health",
    "fixed_clip": "clips the gradients",
}


def loss_scale_manager(scaler, *, prefix: str | None = None, **settings) -> UserLossScaleManager:
    """ampgan's `scaler` with `settings` as a `mindspore.amp.LossScaleManager` (none, static, dynamic)."""
    cfg = scaler_config(scaler, settings, "api.loss_scale_manager")
    if cfg.name in _NEED_GRADIENTS:
        raise AmpganError(f"api.loss_scale_manager: scaler {cfg.name!r} {_NEED_GRADIENTS[cfg.name]}, and MindSpore "
                          "gives a LossScaleManager only the overflow flag: choose none, static or dynamic, "
                          f"or {TRAIN_STEP_HINT} (api.loss_scaler in a functional loop)")
    return UserLossScaleManager(cfg, _prefix(prefix, "loss_scale_manager"))
