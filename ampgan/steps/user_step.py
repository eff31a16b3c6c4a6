"""ampgan's train step as a `mindspore.nn.Cell` for the user's own `Model.train` script.

    step_cell = api.train_step(nn.WithLossCell(net, loss_fn), optimizer, amp="O2", scaler="dynamic")
    model = Model(step_cell)
    model.train(epochs, dataset, callbacks=[api.callback(), LossMonitor()], dataset_sink_mode=False)

The cell is ampgan's own compiled step (`make_step` -> `build_update` in `ampgan.steps.common`):
scaled backward, unscale, gradient health, clip, adjust, `if apply: optimizer(grads)`, all inside
one `ms.jit` graph, so dynamic loss scaling runs on CPU too (MindSpore's
`TrainOneStepWithLossScaleCell` does not). The optimizer is called only for an applied step:
a skipped (non-finite) step does not advance `optimizer.global_step`, so a learning-rate
schedule counts applied updates only.

It returns `(loss, overflow, loss_scale)` as `nn.TrainOneStepWithLossScaleCell` does (`loss_scale`
is the scale the step used), so the user's callbacks (LossMonitor...) keep working; each is cut
out of the status only when read (`StepOutputs`). The full
packed status of each step stays on the device (`last_status`) for `api.callback` to read at its
cadence: no host sync here.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict

import mindspore as ms
from mindspore import nn, ops

from ampgan import AmpganError
from ampgan.amp.activations import ActivationPeaks
from ampgan.amp.health import grad_health, no_health
from ampgan.amp.policy import apply_amp, check_keep_paths, resolve_cell_types
from ampgan.amp.scalers import build_scaler
from ampgan.amp.state import training_state
from ampgan.steps.common import FINITE, SCALE, Step, make_step

LOSSES = ("loss",)
LEVELS = ("O0", "O1", "O2", "O3")
_cells = itertools.count()


class FP32LossCell(nn.Cell):
    """`loss_fn(backbone(data).astype(float32), label)`: MindSpore's `WithLossCell` with the loss in
    FP32, as ampgan's classifier (`amp.fp32_loss`) and `build_train_network(level="O2")` keep it.
    Parameter names are the backbone's (no prefix)."""

    def __init__(self, backbone: nn.Cell, loss_fn):
        super().__init__(auto_prefix=False)
        self._backbone = backbone
        self._loss_fn = loss_fn

    def construct(self, data, label):
        return self._loss_fn(self._backbone(data).astype(ms.float32), label)

    @property
    def backbone_network(self):
        return self._backbone


def split_with_loss(net_with_loss: nn.Cell):
    """(backbone, loss_fn) of a `nn.WithLossCell` (or a cell of that shape), else (net_with_loss, None)."""
    backbone = getattr(net_with_loss, "_backbone", None)
    loss_fn = getattr(net_with_loss, "_loss_fn", None)
    if isinstance(backbone, nn.Cell) and loss_fn is not None:
        return backbone, loss_fn
    return net_with_loss, None


def optimizer_weights(optimizer) -> tuple:
    """The parameters the optimizer updates, in its order (as `nn.TrainOneStepCell` takes them)."""
    params = getattr(optimizer, "parameters", None)
    if params is not None and not callable(params):
        return tuple(params)
    groups = getattr(optimizer, "param_groups", None)   # mindspore.mint.optim
    if groups:
        return tuple(p for g in groups for p in g["params"])
    raise AmpganError(f"api.train_step: optimizer {type(optimizer).__name__} exposes neither `parameters` "
                      "(mindspore.nn optimizers) nor `param_groups` (mindspore.mint.optim)")


