"""What every task shares: the per-net step state (`NetState`) and the loop's side of a task (`TaskBase`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
import mindspore as ms
import numpy as np
from ampgan.amp.activations import ActivationPeaks, headroom
from ampgan.amp.health import HEALTH_FIELDS, grad_health, no_health
from ampgan.config.schema import Settings
from ampgan.data import Batches, Dataset, build_dataset
from ampgan.steps.common import APPLIED, CLIPPED, FINITE, GRAD_NORM, SCALE, Step, StepStatus


SAMPLES_OVER_TIME = "samples"   # run-folder subfolder of the pictures made at each evaluation


class NetState:
    """Host-side bookkeeping for one optimised net: pending step statuses, cumulative counts.

    Steps are launched without waiting (`push`); `drain` fetches what is pending in one go,
    so the host does not stall MindSpore after every step, only at the logging cadence.
    Only what a step measured is reported: health fields and activation peaks from the newest
    measured status drained (none when health was off or no drained status was measured),
    `grad_norm` only when the newest status computed the norm. `float16`: the run computes in
    float16 (an AMP level), so each peak also has a headroom, FP16_MAX / peak.
    """

    COUNTERS = ("skipped", "clipped", "steps", "nonfinite_run")

    def __init__(self, prefix: str, step: Step, float16: bool = False):
        self.prefix, self.step, self.float16 = prefix, step, float16
        sizes = np.array([p.size for p in step.weights], dtype=np.float64)
        self.weight_shares = sizes / sizes.sum()   # each parameter's share of the net's elements
        self.pending: list[tuple[int, ms.Tensor, bool]] = []  # (step, packed status, measured)
        self.skipped = self.clipped = self.steps = 0
        self.nonfinite_run = 0          # consecutive steps whose loss was not finite
        self.last_measured: StepStatus | None = None

    def push(self, step: int, packed_status, measured: bool) -> None:
        """A launched step's status; `measured`: it ran the measuring variant (`Step.measured`)."""
        self.pending.append((step, packed_status, measured))

    def launch(self, step: int, inputs: tuple, measure: bool) -> None:
        """Launch the step on `inputs` (measuring or plain variant) and push its status."""
        self.push(step, self.step.launch(*inputs, measure=measure), self.step.measured(measure))

    @property
    def last_health(self) -> np.ndarray | None:
        """Per-parameter gradient health of the newest measured status drained (None: none measured)."""
        return self.last_measured.health if self.step.measures_health and self.last_measured else None

    def peaks(self) -> dict[str, float]:
        """Cell path -> max |output| of the newest measured status drained, for the cells its
        forward passes ran (empty: no activation peaks measured)."""
        if self.last_measured is None:
            return {}
        return {path: float(v) for path, v in zip(self.step.act_paths, self.last_measured.act)
                if not v < 0}   # NOT_REACHED is negative; a NaN peak was reached

    def drain(self) -> tuple[int, dict[str, float]]:
        """(last step, metrics) of the steps since the last drain: losses averaged; scale from the
        last, health and activation peaks from the last measured.

        The pending statuses are read as one table, a row per step, and counted column-wise: a
        status is decoded into fields only for the newest measured step (its health and peaks)."""
        if not self.pending:
            return 0, {}
        last_step, _, last_measured = self.pending[-1]
        rows = np.stack([t.asnumpy() for _, t, _ in self.pending])
        measured = [i for i, (_, _, was_measured) in enumerate(self.pending) if was_measured]
        self.pending.clear()
        lay = self.step.layout
        losses = np.array(rows[:, lay.losses].T, dtype=np.float64, order="C")   # a row per loss
        stat = rows[:, lay.stat]
        finite_losses = np.flatnonzero(np.isfinite(losses).all(axis=0))
        n = len(rows)
        # consecutive non-finite losses, continued across drains
        self.nonfinite_run = n - 1 - int(finite_losses[-1]) if finite_losses.size else self.nonfinite_run + n
        self.steps += n
        self.skipped += int(np.count_nonzero(stat[:, APPLIED] == 0))
        self.clipped += int(np.count_nonzero(stat[:, CLIPPED]))
        p = self.prefix
        out = {f"{p}/{name}": float(np.mean(row)) for name, row in zip(self.step.loss_names, losses)}
        out.update({
            f"{p}/scale": float(stat[-1, SCALE]), f"{p}/skipped": float(self.skipped),
            f"{p}/finite": float(np.count_nonzero(stat[:, FINITE]) == n), f"{p}/clip_rate": self.clipped / self.steps,
        })
        if self.step.computes_norm(last_measured):
            out[f"{p}/grad_norm"] = float(stat[-1, GRAD_NORM])
        if not measured:
            return last_step, out
        self.last_measured = self.step.decode(rows[measured[-1]])
        if (h := self.last_health) is not None:
            w = self.weight_shares
            out[f"{p}/underflow"] = float(h[:, HEALTH_FIELDS.index("underflow")] @ w)
            out[f"{p}/zero"] = float(h[:, HEALTH_FIELDS.index("zero")] @ w)
            out[f"{p}/max_abs_scaled_grad"] = float(h[:, HEALTH_FIELDS.index("max_abs")].max())
            out[f"{p}/nonfinite"] = float(h[:, HEALTH_FIELDS.index("nonfinite")].sum())
        if peaks := self.peaks():
            peak = float(np.max(list(peaks.values())))   # NaN if any peak is
            out[f"{p}/act_max_abs"] = peak
            if self.float16:
                out[f"{p}/headroom"] = headroom(peak)
        return last_step, out

    def layer_health(self) -> dict[str, float]:
        """Per-parameter health and per-cell activation peaks of the newest measured step drained:
        `grad/<param>/<field>`, `act/<cell path>/max_abs` (and `.../headroom` in float16 runs);
        empty if nothing was measured."""
        out = {}
        if (h := self.last_health) is not None:
            out.update({f"grad/{name}/{field}": float(v)
                        for name, row in zip(self.step.param_names, h) for field, v in zip(HEALTH_FIELDS, row)})
        for path, peak in self.peaks().items():
            out[f"act/{path}/max_abs"] = peak
            if self.float16:
                out[f"act/{path}/headroom"] = headroom(peak)
        return out

    def counters(self) -> dict[str, int]:
        return {k: int(getattr(self, k)) for k in self.COUNTERS}

    def load_counters(self, counters: dict[str, int]) -> None:
        for k in self.COUNTERS:
            setattr(self, k, int(counters[k]))


