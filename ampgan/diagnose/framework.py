"""Is it the framework? The gradient penalty's weight gradient against finite differences.

MindSpore 2.10 computes the penalty's second-order gradient wrongly in PYNATIVE mode (zero for
some nets, even in FP32). The check runs on the FP32 twin, never on the AMP nets: float16's own
rounding must not be mistaken for the framework's error, and a framework bug shows in FP32 too.

Algorithm, for the twin's penalty net and one sub-step's (real, fake, alpha), its first `SAMPLES`
samples (the GP is piecewise smooth: every sample's ReLUs add kinks a difference may straddle):
1. the analytic d GP / d W, taken in the run's own mode (compiled or PYNATIVE) and, when that is
   PYNATIVE, compiled as well (whenever the task has a second-order term the compiled gradient is
   checked too: it is what the fix would switch to);
2. finite differences (central, forward and backward) of the same FP32 GP (first order only:
   right in either mode) on
   the `ENTRIES` entries of each weight matrix where the compiled gradient is largest (where the
   signal is: random entries often sit on dead ReLUs, where both are zero and the differences
   are float32 noise), at two step sizes `STEPS`: a ReLU kink within a step spoils the central
   difference and that side's, not the other side's; a wrong gradient (for example zero) fails all;
3. per parameter, the median over its entries of |analytic - fd| / max(|fd|, noise), each entry
   against the closest of its six differences (noise: float32's rounding of the GP over the step;
   the median: a kink that spoils one entry at both step sizes leaves a right gradient right, a
   wrong gradient is wrong on every entry). A non-finite analytic entry is an error (infinite),
   never dropped. A mode is wrong when any parameter's error exceeds TOLERANCE.

The verdict takes its layer from the worst parameter measured in the run's mode and its fix
from what was measured: `hardware.jit=true` only when the compiled gradient is right.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mindspore as ms
import numpy as np

from ampgan.steps.gan import gradient_penalty

ENTRIES = 6              # entries checked per weight matrix
STEPS = (1e-3, 3e-4)     # the two finite-difference step sizes
TOLERANCE = 0.2          # a parameter's relative error above which its gradient is wrong
FP16_TOLERANCE = 0.05    # PYNATIVE vs jit at the run's precision: float16's rounding stays far below this
SAMPLES = 8              # the penalty on the sub-step's first samples: fewer ReLU kinks inside a step
EPS = STEPS[0]


@dataclass
class ModeCheck:
    """One execution mode's analytic gradient against the differences, per parameter."""

    mode: str                          # "jit" or "PYNATIVE"
    errors: dict[str, float]           # parameter name -> relative error over its entries (inf: not finite)
    zero_share: float                  # share of checked entries whose analytic gradient is exactly 0

    @property
    def worst(self) -> tuple[str, float]:
        return max(self.errors.items(), key=lambda kv: kv[1] if np.isfinite(kv[1]) else np.inf)

    @property
    def wrong(self) -> bool:
        return any(not e <= TOLERANCE for e in self.errors.values())   # NaN counts as wrong

    def describe(self) -> str:
        name, err = self.worst
        return (f"{self.mode}: worst {name} relative error {err:.3g} over {len(self.errors)} weight matrices "
                f"({100 * self.zero_share:.0f}% of entries exactly zero) -> {'WRONG' if self.wrong else 'right'}")


@dataclass
class PrecisionModes:
    """The run's own nets (its precision) in its own mode against jit, on the same inputs: per
    parameter |PYNATIVE - jit| / |jit| over the whole gradient. No finite differences in float16
    (its rounding swamps them): the two modes must agree within float16's tolerance."""

    precision: str                     # "O2", "O3", ...
    errors: dict[str, float]           # parameter name -> relative disagreement (inf: not finite)

    @property
    def worst(self) -> tuple[str, float]:
        return max(self.errors.items(), key=lambda kv: kv[1] if np.isfinite(kv[1]) else np.inf)

    @property
    def wrong(self) -> bool:
        return any(not e <= FP16_TOLERANCE for e in self.errors.values())

    def describe(self) -> str:
        name, err = self.worst
        return (f"{self.precision}: PYNATIVE vs jit, worst {name} relative disagreement {err:.3g} over "
                f"{len(self.errors)} parameters (float16's tolerance {FP16_TOLERANCE:g}) -> "
                f"{'WRONG' if self.wrong else 'agree'}")


@dataclass
class FrameworkCheck:
    run_mode: str                      # the mode the run uses
    modes: dict[str, ModeCheck] = field(default_factory=dict)
    entries: int = 0
    at_precision: PrecisionModes | None = None   # a PYNATIVE run's own nets, PYNATIVE vs jit

    @property
    def run(self) -> ModeCheck:
        return self.modes[self.run_mode]

    @property
    def wrong(self) -> bool:
        """The run's mode gets the penalty's gradient wrong, in FP32 or at the run's precision."""
        return self.run.wrong or (self.at_precision is not None and self.at_precision.wrong)

    @property
    def worst(self) -> tuple[str, float]:
        return self.run.worst if self.run.wrong or self.at_precision is None else self.at_precision.worst

    @property
    def rel_err(self) -> float:
        return self.worst[1]

    @property
    def param(self) -> str:
        """The parameter whose gradient is the most wrong in the run's mode."""
        return self.worst[0]

    @property
    def compiled_right(self) -> bool:
        return "jit" in self.modes and not self.modes["jit"].wrong

    def describe(self) -> str:
        same = f"; GP weight gradient at the run's precision, {self.at_precision.describe()}" if self.at_precision else ""
        return (f"GP weight gradient of the FP32 twin vs finite differences (steps {STEPS[0]:g} and {STEPS[1]:g}, "
                f"{self.entries} entries): " + "; ".join(m.describe() for m in self.modes.values()) + same)