def learning_rate(optimizer) -> str:
    """The optimizer's learning rate as a param value: a number, or what kind of schedule."""
    groups = getattr(optimizer, "param_groups", None)
    if groups:
        return str(groups[0].get("lr"))
    lr = getattr(optimizer, "learning_rate", None)
    if isinstance(lr, ms.Parameter):
        values = lr.asnumpy().reshape(-1)
        if values.size == 1:
            return f"{float(values[0]):g}"
        return f"schedule of {values.size} steps, from {float(values[0]):g}"
    if isinstance(lr, nn.Cell):
        inner = getattr(lr, "learning_rate", None)
        if isinstance(inner, ms.Parameter):   # MindSpore wraps a list of rates in a cell
            values = inner.asnumpy().reshape(-1)
            return f"{float(values[0]):g}" if values.size == 1 else f"schedule of {values.size} steps, from {float(values[0]):g}"
        return type(lr).__name__
    return str(lr)


def _qualname(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


class StepOutputs(tuple):
    """`(loss, overflow, loss_scale)` of one step, as `nn.TrainOneStepWithLossScaleCell` returns
    them, each read out of the step's packed status only when asked for (and once).

    `Model.train` only stores a step's outputs (`cb_params.net_outputs`); most steps nobody reads
    them. Cut out eagerly, they were three device ops a step on the host's critical path (about
    0.8 ms each, measured in GRAPH_MODE), more than the step's own launch. Indexing, unpacking and
    iterating give the tensors; the tuple's own storage holds nothing but placeholders.
    """

    def __new__(cls, packed, stat: int):
        out = super().__new__(cls, (None, None, None))
        out._packed, out._stat, out._read = packed, stat, {}
        return out

    def _item(self, i: int):
        if i not in self._read:
            p, stat = self._packed, self._stat
            self._read[i] = p[0] if i == 0 else (p[stat + FINITE] == 0) if i == 1 else p[stat + SCALE]
        return self._read[i]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self._item(i) for i in range(3)[index])
        return self._item(range(3)[index])

    def __iter__(self):
        return (self._item(i) for i in range(3))

    def __contains__(self, value):
        return any(value is item for item in self)

    def __repr__(self):
        return f"({', '.join(repr(item) for item in self)})"


