"""In-graph gradient health: a few reductions per parameter gradient, one small tensor per step.

For each gradient g (as the scaled backward pass produced it) the row is
    zero      fraction of elements exactly 0
    underflow fraction nonzero but below float16's smallest normal 2**-14 (~6.1e-5):
              float16 holds them only as subnormals (down to 2**-24), with lost precision
    max_abs   max |g|
    nonfinite count of inf/nan elements
Computed inside the jitted step so the host fetches one (n_params, 4) array, not every gradient.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import ops

from ampgan.amp.float16 import FP16_MIN_NORMAL, FP16_MIN_SUBNORMAL_EXP

FP16_MIN_SUBNORMAL = 2.0**FP16_MIN_SUBNORMAL_EXP
HEALTH_FIELDS = ("zero", "underflow", "max_abs", "nonfinite")


def grad_health(grads: tuple) -> ms.Tensor:
    rows = []
    for g in grads:
        a = ops.abs(g.astype(ms.float32)).reshape(-1)
        zero = (a == 0).astype(ms.float32).mean()
        underflow = ops.logical_and(a > 0, a < FP16_MIN_NORMAL).astype(ms.float32).mean()
        nonfinite = ops.logical_not(ops.isfinite(a)).astype(ms.float32).sum()
        rows.append(ops.stack([zero, underflow, a.max(), nonfinite]))
    return ops.stack(rows)


def no_health(grads: tuple) -> ms.Tensor:
    """The same shape, all zeros, nothing computed: `trainer.grad_health=false`."""
    return ops.zeros((len(grads), len(HEALTH_FIELDS)), ms.float32)


def no_norm(grads: tuple) -> ms.Tensor:
    """`trainer.grad_health=false` and a scaler that does not clip: the norm is not computed."""
    return ops.zeros((), ms.float32)


def all_finite(grads: tuple) -> ms.Tensor:
    """Whether every element of every gradient is finite, as one bool tensor, from one float32
    sum per gradient: a sum is finite exactly when its elements are, except a sum beyond
    float32's range (3.4e38), which counts as an overflow too. `mindspore.amp.all_finite` runs
    three kernels per gradient on CPU (IsFinite, ReduceAll, a subtraction); on a small conv net
    (mindcv's mobilenet_v1_025) those were about 7% of a training step."""
    return ops.isfinite(ops.addn([g.astype(ms.float32).sum() for g in grads]))


def global_norm(grads: tuple) -> ms.Tensor:
    return ops.sqrt(ops.addn([ops.square(g.astype(ms.float32)).sum() for g in grads]))
