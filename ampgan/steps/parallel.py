"""Data parallel inside a compiled step: every rank decides the same.

In a data-parallel run (`hardware.workers` > 1: MindSpore's `parallel_mode="data_parallel"`, set by
`ampgan.training.parallel` in each rank before anything is built) a step's update differs from a
single process's in four places, all inside the graph:

    loss     = this rank's shard's mean loss / N                 # (`part_of`) see below
    own      = all_finite(this rank's scaled gradients)        # the status's `finite`: this rank's shard
    grads    = sum over ranks (nn.DistributedGradReducer)       # health and the norm read these
    finite   = no rank's `own` is False (an all-reduced count)  # the scaler adjusts, skips, applies on it
    losses   = mean over ranks; activation peaks = max over ranks

so every rank's scaler sees the same finite flag and the same gradient health (computed from the
all-reduced gradients), and scales, skips and updates the same way.

Why loss / N and a sum, not a mean of the ranks' gradients: the backward pass runs in float16,
and a rank's mean over B/N samples gives each sample's gradient N times the weight one process's
mean over B gives it. Averaging afterwards gives the same gradient, but inside the backward every
value is N times larger, so float16 overflows at an N times smaller loss scale: a 2-rank O2 run
skipped steps at scale 2^19 that one process did not (measured). Scaling the loss by 1/N (a power
of two for N = 2, 4, 8: exact) makes every intermediate value what one process computes. A single process has no
`Replicas` (`replicas_for` returns None) and its step is unchanged.

MindSpore's `TrainOneStepWithLossScaleCell` all-reduces its overflow status on GPU/Ascend only,
and a finite check of one rank's gradients (`ampgan.amp.health.all_finite`, like
`mindspore.amp.all_finite`) has no collective: without `agree` a rank whose shard overflows
would skip the step while the others apply it. On CPU, MindSpore's AllReduce sums only
(MIN/MAX raise), so the flag is agreed through a sum and the peaks through an AllGather.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mindspore as ms
from mindspore import nn, ops

from ampgan.amp.health import all_finite


def data_parallel() -> bool:
    """This process is one rank of a data-parallel run (MindSpore's auto-parallel context says so)."""
    return ms.get_auto_parallel_context("parallel_mode") == "data_parallel"


@dataclass(frozen=True)
class Replicas:
    """The in-graph functions of one net's data-parallel step (closures over collectives and the
    net's gradient reducer): call them inside `ms.jit` code, unpacked outside it."""

    size: int
    part_of: Callable     # a step's loss_fn -> the same with its scaled loss divided by `size` (outside jit)
    gradients: Callable   # scaled grads -> (sum over ranks, this rank's own finite flag)
    agree: Callable       # own finite flag -> True iff every rank's is
    losses: Callable      # this rank's losses -> their mean over ranks
    peaks: Callable       # this rank's activation peaks -> their max over ranks


def agree_finite(own_finite, all_sum):
    """True iff no rank's own flag is False: the count of non-finite ranks, summed over ranks, is 0."""
    bad = all_sum((1.0 - own_finite.astype(ms.float32)).reshape(1))
    return (bad == 0).reshape(())


def replicas_for(weights) -> Replicas | None:
    """The data-parallel functions for a step optimising `weights`; None in a single process."""
    if not data_parallel():
        return None
    from mindspore.communication import get_group_size

    size = get_group_size()
    reducer = nn.DistributedGradReducer(weights, mean=False, degree=size)   # a sum: each loss is already / size
    all_sum = ops.AllReduce()       # ReduceOp.SUM: the only one MindSpore's CPU kernel has
    gather = ops.AllGather()        # concatenates along axis 0

    def part_of(loss_fn):
        share = 1.0 / size

        def part(*inputs):
            scaled, losses = loss_fn(*inputs)
            return scaled * share, losses

        return part

    def gradients(scaled_grads):
        return reducer(scaled_grads), all_finite(scaled_grads)

    def agree(own_finite):
        return agree_finite(own_finite, all_sum)

    def losses(values):
        return all_sum(values) / size

    def peaks(values):
        return gather(values.reshape(1, -1)).max(0)

    return Replicas(size, part_of, gradients, agree, losses, peaks)