class UserTrainStep(nn.Cell):
    """ampgan's compiled train step, built from the user's net-with-loss and optimizer.

    `__call__(*batch) -> (loss, overflow, loss_scale)`. The cell runs its compiled step itself
    (`ms.jit`); `__call__` bypasses MindSpore's own compile of the cell (tested in PYNATIVE mode).
    Steps whose status is read (`measure_next`, set by `api.callback` for its log steps; without
    a callback, the first and every `measure_every`-th call, or none when it is None) run the
    measuring variant, with gradient health and (`headroom`) each leaf cell's max |output|
    (`ampgan.amp.activations`); the others run the plain variant. Without a callback nothing
    reads a status, so by default no step measures: a measuring step cost a mindcv
    mobilenet_v1_025 step under `Model.train` about 10%, averaged over one in ten steps.
    `last_status`/`last_measured`: the newest step's packed status (a device tensor, not fetched)
    and whether it was measured; `step` decodes it.
    """

    ampgan_step = True   # what api.callback looks for

    def __init__(self, net_with_loss: nn.Cell, optimizer, scaler_cfg, amp: str = "O2", keep_fp32=(),
                 health: bool = True, measure_every: int | None = None, jit: bool = True, headroom: bool = True):
        super().__init__(auto_prefix=False)
        if not isinstance(net_with_loss, nn.Cell):
            raise AmpganError(f"api.train_step: net_with_loss must be a mindspore.nn.Cell that returns the loss "
                              f"(e.g. nn.WithLossCell(net, loss_fn)), got {type(net_with_loss).__name__}")
        if not isinstance(optimizer, nn.Cell):
            raise AmpganError(f"api.train_step: optimizer must be a MindSpore optimizer (a Cell called with the "
                              f"gradients, e.g. nn.Momentum(net.trainable_params(), ...)), got {type(optimizer).__name__}")
        level = str(amp).upper()
        if level not in LEVELS:
            raise AmpganError(f"api.train_step: amp must be one of {', '.join(LEVELS)}, got {amp!r}")
        keep = list(keep_fp32 or ())
        if measure_every is not None and (isinstance(measure_every, bool) or not isinstance(measure_every, int)
                                          or measure_every < 1):
            raise AmpganError(f"api.train_step: measure_every must be a whole number >= 1 or None (measure only "
                              f"the steps api.callback logs), got {measure_every!r}")
        try:
            resolve_cell_types(keep)
            backbone, loss_fn = split_with_loss(net_with_loss)
            check_keep_paths({"": backbone}, keep)
        except AmpganError as err:
            raise AmpganError(f"api.train_step: {err}") from None
        self.net_class = _qualname(backbone)
        self.n_params = int(sum(p.size for p in backbone.trainable_params()))
        net_amp = apply_amp(backbone, level, keep)
        self.network = FP32LossCell(net_amp, loss_fn) if loss_fn is not None else net_amp
        self.network.set_train(True)   # cells start in inference mode: BatchNorm would use its moving statistics
        object.__setattr__(self, "backbone", backbone)   # the user's net (its Parameters, not a second registration)
        object.__setattr__(self, "loss_fn", loss_fn)
        self.optimizer = optimizer
        self.amp_level, self.keep_fp32, self.scaler_cfg = level, keep, scaler_cfg
        self.scaler = build_scaler(scaler_cfg, f"ampgan_step{next(_cells)}.scaler")
        network, scaler = self.network, self.scaler

        def loss_fn_(*inputs):
            loss = network(*inputs).astype(ms.float32).reshape(())
            return scaler.scale(loss), ops.stack([loss])

        # the activation peaks of the net's leaf cells, measured with the gradient health (float16 headroom)
        peaks = ActivationPeaks(net_amp, "") if health and headroom else None
        self.step: Step = make_step(loss_fn_, optimizer_weights(optimizer), optimizer, self.scaler,
                                    grad_health if health else no_health, LOSSES, jit, peaks=peaks)
        self.measure_every = measure_every
        self.measure_next: bool | None = None
        self.calls = 0
        self.last_status = None
        self.last_measured = False

    def describe(self) -> dict[str, str]:
        """What a run records of this step: ampgan's parameter keys where they apply."""
        out = {"model.net._target_": self.net_class, "model.params": str(self.n_params),
               "model.optimizer._target_": _qualname(self.optimizer), "model.lr": learning_rate(self.optimizer),
               "amp.level": self.amp_level, "amp.keep_fp32": str(self.keep_fp32)}
        out.update({f"scaler.{k}": str(v) for k, v in asdict(self.scaler_cfg).items()})
        return out

    def state_tensors(self) -> dict[str, ms.Parameter]:
        """Every state tensor a replay needs (`ampgan.amp.state.training_state`): what
        `api.callback`'s flight recorder saves."""
        return training_state(self.backbone, self.optimizer, self.scaler)

    @property
    def float16(self) -> bool:
        """The net computes in float16 somewhere (an AMP level other than O0)."""
        return self.amp_level != "O0"

    def __call__(self, *inputs):
        return self.construct(*inputs)

    def construct(self, *inputs):
        self.calls += 1
        measure = self.measure_next if self.measure_next is not None else (
            self.measure_every is not None and (self.calls == 1 or self.calls % self.measure_every == 0))
        self.measure_next = None
        packed = self.step.launch(*inputs, measure=measure)
        self.last_status, self.last_measured = packed, self.step.measured(measure)
        return StepOutputs(packed, self.step.layout.stat.start)


def build_train_step(net_with_loss, optimizer, scaler_cfg, amp: str = "O2", keep_fp32=(), health: bool = True,
                     measure_every: int | None = None, jit: bool = True, headroom: bool = True) -> UserTrainStep:
    return UserTrainStep(net_with_loss, optimizer, scaler_cfg, amp, keep_fp32, health, measure_every, jit, headroom)
