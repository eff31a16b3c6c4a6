"""Step variants for `python -m ampgan.diagnose` only: the training hot path does not use them.

A probe is a train step that also returns the unscaled gradients it applied, so the AMP run
and its FP32 twin can be compared element by element. The comparison itself runs compiled
too and returns one small (n_params, len(COMPARE_FIELDS)) tensor plus an exponent histogram
of the FP32 gradient, instead of every gradient on the host:

    rel_err    ||g_amp - g_fp32|| / ||g_fp32||        (0 when both are zero)
    cosine     <g_amp, g_fp32> / (||g_amp|| ||g_fp32||) (1 when both are zero)
    flushed    fraction of elements nonzero in FP32 but exactly zero in AMP (true underflow,
               which in-graph health cannot see: it leaves exact zeros out)
    lost_norm  ||g_fp32 on the flushed elements|| / ||g_fp32||: how much of the gradient is lost
    fp32_norm  ||g_fp32||

`exp_hist[p, k]` counts the nonzero FP32 elements of parameter p with floor(log2|g|) = EXP_MIN + k
(clipped to the ends); `ampgan.diagnose.ranges` turns it into loss-scale ranges.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mindspore as ms
from mindspore import ops

from ampgan.amp.health import global_norm, grad_health
from ampgan.steps.common import Step, build_body
from ampgan.steps.gan import penalty_inner_gradient

COMPARE_FIELDS = ("rel_err", "cosine", "flushed", "lost_norm", "fp32_norm")
EXP_MIN, EXP_MAX = -64, 17          # float16: subnormals from 2**-24, normals from 2**-14, max < 2**16
EXP_BINS = EXP_MAX - EXP_MIN + 1
TINY = 1e-30


@dataclass
class Probe:
    """`fn(*inputs) -> (packed status as a train Step returns it, unscaled gradients)`."""

    fn: Callable
    layout: Step  # decodes the packed status (loss names, parameter names)

    @property
    def weights(self) -> tuple:
        return self.layout.weights

    def __call__(self, *inputs):
        packed, grads = self.fn(*inputs)
        return self.layout.decode(packed.asnumpy()), grads


def make_probe(loss_fn: Callable, weights: Sequence, optimizer, scaler, loss_names: Sequence[str],
               jit: bool = True) -> Probe:
    """A full train step of `loss_fn` (the very update a train step does, health always on)
    that also returns the unscaled gradients."""
    weights = tuple(weights)
    grad_fn = ms.value_and_grad(loss_fn, None, weights, has_aux=True)
    scaler.watch(weights)
    probe = build_body(grad_fn, optimizer, scaler, grad_health, global_norm)
    layout = Step(fn=probe, loss_names=tuple(loss_names), weights=weights)
    return Probe(fn=ms.jit(probe) if jit else probe, layout=layout)


def _compare_one(ga, gf):
    ga, gf = ga.astype(ms.float32).reshape(-1), gf.astype(ms.float32).reshape(-1)
    nf = ops.sqrt(ops.square(gf).sum())
    na = ops.sqrt(ops.square(ga).sum())
    nd = ops.sqrt(ops.square(ga - gf).sum())
    both_zero = ops.logical_and(nf == 0, na == 0)
    rel = ops.select(both_zero, ops.zeros((), ms.float32), nd / ops.maximum(nf, TINY))
    cos = ops.select(both_zero, ops.ones((), ms.float32), (ga * gf).sum() / ops.maximum(na * nf, TINY))
    flushed_mask = ops.logical_and(gf != 0, ga == 0)
    flushed = flushed_mask.astype(ms.float32).mean()
    lost = ops.sqrt(ops.select(flushed_mask, ops.square(gf), ops.zeros_like(gf)).sum()) / ops.maximum(nf, TINY)
    row = ops.stack([rel, cos, flushed, lost, nf])
    a = ops.abs(gf)
    nonzero = ops.logical_and(a > 0, ops.isfinite(a))
    e = ops.floor(ops.log2(ops.select(nonzero, a, ops.ones_like(a))))
    idx = (ops.clip_by_value(e, EXP_MIN, EXP_MAX) - EXP_MIN).astype(ms.int32)
    # a scatter-add of the nonzero flags into the bins (ScatterNd sums duplicate indices): exact
    # counts, about 6x cheaper than summing a (size, EXP_BINS) one-hot matrix
    hist = ops.scatter_nd(idx.reshape(-1, 1), nonzero.astype(ms.float32), (EXP_BINS,))
    return row, hist


@ms.jit
def _compare(*grads):
    n = len(grads) // 2
    rows, hists = [], []
    for i in range(n):
        row, hist = _compare_one(grads[i], grads[n + i])
        rows.append(row)
        hists.append(hist)
    return ops.stack(rows), ops.stack(hists)


def compare_gradients(amp_grads, fp32_grads):
    """`((n, len(COMPARE_FIELDS)), (n, EXP_BINS))` for two gradient tuples, compiled.

    The tensors go in as separate arguments: a tuple argument would be compiled anew per call."""
    return _compare(*amp_grads, *fp32_grads)


def make_loader(dst: Sequence[ms.Parameter]) -> Callable[[Sequence[ms.Tensor]], None]:
    """`load(values)`: a compiled copy of `values` (tensors) into the Parameters `dst`.

    Used to sync the AMP nets to the FP32 twin's recorded weights before each step and to reset
    optimizer and scaler state between replays. An in-graph `assign`, not `Parameter.set_data`:
    MindSpore 2.10's compiled steps may not see a `set_data` made after their first call.
    """
    dst = tuple(dst)

    @ms.jit
    def load(*values):
        for d, v in zip(dst, values):
            ops.assign(d, v)
        return ops.zeros((), ms.float32)

    def run(values: Sequence[ms.Tensor]) -> None:
        load(*values).asnumpy()

    return run


def make_inner_gradient_probe(critic_gp, jit: bool = True) -> Callable:
    """`fn(real, fake, alpha) -> stack([max |d critic / d x_hat|, non-finite count])` in the critic's
    own precision: the gradient penalty's inner gradient (first order: right in PYNATIVE too)."""

    def inner(real, fake, alpha):
        g = ops.abs(penalty_inner_gradient(critic_gp, real, fake, alpha))
        return ops.stack([g.max(), ops.logical_not(ops.isfinite(g)).astype(ms.float32).sum()])

    return ms.jit(inner) if jit else inner
