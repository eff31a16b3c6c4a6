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
from mindspore import ops

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


def check_penalty_gradient(amp_task, fp32_task, inputs, jit: bool, seed: int = 0) -> FrameworkCheck:
    """`amp_task`, `fp32_task`: freshly built from one seed (same weights); `inputs`: a critic step's."""
    real, z, alpha = inputs
    fake = ops.stop_gradient(fp32_task.gen(z))
    params = amp_task.critic_amp.trainable_params()
    fp32_params = fp32_task.critic.trainable_params()

    def penalty(r, f, a):
        return gradient_penalty(amp_task.critic_gp, r, f, a)

    grad = ms.grad(penalty, None, params)
    analytic = [g.asnumpy() for g in (ms.jit(grad) if jit else grad)(real, fake, alpha)]
    rng = np.random.default_rng(seed)
    got, fds = [], []
    for p, g in zip(fp32_params, analytic):
        if p.ndim < 2:
            continue
        base = p.asnumpy().copy()
        for flat in rng.choice(base.size, size=min(ENTRIES, base.size), replace=False):
            idx = np.unravel_index(flat, base.shape)
            vals = []
            for sign in (1, -1):
                w = base.copy()
                w[idx] += sign * EPS
                p.set_data(ms.Tensor(w))  # the FP32 twin is uncompiled here: set_data is seen
                vals.append(float(gradient_penalty(fp32_task.critic, real, fake, alpha).asnumpy()))
            fds.append((vals[0] - vals[1]) / (2 * EPS))
            got.append(float(g[idx]))
        p.set_data(ms.Tensor(base))
    got, fds = np.array(got), np.array(fds)
    rel = float(np.linalg.norm(got - fds) / max(np.linalg.norm(fds), 1e-12))
    return FrameworkCheck("jit" if jit else "PYNATIVE", rel, len(got), float((got == 0).mean()))