def differences(value, param, indices, eps: float = EPS) -> np.ndarray:
    """(3, len(indices)): the central, forward and backward differences d value() / d param[idx]
    for each idx of `indices`: `value()` is a float computed from the current weights, `param` an
    uncompiled net's Parameter (set_data is seen). The weights are put back afterwards. A kink of
    the function on one side of the weight spoils the central difference and that side's."""
    base = param.asnumpy().copy()
    centre = value()
    out = []
    for idx in indices:
        vals = []
        for sign in (1, -1):
            w = base.copy()
            w[idx] += sign * eps
            param.set_data(ms.Tensor(w))
            vals.append(value())
        out.append(((vals[0] - vals[1]) / (2 * eps), (vals[0] - centre) / eps, (centre - vals[1]) / eps))
    param.set_data(ms.Tensor(base))
    return np.array(out).T


def relative_error(got: np.ndarray, fds: list[np.ndarray], floor: float = 1e-12) -> float:
    """The median over entries of |got - fd| / max(|fd|, floor), each entry against the closest of
    its differences (`fds`: arrays of one value per entry, or of rows of them); inf when `got` is
    not finite. The median: a kink that spoils one entry everywhere does not make a right gradient
    wrong, while a wrong one (zero) is wrong on every entry. `floor`: the differences' own noise
    (below it a gradient reads as zero)."""
    if not np.isfinite(got).all():
        return float("inf")
    stacked = np.concatenate([np.atleast_2d(f) for f in fds])   # (candidates, entries)
    errors = np.abs(stacked - got) / np.maximum(np.abs(stacked), floor)
    return float(np.median(errors.min(axis=0)))


def check_penalty_gradient(fp32_task, name: str, inputs, jit: bool) -> FrameworkCheck:
    """`fp32_task`: the FP32 twin, freshly built; `inputs`: sub-step `name`'s. The penalty hook
    (`TaskBase.penalty`) gives the net and its arguments."""
    _, net, args = fp32_task.penalty(name, inputs)
    args = tuple(a[:SAMPLES] for a in args)
    params = net.trainable_params()

    def penalty(*a):
        return gradient_penalty(net, *a)

    def gp() -> float:
        return float(gradient_penalty(net, *args).asnumpy())

    grad = ms.grad(penalty, None, params)
    run_mode = "jit" if jit else "PYNATIVE"
    analytic = {"jit": [g.asnumpy() for g in ms.jit(grad)(*args)]}
    if not jit:
        analytic[run_mode] = [g.asnumpy() for g in grad(*args)]
    value = gp()
    # float32 rounding of the GP, divided by the step: the differences' own noise
    noise = 10 * np.finfo(np.float32).eps * max(abs(value), 1.0) / min(STEPS)
    checked: list[tuple[str, int, list, list[np.ndarray]]] = []
    for i, p in enumerate(params):
        if p.ndim < 2:
            continue
        reference = np.abs(np.nan_to_num(analytic["jit"][i], nan=0.0, posinf=0.0)).ravel()
        flat = np.argsort(-reference, kind="stable")[:ENTRIES]   # where the compiled gradient says the signal is
        indices = [np.unravel_index(k, p.shape) for k in flat]
        checked.append((p.name, i, indices, [differences(gp, p, indices, eps) for eps in STEPS]))
    out = FrameworkCheck(run_mode, entries=sum(len(c[2]) for c in checked))
    for mode in (run_mode, "jit") if not jit else ("jit",):
        errors, zeros = {}, []
        for pname, i, indices, fds in checked:
            got = np.array([float(analytic[mode][i][idx]) for idx in indices])
            errors[pname] = relative_error(got, fds, noise)
            zeros.extend(got == 0)
        out.modes[mode] = ModeCheck(mode, errors, float(np.mean(zeros)) if zeros else 0.0)
    return out


def compare_modes(amp_task, name: str, inputs, precision: str) -> PrecisionModes:
    """The run's own penalty gradient (its nets, its precision) in PYNATIVE against jit, on the
    same inputs: a disagreement beyond float16's tolerance is the framework's, not float16's."""
    _, net, args = amp_task.penalty(name, inputs)
    args = tuple(a[:SAMPLES] for a in args)
    params = net.trainable_params()

    def penalty(*a):
        return gradient_penalty(net, *a)

    grad = ms.grad(penalty, None, params)
    eager = [g.asnumpy().astype(np.float64) for g in grad(*args)]
    compiled = [g.asnumpy().astype(np.float64) for g in ms.jit(grad)(*args)]
    errors = {}
    for p, e, c in zip(params, eager, compiled):
        if not (np.isfinite(e).all() and np.isfinite(c).all()):
            errors[p.name] = float("inf")
            continue
        scale = np.linalg.norm(c)
        errors[p.name] = float(np.linalg.norm(e - c) / scale) if scale > 0 else float(np.linalg.norm(e) > 0)
    return PrecisionModes(precision, errors)