@dataclass(frozen=True)
class Optimised:
    """One optimised net as the task trains it: diagnose's probes are built from these, so they
    compute exactly the task's own loss and gradients.

    `loss_fn(scaler)` returns `f(*inputs) -> (scaled loss, stack(losses))` for one sub-step's inputs."""

    net: ms.nn.Cell                 # the net as trained (AMP applied)
    loss_fn: Callable
    optimizer: object
    scaler: object
    losses: tuple[str, ...]         # the names of the status's losses

    @property
    def params(self) -> list[ms.Parameter]:
        return self.net.trainable_params()


class TaskBase:
    """Every task: it implements each role's protocol (`ampgan.tasks.protocols`: Trainable,
    Evaluable, Checkpointable, Poolable, Replayable), and each caller names the one it uses.

    The loop: `train_step`, `metrics`, `layer_health`, `nonfinite_run`, `evaluate`, pictures.
    Diagnose: `roots()` (the nets by the root name keep-list paths use), `optimised()` (one
    `Optimised` per sub-step name, in `step_inputs` order), `step_inputs()`, `forward(name,
    inputs)` (the forward passes of one sub-step, for locate's hooks) and the optional hooks
    `eval_forward()` (the evaluation's forward pass, for the inference stage) and
    `penalty(name, inputs)` (a gradient penalty's net and arguments, or None). Nothing outside
    a task asks what kind of model it has.

    A subclass sets `nets`, `optimizers` and `scalers` (name -> object) and `rngs` (name -> NumPy Generator
    used while training) and implements `states()`; checkpoints then hold everything a run needs to
    continue exactly: every Parameter of the nets, optimizers and scalers, the batch sampler's
    position, the RNGs, the host-side counters.
    """

    data: Dataset
    nets: dict
    optimizers: dict
    scalers: dict
    batches: Batches
    rngs: dict[str, np.random.Generator]
    # the attributes that hold the compiled steps and what they close over (nets, optimizers,
    # scalers): `ampgan.graph_pool` hands a pooled task's to a fresh task of the same structure
    GRAPH_ATTRS: tuple[str, ...] = ("nets", "optimizers", "scalers")

    @staticmethod
    def load_data(s: Settings):
        """The data this task trains on: the data group's (a task that reads its own overrides it)."""
        return build_dataset(s.data)

    objective_best = 0.0   # the objective's best possible value (a distance or a loss: 0; accuracy: 1): diagnose's
                           # horizon measures learning as the share of the gap to it a run closes
    penalty_root: str | None = None   # the root (in `roots()`) whose net the gradient penalty runs through
    has_penalty = False   # a gradient penalty (a second-order gradient): diagnose checks it against finite differences

    def states(self) -> list[NetState]:
        raise NotImplementedError

    def step_inputs(self) -> list[tuple[str, tuple]]:
        """One iteration's sub-steps and their inputs, drawn in training order."""
        raise NotImplementedError

    def run_inputs(self, step: int, subs: list[tuple[str, tuple]], measure: bool) -> None:
        """Launch one iteration's sub-steps on `subs` (as `step_inputs` draws them, or a share
        of them); `measure`: its statuses will be read."""
        raise NotImplementedError

    def train_step(self, step: int, measure: bool = True) -> None:
        """Launch one iteration on the sub-steps `step_inputs` draws."""
        self.run_inputs(step, self.step_inputs(), measure)

    def roots(self) -> dict[str, ms.nn.Cell]:
        raise NotImplementedError

    def optimised(self) -> dict[str, Optimised]:
        raise NotImplementedError

    def forward(self, name: str, inputs: tuple) -> None:
        raise NotImplementedError

    def eval_forward(self) -> Callable[[], object] | None:
        """`run()`: the evaluation's forward pass on one batch of evaluation data, in inference mode
        (`set_train(False)`: BatchNorm on its moving statistics), for diagnose's inference stage to
        watch op by op; None (the default): the task has no such pass to watch."""
        return None

    def penalty(self, name: str, inputs: tuple):
        """(root, net, (real, fake, alpha)) of sub-step `name`'s gradient penalty, or None: it has
        none. `root` names the net in `roots()` whose input the penalty's inner gradient reaches."""
        return None

    def net_parameters(self) -> list[ms.Parameter]:
        """Every Parameter of the task's nets (BatchNorm statistics included), in a fixed order."""
        return [p for net in self.roots().values() for p in net.get_parameters()]

    def metrics(self) -> list[tuple[int, dict[str, float]]]:
        """Fetch the statuses of the steps since the last call: (last step, metrics) per net."""
        return [drained for state in self.states() if (drained := state.drain())[1]]

    def layer_health(self) -> dict[str, float]:
        return {k: v for state in self.states() for k, v in state.layer_health().items()}

    def nonfinite_run(self) -> int:
        return max(state.nonfinite_run for state in self.states())

    def eval_picture(self, folder: Path, step: int) -> Path | None:
        """The picture made at each evaluation (`samples/step-000250.png`); None: this task makes none."""
        return None

    def state_parameters(self) -> dict[str, ms.Parameter]:
        """Every on-device state tensor, under a name unique across optimizers and scalers."""
        out = {}
        for group, net in self.nets.items():   # what no optimizer holds: BatchNorm's moving statistics
            for param in net.untrainable_params():
                out[f"{group}/{param.name}"] = param
        for group, opt in self.optimizers.items():
            for _, param in opt.parameters_and_names():
                out[f"{group}/{param.name}"] = param
        for group, scaler in self.scalers.items():
            for attr, value in sorted(vars(scaler).items()):
                if isinstance(value, ms.Parameter) and attr not in scaler.hyperparameters:
                    out[f"{group}/{attr}"] = value
        return out

    def graph_parameters(self) -> dict[str, ms.Parameter]:
        """Every Parameter the compiled steps read: the state above, the weights, the learning
        rates and the scalers' settings; `ampgan.graph_pool` copies them all into a pooled task."""
        out = self.state_parameters()
        for group, net in self.nets.items():
            for param in net.trainable_params():
                out.setdefault(f"{group}/{param.name}", param)
        for group, opt in self.optimizers.items():
            for i, lr in enumerate(getattr(opt, "lrs", ())):   # mint optimizers: a Parameter per group
                out[f"{group}/lr{i}"] = lr
        for group, scaler in self.scalers.items():
            for attr in scaler.hyperparameters:
                out[f"{group}/{attr}"] = getattr(scaler, attr)
        return out

    def host_state(self) -> dict:
        """Host-side state as plain JSON-able values."""
        return {"batches": self.batches.state(),
                "rngs": {k: rng.bit_generator.state for k, rng in self.rngs.items()},
                "counters": {s.prefix: s.counters() for s in self.states()}}

    def load_host_state(self, state: dict) -> None:
        self.batches.load_state(state["batches"])
        for k, rng in self.rngs.items():
            rng.bit_generator.state = state["rngs"][k]
        for s in self.states():
            s.load_counters(state["counters"][s.prefix])


def health_fn(s: Settings):
    return grad_health if s.trainer.grad_health else no_health


def activation_peaks(s: Settings, net: ms.nn.Cell, root: str) -> ActivationPeaks | None:
    """The activation peaks to measure in `net`'s step (`root`: its name in `roots()`), or None:
    `trainer.headroom` or `trainer.grad_health` is off."""
    return ActivationPeaks(net, root) if s.trainer.grad_health and s.trainer.headroom else None


def computes_float16(s: Settings) -> bool:
    """The nets compute in float16: an AMP level other than O0 (the headroom metrics are logged)."""
    return s.amp.level != "O0"
