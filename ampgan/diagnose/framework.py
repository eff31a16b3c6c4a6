"""Is it the framework? The gradient penalty's weight gradient against finite differences.

MindSpore 2.10 computes the penalty's second-order gradient wrongly in PYNATIVE mode (zero for
some nets, even in FP32). This check takes the AMP critic's analytic d GP / d W in the mode the
run uses (compiled or not) and compares it, on a few entries per weight matrix, with central
finite differences of the GP computed in FP32 (first order only: right in either mode).
"""

from __future__ import annotations

from dataclasses import dataclass

import mindspore as ms
import numpy as np

from ampgan.steps.gan import gradient_penalty

ENTRIES = 4        # entries checked per weight matrix
EPS = 1e-3
TOLERANCE = 0.2    # relative error of the checked entries above which the gradient is wrong


@dataclass
class FrameworkCheck:
    mode: str                # "jit" or "PYNATIVE"
    rel_err: float           # ||analytic - finite differences|| / ||finite differences|| over the entries
    entries: int
    zero_analytic: float     # share of checked entries whose analytic gradient is exactly 0

    @property
    def wrong(self) -> bool:
        return self.rel_err > TOLERANCE

    def describe(self) -> str:
        return (f"GP weight gradient in {self.mode} vs finite differences: relative error {self.rel_err:.3g} "
                f"over {self.entries} entries ({100 * self.zero_analytic:.0f}% exactly zero)")


def finite_difference(value, param, indices, eps: float = EPS) -> np.ndarray:
    """Central differences d value() / d param[idx] for each idx of `indices`: `value()` is a float
    computed from the current weights, `param` an uncompiled net's Parameter (set_data is seen).
    The weights are put back afterwards."""
    base = param.asnumpy().copy()
    grads = []
    for idx in indices:
        vals = []
        for sign in (1, -1):
            w = base.copy()
            w[idx] += sign * eps
            param.set_data(ms.Tensor(w))
            vals.append(value())
        grads.append((vals[0] - vals[1]) / (2 * eps))
    param.set_data(ms.Tensor(base))
    return np.array(grads)


def check_penalty_gradient(amp_task, fp32_task, name: str, inputs, jit: bool, seed: int = 0) -> FrameworkCheck:
    """`amp_task`, `fp32_task`: freshly built from one seed (same weights); `inputs`: sub-step
    `name`'s. Both tasks' penalty hooks (`TaskBase.penalty`) give the net and its arguments; the
    arguments are the FP32 twin's for both, so that only the gradient's computation differs."""
    _, net, _ = amp_task.penalty(name, inputs)
    _, fp32_net, args = fp32_task.penalty(name, inputs)
    params, fp32_params = net.trainable_params(), fp32_net.trainable_params()

    def penalty(*a):
        return gradient_penalty(net, *a)

    def fp32_gp() -> float:
        return float(gradient_penalty(fp32_net, *args).asnumpy())

    grad = ms.grad(penalty, None, params)
    analytic = [g.asnumpy() for g in (ms.jit(grad) if jit else grad)(*args)]
    rng = np.random.default_rng(seed)
    got, fds = [], []
    for p, g in zip(fp32_params, analytic):
        if p.ndim < 2:
            continue
        indices = [np.unravel_index(flat, p.shape) for flat in rng.choice(p.size, size=min(ENTRIES, p.size), replace=False)]
        fds.extend(finite_difference(fp32_gp, p, indices))  # the FP32 twin is uncompiled here
        got.extend(float(g[idx]) for idx in indices)
    got, fds = np.array(got), np.array(fds)
    rel = float(np.linalg.norm(got - fds) / max(np.linalg.norm(fds), 1e-12))
    return FrameworkCheck("jit" if jit else "PYNATIVE", rel, len(got), float((got == 0).mean()))
